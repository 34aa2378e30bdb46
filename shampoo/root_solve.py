"""One batched matroots solve of Kronecker factors (:func:`solve_batch`), warm-started as the solver's
capabilities declare (:func:`solve_with_warm_start`), the fallback solver (:func:`solve_fallback`),
and the per-factor condition number of the matrix actually solved.

A factor's solve *fails* when the call raises a numerical error (``matroots.MatrootsNumericalError``,
``torch.linalg.LinAlgError``; input errors propagate), or its root is non-finite (even when the solver
claims convergence), or the solver reports ``converged=False``; the fallback is
:class:`shampoo.config.FailurePolicy`'s. Per factor, the diagnostics record the shift actually
applied (psd shift, eps, their sum) and the condition number of the matrix actually solved: from
the spectrum the solver computed when it reports one (eigh: ``solved_lambda_min/max``), else
estimated by power iteration (:func:`_kappa`, ``DiagnosticsConfig.kappa_power_iters``).
"""

from __future__ import annotations

import math
import time
from fractions import Fraction

import torch

from matroots import MatrootsNumericalError
from matroots.core.result import info_per_element
from matroots.core.spectral import power_lambda_max
from matroots.solvers import AutoConfig, SolverConfig

from .config import DiagnosticsConfig, GroupOptions
from .refresh import SolveOutcome, finite_rows

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


def solve_with_warm_start(
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


def solve_fallback(
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


__all__ = [
    "NUMERICAL_ERRORS",
    "solve_batch",
    "solve_fallback",
    "solve_with_warm_start",
    "supports_warm_start",
    "uses_eigenbasis",
]
