"""The selection step of ``matroots tune``: sweep rows -> selection table.

A *cell* is (device, dtype, p, n band, kappa band); its *cases* are the sweep units whose n and kappa
(the condition number of the matrix actually solved, A + eps I) fall in the bands. For each cell and
each accuracy target the table names the cheapest candidate that met the target on **every** case of
the cell: no failure (typed error, non-convergence, non-finite root) and relative forward error (against
the high-precision reference of the matrix solved) <= target. "Cheapest" is the median of the measured
GEMM-equivalents (process CPU seconds of the solve / CPU seconds of one n x n GEMM in the same dtype,
both measured in the same work unit; see :mod:`matroots.study.tuning.cost`); candidates within the config's
``cost_tolerance`` (default 10%) of the cheapest tie, and the tie goes to the one listed first in the
config (so equal-cost variants such as eigh's rank policies do not flip from cell to cell on timing
noise). The runner-up is the next cheapest passing candidate. Where no candidate passes, the row has
choice "NA" and a reason naming the cell's *best effort*, the most accurate candidate: the smallest
median error over the cell's cases (a failure counts as an infinite error), then the fewest failures,
then the smallest worst error; a candidate that returns the root of another matrix than A + eps I
(:func:`changes_matrix`: eigh's "clamp" and "pseudo_inverse" rank policies) is the best effort only
where no other candidate solved any case of the cell. ``best_effort_error`` is its worst error over
the cases it did not fail. Cases whose reference could not be computed (A + eps I not positive
definite) have no error to judge and are left out (counted in ``excluded_cases``).

A cell built from fewer cases than the config asks for is never silent: given the config's planned
cases (:func:`planned_cases`, what ``matroots tune`` passes), ``missing_cases`` counts the cases of the
cell that have no rows or only ``WorkerCrashed`` rows (no data: not a failure of any candidate), the
reason says "built from k of m cases", a warning is logged, and a cell none of whose cases finished
still gets rows (choice "NA"). A missing case is placed in its cell by its nominal n and kappa.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pandas as pd

from ...core import precision
from ...solvers.auto_table import options_of
from .spec import TuneSpec

log = logging.getLogger("matroots.tune")

CRASHED = "WorkerCrashed"

TABLE_COLUMNS = [
    "device",
    "dtype",
    "p",
    "n_lo",
    "n_hi",
    "kappa_lo",
    "kappa_hi",
    "target",
    "choice",
    "method",
    "options",
    "worst_error",
    "median_gemm_equivalents",
    "median_cpu_seconds",
    "median_matmuls",
    "failure_rate",
    "cases",
    "families",
    "n_seen",
    "kappa_seen_min",
    "kappa_seen_max",
    "runner_up",
    "runner_up_gemm_equivalents",
    "runner_up_worst_error",
    "best_effort",
    "best_effort_error",
    "reason",
    "missing_cases",
]


def dtype_order(names: list[str]) -> list[str]:
    """dtype names in precision order (smallest unit roundoff first: fp64, fp32, fp16, bf16)."""
    return sorted(names, key=lambda d: (precision.unit_roundoff(d), d))


def _band(values: pd.Series, edges: tuple[float, ...]) -> pd.Series:
    """Index i of the band [edges[i], edges[i+1]) of each value; -1 outside."""
    idx = np.searchsorted(np.asarray(edges, dtype=float), values.to_numpy(dtype=float), side="right") - 1
    idx[(idx < 0) | (idx >= len(edges) - 1)] = -1
    return pd.Series(idx, index=values.index)


def case_kappa(rows: pd.DataFrame) -> pd.Series:
    """The condition number of the matrix actually solved (A + eps I) per row, from the reference,
    one value per case and format: the median over its rows (``unit``, ``dtype``). The solvers of a
    case may solve slightly different matrices (the psd policy's shift is certified by Cholesky for the iterative
    methods and by eigh's own spectrum for eigh), so their rows' kappas can straddle a band edge; a
    case must fall in one band for every solver, or the solvers are compared on different cases."""
    k = rows["condition_number"] if "condition_number" in rows else pd.Series(np.nan, index=rows.index)
    for alt in ("kappa_actual", "kappa"):
        if alt in rows:
            k = k.where(k.notna(), rows[alt])
    k = k.astype(float)
    if "unit" in rows:
        keys = [rows[c] for c in ("unit", "dtype") if c in rows]
        k = k.groupby(keys).transform("median")
    return k


# Candidate options under which a solver returns the root of another matrix than A + eps I: eigh's
# rank policies that replace the eigenvalues below a threshold (EighConfig: "clamp" raises them to it,
# "pseudo_inverse" drops them). Their error on an ill-conditioned case is that change, not rounding.
MATRIX_CHANGING_OPTIONS = {"rank_policy": ("clamp", "pseudo_inverse")}


def changes_matrix(options_json: str) -> bool:
    """Whether a candidate with these options (a table row's JSON) solves another matrix."""
    opts = options_of(options_json) if isinstance(options_json, str) else {}
    return any(opts.get(k) in v for k, v in MATRIX_CHANGING_OPTIONS.items())


def best_effort(st: pd.DataFrame) -> pd.Series:
    """The most accurate candidate of a cell's statistics (:func:`_candidate_stats`; see the module
    docstring)."""
    keep = ~st["options"].map(changes_matrix) & (st["failure_rate"] < 1)
    pool = st[keep] if bool(keep.any()) else st
    order = ["median_error", "failure_rate", "worst_ok_error", "median_gemm_equivalents"]
    return pool.sort_values(order, na_position="last").iloc[0]


def _candidate_stats(cell: pd.DataFrame, cases: int) -> pd.DataFrame:
    failed = cell["failure"].fillna("").astype(str) != ""
    err = cell["relative_forward_error"].astype(float).where(~failed, np.inf).fillna(np.inf)
    d = cell.assign(_failed=failed, _err=err)
    g = d.groupby("solver", sort=True)
    ok = d[~d["_failed"]].groupby("solver", sort=True)
    out = pd.DataFrame(
        {
            "rows": g.size(),
            "failure_rate": g["_failed"].mean(),
            "worst_error": g["_err"].max(),
            "median_error": g["_err"].median(),
            "method": g["method"].first(),
            "options": g["options"].first(),
        }
    )
    out["median_gemm_equivalents"] = ok["gemm_equivalents"].median()
    out["median_cpu_seconds"] = ok["cpu_seconds"].median()
    out["median_matmuls"] = ok["matmuls"].median()
    out["complete"] = out["rows"] == cases
    # Worst error over the cases that did not fail (for the reason text of a failed candidate).
    out["worst_ok_error"] = ok["_err"].max()
    return out


def _fmt(x: float) -> str:
    return "NA" if x is None or not np.isfinite(x) else f"{x:.2g}"


def _band_label(lo: float, hi: float) -> str:
    return f"[{lo:g}, {hi:g})"


def planned_cases(spec: TuneSpec) -> pd.DataFrame:
    """Every case the config asks for: one row per (unit, dtype) of its sweeps, with nominal n, p, kappa."""
    from .. import grid as gridmod

    out = []
    for g in spec.sweeps:
        for u in gridmod.units(g):
            for dt in g.dtypes:
                out.append(
                    {"unit": u.key, "dtype": precision.info(dt).name, "n": u.n, "p": u.p, "kappa": u.kappa}
                )
    df = pd.DataFrame(out, columns=["unit", "dtype", "n", "p", "kappa"])
    return df.drop_duplicates(subset=["unit", "dtype"]).reset_index(drop=True)


def _expected_per_cell(
    planned: pd.DataFrame, present: pd.DataFrame, excluded: set[tuple[str, str]], spec: TuneSpec
) -> dict[tuple[Any, ...], int]:
    """Cases the config asks for per cell (device, dtype, p, n band, kappa band): a case with rows is
    counted in the cell of its rows, a missing one in the cell of its nominal n and kappa; cases whose
    reference failed are not expected (they are ``excluded_cases``)."""
    seen = present.drop_duplicates(subset=["unit", "dtype"])
    where = {
        (u, dt): (dev, dt, float(p), int(nb), int(kb))
        for u, dt, dev, p, nb, kb in zip(
            seen["unit"], seen["dtype"], seen["device"], seen["p"], seen["_nb"], seen["_kb"], strict=True
        )
    }
    nb = _band(planned["n"], spec.n_bands)
    kb = _band(planned["kappa"], spec.kappa_bands)
    counts: dict[tuple[Any, ...], int] = {}
    for i, r in enumerate(planned.itertuples()):
        k = (r.unit, r.dtype)
        if k in excluded:
            continue
        cell = where.get(k, (spec.device, r.dtype, float(r.p), int(nb.iloc[i]), int(kb.iloc[i])))
        if cell[3] >= 0 and cell[4] >= 0:
            counts[cell] = counts.get(cell, 0) + 1
    return counts


def select(
    rows: pd.DataFrame, spec: TuneSpec, *, planned: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The selection table of a tune run's rows, and a summary of what was left out.

    ``planned``: the cases the config asks for (:func:`planned_cases`); with it, cells built from fewer
    cases are flagged (``missing_cases``, reason, a logged warning) and cells with no finished case
    appear as "NA" rows. Without it ``missing_cases`` is NA (not checked)."""
    d, excluded, excluded_cases, outside = _judged_rows(rows, spec)
    expected = None if planned is None else _expected_per_cell(planned, d, excluded_cases, spec)
    out: list[dict[str, Any]] = []
    order = {c.label: i for i, c in enumerate(spec.candidates)}
    done_cells = set()
    for (device, dtype, p, nb, kb), cell in d.groupby(["device", "dtype", "p", "_nb", "_kb"], sort=True):
        done_cells.add((device, dtype, float(p), int(nb), int(kb)))
        out.extend(_cell_rows(cell, spec, (device, dtype, p, nb, kb), expected, order))
    for cell, want in sorted((expected or {}).items(), key=str):
        if cell not in done_cells:  # every case of the cell is missing
            out.extend(_empty_cell_rows(cell, want, spec))
    table = _ordered_table(out)
    summary = {"excluded_cases": int(excluded), "cases_outside_bands": int(outside), "rows": len(d)}
    if expected is not None:
        summary.update(_missing_summary(table))
    return table, summary


def _judged_rows(rows: pd.DataFrame, spec: TuneSpec) -> tuple[pd.DataFrame, int, set[tuple[str, str]], int]:
    """The rows that can be judged, with their n and kappa bands (``_nb``, ``_kb``): one per (unit,
    dtype, solver), no ``WorkerCrashed`` rows, a reference, inside the bands; and the cases left out
    (number of units without a reference, their (unit, dtype) cases, number of units outside the bands)."""
    # A case run by two sweeps of the config (same unit key) counts once.
    keys = [c for c in ("unit", "dtype", "solver") if c in rows]
    d = rows.drop_duplicates(subset=keys, keep="first").copy()
    # WorkerCrashed rows hold no data (the unit never ran to the end): a missing case, not a failure.
    d = d[d["failure"].fillna("").astype(str) != CRASHED] if "failure" in d else d
    d["_kappa"] = case_kappa(d)
    has_ref = d["relative_forward_error"].notna() | (d["failure"].fillna("").astype(str) != "")
    if "reference_error" in d:
        has_ref &= d["reference_error"].isna()
    excluded = d.loc[~has_ref, "unit"].nunique()
    excluded_cases = set(zip(d.loc[~has_ref, "unit"], d.loc[~has_ref, "dtype"], strict=True))
    d = d[has_ref]
    d = d.assign(_nb=_band(d["n"], spec.n_bands), _kb=_band(d["_kappa"], spec.kappa_bands))
    outside = d.loc[(d["_nb"] < 0) | (d["_kb"] < 0), "unit"].nunique()
    d = d[(d["_nb"] >= 0) & (d["_kb"] >= 0)]
    if "device" not in d:
        d["device"] = spec.device
    return d, excluded, excluded_cases, outside


def _cell_rows(
    cell: pd.DataFrame,
    spec: TuneSpec,
    ident: tuple[Any, ...],
    expected: dict[tuple[Any, ...], int] | None,
    order: dict[str, int],
) -> list[dict[str, Any]]:
    """The rows of one cell with cases (``ident``: device, dtype, p, n band, kappa band), one per target."""
    device, dtype, p, nb, kb = ident
    cases = cell["unit"].nunique()
    want = None if expected is None else expected.get((device, dtype, float(p), int(nb), int(kb)), cases)
    missing = math.nan if want is None else max(want - cases, 0)
    st = _candidate_stats(cell, cases)
    be = best_effort(st)
    be_err = be["worst_error"] if np.isfinite(be["worst_error"]) else be["worst_ok_error"]
    base = {
        **_cell_identity(spec, device, dtype, p, nb, kb),
        "cases": int(cases),
        "families": ";".join(sorted(cell["family"].unique())),
        "n_seen": ";".join(str(int(x)) for x in sorted(cell["n"].unique())),
        "kappa_seen_min": float(cell["_kappa"].min()),
        "kappa_seen_max": float(cell["_kappa"].max()),
        "best_effort": be.name,
        "best_effort_error": float(be_err),
        "missing_cases": missing,
    }
    short = (
        f"; built from {cases} of {want} cases ({missing} crashed or not run: resume the tune)"
        if want is not None and missing > 0
        else ""
    )
    where = f"{_cell_label(base)} ({cases} cases)"
    out = []
    for target in spec.targets:
        passing, tie = _ranked_passing(st, spec, target, order)
        row = dict(base, target=float(target))
        if passing.empty:
            row.update(_no_choice(spec, target, be, be_err, where, short))
        else:
            row.update(_choice(passing, tie, spec, target, where, short))
        out.append(row)
    return out


def _ranked_passing(
    st: pd.DataFrame, spec: TuneSpec, target: float, order: dict[str, int]
) -> tuple[pd.DataFrame, bool]:
    """The candidates that meet ``target`` (with the margin) on every case, cheapest first, and whether
    the first was moved there by the tie rule (the config's order among costs within cost_tolerance)."""
    bar = spec.margin * target
    passing = st[(st["failure_rate"] == 0) & (st["worst_error"] <= bar) & st["complete"]]
    passing = passing.sort_values(["median_gemm_equivalents", "worst_error"])
    tie = False
    if len(passing) > 1:
        # Costs within cost_tolerance of the cheapest are a tie (timing noise): the candidate
        # listed first in the config wins it, so equal-cost variants do not flip cell to cell.
        cheapest = passing["median_gemm_equivalents"].iloc[0]
        near = passing[passing["median_gemm_equivalents"] <= cheapest * (1 + spec.cost_tolerance)]
        first = min(near.index, key=lambda lab: order.get(lab, len(order)))
        tie = first != passing.index[0]
        passing = pd.concat([passing.loc[[first]], passing.drop(index=first)])
    return passing, tie


def _no_choice(
    spec: TuneSpec, target: float, be: pd.Series, be_err: float, where: str, short: str
) -> dict[str, Any]:
    """The choice columns of a (cell, target) no candidate meets: NA, and the best effort in the reason."""
    fails = f", failing {be['failure_rate']:.0%} of cases" if be["failure_rate"] > 0 else ""
    return dict(
        choice="NA",
        method="NA",
        options="",
        worst_error=math.nan,
        median_gemm_equivalents=math.nan,
        median_cpu_seconds=math.nan,
        median_matmuls=math.nan,
        failure_rate=math.nan,
        runner_up="NA",
        runner_up_gemm_equivalents=math.nan,
        runner_up_worst_error=math.nan,
        reason=f"no candidate meets {target:g}"
        + (f" (with margin {spec.margin:g})" if spec.margin < 1 else "")
        + f" at {where}; best is {be.name} at {_fmt(be_err)}{fails}{short}",
    )


def _choice(
    passing: pd.DataFrame, tie: bool, spec: TuneSpec, target: float, where: str, short: str
) -> dict[str, Any]:
    """The choice columns of a (cell, target) with passing candidates: the first, and the runner-up."""
    c = passing.iloc[0]
    r = passing.iloc[1] if len(passing) > 1 else None
    return dict(
        choice=c.name,
        method=c["method"],
        options=c["options"],
        worst_error=float(c["worst_error"]),
        median_gemm_equivalents=float(c["median_gemm_equivalents"]),
        median_cpu_seconds=float(c["median_cpu_seconds"]),
        median_matmuls=float(c["median_matmuls"]),
        failure_rate=float(c["failure_rate"]),
        runner_up=r.name if r is not None else "NA",
        runner_up_gemm_equivalents=float(r["median_gemm_equivalents"]) if r is not None else math.nan,
        runner_up_worst_error=float(r["worst_error"]) if r is not None else math.nan,
        reason=(
            f"first in the config's order among the candidates within "
            f"{spec.cost_tolerance:.0%} of the cheapest"
            if tie
            else "cheapest"
        )
        + f" (median {c['median_gemm_equivalents']:.3g} GEMM-equivalents) of "
        f"{len(passing)} candidates meeting {target:g} on every case at {where}{short}",
    )


def _ordered_table(out: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as a table: by device, dtype (precision order), p, n and kappa band, target descending."""
    table = pd.DataFrame(out, columns=TABLE_COLUMNS)
    if not table.empty:
        order = {d: i for i, d in enumerate(dtype_order(list(table["dtype"].unique())))}
        table = (
            table.assign(_d=table["dtype"].map(order))
            .sort_values(["device", "_d", "p", "n_lo", "kappa_lo", "target"], ascending=[1, 1, 1, 1, 1, 0])
            .drop(columns="_d")
            .reset_index(drop=True)
        )
    return table


def _missing_summary(table: pd.DataFrame) -> dict[str, int]:
    """The summary's count of cells built from fewer cases than planned, and of their missing cases."""
    cells = table.drop_duplicates(subset=["device", "dtype", "p", "n_lo", "kappa_lo"])
    short = cells[cells["missing_cases"] > 0]
    out = {"incomplete_cells": len(short), "missing_cases": int(short["missing_cases"].sum())}
    if len(short):
        log.warning(
            "%d of %d selection cells are built from fewer cases than the config asks for (%d cases "
            "missing: crashed or not run; see the missing_cases column); resume the tune to fill them",
            len(short),
            len(cells),
            out["missing_cases"],
        )
    return out


def _cell_identity(spec: TuneSpec, device: str, dtype: str, p: float, nb: int, kb: int) -> dict[str, Any]:
    """The columns that name a selection cell: device, dtype, p and its n and kappa band edges."""
    return {
        "device": device,
        "dtype": dtype,
        "p": int(p),
        "n_lo": int(spec.n_bands[nb]),
        "n_hi": int(spec.n_bands[nb + 1]),
        "kappa_lo": float(spec.kappa_bands[kb]),
        "kappa_hi": float(spec.kappa_bands[kb + 1]),
    }


def _cell_label(key: dict[str, Any]) -> str:
    """A cell named for a person: dtype, p, and the n and kappa bands."""
    return (
        f"{key['dtype']} p={key['p']} n {_band_label(key['n_lo'], key['n_hi'])} "
        f"kappa {_band_label(key['kappa_lo'], key['kappa_hi'])}"
    )


def _empty_cell_rows(cell: tuple[Any, ...], want: int, spec: TuneSpec) -> list[dict[str, Any]]:
    device, dtype, p, nb, kb = cell
    key = _cell_identity(spec, device, dtype, p, nb, kb)
    where = _cell_label(key)
    return [
        {
            **key,
            "target": float(t),
            "choice": "NA",
            "method": "NA",
            "options": "",
            "cases": 0,
            "families": "",
            "n_seen": "",
            "runner_up": "NA",
            "best_effort": "NA",
            "missing_cases": int(want),
            "reason": f"no case of {where} finished ({want} asked for: crashed or not run); resume the tune",
        }
        for t in spec.targets
    ]


__all__ = [
    "MATRIX_CHANGING_OPTIONS", "TABLE_COLUMNS", "best_effort", "case_kappa", "changes_matrix", "dtype_order",
    "planned_cases", "select",
]  # fmt: skip
