"""The per-block transform seam: a preconditioner defined here, in the test suite alone, plugs into
Shampoo through the ``preconditioner`` param-group option without touching ``shampoo/``.

``Sign`` preconditions m by its sign (signSGD, Bernstein et al. 2018, Alg. 1): the direction of a
Shampoo block is sign(m_hat) unscaled with ``grafting="none"``, and sign(m_hat) rescaled per block to
the norm of the grafting direction otherwise (Agarwal et al. 2020). Blocks of other kinds (vectors
under ``vector_policy="diagonal"``) keep their own preconditioner.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import shampoo


@dataclass(frozen=True)
class Sign:
    """A stateless per-block preconditioner: d = sign(m)."""

    def init(self, stack: Any) -> None:
        return None

    def bind(self, state: None, j: int, block: Any) -> None:
        return None

    def update(self, state: None, G: torch.Tensor, ctx: Any) -> None:
        return None

    def direction(self, state: None, m: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, float]:
        return torch.sign(m), 1.0

    def ready(self, state: None, j: int) -> bool:
        return True

    def refresh(self, state: None, positions: list[int], steps: list[int], label: Any) -> list[Any]:
        return []

    def accumulators(self, state: None) -> list[torch.Tensor]:
        return []


def _problem(seed: int = 0) -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(64, 8, generator=g, dtype=torch.float64)
    Wt = torch.randn(3, 8, generator=g, dtype=torch.float64)
    torch.manual_seed(seed)
    lin = nn.Linear(8, 3, bias=False).double()
    return lin, X, X @ Wt.T


def _grad(lin: nn.Linear, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    lin.zero_grad()
    loss = ((lin(X) - Y) ** 2).mean()
    loss.backward()
    return lin.weight.grad.clone()  # type: ignore[union-attr]


def test_sign_direction_is_exactly_sign_of_the_gradient_without_grafting() -> None:
    lin, X, Y = _problem()
    lr = 0.01
    opt = shampoo.Shampoo(
        [{"params": lin.parameters(), "preconditioner": Sign()}],
        lr=lr, betas=(0.0, 0.99), grafting="none", start_preconditioning_step=1,
    )  # fmt: skip
    for _ in range(5):
        w0 = lin.weight.detach().clone()
        g = _grad(lin, X, Y)
        opt.step()
        assert torch.equal(lin.weight.detach(), w0.add(torch.sign(g), alpha=-lr))
    assert opt.state[lin.weight].blocks[0].factors == []  # no Kronecker state was created


def test_sign_direction_is_grafted_to_the_adam_norm_per_block() -> None:
    """Blocks of 4 columns: each block's step is sign(m_hat) * ||adam direction|| / ||sign(m_hat)||."""
    lin, X, Y = _problem(1)
    lr, b1, b2, eps = 0.02, 0.9, 0.999, 1e-8
    opt = shampoo.Shampoo(
        [{"params": lin.parameters(), "preconditioner": Sign()}],
        lr=lr, betas=(b1, b2), grafting=shampoo.AdamGrafting(beta2=b2, eps=eps),
        max_preconditioner_dim=4, start_preconditioning_step=1,
    )  # fmt: skip
    m = torch.zeros_like(lin.weight)
    v = torch.zeros_like(lin.weight)
    for t in range(1, 8):
        w0 = lin.weight.detach().clone()
        g = _grad(lin, X, Y)
        opt.step()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        adam = m_hat / ((v / (1 - b2**t)).sqrt() + eps)
        step = torch.empty_like(g)
        for cols in (slice(0, 4), slice(4, 8)):  # the two blocks of the (3, 8) weight
            s = torch.sign(m_hat[:, cols])
            step[:, cols] = s * adam[:, cols].norm() / s.norm()
        torch.testing.assert_close(lin.weight.detach(), w0 - lr * step, rtol=1e-12, atol=1e-14)


def test_sign_preconditioner_trains_a_tiny_model_and_checkpoints() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    X = torch.randn(128, 8)
    Y = X[:, :1] * 2 - X[:, 1:2]
    opt = shampoo.Shampoo(
        [{"params": model.parameters(), "preconditioner": Sign()}],
        lr=0.01, grafting="adam", precondition_frequency=5,
    )  # fmt: skip

    def loss() -> torch.Tensor:
        return ((model(X) - Y) ** 2).mean()

    first = float(loss().detach())
    for _ in range(60):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert float(loss()) < 0.3 * first
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    assert sd["param_groups"][0]["preconditioner"] == {"__config__": "Sign"}
    opt2 = shampoo.Shampoo(
        [{"params": model.parameters(), "preconditioner": Sign()}],
        lr=0.01,
        grafting="adam",
        precondition_frequency=5,
    )
    opt2.load_state_dict(sd)
    assert opt2.state_dict()["state"].keys() == sd["state"].keys()


def test_an_object_that_is_not_a_transform_is_refused() -> None:
    lin, _, _ = _problem()
    lin.weight.grad = torch.ones_like(lin.weight)
    with pytest.raises(ValueError, match="per-block transform"):
        shampoo.Shampoo([{"params": lin.parameters(), "preconditioner": "sign"}]).step()


@dataclass(frozen=True)
class ShortSign(shampoo.transforms.Preconditioner):
    """Sign written against the protocol class: only its three required methods, the rest inherited."""

    def init(self, stack: Any) -> None:
        return None

    def update(self, state: None, G: torch.Tensor, ctx: Any) -> None:
        return None

    def direction(self, state: None, m: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, float]:
        return torch.sign(m), 1.0


def test_a_preconditioner_subclass_inherits_the_optional_methods() -> None:
    """A subclass of shampoo.transforms.Preconditioner inherits bind/ready/refresh/accumulators (no
    view, always ready, no periodic work, nothing to check) and steps exactly as the full Sign."""
    runs = []
    for pre in (Sign(), ShortSign()):
        lin, X, Y = _problem(2)
        opt = shampoo.Shampoo(
            [{"params": lin.parameters(), "preconditioner": pre}],
            lr=0.01, grafting="adam", max_preconditioner_dim=4, start_preconditioning_step=1,
            precondition_frequency=2,
        )  # fmt: skip
        for _ in range(4):
            _grad(lin, X, Y)
            opt.step()
        runs.append(lin.weight.detach().clone())
    assert torch.equal(runs[0], runs[1])


def test_a_preconditioner_subclass_must_write_its_direction() -> None:
    class NoDirection(shampoo.transforms.Preconditioner):
        def init(self, stack: Any) -> None:
            return None

        def update(self, state: None, G: torch.Tensor, ctx: Any) -> None:
            return None

    with pytest.raises(TypeError, match="direction"):
        NoDirection()


def test_an_object_missing_a_method_is_refused_with_the_protocol_named() -> None:
    @dataclass(frozen=True)
    class NoReady:  # Sign's methods but ready
        init, bind, update, direction = Sign.init, Sign.bind, Sign.update, Sign.direction
        refresh, accumulators = Sign.refresh, Sign.accumulators

    lin, _, _ = _problem()
    lin.weight.grad = torch.ones_like(lin.weight)
    with pytest.raises(ValueError, match=r"per-block transform \(shampoo.transforms.Preconditioner: init"):
        shampoo.Shampoo([{"params": lin.parameters(), "preconditioner": NoReady()}]).step()
