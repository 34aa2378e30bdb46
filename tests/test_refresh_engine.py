"""The refresh engine (shampoo.refresh): one failure policy for Kronecker roots and SOAP's eigenbases,
and a round split into a compute half that reads only its snapshot and an install half.

The bitwise comparisons below compare the same operations on the same values in one process (a
snapshot's inputs are copies of what the synchronous round reads), so they hold on every CPU.
"""

from __future__ import annotations

import dataclasses
import warnings
from fractions import Fraction

import pytest
import torch

import shampoo
from shampoo.config import DiagnosticsConfig, GroupOptions
from shampoo.refresh import RootJob, Round, compute
from shampoo.roots import KroneckerRoots, compute_roots, round_chunks
from shampoo.state import FactorState
from shampoo.transforms import soap as soap_mod

F64 = torch.float64


def _jobs(seed: int) -> list[RootJob]:
    """Two stacks of SPD statistics (n = 5 and 3, p = 2), roots the identity, no root yet."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for b, n in ((3, 5), (2, 3)):
        G = torch.randn(b, n, 2 * n, generator=g, dtype=F64)
        factors = torch.triu(G @ G.mT)  # the upper triangle is the statistic
        roots = torch.eye(n, dtype=F64).repeat(b, 1, 1)
        recs = [
            FactorState(dim=0, n=n, root_p=Fraction(2), matrix=factors[i], root=roots[i]) for i in range(b)
        ]
        out.append(RootJob(factors, roots, recs, Fraction(2), list(range(b)), [4] * b, label=str))
    return out


def _opts(solver: str) -> GroupOptions:
    opt = shampoo.Shampoo(
        [torch.zeros(2, dtype=F64)], betas=(0.9, 0.9), eps=1e-8, factor_dtype=F64, root_dtype=F64,
        root_solver=solver,
    )  # fmt: skip
    return GroupOptions.from_group(opt.param_groups[0])


def _bookkeeping(jobs: list[RootJob]) -> list[str]:
    """Every factor's counters and diagnostics (repr: exact, and NaN equals NaN)."""
    skip = {"matrix", "root", "basis", "seconds"}
    return [
        repr({k: v for k, v in dataclasses.asdict(f).items() if k not in skip})
        for job in jobs
        for f in job.records
    ]


@pytest.mark.parametrize("solver", ["coupled_newton", "eigh_warm"])  # warm starts from roots / bases
def test_compute_reads_only_its_snapshot_and_install_equals_the_synchronous_round(solver: str) -> None:
    opts, diag = _opts(solver), DiagnosticsConfig()
    a, b = _jobs(0), _jobs(0)
    for jobs in (a, b):  # a first round: every factor has a root (and eigh_warm a basis) to warm-start from
        compute_roots(jobs, opts, diag)
    for jobs in (a, b):  # the statistics move on
        for job in jobs:
            job.factors.mul_(1.5).add_(torch.triu(torch.ones_like(job.factors[0])))
    compute_roots(b, opts, diag)  # the synchronous reference

    rnd = Round(KroneckerRoots(opts, diag))
    snaps = [rnd.snapshot(chunk, copy=True) for chunk in round_chunks(a, opts)]
    kept = [(job.factors.clone(), job.roots.clone()) for job in a]
    books = _bookkeeping(a)
    for job in a:  # live state changes after the snapshot (later steps, in the training thread)
        job.factors.fill_(float("nan"))
        job.roots.fill_(-1.0)
    results = [compute(s) for s in snaps]
    for job, (F, _) in zip(a, kept, strict=True):
        assert torch.isnan(job.factors).all() and (job.roots == -1.0).all(), "compute wrote live state"
        job.factors.copy_(F)  # (install resets only the statistics the snapshot found non-finite)
    assert _bookkeeping(a) == books, "compute wrote a factor's bookkeeping"
    for res in results:
        rnd.install(res)
    report = rnd.finish()
    assert report.factors == 5 and report.failures == 0
    for ja, jb in zip(a, b, strict=True):
        assert torch.equal(ja.roots, jb.roots)
    assert _bookkeeping(a) == _bookkeeping(b)


def _soap_opt(W: torch.nn.Parameter, basis: str, policy: shampoo.FailurePolicy) -> shampoo.Shampoo:
    return shampoo.Shampoo(
        [{"params": [W], "preconditioner": shampoo.SOAP(basis_update=basis)}], lr=1e-2, grafting="none",
        start_preconditioning_step=1, precondition_frequency=1, merge_dims=False, failure=policy,
    )  # fmt: skip


def _steps(opt: shampoo.Shampoo, W: torch.nn.Parameter, k: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(k):
        W.grad = torch.randn(W.shape, generator=g)
        opt.step()


def test_a_failed_soap_refresh_warns_and_hits_the_limit_with_the_engines_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SOAP's eigh refresh failing every time: a RootFailureWarning per round, then the shared limit
    error (before the engine, SOAP warned nothing and wrote its own message)."""

    def fails(A: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, str]:
        return A.clone(), torch.zeros(A.shape[0], dtype=torch.bool), "LinAlgError: injected"

    monkeypatch.setattr(soap_mod, "_eigh", fails)
    W = torch.nn.Parameter(torch.zeros(4, 3))
    opt = _soap_opt(W, "eigh", shampoo.FailurePolicy(max_consecutive_failures=2))
    _steps(opt, W, 1)  # step 1 records the refresh; step 2 computes it (and fails)
    with pytest.warns(
        shampoo.RootFailureWarning, match=r"2 of 2 eigenbasis computations failed with 'soap:eigh'"
    ):
        _steps(opt, W, 1)
    f = opt.state[W].blocks[0].factors[0]
    assert (f.failures, f.consecutive_failures, f.primary_failures) == (1, 1, 1)
    assert not f.converged and "injected" in f.error and not f.has_root
    with (
        warnings.catch_warnings(),
        pytest.raises(
            shampoo.RootComputationError,
            match=r"shampoo: 2 consecutive eigenbasis computations without a usable eigenbasis .*"
            r"basis_update='eigh'.*last error: LinAlgError: injected",
        ),
    ):
        warnings.simplefilter("ignore", shampoo.RootFailureWarning)
        _steps(opt, W, 1)


def test_soap_honours_max_consecutive_primary_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    """eigh_warm failing, its fp64 eigh fallback serving: counted as Shampoo counts a fallback, and
    FailurePolicy.max_consecutive_primary_failures applies (SOAP ignored it before the engine)."""
    monkeypatch.setattr(soap_mod, "_eigh_warm", lambda *a: "LinAlgError: injected")
    W = torch.nn.Parameter(torch.zeros(4, 3))
    opt = _soap_opt(W, "eigh_warm", shampoo.FailurePolicy(max_consecutive_primary_failures=3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", shampoo.RootFailureWarning)
        _steps(opt, W, 3)
        for f in opt.state[W].blocks[0].factors:
            assert f.solver == "soap:eigh_warm[fallback eigh]" and f.converged and f.has_root
            assert (f.fallback_uses, f.primary_failures, f.failures) == (2, 2, 0)
        with pytest.raises(
            shampoo.RootComputationError, match="3 consecutive failures of the configured eigenbasis"
        ):
            _steps(opt, W, 1)


@pytest.mark.parametrize("preconditioner", [None, "soap"])
def test_one_reset_text_attributed_to_the_callers_step(preconditioner: str | None) -> None:
    """Overflowing statistics are reset with the same warning for roots and eigenbases, attributed to
    the line that called step() (not to a frame inside shampoo or torch)."""
    W = torch.nn.Parameter(torch.zeros(4, 3))
    opt = shampoo.Shampoo(
        [{"params": [W], "preconditioner": preconditioner}], lr=1e-2, start_preconditioning_step=1,
        precondition_frequency=1, merge_dims=False,
    )  # fmt: skip
    _steps(opt, W, 2)
    W.grad = torch.full((4, 3), 1e30)  # finite, but its square overflows fp32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
        _steps(opt, W, 2, seed=1)
    resets = [w for w in caught if issubclass(w.category, shampoo.FactorResetWarning)]
    assert all(w.filename == __file__ for w in resets), [(w.filename, w.lineno) for w in resets]
    resets = [w for w in resets if "Kronecker" in str(w.message)]  # not the grafting accumulators'
    noun = "eigenbases" if preconditioner else "roots"
    assert len(resets) == 2  # both factors of W
    assert all(
        str(w.message).startswith("shampoo: the Kronecker factor statistics of ")
        and f"reset to zero and accumulate again from the next step, and the previous {noun} are kept"
        in str(w.message)
        for w in resets
    ), [str(w.message) for w in resets]
