"""Inverse-root computation for Kronecker factors: batching, inputs, warm starts and the solves.

The failure policy (non-finite statistics reset, primary -> fallback, counters, warnings, limits) is
the refresh engine's, :mod:`shampoo.refresh`; this module is the Kronecker :class:`KroneckerRoots`
refresher it runs (how to read, solve and install roots) and :func:`compute_roots`, the synchronous
round; the batches are :mod:`shampoo.root_batches`', the solves :mod:`shampoo.root_solve`'s.

Due factors of equal size n and root p (across stacks) are concatenated into (b, n, n) batches of at
most ``ShampooImplementation.round_chunk_bytes`` each (consecutive chunks of the due rows, in
order), each solved by one matroots call, with the group's ``eps`` and rank-deficiency policy ``psd``
(:mod:`matroots.core.psd`; the same for the primary solver and the fallback) and ``quiet=True`` (a
non-convergence is reported once, by the engine, not also by the solver). The stored factors are read
as bitwise symmetric matrices (the upper triangle, the statistic, mirrored; see
:func:`shampoo.state.mirror_upper_`), divided by 1 - beta2^t (Adam-style bias correction of the
factor EMA); a factor whose statistics became non-finite is reset by the engine.

The factors handed to the solver are therefore finite, exactly symmetric (A == A^T bitwise) and
correctly shaped by construction, so the call declares them ``trusted=True``
(:class:`matroots.SolveOptions`): the solver skips re-validating them (the symmetry test and the
finiteness scans such input cannot fail) and the result is bitwise the validated one. The checks of
the *result* are never skipped: a non-finite root is a failure, convergence flags are the solver's.

A factor's solve *fails* when the call raises a numerical error (``matroots.MatrootsNumericalError``,
``torch.linalg.LinAlgError``; input errors propagate), or its root is non-finite (even when the solver
claims convergence), or the solver reports ``converged=False`` (:func:`solve_batch`); the fallback is
:class:`shampoo.config.FailurePolicy`'s. Per factor, the diagnostics record the shift actually
applied (psd shift, eps, their sum) and the condition number of the matrix actually solved: from
the spectrum the solver computed when it reports one (eigh: ``solved_lambda_min/max``), else
estimated by power iteration (:func:`_kappa`, ``DiagnosticsConfig.kappa_power_iters``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import torch

from .config import DiagnosticsConfig, FailurePolicy, GroupOptions
from .implementation import DEFAULT_IMPLEMENTATION, ShampooImplementation
from .refresh import Result, RootJob, Round, RoundReport, Snapshot, SolveOutcome
from .root_batches import factor_inputs, previous_bases, previous_roots, round_chunks, work_dtype, write_back
from .root_solve import (
    solve_batch,
    solve_fallback,
    solve_with_warm_start,
    supports_warm_start,
    uses_eigenbasis,
)
from .state import FactorState


@dataclass(frozen=True)
class _Warm:
    has_prev: list[bool]  # per factor: warm-started (from ``previous``)
    previous: torch.Tensor | None  # (b, n, n) in root_dtype: roots or eigenbases; None: all cold


@dataclass(frozen=True)
class KroneckerRoots:
    """How Kronecker factors refresh their inverse roots (:class:`shampoo.refresh.Refresher`): the
    bias-corrected mirrored factors (:func:`factor_inputs`), the group's ``root_solver`` warm-started as its
    capabilities declare, the ``FailurePolicy``'s fallback, the roots written in place."""

    opts: GroupOptions
    diag: DiagnosticsConfig
    impl: ShampooImplementation = DEFAULT_IMPLEMENTATION  # trust_factors: the solves skip input checks
    noun: ClassVar[str] = "root"
    nouns: ClassVar[str] = "roots"
    remedies: ClassVar[str] = (
        "psd='shift' (the default rank-deficiency policy) if it was changed, a larger eps (or "
        "eps_mode='relative'), root_dtype=torch.float64, a more robust root_solver (e.g. 'eigh')"
    )

    @property
    def name(self) -> str:
        return self.opts.root_solver.name

    @property
    def fallback_name(self) -> str | None:
        fb = self.opts.failure.fallback
        return None if fb is None else f"{fb.name}[fallback]"

    @property
    def dtype(self) -> torch.dtype:
        return self.opts.root_dtype

    @property
    def policy(self) -> FailurePolicy:
        return self.opts.failure

    @property
    def log_level(self) -> int:
        return self.diag.log_level

    def detail(self, p: Fraction) -> str:
        return f"inverse root p={p}"

    def inputs(self, jobs: list[RootJob]) -> torch.Tensor:
        opts = self.opts
        bc_on = opts.use_bias_correction and opts.beta2 < 1.0
        return factor_inputs(jobs, work_dtype(opts), opts.beta2 if bc_on else None)

    def prepare(self, snap: Snapshot, records: list[FactorState], copy: bool) -> _Warm:
        opts, cfg = self.opts, self.opts.root_solver
        eigen = uses_eigenbasis(cfg)
        if eigen:  # warm start from the kept eigenbases, unless backing off
            snap.backoff = [f.basis is not None and f.warm_skip > 0 for f in records]
            has_prev = [
                f.basis is not None and not skip for f, skip in zip(records, snap.backoff, strict=True)
            ]
        else:
            snap.backoff = [False] * len(records)
            has_prev = [f.has_root for f in records]
        if not (opts.warm_start and (supports_warm_start(cfg) or eigen) and any(has_prev)):
            return _Warm(has_prev, None)
        prev = (previous_bases(records, snap.A) if eigen else previous_roots(snap.jobs)).to(opts.root_dtype)
        if copy and not eigen:  # views of the root storage
            prev = prev.clone()
        return _Warm(has_prev, prev)

    def solve(self, snap: Snapshot) -> SolveOutcome:
        warm: _Warm = snap.extra
        return solve_with_warm_start(
            self.opts.root_solver,
            snap.A,
            snap.p,
            self.opts,
            warm.previous,
            warm.has_prev,
            self.diag,
            snap.kappa,
            self.impl.trust_factors,
        )

    def fallback(self, snap: Snapshot, rows: list[int]) -> SolveOutcome:
        return solve_fallback(
            snap.A[rows], snap.p, self.opts, self.diag.kappa_power_iters, self.impl.trust_factors
        )

    def install(self, snap: Snapshot, result: Result) -> None:
        """The usable roots into the root storage; an eigenbasis solver's new bases into the records
        (the next round's warm start; a failed primary's next round starts cold)."""
        write_back(snap.jobs, result.final, result.good.tolist())
        out = result.primary
        for i, f in enumerate(snap.records):
            if snap.reset[i]:
                continue
            if out.bases is not None and bool(out.ok[i]):
                f.basis = out.bases[i].to(self.opts.root_dtype).clone()
            elif not bool(out.ok[i]):
                f.basis = None


def compute_roots(
    jobs: list[RootJob],
    opts: GroupOptions,
    diag: DiagnosticsConfig,
    impl: ShampooImplementation = DEFAULT_IMPLEMENTATION,
) -> RoundReport:
    """Compute the due roots of ``jobs`` in batches of equal (n, p) and apply the failure policy
    (:mod:`shampoo.refresh`): each chunk is snapshotted, solved and installed in turn. ``impl``: the
    optimizer's fast paths (the chunk size of a round, whether the factors are declared trusted).

    Raises RootComputationError after ``opts.failure.max_consecutive_failures`` consecutive failures
    of any factor.
    """
    rnd = Round(KroneckerRoots(opts, diag, impl))
    for chunk in round_chunks(jobs, opts, impl):
        rnd.run(chunk)
    return rnd.finish()


__all__ = [
    "KroneckerRoots",
    "compute_roots",
    "round_chunks",
    "solve_batch",
    "supports_warm_start",
    "uses_eigenbasis",
]
