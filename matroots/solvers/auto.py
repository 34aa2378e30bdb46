"""``method="auto"``: the solver a measured selection table names for the problem at hand.

For each matrix of the batch: get kappa(A + eps I) (:mod:`matroots.solvers.kappa_estimate`: exact from one
float64 ``eigvalsh`` for small problems, else power iteration for lambda_max and Cholesky inverse
iteration for lambda_min, or the previous root when a warm start is given; or ``kappa_hint``, which
Shampoo passes from the previous round), multiply an inexact one by ``kappa_safety`` (such estimates
err low), look up the cell (device kind, working dtype, n band, kappa band, p) of the selection table
at the loosest tuned target that is <= ``target`` (:class:`matroots.solvers.auto_table.SelectionTable`), and
solve the elements that chose the same configuration together, as one batch. The table's answers
are memoised per question on the table object, so a repeated call costs the estimate and the solve.

* ``status="chosen"``: the cell's cheapest configuration that met the target on every tuning case.
* ``status="unattainable"``: no candidate met the target in that cell; the cell's ``best_effort``,
  the most accurate candidate measured that solves the matrix given
  (:func:`matroots.study.tuning.select.best_effort`), is used.
* ``status="outside"``: the problem is outside the table (dtype, p, n or kappa not tuned, kappa not
  finite, target tighter than every tuned target, non-symmetric input, no table for the device): the
  documented safe choice is used: ``fallback`` if given, else ``EighConfig()`` (LAPACK
  eigendecomposition; the most accurate candidate wherever the tuning ran, defined for every rational
  p) for symmetric input and ``SchurNewtonConfig()`` for general input.

Each group reports the error to expect (``expected_error``): the cell's measured worst error (chosen;
unattainable: the best effort's), else cond(f, A) u of the working format (outside the table, or after
a re-solve with the safe choice), with cond from kappa for symmetric input (|q| kappa for the inverse
root, q = -1/p) and :func:`matroots.core.conditioning.cond_root` for general input. A :class:`TargetWarning`
says when the table cannot promise the target (unattainable) or the expected error exceeds it
(unless ``warn=False``).

If the chosen configuration raises a numerical error (e.g. ``eigh[rank_policy=perturb]`` on a factor
that rounding made indefinite), its elements are re-solved with the safe choice and ``info`` says so.

``info["auto"]`` holds the table used, the target (and where it came from), the kappa estimates and
their source, the estimate's cost, the configuration chosen per element, and one record per group
(configuration, elements, status, the cell with its measured worst error / median cost / runner-up,
and the reason). ``matmuls`` adds the estimate's cost to the element-weighted mean of the groups'.

Default targets (relative forward error), from the working dtype: fp64 1e-8, fp32 1e-3, fp16 and bf16
1e-1 -- roughly sqrt(u) for the wide formats and ~25 u for the half formats, what a root in that format
can deliver for moderately conditioned input (kappa <~ 1e4).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import logging
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core import arguments, precision
from ..core.errors import InvalidArgumentError, MatrootsNumericalError
from ..core.inputs import (
    all_finite,
    check_shape,
    default_symmetry_tol,
    parse_exponent,
    symmetry_defect,
    to_tensor,
)
from ..core.options import SolveOptions
from ..core.psd import check_policy, floor_level
from ..core.result import RootResult
from . import auto_table, kappa_estimate, registry
from .base import Capabilities, SolverConfig

log = logging.getLogger("matroots.auto")

DEFAULT_TARGETS = {"fp64": 1e-8, "fp32": 1e-3, "tf32": 1e-2, "fp16": 1e-1, "bf16": 1e-1}
SOLVE_OPTIONS = ("tol", "max_iter", "compute_dtype")
# Caps of the effort fields: the table's kappa bands span a factor 100 and the estimate's error shrinks
# like (lambda_2/lambda_1)^(2k), so beyond ~100 steps an estimate gains nothing but time.
MAX_ESTIMATE_ITERS = 100


class TargetWarning(UserWarning):
    """``method="auto"`` cannot promise the requested accuracy (the table says no candidate meets it, or
    the error to expect from what it chose exceeds it)."""


def default_target(dtype: Any) -> float:
    """The default relative forward-error target of ``method="auto"`` for a working dtype."""
    name = precision.info(dtype).name
    return DEFAULT_TARGETS.get(name, max(1e-8, math.sqrt(precision.unit_roundoff(dtype))))


@functools.lru_cache(maxsize=16)
def _default_target_of(dtype: torch.dtype) -> tuple[float, str]:
    """(default target, where it came from) of a (validated) working dtype, once per dtype."""
    return default_target(dtype), f"default for {precision.info(dtype).name}"


@dataclass(frozen=True)
class Decision:
    """What one batch element gets: a configuration, the solve options, and why."""

    config: SolverConfig
    label: str
    solve_options: dict[str, Any]
    status: str
    reason: str
    cell: dict[str, Any] | None
    target_used: float | None


def _effort(name: str, value: object) -> int:
    v = arguments.integer(
        name, value, minimum=1, what=f"steps of the kappa estimate, at most {MAX_ESTIMATE_ITERS}"
    )
    if v > MAX_ESTIMATE_ITERS:  # type: ignore[operator]
        raise InvalidArgumentError(
            f"{name} must be an int in [1, {MAX_ESTIMATE_ITERS}] (steps of the kappa estimate), got {value!r}"
        )
    return int(v)  # type: ignore[arg-type]


def _table_field(value: object) -> str | None:
    """None, or the path of a readable selection table (checked now: a typo is an error, not a silent
    fall-back to the safe choice at every solve)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise InvalidArgumentError(
            f"table must be None or the path of a selection table CSV, got {value!r} of type {type(value).__name__}"
        )
    path = os.fspath(value)
    try:
        auto_table.load_table(path)
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"table must be None or the path of a selection table CSV, got {path!r}: no such file"
        ) from None
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"table must be None or the path of a selection table CSV, got {path!r}: {exc}"
        ) from None
    return path


def _device_field(value: object) -> str | None:
    if value is None:
        return None
    kind = None
    if isinstance(value, str):
        with contextlib.suppress(RuntimeError):
            kind = torch.device(value).type
    if kind is None:
        raise InvalidArgumentError(
            f"device must be None or a torch device kind ('cpu', 'cuda', ...), got {value!r}"
        )
    return kind


def _fallback_field(value: object) -> SolverConfig | None:
    if value is None:
        return None
    if isinstance(value, str) and value != "auto":
        return registry.get(value)
    if isinstance(value, SolverConfig) and not isinstance(value, AutoConfig):
        return value
    raise InvalidArgumentError(
        f"fallback must be None, a solver config or a registry name other than 'auto', got {value!r}"
    )


@functools.lru_cache(maxsize=256)
def _config_from(label: str, method: str, options_json: str) -> tuple[SolverConfig, dict[str, Any]]:
    """The (frozen) config and solve options of a table row; memoised, callers do not mutate them."""
    opts = auto_table.options_of(options_json)
    cfg_opts = {k: v for k, v in opts.items() if k not in SOLVE_OPTIONS}
    return registry.get(method, **cfg_opts), {k: v for k, v in opts.items() if k in SOLVE_OPTIONS}


@functools.lru_cache(maxsize=2)
def _default_safe(symmetric: bool) -> SolverConfig:
    """eigh for symmetric input, Schur-Newton for general input (frozen configs, built once)."""
    return registry.get("eigh") if symmetric else registry.get("schur_newton")


def _cond_spd(kappa: float, q: float) -> float:
    """Relative condition number of f(x) = x^q at an SPD matrix with condition number ``kappa``, from
    the divided differences f[lambda_i, lambda_j] over [lambda_min, lambda_max] (Higham, *Functions
    of Matrices*, 2008, Thm. 3.11; docs/design.md §4): |q| kappa for q < 0 (the inverse root,
    kappa/p), q kappa^(1-q) for 0 < q < 1, q for q >= 1."""
    if q < 0:
        return abs(q) * kappa
    if q < 1:
        return q * kappa ** (1.0 - q) if math.isfinite(kappa) else math.inf
    return q


@dataclass(slots=True)  # not frozen: a frozen init sets each field through object.__setattr__
class _Estimate:
    kappa: list[float]
    source: str
    matmuls: float
    exact: bool


@dataclass(slots=True)  # built on every call: plain slots (internal, never mutated)
class _Call:
    """One call as auto sees it (:meth:`AutoConfig._call`)."""

    t: torch.Tensor
    flat: torch.Tensor
    det: torch.Tensor  # flat detached, once: every look at the input outside the solves uses it
    b: int
    n: int
    frac: Any
    wdtype: Any
    device: str
    target: float
    target_src: str
    sym: bool
    hint: list[float] | None


@dataclass
class _Plan:
    """What the table says for one (configuration, device, dtype, n, p, target, symmetry): whether
    it covers the problem, its kappa band edges, and the decision per band (filled on demand)."""

    table: Any
    table_name: str
    coverage: str  # "" when the table has cells for the problem (kappa then decides), else why not
    edges: np.ndarray
    device: str
    dtype: Any
    n: int
    p: Any
    target: float
    sym: bool
    memo: dict[object, Decision] = field(default_factory=dict)
    edge_list: list[float] | None = None

    @property
    def kappa_free(self) -> bool:
        """The decision is the same for every kappa (one cell-less answer: the safe choice)."""
        return bool(self.coverage) or self.table is None

    def decision(self, cfg: AutoConfig, kappa: float) -> Decision:
        """The decision for an element whose (safety-scaled) kappa estimate is ``kappa``; it depends
        on kappa only through its band."""
        if self.coverage or not self.sym or self.table is None:
            key: object = "any"
        else:
            # bisect_right on the edges as floats: numpy's searchsorted(side="right"), without its
            # dispatch
            if self.edge_list is None:
                self.edge_list = [float(x) for x in self.edges]
            key = bisect.bisect_right(self.edge_list, kappa) if math.isfinite(kappa) else "inf"
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = cfg._decide(
                self.table, self.coverage, self.device, self.dtype, self.n, kappa, self.p, self.target,
                self.sym,
            )  # fmt: skip
        return hit


def _spectrum_kappa(info: dict[str, Any], b: int) -> _Estimate | None:
    """kappa per element from the extreme eigenvalues of the matrix solved, when the solver reports
    them (eigh: ``solved_lambda_min/max``, user units, psd and eps shifts included), else None."""
    lo, hi = info.get("solved_lambda_min"), info.get("solved_lambda_max")
    if not isinstance(lo, torch.Tensor) or not isinstance(hi, torch.Tensor):
        return None
    if lo.numel() != b or hi.numel() != b:
        return None
    ends = zip(lo.reshape(-1).tolist(), hi.reshape(-1).tolist(), strict=True)
    kappa = [h / lo_ if lo_ > 0 and math.isfinite(h) else math.inf for lo_, h in ends]
    return _Estimate(kappa, "eigenvalues of the matrix solved (the chosen solver's)", 0.0, True)


def _target_message(missed: list, target: float) -> str:
    parts = []
    for d, idx, _, used, _, _, expected, source in missed:
        parts.append(f"{used} for {len(idx)} matrices: expected error {expected:.2g} ({source}); {d.reason}")
    return (
        f"method='auto' cannot promise the target {target:g}: "
        + " | ".join(parts)
        + ". Use a wider dtype, a larger eps, or a looser target."
    )


def _cell_record(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    keys = (
        "device", "dtype", "p", "n_lo", "n_hi", "kappa_lo", "kappa_hi", "target", "choice", "worst_error",
        "median_gemm_equivalents", "median_cpu_seconds", "failure_rate", "cases", "runner_up",
        "runner_up_gemm_equivalents", "best_effort", "best_effort_error",
    )  # fmt: skip
    return {k: entry.get(k) for k in keys}


@registry.register
@dataclass(frozen=True, kw_only=True)
class AutoConfig(SolverConfig):
    """The configuration a selection table names per batch element (see the module docstring).

    Args:
        target: relative forward error to meet; None means :func:`default_target` of the dtype.
        table: path of a selection table CSV; None means the shipped table of the input's device kind.
        device: device kind to look up ("cpu", "cuda"); None means the input tensor's.
        kappa_safety: factor applied to the kappa estimate before the lookup (estimates err low).
        power_iters, inverse_iters: effort of the kappa estimate (:mod:`matroots.solvers.kappa_estimate`).
        fallback: the safe choice outside the table; None means eigh (symmetric) / schur_newton.
        warn: warn (TargetWarning) when the target cannot be promised (see the module docstring).
    """

    name = "auto"
    # warm start: a previous root gives the kappa estimate and goes on to a chosen "root" method
    capabilities = Capabilities(warm_start="root", general_input=True)
    target: float | None = None
    table: str | None = None
    device: str | None = None
    kappa_safety: float = 2.0
    power_iters: int = 8
    inverse_iters: int = 4
    fallback: SolverConfig | None = None
    warn: bool = True

    def __post_init__(self) -> None:  # typed InvalidArgumentError for every field (matroots.core.arguments)
        arguments.store(
            self,
            target=arguments.real(
                "target", self.target, minimum=0.0, exclusive_minimum=True, maximum=1.0,
                exclusive_maximum=True, allow_none=True, what="a relative forward error",
            ),
            table=_table_field(self.table),
            device=_device_field(self.device),
            kappa_safety=arguments.real(
                "kappa_safety", self.kappa_safety, minimum=1.0, what="factor applied to the kappa estimate"
            ),
            power_iters=_effort("power_iters", self.power_iters),
            inverse_iters=_effort("inverse_iters", self.inverse_iters),
            fallback=_fallback_field(self.fallback),
            warn=arguments.flag("warn", self.warn),
            psd=check_policy(self.psd),
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------ choice
    def safe_choice(self, symmetric: bool) -> SolverConfig:
        """The documented safe configuration used outside the table."""
        if self.fallback is not None:
            return self.fallback
        return _default_safe(symmetric)

    def decide(
        self, *, device: str, dtype: Any, n: int, kappa: float, p: Any, target: float, symmetric: bool = True
    ) -> Decision:
        """The decision for one matrix (no solving): table lookup, or the safe choice and why."""
        try:
            table, why = auto_table.load_table(self.table, device=device), ""
        except (InvalidArgumentError, FileNotFoundError) as exc:
            table, why = None, str(exc)
        return self._decide(table, why, device, dtype, n, kappa, p, target, symmetric)

    def _decide(
        self, table: Any, why: str, device: str, dtype: Any, n: int, kappa: float, p: Any, target: float,
        symmetric: bool,
    ) -> Decision:  # fmt: skip
        safe = self.safe_choice(symmetric)
        if not symmetric:
            return Decision(
                safe, safe.name, {}, "outside",
                "input is not symmetric: the table covers symmetric positive definite input", None, None,
            )  # fmt: skip
        if table is None:
            return Decision(safe, safe.name, {}, "outside", why, None, None)
        lk = table.lookup(device=device, dtype=dtype, n=n, kappa=kappa, p=p, target=target)
        if lk.status == "outside" or lk.entry is None:
            return Decision(
                safe, safe.name, {}, "outside", f"{lk.reason}; safe choice {safe.name}", None, None
            )
        e = lk.entry
        if lk.status == "chosen":
            cfg, sopts = _config_from(e["choice"], e["method"], e["options"])
            return Decision(cfg, e["choice"], sopts, "chosen", lk.reason, _cell_record(e), lk.target_used)
        label = str(e["best_effort"])
        cfg, sopts = self._candidate(table, label)
        return Decision(cfg, label, sopts, "unattainable", lk.reason, _cell_record(e), lk.target_used)

    @staticmethod
    def _candidate(table: Any, label: str) -> tuple[SolverConfig, dict[str, Any]]:
        """Config of a candidate by its label: from the table's provenance (``candidate_specs``), else
        from a row of the table that chose it, else parsed from the label."""
        for c in table.provenance.get("candidate_specs", []):
            if c.get("label") == label:
                opts = dict(c.get("options", {}))
                cfg_opts = {k: v for k, v in opts.items() if k not in SOLVE_OPTIONS}
                return registry.get(c["name"], **cfg_opts), {
                    k: v for k, v in opts.items() if k in SOLVE_OPTIONS
                }
        rows = table.df[table.df["choice"] == label]
        if len(rows):
            r = rows.iloc[0]
            return _config_from(label, r["method"], r["options"])
        name, _, rest = label.partition("[")
        opts: dict[str, Any] = {}
        for kv in rest.rstrip("]").split(",") if rest else []:
            k, _, v = kv.partition("=")
            try:
                opts[k] = float(v) if k in ("tol", "atol", "rtol") else int(v) if v.isdigit() else v
            except ValueError:
                opts[k] = v
        cfg_opts = {k: v for k, v in opts.items() if k not in SOLVE_OPTIONS}
        return registry.get(name, **cfg_opts), {k: v for k, v in opts.items() if k in SOLVE_OPTIONS}

    # ------------------------------------------------------------------------------------------- solve
    def _solve(self, A: object, p: object, opts: SolveOptions, t0: float) -> RootResult:
        """The template of ``method="auto"`` (module docstring): the kappa estimate, one decision per
        element, each group solved by its configuration's own template (prepare -> run -> finalise),
        the warning where the target cannot be promised, and the groups merged into one result.

        ``opts.kappa_hint``: per-element kappa estimates of A + eps I (e.g. the previous round's, as
        Shampoo passes them), used instead of a fresh estimate when every entry is finite. The other
        options go to the chosen solvers.
        """
        call = self._call(A, p, opts)
        plan = self._plan(call.device, call.wdtype, call.n, call.frac, call.target, call.sym)
        est = _Estimate([math.nan] * call.b, "none (non-symmetric input)", 0.0, False)
        if call.sym and call.hint is None and plan.kappa_free:
            return self._solve_kappa_free(A, call, plan, opts, t0)
        if call.sym and (call.hint is not None or all_finite(call.det)):
            est = self._estimate(call, opts)
        est_seconds = time.perf_counter() - t0
        # the estimate errs low unless it is exact (eigenvalues): the lookup uses kappa * kappa_safety
        safety = 1.0 if est.exact else self.kappa_safety
        looked = [k * safety if math.isfinite(k) else math.inf for k in est.kappa]
        groups = []
        for d, idx, cells in self._decisions(plan, looked):
            res, used, note, failed = self._solve_group(d, A, call, idx, opts)
            kap = [est.kappa[i] for i in idx]
            expected, source = self._expected(
                d, failed, call.sym, kap, call.det, idx, call.frac, opts.inverse, call.wdtype
            )
            groups.append((d, idx, res, used, note, cells, expected, source))
        self._warn_missed(groups, call.target)
        out = self._merge(groups, call.t, call.b, call.n, est.matmuls)
        out.info["auto"] = self._report(call, plan, est, est_seconds, safety, groups)
        out.seconds = time.perf_counter() - t0
        out.method = "auto"
        return out

    def _solve_kappa_free(
        self, A: object, call: _Call, plan: _Plan, opts: SolveOptions, t0: float
    ) -> RootResult:
        """:meth:`_solve` where the table's answer does not depend on kappa (the problem is outside
        the table's dtype, p or n bands, or there is no table: the safe choice for every kappa), so
        no estimate is taken to choose. kappa is still reported and still sets the error to expect
        (cond(f, A) u, the TargetWarning): read from the spectrum the solver computed when it
        reports one (eigh: ``solved_lambda_min/max``, the matrix actually solved, exactly), else
        estimated after the solve as before it."""
        d = plan.decision(self, math.nan)  # the one decision of this plan, whatever kappa
        idx = list(range(call.b))
        cells = [{"reason": d.reason, "cell": d.cell, "target_used": d.target_used, "elements": idx}]
        res, used, note, failed = self._solve_group(d, A, call, idx, opts)
        t_est = time.perf_counter()
        est = _spectrum_kappa(res.info, call.b)
        if est is None:  # the solver reports no spectrum: the estimate, after the solve
            est = self._estimate(call, opts) if all_finite(call.det) else est
            est = est or _Estimate([math.nan] * call.b, "none (non-finite input)", 0.0, False)
        est_seconds = time.perf_counter() - t_est
        expected, source = self._expected(
            d, failed, call.sym, est.kappa, call.det, idx, call.frac, opts.inverse, call.wdtype
        )
        groups = [(d, idx, res, used, note, cells, expected, source)]
        self._warn_missed(groups, call.target)
        out = self._merge(groups, call.t, call.b, call.n, est.matmuls)
        safety = 1.0 if est.exact else self.kappa_safety
        out.info["auto"] = self._report(call, plan, est, est_seconds, safety, groups)
        out.seconds = time.perf_counter() - t0
        out.method = "auto"
        return out

    def _call(self, A: object, p: object, opts: SolveOptions) -> _Call:
        """The problem as auto sees it: the exponent, the flattened batch, the working dtype, the
        device kind, the target (and where it came from), symmetry, and the checked kappa hint."""
        frac = parse_exponent(p, integer=False, method=self.name)
        t = to_tensor(A)
        check_shape(t)
        n = t.shape[-1]
        flat = t.reshape(-1, n, n)
        b = flat.shape[0]
        hint = self._hint(opts.kappa_hint, b)
        wdtype = opts.dtype if opts.dtype is not None else t.dtype
        if self.target is not None:
            target, target_src = float(self.target), "argument"
        else:
            target, target_src = _default_target_of(wdtype)
        det = flat.detach()
        sym = opts.trusted or self._symmetric(det, t.dtype)  # trusted: symmetric
        return _Call(
            t=t, flat=flat, det=det, b=b, n=n, frac=frac, wdtype=wdtype, device=self.device or t.device.type,
            target=target, target_src=target_src, sym=sym, hint=hint,
        )  # fmt: skip

    def _decisions(
        self, plan: _Plan, looked: list[float]
    ) -> list[tuple[Decision, list[int], list[dict[str, Any]]]]:
        """The decision per element (its safety-scaled kappa looked up in the plan), grouped: elements
        that chose the same configuration with the same status are solved as one batch; the cells and
        reasons behind the choice are kept per group."""
        decisions: dict[tuple[str, str], tuple[Decision, list[int], dict[str, dict[str, Any]]]] = {}
        for i, kappa in enumerate(looked):
            d = plan.decision(self, kappa)
            _, idx, cells = decisions.setdefault((d.label, d.status), (d, [], {}))
            idx.append(i)
            rec = cells.setdefault(
                d.reason, {"reason": d.reason, "cell": d.cell, "target_used": d.target_used}
            )
            rec.setdefault("elements", []).append(i)
        return [(d, idx, list(cells.values())) for d, idx, cells in decisions.values()]

    def _warn_missed(self, groups: list, target: float) -> None:
        """A TargetWarning where the table cannot promise the target (unattainable) or the error to
        expect exceeds it."""
        missed = [g for g in groups if g[0].status == "unattainable" or not (g[6] <= target)]
        if missed and self.warn:
            msg = _target_message(missed, target)
            warnings.warn(msg, TargetWarning, stacklevel=4)  # the caller of solve()
            log.info(msg)  # the TargetWarning is the user-facing report

    @staticmethod
    def _report(
        call: _Call, plan: _Plan, est: _Estimate, est_seconds: float, safety: float, groups: list
    ) -> dict[str, Any]:
        """``info["auto"]``: the table, the target, the estimates, and one record per group."""
        chosen = [""] * call.b
        for _, idx, _, used, *_ in groups:
            for i in idx:
                chosen[i] = used
        return {
            "table": plan.table_name,
            "device": call.device,
            "dtype": precision.info(call.wdtype).name,
            "target": call.target,
            "target_source": call.target_src,
            "kappa_estimate": est.kappa,
            "kappa_source": est.source,
            "kappa_safety": safety,
            "estimate_matmuls": est.matmuls,
            "estimate_seconds": est_seconds,
            "chosen": chosen,
            "groups": [
                {
                    "config": used,
                    "elements": idx,
                    "status": d.status,
                    "note": note,
                    "cells": cells,
                    "matmuls": float(res.matmuls),
                    "expected_error": expected,
                    "expected_error_source": source,
                }
                for d, idx, res, used, note, cells, expected, source in groups
            ],
        }

    # ----------------------------------------------------------------------------------------- helpers
    def _plan(self, device: str, dtype: Any, n: int, p: Any, target: float, sym: bool) -> _Plan:
        """The table's answers for (device, dtype, n, p, target, symmetry), memoised on the table
        object per configuration (a Shampoo run asks the same questions every round; a changed table
        file is a new table object, so nothing stale is reused)."""
        try:
            table = auto_table.load_table(self.table, device=device)
        except (InvalidArgumentError, FileNotFoundError) as exc:
            return _Plan(None, f"none ({exc})", str(exc), np.empty(0), device, dtype, n, p, target, sym)
        key = (self, device, precision.info(dtype).name, int(n), p, float(target), sym)
        try:
            hit = table.plans.get(key)
        except TypeError:  # an unhashable user fallback config: no memo
            key, hit = None, None
        if hit is None:
            coverage = table.coverage(device=device, dtype=dtype, n=n, p=p) if sym else ""
            edges = (
                np.empty(0)
                if coverage or not sym
                else table.kappa_edges(device=device, dtype=dtype, n=n, p=p)
            )
            hit = _Plan(table, table.describe(), coverage, edges, device, dtype, n, p, target, sym)
            if key is not None:
                table.plans[key] = hit
        return hit

    def _estimate(self, call: _Call, opts: SolveOptions) -> _Estimate:
        """kappa(A + eps I) per element: the hint, else :func:`matroots.solvers.kappa_estimate.estimate_kappa`
        (exact at small sizes; from the previous root when a warm start is given)."""
        if call.hint is not None:
            return _Estimate(call.hint, "kappa_hint", 0.0, False)
        prev = self._previous_root(opts.warm_start, call.b, call.n)
        floor = None
        if (opts.psd or self.psd) == "shift":
            floor = floor_level(call.det.to(call.wdtype), call.t.dtype)
        ke = kappa_estimate.estimate_kappa(
            call.det,
            eps=float(opts.eps),
            eps_mode=str(opts.eps_mode),
            power_iters=self.power_iters,
            inverse_iters=self.inverse_iters,
            previous_root=prev,
            p=float(call.frac) if prev is not None else None,
            floor=floor,
        )
        return _Estimate(ke.kappa, ke.source, ke.matmuls, ke.exact)

    @staticmethod
    def _expected(
        d: Decision,
        failed: bool,
        sym: bool,
        kappa: list[float],
        flat: torch.Tensor,
        idx: list[int],
        p: Any,
        inverse: bool,
        wdtype: Any,
    ) -> tuple[float, str]:
        """The error to expect from what a group got: the cell's measured worst error (chosen) or the
        best effort's (unattainable), else cond(f, A) u of the working format (outside the table, or
        re-solved with the safe choice after the chosen solver failed). ``kappa``: the group's
        elements'; ``flat[idx]``: the group's matrices (only looked at for general input)."""
        if not failed and d.cell is not None:
            key = "worst_error" if d.status == "chosen" else "best_effort_error"
            v = d.cell.get(key)
            if v is not None and math.isfinite(float(v)):
                return float(v), f"the table's measured {key.replace('_', ' ')} in the cell"
        u = precision.unit_roundoff(wdtype)
        q = (-1.0 if inverse else 1.0) / float(p)
        if sym:
            k = max((x if not math.isnan(x) else math.inf) for x in kappa)
            return _cond_spd(k, q) * u, f"cond(f, A) u, cond from kappa ~{k:.3g} (SPD)"
        from ..core.conditioning import cond_root

        cond = cond_root(flat[idx].to(torch.float64), p, inverse=inverse)
        return cond * u, "cond(f, A) u (matroots.core.conditioning.cond_root of the general input)"

    @staticmethod
    def _symmetric(flat: torch.Tensor, source: torch.dtype) -> bool:
        if torch.equal(flat, flat.mT):  # exactly symmetric (the common case): one comparison
            return True
        return bool((symmetry_defect(flat) <= default_symmetry_tol(flat, source)).all())  # the solvers' rule

    @staticmethod
    def _hint(kappa_hint: Any, b: int) -> list[float] | None:
        """The per-element kappa hint as b floats, or None when any entry is unknown (nan / inf: a
        fresh estimate is taken). A real number applies to every element."""
        if kappa_hint is None:
            return None
        allowed = f"a condition number >= 1 per matrix ({b} reals, nan or inf for unknown)"
        if isinstance(kappa_hint, torch.Tensor | np.ndarray):  # entries checked below (bool, complex)
            items = kappa_hint.reshape(-1).tolist()
        elif isinstance(kappa_hint, str | bytes) or not isinstance(kappa_hint, Sequence):
            items = [kappa_hint] * b
        else:
            items = list(kappa_hint)
        if len(items) != b:
            raise InvalidArgumentError(f"kappa_hint has {len(items)} entries for a batch of {b} matrices")
        ks = []
        for x in items:
            if isinstance(x, bool | np.bool_) or not isinstance(x, int | float | np.integer | np.floating):
                raise InvalidArgumentError(f"kappa_hint must be {allowed}, got {kappa_hint!r}")
            k = float(x)
            if k < 1:
                raise InvalidArgumentError(f"kappa_hint must be {allowed}, got the entry {x!r}")
            ks.append(k)
        return ks if all(math.isfinite(k) for k in ks) else None

    @staticmethod
    def _previous_root(warm_start: Any, b: int, n: int) -> torch.Tensor | None:
        Z = warm_start.root if isinstance(warm_start, RootResult) else warm_start
        if isinstance(Z, torch.Tensor) and Z.numel() == b * n * n and bool(torch.isfinite(Z).all()):
            return Z.reshape(b, n, n)
        return None

    def _solve_group(
        self, d: Decision, whole: object, call: _Call, idx: list[int], opts: SolveOptions
    ) -> tuple[RootResult, str, str, bool]:
        """The group's solve by its configuration's template: (result, configuration used, note,
        whether the chosen one failed and the safe choice solved it). The table's solve options (tol,
        max_iter, compute_dtype) apply where the caller set none."""
        # One group for the whole batch: the chosen solver gets exactly the caller's input (shape,
        # layout, autograd); otherwise the group's elements as a (k, n, n) batch.
        everything = len(idx) == call.b
        sub = whole if everything else call.flat[idx]
        # the table's solve options where the caller set none, the config's psd policy where the caller
        # gave none, the warm start where the chosen method uses one: a call that changes nothing
        # reuses the caller's options (a default call builds no SolveOptions, as a direct call)
        kw: dict[str, Any] = {}
        if d.solve_options:
            caller = opts.changed()
            kw = {k: v for k, v in d.solve_options.items() if k not in caller}
        psd = self.psd if self.psd != "none" and opts.psd is None else None  # the caller's policy
        p = call.frac
        pp = int(p) if p.denominator == 1 else p
        given = None  # the previous root, only for a method that uses one (its finiteness is a pass)
        if opts.warm_start is not None and d.config.capabilities.warm_start == "root":
            warm = self._previous_root(opts.warm_start, call.b, call.n)
            if warm is not None:
                given = opts.warm_start if everything else warm[idx]
        if kw:  # the table's solve options: validated as a new SolveOptions
            if psd is not None:
                kw["psd"] = psd
            group = dataclasses.replace(opts, warm_start=given, **kw)
        elif given is not opts.warm_start or psd is not None:
            group = opts.with_warm_start(given, psd=psd)  # the other fields are validated already
        else:
            group = opts
        try:
            return d.config._solve(sub, pp, group, time.perf_counter()), d.label, "", False
        except MatrootsNumericalError as exc:
            safe = self.safe_choice(True)
            if d.status == "outside" or safe == d.config:
                raise
            # the safe choice with the caller's own options: no warm start, none of the table's
            plain = dataclasses.replace(
                group, warm_start=None, **{k: getattr(opts, k) for k in SOLVE_OPTIONS}
            )
            res = safe._solve(sub, pp, plain, time.perf_counter())
            note = f"{d.label} raised {type(exc).__name__}; re-solved with the safe choice {safe.name}"
            log.info("method='auto': %s", note)
            return res, f"{safe.name}[after {d.label} failed]", note, True

    @staticmethod
    def _merge(groups: list, t: torch.Tensor, b: int, n: int, est_cost: float) -> RootResult:
        bs = tuple(t.shape[:-2])
        if len(groups) == 1:
            res = groups[0][2]
            res.matmuls = float(res.matmuls) + est_cost
            return res
        first = groups[0][2]
        root = torch.empty((b, n, n), dtype=first.root.dtype, device=first.root.device)
        conv = torch.zeros(b, dtype=torch.bool)
        iters = torch.zeros(b, dtype=torch.int64)
        resid = torch.full((b,), math.nan, dtype=torch.float64)
        per_elem: dict[str, torch.Tensor] = {}
        info_groups = []
        matmuls = 0.0
        for _, idx, res, used, *_ in groups:
            ii = torch.tensor(idx)
            root[ii] = res.root.reshape(-1, n, n).to(root.dtype)
            conv[ii] = torch.as_tensor(res.converged).reshape(-1).cpu()
            iters[ii] = torch.as_tensor(res.iterations).reshape(-1).cpu().to(torch.int64)
            resid[ii] = torch.as_tensor(res.residual, dtype=torch.float64).reshape(-1).cpu()
            matmuls += float(res.matmuls) * len(idx) / b
            for key in ("lambda_min", "lambda_max", "eps_abs"):
                v = res.info.get(key)
                if isinstance(v, torch.Tensor) and v.numel() == len(idx):
                    per_elem.setdefault(key, torch.full((b,), math.nan, dtype=torch.float64))[ii] = (
                        v.reshape(-1).double().cpu()
                    )
            info_groups.append({"config": used, "info": res.info})
        info: dict[str, Any] = dict(per_elem)
        info["group_infos"] = info_groups
        return RootResult(
            root=root.reshape(*bs, n, n),
            converged=conv.reshape(bs),
            iterations=iters.reshape(bs),
            residual=resid.reshape(bs),
            history=[],
            matmuls=matmuls + est_cost,
            seconds=0.0,
            method="auto",
            dtype=first.dtype,
            info=info,
            finite_checked=all(g[2].finite_checked for g in groups),
        )


__all__ = ["DEFAULT_TARGETS", "AutoConfig", "Decision", "TargetWarning", "default_target"]
