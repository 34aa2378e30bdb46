"""Root computations inside Shampoo: warm starts, and the failure policy under injected faults."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch

import matroots
import shampoo
from matroots.solvers import EighConfig, SolverConfig
from matroots.solvers.base import RawResult

# ------------------------------------------------------------------------------------------ warm start


def _warm_cold_run(warm: bool, dtype: torch.dtype):
    W = torch.zeros(32, 24, dtype=dtype, requires_grad=True)
    opt = shampoo.Shampoo(
        [W],
        lr=0.0,
        betas=(0.0, 0.95),
        eps=1e-4,
        grafting="none",
        root_solver="coupled_newton",
        precondition_frequency=2,
        start_preconditioning_step=2,
        merge_dims=False,
        warm_start=warm,
        factor_dtype=dtype,
        root_dtype=dtype,
    )
    g = torch.Generator().manual_seed(0)
    base = torch.randn(32, 24, generator=g, dtype=dtype)
    rounds = []
    for t in range(16):
        W.grad = base + 0.3 * torch.randn(32, 24, generator=g, dtype=dtype)
        opt.step()
        if t % 2 == 1:
            rounds.append([f.iterations for d in opt.diagnostics() for f in d.factors])
    return np.array(rounds), opt


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_warm_start_needs_fewer_iterations(dtype: torch.dtype) -> None:
    warm, opt = _warm_cold_run(True, dtype)
    cold, _ = _warm_cold_run(False, dtype)
    np.testing.assert_array_equal(warm[0], cold[0])  # the first root is cold in both runs
    assert (warm[1:] <= cold[1:]).all()
    assert warm[1:].sum() < cold[1:].sum(), (warm, cold)
    # ... and the warm-started roots are the true roots (forward error against float64 eigh).
    (W,) = opt.param_groups[0]["params"]
    st = opt.state[W]
    bc = 1 - 0.95**st.step
    for f in st.blocks[0].factors:
        A = f.matrix.double().numpy() / bc
        w, Q = np.linalg.eigh(A)
        w = w + 1e-4
        ref = (Q * w**-0.25) @ Q.T
        err = np.linalg.norm(f.root.double().numpy() - ref) / np.linalg.norm(ref)
        assert err < (1e-9 if dtype == torch.float64 else 1e-3), err
        assert f.solver == "coupled_newton" and f.converged


# ------------------------------------------------------------------------------------- fault injection

SWITCH = {"fail": False}


@dataclass(frozen=True, kw_only=True)
class Injected(SolverConfig):
    """A solver that fails on purpose: raises, returns NaN, or never converges."""

    name: ClassVar[str] = "injected"
    mode: str = "raise"

    def _run(self, prob, *, inverse, warm_start) -> RawResult:  # type: ignore[override]
        if self.mode == "bug":
            raise RuntimeError("a bug, not a numerical failure")
        if self.mode == "switch" and not SWITCH["fail"]:
            return EighConfig(rank_policy="clamp")._run(prob, inverse=inverse, warm_start=warm_start)
        if self.mode in ("raise", "switch"):
            raise matroots.NotPositiveDefiniteError("injected failure")
        b, n = prob.A.shape[0], prob.n
        eye = torch.eye(n, dtype=prob.A.dtype).expand(b, n, n).clone()
        nan = self.mode == "nan"
        return RawResult(
            root=torch.full_like(eye, float("nan")) if nan else eye,
            converged=torch.full((b,), nan),
            iterations=torch.full((b,), 100),
            residual=torch.ones(b, dtype=torch.float64),
            matmuls=0.0,
            info={"stop_reason": "injected"},
        )


def _opt(W, solver, **failure):
    return shampoo.Shampoo(
        [W],
        lr=1.0,
        betas=(0.0, 1.0),
        eps=1e-3,
        grafting="sgd",
        root_solver=solver,
        precondition_frequency=1,
        start_preconditioning_step=1,
        merge_dims=False,
        factor_dtype=torch.float64,
        root_dtype=torch.float64,
        failure=shampoo.FailurePolicy(**failure),
    )


def _grad(step: int) -> torch.Tensor:
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(step), dtype=torch.float64)


@pytest.mark.parametrize("mode", ["raise", "nan", "never"])
def test_failures_without_fallback_keep_graft_then_raise(mode: str) -> None:
    W = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    opt = _opt(W, Injected(mode=mode), fallback=None, max_consecutive_failures=3)
    for step in range(2):
        before = W.detach().clone()
        W.grad = _grad(step)
        with pytest.warns(shampoo.RootFailureWarning):
            opt.step()
        assert torch.isfinite(W).all()
        # No root yet: the update is the grafting direction (sgd: the gradient).
        torch.testing.assert_close(before - W.detach(), _grad(step), rtol=1e-12, atol=0)
    f = opt.diagnostics()[0].factors[0]
    assert (f.has_root, f.consecutive_failures, f.primary_failures, f.fallback_uses) == (False, 2, 2, 0)
    assert f.error
    W.grad = _grad(2)
    with (
        pytest.warns(shampoo.RootFailureWarning),
        pytest.raises(shampoo.RootComputationError, match="3 consecutive"),
    ):
        opt.step()
    assert torch.isfinite(W).all()


@pytest.mark.parametrize("mode", ["raise", "nan", "never"])
def test_fallback_rescues_failed_roots(mode: str) -> None:
    W = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    ref = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    opt = _opt(W, Injected(mode=mode), max_consecutive_failures=2)
    good = _opt(ref, EighConfig(rank_policy="clamp"))
    for step in range(5):  # more steps than max_consecutive_failures: the fallback's roots count
        W.grad, ref.grad = _grad(step), _grad(step)
        with pytest.warns(shampoo.RootFailureWarning):
            opt.step()
        good.step()
    torch.testing.assert_close(W, ref, rtol=1e-12, atol=1e-14)
    f = opt.diagnostics()[0].factors[0]
    assert f.solver == "eigh[fallback]" and f.has_root and f.converged
    assert (f.primary_failures, f.fallback_uses, f.consecutive_failures) == (5, 5, 0)


def test_previous_root_is_kept_when_a_later_computation_fails() -> None:
    W = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    opt = _opt(W, Injected(mode="switch"), fallback=None, max_consecutive_failures=2)
    SWITCH["fail"] = False
    try:
        for step in range(2):
            W.grad = _grad(step)
            opt.step()
        roots = [f.root.clone() for f in opt.state[W].blocks[0].factors]
        SWITCH["fail"] = True
        before = W.detach().clone()
        W.grad = _grad(2)
        with pytest.warns(shampoo.RootFailureWarning):
            opt.step()
    finally:
        SWITCH["fail"] = False
    factors = opt.state[W].blocks[0].factors
    for f, r in zip(factors, roots, strict=True):
        assert torch.equal(f.root, r) and f.has_root and f.consecutive_failures == 1 and f.root_step == 2
    # The update used the kept roots (then grafted to the gradient's norm).
    G = _grad(2)
    d = roots[0] @ G @ roots[1]
    torch.testing.assert_close(before - W.detach(), d * G.norm() / d.norm(), rtol=1e-12, atol=1e-14)


def test_primary_failure_limit_raises_even_with_a_working_fallback() -> None:
    W = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    opt = _opt(W, Injected(mode="raise"), max_consecutive_primary_failures=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", shampoo.RootFailureWarning)
        W.grad = _grad(0)
        opt.step()
        W.grad = _grad(1)
        with pytest.raises(shampoo.RootComputationError, match="configured root solver"):
            opt.step()


def test_solver_bugs_are_not_swallowed() -> None:
    W = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    opt = _opt(W, Injected(mode="bug"))
    W.grad = _grad(0)
    with pytest.raises(RuntimeError, match="a bug"):
        opt.step()


def test_non_finite_gradient_skips_only_that_parameter() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = shampoo.Shampoo(
        model.named_parameters(), lr=0.1, precondition_frequency=1, start_preconditioning_step=1
    )
    model(torch.randn(8, 4)).sum().backward()
    model.weight.grad[0, 0] = float("nan")
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    with pytest.warns(shampoo.NonFiniteGradientWarning, match="weight"):
        opt.step()
    assert torch.equal(model.weight, w0) and not torch.equal(model.bias, b0)
    assert opt.state[model.weight].skipped_steps == 1 and opt.state[model.weight].step == 0
    assert opt.state[model.bias].step == 1
    model.weight.grad.fill_(float("inf"))
    model.bias.grad.fill_(1.0)
    with pytest.warns(shampoo.NonFiniteGradientWarning):
        opt.step()
    assert torch.isfinite(model.weight).all() and opt.state[model.weight].skipped_steps == 2


def test_integer_root_solvers_reject_rational_overrides_early() -> None:
    W = torch.zeros(4, 4, requires_grad=True)
    with pytest.raises(ValueError, match="integer roots"):
        shampoo.Shampoo([W], root_solver="coupled_newton", exponent_override={2: 0.3})


def test_mixed_warm_and_cold_factors_in_one_batch() -> None:
    """A parameter that starts late joins a batch where the others warm-start: it is solved cold."""
    a = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    opt = shampoo.Shampoo(
        [a, b],
        lr=0.1,
        betas=(0.0, 1.0),
        eps=1e-3,
        root_solver="coupled_newton",
        precondition_frequency=2,
        start_preconditioning_step=1,
        merge_dims=False,
        factor_dtype=torch.float64,
        root_dtype=torch.float64,
    )
    for t in range(3):
        a.grad = _grad(t)
        b.grad = _grad(10 + t) if t == 2 else None
        opt.step()
    for p in (a, b):
        for f in opt.state[p].blocks[0].factors:
            assert f.has_root and f.converged and f.solver == "coupled_newton"
            w, Q = np.linalg.eigh(f.matrix.numpy())
            ref = (Q * (w + 1e-3) ** -0.25) @ Q.T
            np.testing.assert_allclose(f.root.numpy(), ref, rtol=1e-8, atol=1e-10)
    assert (
        opt.state[a].blocks[0].factors[0].root_step == 3 and opt.state[b].blocks[0].factors[0].root_step == 1
    )
