"""The amortised refresh engine: one failure policy for everything a preconditioner recomputes every
``precondition_frequency`` steps (Kronecker inverse roots, :mod:`shampoo.roots`; SOAP's eigenbases,
:mod:`shampoo.transforms.soap`).

Shampoo amortises its per-factor work over ``precondition_frequency`` steps (Gupta et al. 2018, Alg. 1;
Anil et al. 2020, §3-4, whose roots may also be computed off the training thread). What happens when
that work fails is the same whichever preconditioner asks, so it is written once, here. A
preconditioner supplies a :class:`Refresher`: how to read its due factors, how to solve them (and its
fallback), and how to install a result. This module owns the rest:

* **The snapshot** (:meth:`Round.snapshot`): the due factors as one finite batch. A factor whose
  statistics became non-finite (G G^T overflowing) is marked *reset* and solved as the identity (the
  result is discarded): it keeps its previous root or basis and is not a failure.
* **Judging** (:func:`compute`): a factor's result is usable when the solver converged and the result
  is finite (:func:`finite_rows`; a numerical error of the call fails its whole batch, see the
  refreshers). Factors without a usable result from the primary go to the fallback, if there is one.
* **Installing** (:meth:`Round.install`): the usable results are written (the refresher's
  ``install``), reset statistics are zeroed, every factor's bookkeeping is updated by one rule
  (:func:`record`), and one warning text per event is emitted.
* **Limits** (:meth:`Round.finish`): ``FailurePolicy.max_consecutive_failures`` rounds in a row without
  a usable result (or ``max_consecutive_primary_failures`` of the primary) raise
  :class:`~shampoo.errors.RootComputationError`.

A round is split so that its expensive half can run elsewhere: :func:`compute` reads only its
:class:`Snapshot` (with ``copy=True`` nothing in it aliases live state) and writes nothing but its
:class:`Result`; everything that touches live state (roots, bases, statistics, counters, warnings)
happens in :meth:`Round.install` and :meth:`Round.finish`, in the training thread. Synchronously a
round is snapshot -> compute -> install per chunk of factors, then finish.
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import torch

from .errors import FactorResetWarning, RootComputationError, RootFailureWarning
from .state import FactorState

log = logging.getLogger("shampoo")


@dataclass
class RootJob:
    """Due factors of one stack: plain (b, n, n) storage, the rows due, and their bookkeeping.

    ``factors`` holds the statistics (upper triangle; mirrored into each solve's input), ``roots`` the
    current inverse roots (written in place for the rows that get a usable root; SOAP: its eigenbases),
    ``records`` the :class:`~shampoo.state.FactorState` of every row. ``label(row)`` names a factor in
    messages.
    """

    factors: torch.Tensor  # (b, n, n)
    roots: torch.Tensor  # (b, n, n)
    records: list[FactorState]  # one per row of ``factors``
    p: Fraction  # the inverse root: factors^{-1/p}
    positions: list[int]  # rows due
    steps: list[int]  # each due row's parameter step (for bias correction and bookkeeping)
    label: Callable[[int], str]
    # each due row's count of statistics updates, the t of its bias correction 1 - beta2^t (None: its
    # step; differs under statistics_frequency > 1, see shampoo.transforms.kronecker)
    updates: list[int] | None = None
    # how these rows are refreshed, built from the group's options (None: their inverse roots,
    # shampoo.roots.KroneckerRoots); SOAP's eigenbases bring their own (shampoo.transforms.soap)
    refresher: Callable[[Any], Refresher] | None = None
    # where the owner computes a synchronous round itself, later (SOAP: at the block's next update,
    # the paper's order): called instead of computing the rows in the step that made the job
    defer: Callable[[], None] | None = None


def synchronous(jobs: list[RootJob]) -> list[RootJob]:
    """The jobs a synchronous round computes now: a job its owner computes later (``defer``) is handed
    back to it; the others are returned. A background round (``root_schedule="async"``) takes them all."""
    now = []
    for job in jobs:
        if job.defer is None:
            now.append(job)
        else:
            job.defer()
    return now


@dataclass
class SolveOutcome:
    """Per-element outcome of one batched solve (a refresher's primary or fallback)."""

    roots: torch.Tensor | None  # (b, n, n) results (roots or bases), or None when the call raised
    ok: torch.Tensor  # (b,) bool: usable (converged and finite)
    iterations: list[int]
    residual: list[float]
    seconds: float
    kappa: list[float]
    error: str = ""
    psd_shift: list[float] = field(default_factory=list)
    psd_floor: list[float] = field(default_factory=list)
    eps_abs: list[float] = field(default_factory=list)
    # per element, the configuration a meta-solver chose (method="auto": info["auto"]["chosen"]); [] else
    solvers: list[str] = field(default_factory=list)
    # eigenbasis solvers (eigh_warm): the new eigenvectors (b, n, n) and the warm-start verdicts
    bases: torch.Tensor | None = None
    warm: list[str] = field(default_factory=list)
    # what the refresher's install needs besides the results (SOAP: the re-sorting permutation)
    carry: Any = None

    def regularisation(self, i: int) -> tuple[float, float, float]:
        """(psd_shift, psd_floor, eps_abs) of element i (NaN when not reported)."""
        get = lambda xs: xs[i] if i < len(xs) else math.nan  # noqa: E731
        return get(self.psd_shift), get(self.psd_floor), get(self.eps_abs)


def finite_rows(X: torch.Tensor) -> torch.Tensor:
    """(b,) bool: whether every entry of X[i] is finite (by sums; entrywise only when a sum is not)."""
    sums = X.sum(dim=(-2, -1), dtype=torch.promote_types(X.dtype, torch.float32))
    ok = torch.isfinite(sums)
    if bool(ok.all()):
        return ok.cpu()
    return torch.isfinite(X).flatten(1).all(-1).cpu()


class Refresher(Protocol):
    """How one preconditioner refreshes a batch of its factors (the engine does the rest).

    ``noun``/``nouns`` name what is computed in messages ("root", "eigenbasis"); ``name`` is the
    primary's name (``FactorState.solver``), ``fallback_name`` the one recorded for a factor the
    fallback served (None: no fallback); ``dtype`` that of the results. ``policy`` is the group's ``FailurePolicy``; ``log_level``
    the level of the per-factor log lines; ``detail(p)`` and ``remedies`` complete the limit error.
    """

    noun: str
    nouns: str
    name: str
    fallback_name: str | None
    dtype: torch.dtype
    policy: Any
    log_level: int
    remedies: str

    def detail(self, p: Fraction) -> str: ...

    def inputs(self, jobs: list[RootJob]) -> torch.Tensor:
        """The due factors as one exactly symmetric (b, n, n) batch (may alias the storage)."""
        ...

    def prepare(self, snap: Snapshot, records: list[FactorState], copy: bool) -> Any:
        """What the solve reads besides ``snap.A`` (warm starts, ...), copied when ``copy``; sets
        ``snap.backoff`` for eigenbasis warm starts skipped this round."""
        ...

    def solve(self, snap: Snapshot) -> SolveOutcome: ...

    def fallback(self, snap: Snapshot, rows: list[int]) -> SolveOutcome:
        """The fallback on the primary's failed rows ``rows`` of ``snap.A``."""
        ...

    def install(self, snap: Snapshot, result: Result) -> None:
        """Write ``result.final`` for the rows ``result.good`` (and whatever else the refresher keeps)."""
        ...


@dataclass
class Snapshot:
    """What :func:`compute` reads: the solve inputs of a batch of due factors (finite; reset rows
    replaced by the identity), the refresher's warm-start data, and the bookkeeping to install into."""

    refresher: Refresher
    jobs: list[RootJob]
    records: list[FactorState]  # written by install only; compute never reads them
    p: Fraction
    A: torch.Tensor
    reset: list[bool]
    steps: list[int]
    kappa: list[float]  # each factor's kappa of the previous round (NaN: unknown)
    backoff: list[bool] = field(default_factory=list)
    extra: Any = None  # the refresher's prepare()


@dataclass
class Result:
    """A computed batch (:func:`compute`): the primary's and the fallback's outcomes and the verdicts."""

    snap: Snapshot
    primary: SolveOutcome
    final: torch.Tensor  # (b, n, n): the primary's results, the fallback's where it served
    fallback: SolveOutcome | None
    failed: list[int]  # rows the fallback was tried on
    fb_ok: torch.Tensor  # (b,) bool
    good: torch.Tensor  # (b,) bool: a usable result is installed
    used: list[str]  # FactorState.solver per row


@dataclass
class RoundReport:
    """Summary of one round (for timing and logging)."""

    factors: int = 0
    primary_failures: int = 0
    failures: int = 0
    seconds: float = 0.0
    solver_seconds: float = 0.0
    factor_resets: int = 0
    failed_labels: list[str] = field(default_factory=list)


def compute(snap: Snapshot) -> Result:
    """Solve a snapshot with the refresher's primary, then its fallback on the failed factors.

    Reads only ``snap`` (never its records) and writes nothing else: safe on another thread when the
    snapshot was taken with ``copy=True``.
    """
    r = snap.refresher
    out = r.solve(snap)
    ok = out.ok.clone()
    final = out.roots if out.roots is not None else torch.empty_like(snap.A, dtype=r.dtype)
    b = len(snap.reset)
    used = [c or r.name for c in out.solvers] if out.solvers else [r.name] * b
    fb_ok = torch.zeros_like(ok)
    failed = [i for i in (~ok).nonzero().flatten().tolist() if not snap.reset[i]]
    fb = None
    if failed and r.fallback_name is not None:
        fb = r.fallback(snap, failed)
        for j, i in enumerate(failed):
            if bool(fb.ok[j]):
                assert fb.roots is not None
                final[i] = fb.roots[j].to(final.dtype)
                fb_ok[i] = True
                used[i] = r.fallback_name
    good = (ok | fb_ok) & ~torch.tensor(snap.reset, dtype=torch.bool)
    return Result(snap, out, final, fb, failed, fb_ok, good, used)


def record(f: FactorState, i: int, res: Result) -> None:
    """Factor ``i`` of a computed batch into its bookkeeping (one rule for every refresher).

    A reset factor counts a reset and nothing else (its root or basis, and the solver that made it,
    stay). Otherwise: the warm-start verdict and backoff; the primary's iterations and residual (what
    it did, also when it failed); kappa and the shifts of the result in use (the fallback's when it
    served, NaN when none is usable); a primary failure, a fallback use, and a failure when no usable
    result was installed.
    """
    snap, out, fb = res.snap, res.primary, res.fallback
    f.seconds = out.seconds / max(len(snap.reset), 1)
    if snap.reset[i]:
        f.factor_resets += 1
        f.converged = False
        f.error = f"statistics were non-finite and were reset to zero; previous {snap.refresher.noun} kept"
        return
    f.warm = out.warm[i] if i < len(out.warm) else ""
    f.warm_hits += f.warm in ("accepted", "refined")
    f.update_warm_backoff(skipped=bool(snap.backoff) and snap.backoff[i])
    if bool(out.ok[i]):
        f.iterations, f.residual, f.kappa = out.iterations[i], out.residual[i], out.kappa[i]
        f.psd_shift, f.psd_floor, f.eps_abs = out.regularisation(i)
        f.converged, f.error = True, ""
        f.consecutive_primary_failures = 0
    else:
        f.primary_failures += 1
        f.consecutive_primary_failures += 1
        f.error = out.error
        f.converged = False
        f.iterations, f.residual = out.iterations[i], out.residual[i]
        f.kappa = f.psd_shift = f.psd_floor = f.eps_abs = math.nan
        if fb is not None:
            j = res.failed.index(i)
            f.seconds += fb.seconds / max(len(res.failed), 1)
            if bool(res.fb_ok[i]):
                f.fallback_uses += 1
                f.kappa = fb.kappa[j]
                f.psd_shift, f.psd_floor, f.eps_abs = fb.regularisation(j)
                f.converged = True
            else:
                f.error += f"; fallback: {fb.error}"
    f.solver = res.used[i]
    if bool(res.good[i]):
        f.has_root = True
        f.root_step = snap.steps[i]
        f.consecutive_failures = 0
    else:
        f.failures += 1
        f.consecutive_failures += 1
    if not (math.isnan(f.psd_shift) and math.isnan(f.eps_abs)):
        f.regularisation = (0.0 if math.isnan(f.psd_shift) else f.psd_shift) + (
            0.0 if math.isnan(f.eps_abs) else f.eps_abs
        )


class Round:
    """One refresh round of one refresher: snapshot, compute and install batches, then finish."""

    def __init__(self, refresher: Refresher) -> None:
        self.refresher = refresher
        self.report = RoundReport()
        self._t0 = time.perf_counter()
        self._installed: list[tuple[list[RootJob], list[FactorState], Fraction]] = []

    def snapshot(self, jobs: list[RootJob], *, copy: bool = False) -> Snapshot:
        """The due rows of ``jobs`` (one n and p) as a :class:`Snapshot`. Writes nothing but the
        scratch lower triangles of the statistics; ``copy``: nothing in it aliases live state."""
        r = self.refresher
        records = [job.records[i] for job in jobs for i in job.positions]
        steps = [t for job in jobs for t in job.steps]
        A = r.inputs(jobs)
        reset = (~finite_rows(A)).tolist()
        if any(reset):  # solved as the identity and discarded
            A = A.clone()
            A[torch.tensor(reset, device=A.device)] = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        elif copy and A.untyped_storage().data_ptr() == jobs[0].factors.untyped_storage().data_ptr():
            A = A.clone()
        snap = Snapshot(r, jobs, records, jobs[0].p, A, reset, steps, [f.kappa for f in records])
        snap.extra = r.prepare(snap, records, copy)
        return snap

    def run(self, jobs: list[RootJob]) -> None:
        """Snapshot, compute and install one batch now (the synchronous round)."""
        self.install(compute(self.snapshot(jobs)))

    def install(self, res: Result) -> None:
        """Write a computed batch into live state: results, reset statistics, bookkeeping, log."""
        snap, r, rep = res.snap, self.refresher, self.report
        if any(snap.reset):
            self._reset_statistics(snap)
        r.install(snap, res)
        rep.solver_seconds += res.primary.seconds + (res.fallback.seconds if res.fallback else 0.0)
        for i, f in enumerate(snap.records):
            record(f, i, res)
        not_reset = ~torch.tensor(snap.reset, dtype=torch.bool)
        failed = ~res.primary.ok & not_reset
        rep.factors += len(snap.records)
        rep.primary_failures += int(failed.sum())
        rep.failures += int((~res.good & not_reset).sum())
        if bool(failed.any()):
            rep.failed_labels.extend(_labels(snap.jobs, failed.tolist()))
        if log.isEnabledFor(r.log_level):
            for lab, f in zip(_labels(snap.jobs, [True] * len(snap.records)), snap.records, strict=True):
                log.log(
                    r.log_level,
                    "%s %s n=%d p=%s solver=%s iters=%d residual=%.3e converged=%s failures=%d "
                    "seconds=%.4f kappa=%.3e shift=%.3e",
                    r.noun, lab, f.n, f.root_p, f.solver, f.iterations, f.residual, f.converged,
                    f.consecutive_failures, f.seconds, f.kappa, f.regularisation,
                )  # fmt: skip
        self._installed.append((snap.jobs, snap.records, snap.p))

    def finish(self) -> RoundReport:
        """Warn once about the round's failures, then apply the limits (may raise)."""
        r, rep = self.refresher, self.report
        rep.seconds = time.perf_counter() - self._t0
        if rep.primary_failures:
            labs = rep.failed_labels
            warn(
                f"shampoo: {rep.primary_failures} of {rep.factors} {r.noun} computations failed with "
                f"{r.name!r} ({rep.failures} without a usable {r.noun} after the fallback): "
                f"{', '.join(labs[:5])}{' ...' if len(labs) > 5 else ''}",
                RootFailureWarning,
            )
        for jobs, records, p in self._installed:
            self._check_limits(jobs, records, p)
        return rep

    def _reset_statistics(self, snap: Snapshot) -> None:
        """Zero the stored statistics of the reset factors (they became NaN/Inf) and warn."""
        i = 0
        for job in snap.jobs:
            for pos in job.positions:
                if snap.reset[i]:
                    job.factors[pos].zero_()
                i += 1
        labs = _labels(snap.jobs, snap.reset)
        self.report.factor_resets += len(labs)
        warn(
            f"shampoo: the Kronecker factor statistics of {len(labs)} factor(s) became non-finite "
            f"({', '.join(labs[:5])}{' ...' if len(labs) > 5 else ''}), typically G G^T overflowing "
            f"{str(snap.A.dtype).removeprefix('torch.')} after one huge gradient; they were reset to zero "
            f"and accumulate again from the next step, and the previous {self.refresher.nouns} are kept. "
            "Clip gradients or use factor_dtype=torch.float64 if this repeats.",
            FactorResetWarning,
        )

    def _check_limits(self, jobs: list[RootJob], states: list[FactorState], p: Fraction) -> None:
        r = self.refresher
        max_fail = r.policy.max_consecutive_failures
        max_primary = r.policy.max_consecutive_primary_failures
        over = [f.consecutive_failures >= max_fail for f in states]
        over_primary = [
            max_primary is not None and f.consecutive_primary_failures >= max_primary for f in states
        ]
        if not any(over) and not any(over_primary):
            return
        mask = [a or b for a, b in zip(over, over_primary, strict=True)]
        labs = _labels(jobs, mask)
        f = next(s for s, m in zip(states, mask, strict=True) if m)
        what = (
            f"{f.consecutive_failures} consecutive {r.noun} computations without a usable {r.noun}"
            if f.consecutive_failures >= max_fail
            else f"{f.consecutive_primary_failures} consecutive failures of the configured {r.noun} solver"
        )
        raise RootComputationError(
            f"shampoo: {what} for {labs[0]} (n={f.n}, {r.detail(p)}, {len(labs)} factor(s) affected); "
            f"last error: {f.error or 'not converged'}. The previous {r.nouns} were kept so far. Try "
            f"{r.remedies}, or raise FailurePolicy.max_consecutive_failures."
        )


def _labels(jobs: list[RootJob], mask: list[bool]) -> list[str]:
    out, i = [], 0
    for job in jobs:
        for pos in job.positions:
            if mask[i]:
                out.append(job.label(pos))
            i += 1
    return out


_OWN = (str(Path(__file__).parent), str(Path(torch.__file__).parent))


def warn(msg: str, category: type[Warning]) -> None:
    """Log and warn, attributed to the first caller outside shampoo and torch (the user's step)."""
    log.warning(msg)
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is _warn's caller
    while frame is not None and frame.f_code.co_filename.startswith(_OWN):
        level, frame = level + 1, frame.f_back
    warnings.warn(msg, category, stacklevel=level)


@dataclass
class PreparedRound:
    """A round's parts, one per refresher: its :class:`Round` and
    snapshots, one per chunk (the Kronecker roots: :func:`shampoo.roots.round_chunks`; a job that
    brings its own refresher, as SOAP's eigenbases: one per job). Built by
    :func:`shampoo.root_pipeline.prepare_round`, moved by :mod:`shampoo.root_transfer`."""

    parts: list[tuple[Round, list[Snapshot]]]

    @property
    def snaps(self) -> list[Snapshot]:
        return [s for _, snaps in self.parts for s in snaps]


__all__ = [
    "PreparedRound",
    "Refresher",
    "Result",
    "RootJob",
    "Round",
    "RoundReport",
    "Snapshot",
    "SolveOutcome",
    "compute",
    "finite_rows",
    "record",
    "synchronous",
    "warn",
]
