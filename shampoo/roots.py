"""Inverse-root computation for Kronecker factors: batching, inputs, warm starts and the solves.

The failure policy (non-finite statistics reset, primary -> fallback, counters, warnings, limits) is
the refresh engine's, :mod:`shampoo.refresh`; this module is the Kronecker :class:`KroneckerRoots`
refresher it runs (how to read, solve and install roots) and :func:`compute_roots`, the synchronous
round.

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

import logging
import math
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import ClassVar

import torch

from matroots import MatrootsNumericalError
from matroots.core.result import info_per_element
from matroots.core.spectral import power_lambda_max
from matroots.solvers import AutoConfig, SolverConfig

from .config import DiagnosticsConfig, FailurePolicy, GroupOptions
from .implementation import DEFAULT_IMPLEMENTATION, ShampooImplementation
from .refresh import Result, RootJob, Round, RoundReport, Snapshot, SolveOutcome, finite_rows
from .state import FactorState, mirror_upper_

log = logging.getLogger("shampoo")

NUMERICAL_ERRORS = (MatrootsNumericalError, torch.linalg.LinAlgError)


def _as_p(p: Fraction) -> int | Fraction:
    return int(p) if p.denominator == 1 else p


def _kappa(A: torch.Tensor, X: torch.Tensor, p: Fraction, reg: list[float], iters: int) -> list[float]:
    """Condition number of the matrix actually solved, A + r I (r = psd shift + eps), per element.

    The same estimate for every solver: lambda_max(A) by power iteration, plus r, and
    lambda_min(A + r I) = lambda_max(X)^{-p} from the root X = (A + r I)^{-1/p} (power iteration on X).
    Finite for shifted or clamped rank-deficient factors, as long as the root is.
    """
    work = A.to(torch.promote_types(A.dtype, X.dtype))
    if work.dtype not in (torch.float32, torch.float64):
        work = work.float()
    lam_a, _ = power_lambda_max(work, iters)
    Xw = X.to(work.dtype)
    lam_x, _ = power_lambda_max(0.5 * (Xw + Xw.mT), iters)
    r = torch.tensor([0.0 if math.isnan(v) else v for v in reg], dtype=torch.float64)
    k = (lam_a.double().cpu() + r) * lam_x.double().cpu().clamp_min(1e-300) ** float(p)
    return k.tolist()


def _solved_kappa(info: dict, b: int) -> list[float] | None:
    """kappa of the matrix actually solved from the spectrum the solver computed (eigh reports
    ``solved_lambda_min`` / ``solved_lambda_max`` of A + r I), or None when it reports none.

    This is the quantity :func:`_kappa` estimates, without its two power iterations over the batch:
    the estimate lambda_max(X)^-p from the root X = Q diag(w^-1/p) Q^T tends to w_min as the power
    iteration converges, so the spectrum itself is the better value, at no cost.
    """
    if "solved_lambda_min" not in info or "solved_lambda_max" not in info:
        return None
    lo, hi = _per_element(info["solved_lambda_min"], b), _per_element(info["solved_lambda_max"], b)
    if not all(math.isfinite(x) and x > 0 for x in lo) or not all(math.isfinite(x) for x in hi):
        return None
    return [h / lo_ for h, lo_ in zip(hi, lo, strict=True)]


def _auto_kappa(info: dict, b: int, shift: list[float]) -> list[float] | None:
    """kappa of the matrix solved from the estimate ``method="auto"`` made this round to choose its
    solver (:mod:`matroots.solvers.auto`: kappa of A + eps I), or None when it made none.

    That estimate is the quantity :func:`_kappa` estimates when no psd shift was added, so a round
    estimates each factor's kappa once, not twice. An estimate auto took from ``kappa_hint`` (the
    previous round's diagnostics) is not reused: the factors move, and this round's value becomes
    the next round's hint.
    """
    auto = info.get("auto")
    if not isinstance(auto, dict) or auto.get("kappa_source") == "kappa_hint":
        return None
    est = auto.get("kappa_estimate")
    if not isinstance(est, list) or len(est) != b:
        return None
    if not all(math.isfinite(k) and k >= 1.0 for k in est) or any(s > 0 for s in shift):
        return None
    return [float(k) for k in est]


def _per_element(value: object, b: int) -> list[float]:
    """An info value as b floats, NaN where the solver reported none (see matroots.core.result)."""
    return info_per_element(value, b, missing=math.nan)


def solve_batch(
    cfg: SolverConfig,
    A: torch.Tensor,
    p: Fraction,
    opts: GroupOptions,
    dtype: torch.dtype,
    warm: torch.Tensor | None,
    kappa_iters: int,
    kappa_hint: list[float] | None = None,
    *,
    trusted: bool = True,
) -> SolveOutcome:
    """One batched matroots call, never raising for numerical failures.

    The solver is called with ``quiet=True`` (its non-convergence is handled and reported here, once)
    and the group's rank-deficiency policy ``opts.psd`` (:mod:`matroots.core.psd`; None: the config's own).
    A root is usable only when the solver says it converged *and* it is finite. ``kappa_hint``: each
    factor's kappa of the previous round (NaN: unknown), passed to ``method="auto"`` (which then
    needs no estimate of its own, see :mod:`matroots.solvers.auto`); ignored for other solvers.
    """
    b = A.shape[0]
    nan = [math.nan] * b
    t0 = time.perf_counter()
    hint = {"kappa_hint": kappa_hint} if kappa_hint is not None and isinstance(cfg, AutoConfig) else {}
    try:
        res = cfg.solve(
            A, _as_p(p), eps=opts.eps, eps_mode=opts.eps_mode, dtype=dtype, warm_start=warm,
            psd=opts.psd, quiet=True, trusted=trusted, **hint,
        )  # fmt: skip
    except NUMERICAL_ERRORS as exc:
        dt = time.perf_counter() - t0
        return SolveOutcome(
            None, torch.zeros(b, dtype=torch.bool), [0] * b, nan, dt, nan, f"{type(exc).__name__}: {exc}"
        )
    X = res.root
    conv = res.converged if isinstance(res.converged, torch.Tensor) else torch.tensor([res.converged] * b)
    conv = conv.reshape(b).cpu()
    # a result of the solver template promises a finite root where it says converged (its
    # finite_checked); one built elsewhere (a config overriding solve()) is tested here
    finite = None if res.finite_checked else finite_rows(X)
    ok = conv if finite is None else conv & finite
    iters = res.iterations
    iters_l = iters.reshape(b).tolist() if isinstance(iters, torch.Tensor) else [int(iters)] * b
    resid = res.residual
    resid_l = resid.reshape(b).tolist() if isinstance(resid, torch.Tensor) else [float(resid)] * b
    info = res.info
    shift, floor = _per_element(info.get("psd_shift"), b), _per_element(info.get("psd_floor"), b)
    eps_abs = _per_element(info.get("eps_abs"), b)
    reg = [
        (0.0 if math.isnan(s) else s) + (0.0 if math.isnan(e) else e)
        for s, e in zip(shift, eps_abs, strict=True)
    ]
    kappa = list(nan)
    if bool(ok.any()) and kappa_iters > 0:
        solved = _solved_kappa(info, b)
        if solved is None:
            solved = _auto_kappa(info, b, shift)
        if solved is None:
            solved = _kappa(
                A, torch.where(ok.to(X.device).view(-1, 1, 1), X, torch.zeros_like(X)), p, reg, kappa_iters
            )
        kappa = [k if bool(o) else math.nan for k, o in zip(solved, ok.tolist(), strict=True)]
    err = ""
    if not bool(ok.all()):
        parts = []
        if not bool(conv.all()):
            parts.append(f"not converged (stop reasons: {info.get('stop_reason', '')})")
        if finite is None:
            finite = finite_rows(X)
        if not bool(finite.all()):
            parts.append(f"non-finite root for {int((~finite).sum())} of {b}")
        err = "; ".join(parts)
    chosen = info.get("auto", {}).get("chosen", []) if isinstance(info.get("auto"), dict) else []
    solvers = [f"{cfg.name}:{c}" for c in chosen] if len(chosen) == b else []
    bases = info.get("eigenvectors") if uses_eigenbasis(cfg) else None
    warm_l = info.get("warm", [])
    warm_l = [warm_l] if isinstance(warm_l, str) else list(warm_l)
    return SolveOutcome(
        X, ok, iters_l, resid_l, time.perf_counter() - t0, kappa, err, shift, floor, eps_abs, solvers,
        bases.reshape(b, *A.shape[-2:]) if isinstance(bases, torch.Tensor) else None,
        warm_l if len(warm_l) == b else [],
    )  # fmt: skip


def supports_warm_start(cfg: SolverConfig) -> bool:
    """Whether the solver warm-starts from a previous root (declared by its config's capabilities)."""
    return cfg.capabilities.warm_start == "root"


def uses_eigenbasis(cfg: SolverConfig) -> bool:
    """Whether the solver warm-starts from a previous eigenbasis (its declared capabilities, eigh_warm)."""
    return cfg.capabilities.warm_start == "eigenbasis"


def _solve_with_warm_start(
    cfg: SolverConfig,
    A: torch.Tensor,
    p: Fraction,
    opts: GroupOptions,
    prev: torch.Tensor | None,
    has_root: list[bool],
    diag: DiagnosticsConfig,
    kappa: list[float] | None = None,
    trusted: bool = True,
) -> SolveOutcome:
    """Solve with the primary solver, warm-starting from ``prev`` (None: all cold) the elements that
    have a previous root (and passing their previous kappa, see :func:`solve_batch`)."""
    kappa_iters = diag.kappa_power_iters
    if prev is None:
        return solve_batch(cfg, A, p, opts, opts.root_dtype, None, kappa_iters, kappa, trusted=trusted)
    if all(has_root):
        return solve_batch(cfg, A, p, opts, opts.root_dtype, prev, kappa_iters, kappa, trusted=trusted)
    warm_idx = [i for i, h in enumerate(has_root) if h]
    cold_idx = [i for i, h in enumerate(has_root) if not h]
    pick = lambda idx: None if kappa is None else [kappa[i] for i in idx]  # noqa: E731
    parts = [
        (
            warm_idx,
            solve_batch(
                cfg,
                A[warm_idx],
                p,
                opts,
                opts.root_dtype,
                prev[warm_idx],
                kappa_iters,
                pick(warm_idx),
                trusted=trusted,
            ),
        ),
        (
            cold_idx,
            solve_batch(
                cfg, A[cold_idx], p, opts, opts.root_dtype, None, kappa_iters, pick(cold_idx), trusted=trusted
            ),
        ),
    ]
    return _merge(parts, A, opts.root_dtype)


def _merge(
    parts: list[tuple[list[int], SolveOutcome]], like: torch.Tensor, dtype: torch.dtype
) -> SolveOutcome:
    b, n = like.shape[0], like.shape[-1]
    roots = torch.full((b, n, n), math.nan, dtype=dtype, device=like.device)
    ok = torch.zeros(b, dtype=torch.bool)
    iters, resid, kappa = [0] * b, [math.nan] * b, [math.nan] * b
    shift, floor, eps_abs = [math.nan] * b, [math.nan] * b, [math.nan] * b
    errors, seconds = [], 0.0
    solvers = [""] * b
    warm = [""] * b
    bases = None
    for idx, out in parts:
        seconds += out.seconds
        if out.bases is not None:
            if bases is None:
                bases = torch.full((b, n, n), math.nan, dtype=out.bases.dtype, device=like.device)
            bases[idx] = out.bases
        for j, i in enumerate(idx):
            warm[i] = out.warm[j] if j < len(out.warm) else ""
        for j, i in enumerate(idx):
            solvers[i] = out.solvers[j] if j < len(out.solvers) else ""
        if out.error:
            errors.append(out.error)
        if out.roots is not None:
            roots[idx] = out.roots.to(dtype)
        ok[idx] = out.ok
        for j, i in enumerate(idx):
            iters[i], resid[i], kappa[i] = out.iterations[j], out.residual[j], out.kappa[j]
            shift[i], floor[i], eps_abs[i] = out.regularisation(j)
    solvers = solvers if any(solvers) else []
    return SolveOutcome(
        roots, ok, iters, resid, seconds, kappa, "; ".join(errors), shift, floor, eps_abs, solvers,
        bases, warm if any(warm) else [],
    )  # fmt: skip


def _fallback(
    A: torch.Tensor, p: Fraction, opts: GroupOptions, kappa_iters: int, trusted: bool = True
) -> SolveOutcome:
    """The fallback solver on the failed elements; isolates elements when the batched call raises."""
    fb = opts.failure.fallback
    assert fb is not None
    dtype = opts.failure.fallback_dtype
    out = solve_batch(fb, A, p, opts, dtype, None, kappa_iters, trusted=trusted)
    if out.roots is not None or A.shape[0] == 1:
        return out
    parts = [
        ([i], solve_batch(fb, A[i : i + 1], p, opts, dtype, None, kappa_iters, trusted=trusted))
        for i in range(A.shape[0])
    ]
    return _merge(parts, A, dtype)


@dataclass(frozen=True)
class _Warm:
    has_prev: list[bool]  # per factor: warm-started (from ``previous``)
    previous: torch.Tensor | None  # (b, n, n) in root_dtype: roots or eigenbases; None: all cold


@dataclass(frozen=True)
class KroneckerRoots:
    """How Kronecker factors refresh their inverse roots (:class:`shampoo.refresh.Refresher`): the
    bias-corrected mirrored factors (:func:`_inputs`), the group's ``root_solver`` warm-started as its
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
        return _inputs(jobs, _work_dtype(opts), opts.beta2 if bc_on else None)

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
        prev = (_previous_bases(records, snap.A) if eigen else _previous(snap.jobs)).to(opts.root_dtype)
        if copy and not eigen:  # views of the root storage
            prev = prev.clone()
        return _Warm(has_prev, prev)

    def solve(self, snap: Snapshot) -> SolveOutcome:
        warm: _Warm = snap.extra
        return _solve_with_warm_start(
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
        return _fallback(
            snap.A[rows], snap.p, self.opts, self.diag.kappa_power_iters, self.impl.trust_factors
        )

    def install(self, snap: Snapshot, result: Result) -> None:
        """The usable roots into the root storage; an eigenbasis solver's new bases into the records
        (the next round's warm start; a failed primary's next round starts cold)."""
        _write_back(snap.jobs, result.final, result.good.tolist())
        out = result.primary
        for i, f in enumerate(snap.records):
            if snap.reset[i]:
                continue
            if out.bases is not None and bool(out.ok[i]):
                f.basis = out.bases[i].to(self.opts.root_dtype).clone()
            elif not bool(out.ok[i]):
                f.basis = None


def _work_dtype(opts: GroupOptions) -> torch.dtype:
    return torch.promote_types(opts.factor_dtype, opts.root_dtype)


def round_chunks(
    jobs: list[RootJob], opts: GroupOptions, impl: ShampooImplementation = DEFAULT_IMPLEMENTATION
) -> list[list[RootJob]]:
    """The jobs of a round as batches of one (n, p) each, in chunks of at most
    ``impl.round_chunk_bytes`` (see :func:`_chunks`), in order."""
    batches: dict[tuple[int, Fraction], list[RootJob]] = {}
    for job in jobs:
        batches.setdefault((job.factors.shape[-1], job.p), []).append(job)
    size = torch.empty((), dtype=_work_dtype(opts)).element_size()
    return [
        chunk
        for (n, _), group in batches.items()
        for chunk in _chunks(group, impl.chunk_rows(n * n * size), group[0].factors.device)
    ]


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


def _inputs(group: list[RootJob], dtype: torch.dtype, beta2: float | None) -> torch.Tensor:
    """The due factors of the jobs as one exactly symmetric batch (each factor's upper triangle, the
    statistic, mirrored onto its lower), divided by 1 - beta2^t when ``beta2`` is given.

    A single job without bias correction whose due rows are consecutive is mirrored in place and
    returned as a view of the factor storage (the solvers are pure and do not write to their input);
    otherwise each job is written, mirrored and bias-corrected, straight into the batch (one pass
    over the storage; the stored lower triangles stay scratch).
    """
    first = group[0].factors
    if len(group) == 1 and beta2 is None and first.dtype == dtype:
        view = _row_range(group[0])
        if view is not None:
            return mirror_upper_(first[view])
    total = sum(len(job.positions) for job in group)
    n = first.shape[-1]
    out = torch.empty((total, n, n), dtype=dtype, device=first.device)
    lower = torch.ones(n, n, dtype=torch.bool, device=first.device).tril_(-1)
    start = 0
    for job in group:
        F = _rows(job.factors, job)
        dst = out[start : start + len(job.positions)]
        if F.dtype == dtype:
            torch.where(lower, F.mT, F, out=dst)
        else:  # bf16 statistics solved in fp32: mirrored, then widened (exact)
            dst.copy_(torch.where(lower, F.mT, F))
        counts = job.updates if job.updates is not None else job.steps
        divs = [1.0 - beta2**t for t in counts] if beta2 is not None else [1.0]
        if all(d == divs[0] for d in divs) and divs[0] != 1.0:
            dst.div_(divs[0])
        elif not all(d == divs[0] for d in divs):
            dst.div_(torch.tensor(divs, dtype=dtype, device=dst.device).view(-1, 1, 1))
        start += len(job.positions)
    return out


def _chunks(
    group: list[RootJob], rows: int | None, device: torch.device | None = None
) -> list[list[RootJob]]:
    """``group`` cut into consecutive slices of at most ``rows`` rows (None: one slice; from
    :meth:`ShampooImplementation.chunk_rows`), jobs cut at row boundaries, the order of the rows
    kept. Every temporary of a solve (the bias-corrected copy, the psd Cholesky tests, eigh's
    eigenvectors, the root) is then chunk-sized: glibc serves it from the heap, where the previous
    chunk's blocks are still mapped, instead of a fresh mmap of the whole batch (docs/design.md §6).
    Only on the CPU, whose allocator the limit is about: on a GPU one batched solve per (n, p) is
    kept (each call costs host syncs)."""
    if rows is None or (device is not None and device.type != "cpu"):
        return [group]
    out: list[list[RootJob]] = []
    cur: list[RootJob] = []
    room = rows
    for job in group:
        k = 0
        while k < len(job.positions):
            take = min(room, len(job.positions) - k)
            cur.append(_slice(job, k, k + take) if take < len(job.positions) else job)
            k, room = k + take, room - take
            if room == 0:
                out.append(cur)
                cur, room = [], rows
    if cur:
        out.append(cur)
    return out


def _slice(job: RootJob, a: int, b: int) -> RootJob:
    """The due rows a..b-1 of ``job`` (same storage and records)."""
    return replace(
        job,
        positions=job.positions[a:b],
        steps=job.steps[a:b],
        updates=None if job.updates is None else job.updates[a:b],
    )


def _row_range(job: RootJob) -> slice | None:
    """The due rows of ``job`` as a slice when they are consecutive, else None."""
    pos = job.positions
    if pos and pos == list(range(pos[0], pos[0] + len(pos))):
        return slice(pos[0], pos[0] + len(pos))
    return None


def _rows(store: torch.Tensor, job: RootJob) -> torch.Tensor:
    """The due rows of a (b, n, n) storage: a view when consecutive, else a gathered copy."""
    view = _row_range(job)
    if view is not None:
        return store[view]
    return store.index_select(0, torch.tensor(job.positions, device=store.device))


def _previous_bases(states: list[FactorState], like: torch.Tensor) -> torch.Tensor:
    """The kept eigenbases of the due factors, stacked (identity where a factor has none)."""
    eye = torch.eye(like.shape[-1], dtype=like.dtype, device=like.device)
    return torch.stack([f.basis if f.basis is not None else eye for f in states])


def _previous(group: list[RootJob]) -> torch.Tensor:
    """The current roots of the due factors (warm starts): views of the root storage where the due
    rows are consecutive, so a solver must not write to its warm start or return it (matroots'
    solvers are pure: they copy it)."""
    prevs = [_rows(job.roots, job) for job in group]
    return torch.cat(prevs) if len(prevs) > 1 else prevs[0]


def _write_back(group: list[RootJob], final: torch.Tensor, good: list[bool]) -> None:
    """Write the new roots of the ``good`` factors into their root storage."""
    start = 0
    for job in group:
        k = len(job.positions)
        store = job.roots
        rows = [r for r in range(k) if good[start + r]]
        view = _row_range(job) if len(rows) == k else None
        if view is not None:
            store[view].copy_(final[start : start + k])
        elif rows:
            sel = torch.tensor([job.positions[r] for r in rows], device=store.device)
            src = final[start : start + k][torch.tensor(rows)].to(store.dtype)
            store.index_copy_(0, sel, src)
        start += k


__all__ = [
    "KroneckerRoots",
    "compute_roots",
    "round_chunks",
    "solve_batch",
    "supports_warm_start",
    "uses_eigenbasis",
]
