"""What the selection table says for a problem of ``method="auto"``: one :class:`Decision` per batch
element (the cell's choice, its best effort, or the safe choice and why), the per-problem
:class:`Plan` that memoises the decision per kappa band, and the grouping of elements that chose the
same configuration (:mod:`matroots.solvers.auto` solves each group as one batch).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core import precision
from ..core.errors import InvalidArgumentError
from . import auto_table
from .auto_candidates import candidate, config_from
from .base import SolverConfig


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


def cell_record(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fields of a table cell that ``info["auto"]`` reports."""
    if entry is None:
        return None
    keys = (
        "device", "dtype", "p", "n_lo", "n_hi", "kappa_lo", "kappa_hi", "target", "choice", "worst_error",
        "median_gemm_equivalents", "median_cpu_seconds", "failure_rate", "cases", "runner_up",
        "runner_up_gemm_equivalents", "best_effort", "best_effort_error",
    )  # fmt: skip
    return {k: entry.get(k) for k in keys}


def decide(
    table: Any, why: str, safe: SolverConfig, device: str, dtype: Any, n: int, kappa: float, p: Any,
    target: float, symmetric: bool,
) -> Decision:  # fmt: skip
    """The decision for one matrix: the table's cell (chosen or best effort), else ``safe`` and why
    (``why``: the reason there is no table, when ``table`` is None)."""
    if not symmetric:
        return Decision(
            safe, safe.name, {}, "outside",
            "input is not symmetric: the table covers symmetric positive definite input", None, None,
        )  # fmt: skip
    if table is None:
        return Decision(safe, safe.name, {}, "outside", why, None, None)
    lk = table.lookup(device=device, dtype=dtype, n=n, kappa=kappa, p=p, target=target)
    if lk.status == "outside" or lk.entry is None:
        return Decision(safe, safe.name, {}, "outside", f"{lk.reason}; safe choice {safe.name}", None, None)
    e = lk.entry
    if lk.status == "chosen":
        cfg, sopts = config_from(e["choice"], e["method"], e["options"])
        return Decision(cfg, e["choice"], sopts, "chosen", lk.reason, cell_record(e), lk.target_used)
    label = str(e["best_effort"])
    cfg, sopts = candidate(table, label)
    return Decision(cfg, label, sopts, "unattainable", lk.reason, cell_record(e), lk.target_used)


@dataclass
class Plan:
    """What the table says for one (configuration, device, dtype, n, p, target, symmetry): whether
    it covers the problem, its kappa band edges, and the decision per band (filled on demand).
    ``safe``: the configuration's safe choice for this symmetry."""

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
    safe: SolverConfig
    memo: dict[object, Decision] = field(default_factory=dict)
    edge_list: list[float] | None = None
    first_spectrum: bool | None = None  # auto_first.spectrum_first, memoised

    @property
    def kappa_free(self) -> bool:
        """The decision is the same for every kappa (one cell-less answer: the safe choice)."""
        return bool(self.coverage) or self.table is None

    def band(self, kappa: float) -> object:
        """The key of kappa's band: kappas with the same key get the same decision."""
        if self.coverage or not self.sym or self.table is None:
            return "any"
        # bisect_right on the edges as floats: numpy's searchsorted(side="right"), without its dispatch
        if self.edge_list is None:
            self.edge_list = [float(x) for x in self.edges]
        return bisect.bisect_right(self.edge_list, kappa) if math.isfinite(kappa) else "inf"

    def decision(self, kappa: float) -> Decision:
        """The decision for an element whose (safety-scaled) kappa estimate is ``kappa``; it depends
        on kappa only through its band."""
        key = self.band(kappa)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = decide(
                self.table, self.coverage, self.safe, self.device, self.dtype, self.n, kappa, self.p,
                self.target, self.sym,
            )  # fmt: skip
        return hit


def plan_for(
    owner: object, table_path: str | None, safe: SolverConfig, device: str, dtype: Any, n: int, p: Any,
    target: float, sym: bool,
) -> Plan:  # fmt: skip
    """The table's answers for (device, dtype, n, p, target, symmetry), memoised on the table object
    per ``owner`` (the auto configuration: a Shampoo run asks the same questions every round; a
    changed table file is a new table object, so nothing stale is reused)."""
    try:
        table = auto_table.load_table(table_path, device=device)
    except (InvalidArgumentError, FileNotFoundError) as exc:
        return Plan(None, f"none ({exc})", str(exc), np.empty(0), device, dtype, n, p, target, sym, safe)
    key = (owner, device, precision.info(dtype).name, int(n), p, float(target), sym)
    try:
        hit = table.plans.get(key)
    except TypeError:  # an unhashable user fallback config: no memo
        key, hit = None, None
    if hit is None:
        coverage = table.coverage(device=device, dtype=dtype, n=n, p=p) if sym else ""
        edges = (
            np.empty(0) if coverage or not sym else table.kappa_edges(device=device, dtype=dtype, n=n, p=p)
        )
        hit = Plan(table, table.describe(), coverage, edges, device, dtype, n, p, target, sym, safe)
        if key is not None:
            table.plans[key] = hit
    return hit


def group_decisions(
    plan: Plan, looked: list[float]
) -> list[tuple[Decision, list[int], list[dict[str, Any]]]]:
    """The decision per element (its safety-scaled kappa looked up in the plan), grouped: elements
    that chose the same configuration with the same status are solved as one batch; the cells and
    reasons behind the choice are kept per group."""
    decisions: dict[tuple[str, str], tuple[Decision, list[int], dict[str, dict[str, Any]]]] = {}
    for i, kappa in enumerate(looked):
        d = plan.decision(kappa)
        _, idx, cells = decisions.setdefault((d.label, d.status), (d, [], {}))
        idx.append(i)
        rec = cells.setdefault(d.reason, {"reason": d.reason, "cell": d.cell, "target_used": d.target_used})
        rec.setdefault("elements", []).append(i)
    return [(d, idx, list(cells.values())) for d, idx, cells in decisions.values()]


__all__ = ["Decision", "Plan", "cell_record", "decide", "group_decisions", "plan_for"]
