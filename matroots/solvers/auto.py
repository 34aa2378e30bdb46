"""``method="auto"``: the solver a measured selection table names for the problem at hand.

For each matrix of the batch: estimate kappa(A + eps I) cheaply (:mod:`matroots.tuning.estimate`:
power iteration for lambda_max, Cholesky inverse iteration for lambda_min, or the previous root when a warm
start is given, or ``kappa_hint``), multiply it by ``kappa_safety`` (the estimates err low), look up
the cell (device kind, working dtype, n band, kappa band, p) of the selection table at the loosest
tuned target that is <= ``target`` (:class:`matroots.tuning.table.SelectionTable`), and solve the
elements that chose the same configuration together, as one batch.

* ``status="chosen"``: the cell's cheapest configuration that met the target on every tuning case.
* ``status="unattainable"``: no candidate met the target in that cell; the most accurate candidate
  (the cell's ``best_effort``) is used, a :class:`TargetWarning` says so (unless ``warn=False``).
* ``status="outside"``: the problem is outside the table (dtype, p, n or kappa not tuned, kappa not
  finite, target tighter than every tuned target, non-symmetric input, no table for the device): the
  documented safe choice is used: ``fallback`` if given, else ``EighConfig()`` (LAPACK
  eigendecomposition; the most accurate candidate wherever the tuning ran, defined for every rational
  p) for symmetric input and ``SchurNewtonConfig()`` for general input.

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

import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import precision
from ..errors import InvalidArgumentError, MatrootsNumericalError
from ..inputs import check_shape, parse_exponent, to_tensor
from ..result import RootResult
from . import registry
from .base import Capabilities, SolverConfig

log = logging.getLogger("matroots.auto")

DEFAULT_TARGETS = {"fp64": 1e-8, "fp32": 1e-3, "tf32": 1e-2, "fp16": 1e-1, "bf16": 1e-1}
SOLVE_OPTIONS = ("tol", "max_iter", "compute_dtype")


class TargetWarning(UserWarning):
    """``method="auto"`` could not promise the requested accuracy (the table says no candidate meets it)."""


def default_target(dtype: Any) -> float:
    """The default relative forward-error target of ``method="auto"`` for a working dtype."""
    name = precision.info(dtype).name
    return DEFAULT_TARGETS.get(name, max(1e-8, math.sqrt(precision.unit_roundoff(dtype))))


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


def _config_from(label: str, method: str, options_json: str) -> tuple[SolverConfig, dict[str, Any]]:
    from ..tuning.select import options_of

    opts = options_of(options_json)
    cfg_opts = {k: v for k, v in opts.items() if k not in SOLVE_OPTIONS}
    return registry.get(method, **cfg_opts), {k: v for k, v in opts.items() if k in SOLVE_OPTIONS}


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
        power_iters, inverse_iters: effort of the kappa estimate (:mod:`matroots.tuning.estimate`).
        fallback: the safe choice outside the table; None means eigh (symmetric) / schur_newton.
        warn: warn (TargetWarning) when the table says the target cannot be met.
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

    def __post_init__(self) -> None:
        if self.target is not None and not (0 < float(self.target) < 1):
            raise InvalidArgumentError(f"target must be a relative error in (0, 1), got {self.target!r}")
        if not (self.kappa_safety >= 1):
            raise InvalidArgumentError(f"kappa_safety must be >= 1, got {self.kappa_safety!r}")
        if self.power_iters < 1 or self.inverse_iters < 1:
            raise InvalidArgumentError("power_iters and inverse_iters must be >= 1")
        if self.fallback is not None and isinstance(self.fallback, AutoConfig):
            raise InvalidArgumentError("fallback must be a concrete solver config, not another AutoConfig")

    # ------------------------------------------------------------------------------------------ choice
    def safe_choice(self, symmetric: bool) -> SolverConfig:
        """The documented safe configuration used outside the table."""
        if self.fallback is not None:
            return self.fallback
        return registry.get("eigh") if symmetric else registry.get("schur_newton")

    def decide(
        self, *, device: str, dtype: Any, n: int, kappa: float, p: Any, target: float, symmetric: bool = True
    ) -> Decision:
        """The decision for one matrix (no solving): table lookup, or the safe choice and why."""
        from ..tuning.table import load_table

        safe = self.safe_choice(symmetric)
        if not symmetric:
            return Decision(
                safe, safe.name, {}, "outside",
                "input is not symmetric: the table covers symmetric positive definite input", None, None,
            )  # fmt: skip
        try:
            table = load_table(self.table, device=device)
        except (InvalidArgumentError, FileNotFoundError) as exc:
            return Decision(safe, safe.name, {}, "outside", str(exc), None, None)
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
    def solve(  # type: ignore[override]
        self,
        A: object,
        p: object,
        *,
        eps: float = 0.0,
        eps_mode: str = "absolute",
        dtype: object = None,
        inverse: bool = True,
        warm_start: object = None,
        kappa_hint: Any = None,
        **kwargs: Any,
    ) -> RootResult:
        """Estimate kappa, look up the table per element, solve each group. See the module docstring.

        ``kappa_hint``: per-element kappa estimates of A + eps I (e.g. the previous round's), used
        instead of a fresh estimate where finite. Other keyword arguments go to the chosen solver.
        """
        from ..tuning.estimate import estimate_kappa

        t0 = time.perf_counter()
        frac = parse_exponent(p, integer=False, method=self.name)
        t = to_tensor(A)
        check_shape(t)
        n = t.shape[-1]
        flat = t.reshape(-1, n, n)
        b = flat.shape[0]
        wdtype = precision.as_dtype(dtype) if dtype is not None else t.dtype
        device = self.device or t.device.type
        target = float(self.target) if self.target is not None else default_target(wdtype)
        target_src = "argument" if self.target is not None else f"default for {precision.info(wdtype).name}"
        f64 = flat.detach().to(torch.float64)
        sym = bool(kwargs.get("trusted")) or self._symmetric(f64, t.dtype)  # trusted: exactly symmetric
        est_cost, kappa, ksrc = 0.0, [math.nan] * b, "none (non-symmetric input)"
        uncovered = self._coverage(device, wdtype, n, frac) if sym else ""
        if uncovered:
            ksrc = f"not estimated: {uncovered}"
        elif sym and bool(torch.isfinite(f64).all()):
            hint = self._hint(kappa_hint, b)
            prev = self._previous_root(warm_start, b, n)
            if hint is not None:
                kappa, ksrc = hint, "kappa_hint"
            else:
                policy = kwargs.get("psd") or getattr(self, "psd", "none")
                floor = None
                if policy == "shift":
                    from ..psd import floor_level

                    floor = floor_level(flat.detach().to(wdtype), t.dtype)
                ke = estimate_kappa(
                    f64,
                    eps=float(eps),
                    eps_mode=str(eps_mode),
                    power_iters=self.power_iters,
                    inverse_iters=self.inverse_iters,
                    previous_root=prev,
                    p=float(frac) if prev is not None else None,
                    floor=floor,
                )
                kappa, ksrc, est_cost = ke.kappa, ke.source, ke.matmuls
        est_seconds = time.perf_counter() - t0
        looked = [k * self.kappa_safety if math.isfinite(k) else math.inf for k in kappa]
        # Elements that chose the same configuration (with the same status) are solved as one batch;
        # the cells (and reasons) behind the choice are kept per element group.
        decisions: dict[tuple[str, str], tuple[Decision, list[int], dict[str, dict[str, Any]]]] = {}
        edges = self._kappa_edges(device, wdtype, n, frac) if sym else np.empty(0)
        memo: dict[object, Decision] = {}  # the decision depends on kappa only through its band
        for i in range(b):
            k = looked[i]
            key = int(np.searchsorted(edges, k, side="right")) if math.isfinite(k) else "inf"
            if key not in memo:
                memo[key] = self.decide(
                    device=device, dtype=wdtype, n=n, kappa=k, p=frac, target=target, symmetric=sym
                )
            d = memo[key]
            _, idx, cells = decisions.setdefault((d.label, d.status), (d, [], {}))
            idx.append(i)
            rec = cells.setdefault(
                d.reason, {"reason": d.reason, "cell": d.cell, "target_used": d.target_used}
            )
            rec.setdefault("elements", []).append(i)
        groups = []
        for d, idx, cells in decisions.values():
            res, used, note = self._solve_group(
                d, A, flat, idx, frac, eps, eps_mode, dtype, inverse, warm_start, kwargs
            )
            groups.append((d, idx, res, used, note, list(cells.values())))
        unattainable = [g for g in groups if g[0].status == "unattainable"]
        if unattainable and self.warn:
            msg = f"method='auto': {unattainable[0][0].reason} (target {target:g}); using the most accurate candidate"
            warnings.warn(msg, TargetWarning, stacklevel=2)
            log.info(msg)  # the TargetWarning is the user-facing report
        chosen = [""] * b
        for _, idx, _, used, _, _ in groups:
            for i in idx:
                chosen[i] = used
        auto_info = {
            "table": self._table_name(device),
            "device": device,
            "dtype": precision.info(wdtype).name,
            "target": target,
            "target_source": target_src,
            "kappa_estimate": kappa,
            "kappa_source": ksrc,
            "kappa_safety": self.kappa_safety,
            "estimate_matmuls": est_cost,
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
                }
                for d, idx, res, used, note, cells in groups
            ],
        }
        out = self._merge(groups, t, b, n, est_cost)
        out.info["auto"] = auto_info
        out.seconds = time.perf_counter() - t0
        out.method = "auto"
        return out

    # ----------------------------------------------------------------------------------------- helpers
    def _table_name(self, device: str) -> str:
        from ..tuning.table import load_table

        try:
            return load_table(self.table, device=device).describe()
        except (InvalidArgumentError, FileNotFoundError) as exc:
            return f"none ({exc})"

    def _coverage(self, device: str, dtype: Any, n: int, p: Any) -> str:
        """Empty when the table has cells for this problem (kappa then decides), else why not (no
        estimate is spent on a problem the table cannot cover)."""
        from ..tuning.table import load_table

        try:
            return load_table(self.table, device=device).coverage(device=device, dtype=dtype, n=n, p=p)
        except (InvalidArgumentError, FileNotFoundError) as exc:
            return str(exc)

    def _kappa_edges(self, device: str, dtype: Any, n: int, p: Any) -> np.ndarray:
        from ..tuning.table import load_table

        try:
            return load_table(self.table, device=device).kappa_edges(device=device, dtype=dtype, n=n, p=p)
        except (InvalidArgumentError, FileNotFoundError):
            return np.empty(0)

    @staticmethod
    def _symmetric(f64: torch.Tensor, source: torch.dtype) -> bool:
        nrm = torch.linalg.matrix_norm(f64).clamp_min(1e-300)
        defect = torch.linalg.matrix_norm(f64 - f64.mT) / nrm
        tol = 100 * math.sqrt(f64.shape[-1]) * precision.unit_roundoff(source)
        return bool((defect <= tol).all())

    @staticmethod
    def _hint(kappa_hint: Any, b: int) -> list[float] | None:
        if kappa_hint is None:
            return None
        ks = [float(x) for x in (kappa_hint.tolist() if isinstance(kappa_hint, torch.Tensor) else kappa_hint)]
        if len(ks) != b:
            raise InvalidArgumentError(f"kappa_hint has {len(ks)} entries for a batch of {b} matrices")
        return ks if all(math.isfinite(k) and k >= 1 for k in ks) else None

    @staticmethod
    def _previous_root(warm_start: Any, b: int, n: int) -> torch.Tensor | None:
        Z = warm_start.root if isinstance(warm_start, RootResult) else warm_start
        if isinstance(Z, torch.Tensor) and Z.numel() == b * n * n and bool(torch.isfinite(Z).all()):
            return Z.reshape(b, n, n)
        return None

    def _solve_group(
        self,
        d: Decision,
        whole: object,
        flat: torch.Tensor,
        idx: list[int],
        p: Any,
        eps: float,
        eps_mode: str,
        dtype: Any,
        inverse: bool,
        warm_start: Any,
        kwargs: dict[str, Any],
    ) -> tuple[RootResult, str, str]:
        # One group for the whole batch: the chosen solver gets exactly the caller's input (shape,
        # layout, autograd); otherwise the group's elements as a (k, n, n) batch.
        everything = len(idx) == flat.shape[0]
        sub = whole if everything else flat[idx]
        kw = {**d.solve_options, **kwargs}
        if getattr(self, "psd", "none") != "none" and "psd" not in kw:
            kw["psd"] = self.psd  # the caller's rank-deficiency policy goes to the chosen solver
        pp = int(p) if p.denominator == 1 else p
        warm = self._previous_root(warm_start, flat.shape[0], flat.shape[-1])
        if warm is not None and d.config.capabilities.warm_start == "root":
            kw["warm_start"] = warm_start if everything else warm[idx]
        try:
            res = d.config.solve(sub, pp, eps=eps, eps_mode=eps_mode, dtype=dtype, inverse=inverse, **kw)
            return res, d.label, ""
        except MatrootsNumericalError as exc:
            safe = self.safe_choice(True)
            if d.status == "outside" or safe == d.config:
                raise
            kw.pop("warm_start", None)
            kw = {k: v for k, v in kw.items() if k not in SOLVE_OPTIONS or k in kwargs}
            res = safe.solve(sub, pp, eps=eps, eps_mode=eps_mode, dtype=dtype, inverse=inverse, **kw)
            note = f"{d.label} raised {type(exc).__name__}; re-solved with the safe choice {safe.name}"
            log.info("method='auto': %s", note)
            return res, f"{safe.name}[after {d.label} failed]", note

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
        for _, idx, res, used, _, _ in groups:
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
        )


__all__ = ["DEFAULT_TARGETS", "AutoConfig", "Decision", "TargetWarning", "default_target"]
