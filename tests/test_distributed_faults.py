"""Failures under data-parallel Shampoo (2 gloo ranks): a solver fault on one rank only, a rank that
hits the consecutive-failure limit, and a rank that crashes or hangs."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch
from _dist import run_ranks

import matroots
import shampoo
from matroots.solvers import EighConfig, SolverConfig
from matroots.solvers.base import RawResult
from shampoo.distributed import DistributedError, DistributedTimeoutError, RemoteRankError

SHAPES = {"a": (8, 8), "b": (6, 5)}  # LPT on 2 ranks: "a" (cost 8^3+8^3+64) -> rank 0, "b" -> rank 1
STEPS = 5


@dataclass(frozen=True, kw_only=True)
class FailsOnSmall(SolverConfig):
    """eigh, except that factors of size 5 or 6 (only block "b", owned by rank 1) come back NaN or
    raise."""

    name: ClassVar[str] = "fails_on_small"
    mode: str = "nan"

    def _run(self, prob, *, inverse, warm_start) -> RawResult:  # type: ignore[override]
        if prob.n not in (5, 6):
            return EighConfig(rank_policy="clamp")._run(prob, inverse=inverse, warm_start=warm_start)
        if self.mode == "raise":
            raise matroots.NotPositiveDefiniteError("injected failure")
        b = prob.A.shape[0]
        return RawResult(
            root=torch.full_like(prob.A, float("nan")),
            converged=torch.zeros(b, dtype=torch.bool),
            iterations=torch.full((b,), 3),
            residual=torch.full((b,), float("nan"), dtype=torch.float64),
            matmuls=0.0,
            info={"stop_reason": "injected"},
        )


def _params() -> list[tuple[str, torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(0)
    return [(k, torch.nn.Parameter(torch.randn(s, generator=g))) for k, s in SHAPES.items()]


def _grad(name: str, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + len(name) + ord(name[0]))
    return torch.randn(SHAPES[name], generator=g)


def _train(distributed, steps: int = STEPS, **failure) -> tuple[shampoo.Shampoo, dict, int]:
    """Run ``steps`` steps; returns the optimizer, the parameters and the number of completed steps."""
    params = _params()
    opt = shampoo.Shampoo(
        params,
        lr=0.1,
        betas=(0.0, 1.0),
        eps=1e-3,
        grafting="sgd",
        root_solver=FailsOnSmall(mode=failure.pop("mode", "nan")),
        precondition_frequency=1,
        start_preconditioning_step=1,
        merge_dims=False,
        failure=shampoo.FailurePolicy(**failure),
        distributed=distributed,
    )
    done = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", shampoo.RootFailureWarning)
        for t in range(steps):
            for name, p in params:
                p.grad = _grad(name, t)
            opt.step()
            done += 1
    return opt, {k: p.detach().clone() for k, p in params}, done


def _body(rank: int, ws: int) -> dict:
    cfg = shampoo.DDPConfig(timeout=3)
    out: dict = {}
    # 1. Faults on rank 1 only, rescued by the fallback solver (the default: eigh in fp64).
    opt, params, _ = _train(cfg)
    out["owner_b"] = opt._sharding.assignment.owners[(1, 0)]
    out["params"] = params
    out["fallback_uses"] = sum(f.fallback_uses for d in opt.diagnostics() for f in d.factors)
    # 2. No fallback: rank 1 hits the limit; both ranks stop at the same step with a clear error.
    try:
        _train(cfg, fallback=None, max_consecutive_failures=2, mode="raise")
        out["limit"] = "no error"
    except shampoo.RootComputationError as err:
        out["limit"] = f"own: {err}"
    except RemoteRankError as err:
        out["limit"] = f"remote: {err}"
    # 3. Rank 1 raises an arbitrary error in its training loop and then hangs (a stuck process):
    #    rank 0 must get a clear error within DDPConfig.timeout, not wait forever.
    params = _params()
    opt = shampoo.Shampoo(params, lr=0.1, precondition_frequency=1, merge_dims=False, distributed=cfg)
    t0 = time.monotonic()
    try:
        for t in range(3):
            if rank == 1 and t == 2:
                raise ValueError("simulated crash in rank 1's training loop")
            for name, p in params:
                p.grad = _grad(name, t)
            opt.step()
    except ValueError:
        time.sleep(6)  # stuck: does not exit, does not join the collective
        out["hang"] = "crashed"
    except DistributedError as err:
        out["hang"] = f"{type(err).__name__}: {err}"
        out["hang_seconds"] = time.monotonic() - t0
    return out


def test_fault_on_one_rank_and_rank_failures():
    ref_opt, ref_params, _ = _train(None)
    assert sum(f.fallback_uses for d in ref_opt.diagnostics() for f in d.factors) > 0
    r0, r1 = run_ranks(_body, 2, timeout=120, pg_timeout=30)
    # 1. Same fallback result on both ranks, equal to the single process's; only rank 1 fell back.
    assert r0["owner_b"] == r1["owner_b"] == 1
    assert r0["fallback_uses"] == 0 and r1["fallback_uses"] > 0
    for k in SHAPES:
        assert torch.isfinite(r0["params"][k]).all()
        assert torch.equal(r0["params"][k], r1["params"][k])
        torch.testing.assert_close(r0["params"][k], ref_params[k], rtol=1e-6, atol=1e-6)
    # 2. The owner raises its RootComputationError, the other rank a RemoteRankError naming it.
    assert r1["limit"].startswith("own:") and "2 consecutive" in r1["limit"]
    assert r0["limit"].startswith("remote:") and "rank(s) [1]" in r0["limit"]
    # 3. A crashed, hanging rank: the other one times out with a clear message.
    assert r1["hang"] == "crashed"
    assert r0["hang"].startswith("DistributedTimeoutError") and "did not complete within 3 s" in r0["hang"]
    assert r0["hang_seconds"] < 15


def test_single_process_limit_matches():
    """Reference for case 2: in one process the same run raises at the same step."""
    try:
        _train(None, fallback=None, max_consecutive_failures=2, mode="raise")
    except shampoo.RootComputationError as err:
        assert "2 consecutive" in str(err)
    else:
        raise AssertionError("expected RootComputationError")


def test_timeout_error_type():
    assert issubclass(DistributedTimeoutError, TimeoutError)
    assert issubclass(DistributedTimeoutError, shampoo.ShampooError)


def _state_dict_on_one_rank(rank: int, ws: int) -> str:
    params = _params()
    opt = shampoo.Shampoo(params, lr=0.1, precondition_frequency=1, distributed=shampoo.DDPConfig(timeout=3))
    for t in range(2):
        for name, p in params:
            p.grad = _grad(name, t)
        opt.step()
    if rank == 1:
        time.sleep(5)  # the common mistake: only rank 0 asks for the (collective) state dict
        return "skipped"
    try:
        opt.state_dict()
    except DistributedTimeoutError as err:
        return str(err)
    return "no error"


def test_state_dict_on_one_rank_only_is_a_clear_error():
    r0, r1 = run_ranks(_state_dict_on_one_rank, 2, timeout=90, pg_timeout=30)
    assert "state_dict()" in r0 and "call it on every rank" in r0 and "within 3 s" in r0
    assert r1 == "skipped"
