"""Shampoo's failure policy covers every failure, and only numerical ones.

Fallback rescue of an fp32 factor, non-finite roots claimed converged, overflowing factor statistics,
NaN roots in checkpoints, malformed state dicts, input errors that must propagate, one warning per
failure, and exactly symmetric factors.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn

import matroots
import shampoo
from matroots.core.errors import NotSymmetricError
from matroots.core.result import RootResult
from matroots.solvers import CoupledNewtonConfig, SolverConfig


def mlp(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 2))
    x = torch.randn(256, 20)
    return m, x, (x[:, 0] > 0).long()


def run(opt: shampoo.Shampoo, m: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        out.append(float(loss))
    return out


def factors(opt: shampoo.Shampoo) -> list[shampoo.FactorDiagnostics]:
    return [f for d in opt.diagnostics() for f in d.factors]


class FailsInFp32(SolverConfig):
    """Coupled Newton that does not converge in float32 (one iteration), and is fine in float64."""

    name = "fails_in_fp32"
    integer_p = True

    def solve(self, A, p, *, dtype=None, **kw):  # type: ignore[override]
        max_iter = 1 if dtype == torch.float32 else None
        return CoupledNewtonConfig().solve(A, p, dtype=dtype, max_iter=max_iter, **kw)


class ClaimsNaN(SolverConfig):
    """A broken solver: returns a NaN root and says it converged."""

    name = "claims_nan"

    def solve(self, A, p, **kw):  # type: ignore[override]
        b = A.shape[0]
        root = torch.full_like(A, math.nan)
        return RootResult(
            root=root,
            converged=torch.ones(b, dtype=torch.bool),
            iterations=torch.zeros(b, dtype=torch.int64),
            residual=torch.zeros(b, dtype=torch.float64),
            history=[],
            matmuls=0.0,
            seconds=0.0,
            method=self.name,
            dtype=A.dtype,
            info={},
        )


class RaisesInputError(SolverConfig):
    name = "raises_input_error"

    def solve(self, A, p, **kw):  # type: ignore[override]
        raise NotSymmetricError("a bug upstream: input errors must reach the user")


def test_fp64_fallback_rescues_a_failing_fp32_primary() -> None:
    m, x, y = mlp()
    opt = shampoo.Shampoo(
        m.named_parameters(), lr=1e-3, eps=1e-12, precondition_frequency=10, root_solver=FailsInFp32()
    )
    with pytest.warns(shampoo.RootFailureWarning):
        losses = run(opt, m, x, y, 60)
    fs = factors(opt)
    assert all(f.fallback_uses == f.primary_failures > 0 for f in fs)
    assert all(f.failures == 0 and f.solver == "eigh[fallback]" and f.has_root for f in fs)
    assert all(math.isfinite(f.kappa) and f.regularisation > 0 for f in fs)
    assert losses[-1] < losses[0] and all(torch.isfinite(p).all() for p in m.parameters())


def test_non_finite_root_claimed_converged_is_a_failure() -> None:
    m, x, y = mlp()
    opt = shampoo.Shampoo(
        m.named_parameters(), lr=1e-3, eps=1e-12, precondition_frequency=10, root_solver=ClaimsNaN()
    )
    with pytest.warns(shampoo.RootFailureWarning, match="claims_nan"):
        run(opt, m, x, y, 30)
    fs = factors(opt)
    assert all(f.primary_failures == 3 and f.fallback_uses == 3 for f in fs)
    assert all("non-finite root" in f.error or f.error == "" for f in fs)
    assert all(torch.isfinite(p).all() for p in m.parameters())
    # without a fallback the NaN root never reaches the parameters, and the limit raises
    m, x, y = mlp()
    opt = shampoo.Shampoo(
        m.named_parameters(),
        lr=1e-3,
        precondition_frequency=10,
        root_solver=ClaimsNaN(),
        failure=shampoo.FailurePolicy(fallback=None, max_consecutive_failures=2),
    )
    with pytest.raises(shampoo.RootComputationError, match="non-finite root"), warnings.catch_warnings():
        warnings.simplefilter("ignore", shampoo.RootFailureWarning)
        run(opt, m, x, y, 30)
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_input_errors_propagate() -> None:
    m, x, y = mlp()
    opt = shampoo.Shampoo(m.named_parameters(), precondition_frequency=5, root_solver=RaisesInputError())
    with pytest.raises(NotSymmetricError, match="input errors must reach"):
        run(opt, m, x, y, 5)


def test_overflowing_factor_is_reset_and_training_continues() -> None:
    """One huge but finite gradient makes G G^T overflow fp32: a clear warning, a reset, no failure.

    The overflow is made certain on every CPU: the gradient is scaled so that its largest entry g is
    1e21 (finite in fp32). Both factors' diagonal entries through g, sum_k (1 - beta2) G_ik^2, then hold
    the term (1 - beta2) g^2 = 1e39 > fp32's max 3.4e38 (g^2 = 1e42 overflows too, wherever a kernel
    applies alpha), and every other term is >= 0, so the sum is inf in any summation order (rounding is
    monotone). A plain 1e21 x gradient overflows or not depending on the kernel's order of operations.
    """
    m, x, y = mlp()
    opt = shampoo.Shampoo(m.named_parameters(), lr=1e-3, eps=1e-12, precondition_frequency=10)
    run(opt, m, x, y, 12)
    opt.zero_grad()
    nn.functional.cross_entropy(m(x), y).backward()
    grad = m[0].weight.grad
    grad.mul_(1e21 / grad.abs().max())  # largest entry 1e21: finite in fp32; its square is not
    assert torch.isfinite(grad).all() and (0.001 * float(grad.abs().max()) ** 2) > torch.finfo().max
    opt.step()
    with pytest.warns(shampoo.FactorResetWarning, match="reset to zero"):
        losses = run(opt, m, x, y, 40)
    fs = {(d.param, f.dim): f for d in opt.diagnostics() for f in d.factors}
    for dim in (0, 1):  # (64 x 64) G G^T and (20 x 20) G^T G: both hold the overflowing diagonal entry
        assert fs[("0.weight", dim)].factor_resets == 1 and fs[("0.weight", dim)].failures == 0, dim
    assert all(f.factor_resets == 0 for (name, _), f in fs.items() if name != "0.weight")
    assert all(f.failures == 0 for f in fs.values())
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert all(
        torch.isfinite(st.blocks[0].factors[0].matrix).all()
        for st in opt.state.values()
        if st.blocks[0].factors
    )
    assert losses[-1] < losses[0]
    assert sum(st.skipped_steps for st in opt.state.values()) <= 2


def test_one_warning_per_failed_round_and_none_from_the_solver() -> None:
    m, x, y = mlp()
    opt = shampoo.Shampoo(m.named_parameters(), precondition_frequency=10, root_solver=FailsInFp32())
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        run(opt, m, x, y, 30)
    kinds = [w.category for w in rec]
    assert kinds.count(shampoo.RootFailureWarning) == 3  # rounds at steps 10, 20, 30
    assert matroots.ConvergenceWarning not in kinds  # the solver is asked to be quiet, not filtered
    assert warnings.filters == filters


def test_state_dict_with_nan_root_is_refused(saved_state: dict) -> None:
    sd = copy.deepcopy(saved_state)
    sd["state"]["0.weight"]["blocks.0.factors.0.root"][3, 3] = math.nan
    fresh = shampoo.Shampoo(mlp()[0].named_parameters(), precondition_frequency=5)
    with pytest.raises(shampoo.StateDictError, match="non-finite"):
        fresh.load_state_dict(sd)


def _malformations() -> list[tuple[str, object]]:
    return [
        ("no state", lambda sd: sd.pop("state")),
        ("no groups", lambda sd: sd.pop("param_groups")),
        ("groups not a list", lambda sd: sd.update(param_groups=3)),
        ("step missing", lambda sd: sd["state"]["0.weight"].pop("step")),
        ("step not a number", lambda sd: sd["state"]["0.weight"].update(step="ten")),
        ("root missing", lambda sd: sd["state"]["0.weight"].pop("blocks.0.factors.1.root")),
        (
            "root wrong shape",
            lambda sd: sd["state"]["0.weight"].update({"blocks.0.factors.0.root": torch.eye(3)}),
        ),
        ("root not a tensor", lambda sd: sd["state"]["0.weight"].update({"blocks.0.factors.0.root": [1, 2]})),
        (
            "bookkeeping wrong type",
            lambda sd: sd["state"]["0.weight"].update({"blocks.0.factors.0.failures": "x"}),
        ),
        ("param state not a dict", lambda sd: sd["state"].update({"0.weight": 7})),
        ("shape garbage", lambda sd: sd["state"]["0.weight"].update(shape=5)),
        ("group without params", lambda sd: sd["param_groups"][0].pop("params")),
        ("not a dict", None),
    ]


@pytest.fixture(scope="module")
def saved_state() -> dict:
    m, x, y = mlp()
    opt = shampoo.Shampoo(m.named_parameters(), precondition_frequency=5)
    run(opt, m, x, y, 10)
    return opt.state_dict()


@pytest.mark.parametrize("what,corrupt", _malformations(), ids=[w for w, _ in _malformations()])
def test_malformed_state_dicts_raise_state_dict_error(what: str, corrupt, saved_state: dict) -> None:
    sd = copy.deepcopy(saved_state) if corrupt is not None else ["not", "a", "state", "dict"]
    if corrupt is not None:
        corrupt(sd)
    fresh = shampoo.Shampoo(mlp()[0].named_parameters(), precondition_frequency=5)
    with pytest.raises(shampoo.StateDictError):
        fresh.load_state_dict(sd)  # type: ignore[arg-type]


@pytest.mark.parametrize("factor_dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_factors_are_bitwise_symmetric_when_read(factor_dtype: torch.dtype) -> None:
    """n >= 256 blocks, where baddbmm's two triangles may differ in fp32 (on every CPU kernel path
    where the GEMM does not round them alike); every read of a factor (the solver's input,
    state_dict, dumps) sees an exactly symmetric matrix, by construction (the mirror)."""
    torch.manual_seed(0)
    m = nn.Linear(256, 256, bias=False)
    x = torch.randn(300, 256)
    seen: list[torch.Tensor] = []

    class Recording(SolverConfig):
        name = "recording"

        def solve(self, A, p, **kw):  # type: ignore[override]
            seen.append(A.clone())
            return matroots.EighConfig().solve(A, p, **kw)

    opt = shampoo.Shampoo(
        m.named_parameters(), precondition_frequency=3, factor_dtype=factor_dtype, root_solver=Recording()
    )
    for _ in range(6):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
    assert seen and all(torch.equal(A, A.mT) for A in seen)
    for key, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            if k.endswith(".matrix"):
                assert v.dtype == factor_dtype and torch.equal(v, v.mT), (key, k)
