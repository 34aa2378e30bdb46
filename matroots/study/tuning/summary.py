"""Human-readable summary of a selection table: who wins where, at what cost, accuracy limits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .select import dtype_order


def _band(lo: float, hi: float) -> str:
    return f"[{lo:g},{hi:g})"


def wins(table: pd.DataFrame) -> pd.DataFrame:
    """Per (dtype, target): how many cells each candidate wins, and how many have no candidate."""
    t = table.assign(choice=table["choice"].fillna("NA"))
    c = t.groupby(["dtype", "target", "choice"]).size().rename("cells").reset_index()
    med = t.groupby(["dtype", "target", "choice"])["median_gemm_equivalents"].median().reset_index()
    c = c.merge(med, on=["dtype", "target", "choice"])
    order = {d: i for i, d in enumerate(dtype_order(list(c["dtype"].unique())))}
    return (
        c.assign(_d=c["dtype"].map(order))
        .sort_values(["_d", "target", "cells"], ascending=[True, False, False])
        .drop(columns="_d")
        .reset_index(drop=True)
    )


def accuracy_limits(table: pd.DataFrame) -> pd.DataFrame:
    """Per (dtype, p, kappa band): the tightest target met in every n band, and the best worst error."""
    rows = []
    for (dtype, p, klo, khi), g in table.groupby(["dtype", "p", "kappa_lo", "kappa_hi"]):
        met = g[g["choice"] != "NA"].groupby("n_lo")["target"].min()
        all_n = g["n_lo"].nunique()
        tight = float(met.max()) if len(met) == all_n else np.nan
        rows.append(
            {
                "dtype": dtype,
                "p": int(p),
                "kappa_band": _band(klo, khi),
                "_k": klo,
                "tightest_target_all_n": tight,
                "best_worst_error": float(g["best_effort_error"].min()),
                "best_solver": g.sort_values("best_effort_error").iloc[0]["best_effort"],
            }
        )
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    order = {d: i for i, d in enumerate(dtype_order(list(out["dtype"].unique())))}
    return (
        out.assign(_d=out["dtype"].map(order))
        .sort_values(["_d", "p", "_k"])
        .drop(columns=["_d", "_k"])
        .reset_index(drop=True)
    )


def choice_grid(table: pd.DataFrame, target: float) -> pd.DataFrame:
    """Choice per (dtype, p, kappa band) x n band at one target ("NA" where none meets it)."""
    t = table[np.isclose(table["target"], target)]
    if t.empty:
        return t
    t = t.assign(kappa_band=[_band(a, b) for a, b in zip(t["kappa_lo"], t["kappa_hi"], strict=True)])
    t = t.assign(n_band=[_band(a, b) for a, b in zip(t["n_lo"], t["n_hi"], strict=True)])
    piv = t.pivot_table(
        index=["dtype", "p", "kappa_lo", "kappa_band"],
        columns=["n_lo", "n_band"],
        values="choice",
        aggfunc="first",
    )
    order = {d: i for i, d in enumerate(dtype_order(list(t["dtype"].unique())))}
    piv = piv.sort_index(key=lambda idx: idx.map(order) if idx.name == "dtype" else idx)
    piv = piv.reset_index(level="kappa_lo", drop=True)
    piv.columns = [c[1] for c in piv.columns]
    return piv.fillna("(no cases)")  # "NA" is a cell whose cases no candidate met; no cases: untuned


def format_summary(table: pd.DataFrame, prov: dict[str, Any]) -> str:
    """The text written to summary.txt (and printed by ``matroots tune``)."""
    with pd.option_context("display.width", 250, "display.max_colwidth", 60):  # no global pandas state
        return _format_summary(table, prov)


def _format_summary(table: pd.DataFrame, prov: dict[str, Any]) -> str:
    f = lambda x: f"{x:.3g}"  # noqa: E731
    git = prov.get("git", {})
    parts = [
        f"selection table {prov.get('name')} on {prov.get('device')} ({prov.get('date')}, commit "
        f"{git.get('commit', '?')[:10]}{' dirty' if git.get('dirty') else ''}, {prov.get('units')} cases, "
        f"{prov.get('rows')} rows)",
        f"candidates: {', '.join(prov.get('candidates', []))}",
    ]
    sel = prov.get("selection", {})
    if sel.get("incomplete_cells"):
        parts.append(
            f"WARNING: {sel['incomplete_cells']} cells are built from fewer cases than the config asks for "
            f"({sel['missing_cases']} cases crashed or not run; column missing_cases): resume the tune"
        )
    parts += [
        "",
        "Cells won per candidate (median GEMM-equivalents of the winner's cells):",
        wins(table).to_string(index=False, float_format=f),
        "",
        "Accuracy limits: tightest target met in every n band, and the best worst error of any candidate:",
        accuracy_limits(table).to_string(index=False, float_format=f),
    ]
    for target in sorted(table["target"].unique(), reverse=True):
        parts += ["", f"Choice at target {target:g}:", choice_grid(table, target).to_string()]
    na = table[table["choice"] == "NA"]
    if not na.empty:
        parts += ["", f"{len(na)} cells without a candidate; e.g.:"]
        parts += [f"  {r}" for r in na["reason"].head(8)]
    return "\n".join(parts) + "\n"


__all__ = ["accuracy_limits", "choice_grid", "format_summary", "wins"]
