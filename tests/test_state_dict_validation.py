"""load_state_dict validates everything it restores (issue 28, item 6).

Before, a checkpoint with a NaN first moment, or a graft / SOAP second moment of -1, loaded, and every
later update was non-finite and skipped (300 of 300, with a warning each step); ``step=-5`` skipped
updates until the counter reached 0, then the bias correction divided by zero; ``lr='abc'``,
``lr=nan``, ``precondition_frequency=0`` and ``betas=(0.9,)`` in a saved param group raised plain
ValueError / IndexError at the first step (or not at all). Now each is a StateDictError (a
ValueError) naming the saved key, raised by load_state_dict before anything is loaded.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import shampoo
from shampoo.errors import StateDictError


def _trained(preconditioner: str | None = None) -> tuple[torch.nn.Module, shampoo.Shampoo]:
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 4)
    kw: dict = dict(lr=1e-2, precondition_frequency=1, start_preconditioning_step=1)
    if preconditioner is not None:
        kw.update(preconditioner=preconditioner, grafting="none")
    opt = shampoo.Shampoo(m.named_parameters(), **kw)
    for _ in range(3):
        opt.zero_grad()
        m(torch.randn(16, 8)).square().sum().backward()
        opt.step()
    return m, opt


def _snapshot(opt: shampoo.Shampoo) -> dict:
    return copy.deepcopy(opt.state_dict())


def _assert_unchanged(opt: shampoo.Shampoo, before: dict) -> None:
    after = opt.state_dict()
    for key, entries in before["state"].items():
        for name, v in entries.items():
            w = after["state"][key][name]
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, w), name
            elif not (isinstance(v, float) and math.isnan(v)):
                assert v == w, name
    assert after["param_groups"][0]["lr"] == before["param_groups"][0]["lr"]


TENSOR_CASES = [
    # (preconditioner, key, how to corrupt, what the error says)
    (None, "blocks.0.first_moment", lambda t: torch.full_like(t, math.nan), "non-finite"),
    (None, "blocks.0.graft_state", lambda t: torch.full_like(t, -1.0), "below 0"),
    (None, "blocks.0.graft_state", lambda t: t.to(torch.complex64), "dtype"),
    (None, "blocks.0.first_moment", lambda t: t.to(torch.int32), "dtype"),
    (None, "blocks.0.first_moment", lambda t: t[:1], "shape"),
    (None, "blocks.0.factors.0.root", lambda t: torch.full_like(t, math.inf), "non-finite"),
    (None, "blocks.0.factors.0.matrix", lambda t: -torch.eye(t.shape[0]), "negative diagonal"),
    ("soap", "blocks.0.second_moment", lambda t: torch.full_like(t, -1.0), "below 0"),
    ("soap", "blocks.0.second_moment", lambda t: torch.full_like(t, math.nan), "non-finite"),
    ("soap", "blocks.0.basis_pending", lambda t: torch.full_like(t, -3), "below 0"),
]


@pytest.mark.parametrize(("pre", "key", "corrupt", "says"), TENSOR_CASES)
def test_invalid_tensor_is_refused_naming_its_key(pre, key, corrupt, says) -> None:
    _, opt = _trained(pre)
    sd = _snapshot(opt)
    before = _snapshot(opt)
    sd["state"]["weight"][key] = corrupt(sd["state"]["weight"][key])
    with pytest.raises(StateDictError, match=rf"(?s)'{key}'.*{says}"):
        opt.load_state_dict(sd)
    _assert_unchanged(opt, before)


@pytest.mark.parametrize(
    ("key", "value"),
    [("step", -5), ("step", 2.5), ("skipped_steps", -1), ("blocks.0.factors.0.failures", -2)],
)
def test_invalid_count_is_refused(key: str, value: object) -> None:
    _, opt = _trained()
    sd = _snapshot(opt)
    sd["state"]["weight"][key] = value
    with pytest.raises(StateDictError, match=rf"'{key}'.*must be an int"):
        opt.load_state_dict(sd)


@pytest.mark.parametrize(
    ("name", "value"),
    [("lr", "abc"), ("lr", math.nan), ("precondition_frequency", 0), ("betas", (0.9,))],
)
def test_invalid_hyperparameter_gives_the_constructors_error(name: str, value: object) -> None:
    m, opt = _trained()
    with pytest.raises(ValueError) as ctor:  # the constructor's own error, typed and explained
        shampoo.Shampoo(m.parameters(), **{name: value})
    assert not isinstance(ctor.value, IndexError)
    sd = _snapshot(opt)
    before = _snapshot(opt)
    sd["param_groups"][0][name] = value
    with pytest.raises(StateDictError, match="param group 0") as load:
        opt.load_state_dict(sd)
    assert str(ctor.value) in str(load.value)
    _assert_unchanged(opt, before)


def test_valid_checkpoint_still_loads_and_trains() -> None:
    # the checks refuse nothing a real checkpoint holds (fp64 state is cast as torch.optim does)
    m, opt = _trained("soap")
    sd = _snapshot(opt)
    sd["state"]["weight"]["blocks.0.first_moment"] = sd["state"]["weight"]["blocks.0.first_moment"].double()
    opt.load_state_dict(sd)
    w0 = m.weight.detach().clone()
    opt.zero_grad()
    m(torch.randn(16, 8)).square().sum().backward()
    opt.step()
    assert not torch.equal(w0, m.weight)
    assert opt.state[m.weight].skipped_steps == 0
