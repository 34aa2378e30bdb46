"""Tables computed from a sweep's rows (``matroots report RUN_DIR``).

* :func:`summary`: per solver x dtype, the median and max relative forward error (over cases that did
  not fail), the failure rate, and the median iterations.
* :func:`best_solver_table`: per (dtype, kappa band, eps), the cheapest solver (median seconds) whose
  every case succeeded with a relative forward error <= ``accuracy``. The error is measured against the
  *unregularised* root where A has one (so the eps bias counts against eps), else against the root
  of A + eps I.
"""

from __future__ import annotations

import itertools
import textwrap
from typing import Any

import numpy as np
import pandas as pd

KAPPA_BANDS = (1.0, 1e3, 1e6, 1e9, 1e12, np.inf)
DEFAULT_ACCURACY = 1e-2
#: A kappa band of the decision table holds at least this many of the sweep's kappas (where it has them).
MIN_KAPPAS_PER_BAND = 2


def _edge(x: float) -> str:
    return f"{x:.0e}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")


def kappa_band_edges(kappas: pd.Series | np.ndarray, min_per_band: int = MIN_KAPPAS_PER_BAND) -> list[float]:
    """Band edges for a sweep's kappas: the decade-triple bands :data:`KAPPA_BANDS`, merged with their
    neighbours until each holds at least ``min_per_band`` distinct kappas of the sweep (a band with
    a single kappa is a point, not a band)."""
    vals = np.unique(np.asarray(kappas, dtype=float))
    vals = vals[np.isfinite(vals)]
    edges = list(KAPPA_BANDS)

    def counts(e: list[float]) -> list[int]:
        return [int(((vals >= lo) & (vals < hi)).sum()) for lo, hi in itertools.pairwise(e)]

    # drop empty bands first, then merge the smallest band into its smaller neighbour
    while len(edges) > 2:
        c = counts(edges)
        nonempty = [k for k in c if k]
        if all(k >= min_per_band for k in nonempty) and all(c):
            break
        if not all(c):
            k = c.index(0)
            del edges[k + 1 if k + 1 < len(edges) - 1 else k]
            continue
        k = min(range(len(c)), key=lambda i: (c[i], i))
        if k == 0:
            del edges[1]
        elif k == len(c) - 1:
            del edges[-2]
        else:
            del edges[k if c[k - 1] <= c[k + 1] else k + 1]
    return edges


def kappa_band(kappa: pd.Series, edges: list[float] | None = None) -> pd.Series:
    """Label of the band each kappa falls in; bands from :func:`kappa_band_edges` of these kappas
    unless ``edges`` is given. Labels look like "[1e0,1e6) (1e0,1e3)": the band and the sweep's
    kappas in it."""
    edges = kappa_band_edges(kappa) if edges is None else edges
    vals = np.unique(np.asarray(kappa, dtype=float))
    labels = []
    for lo, hi in itertools.pairwise(edges):
        inside = vals[(vals >= lo) & (vals < hi)]
        rng = f"[{_edge(lo)},{_edge(hi)})" if np.isfinite(hi) else f">={_edge(lo)}"
        labels.append(f"{rng} ({','.join(_edge(v) for v in inside)})")
    return pd.cut(kappa, bins=list(edges), labels=labels, right=False).astype(str)


def eps_label(df: pd.DataFrame) -> pd.Series:
    """'0' or e.g. '1e-12 relative'."""
    return df.apply(lambda r: "0" if r["eps"] == 0 else f"{r['eps']:.0e} {r['eps_mode']}", axis=1)


def failed(df: pd.DataFrame) -> pd.Series:
    """True where the case failed (typed error, non-convergence, non-finite root)."""
    return df["failure"].fillna("").astype(str) != ""


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per solver x dtype: cases, failure_rate, median_error, max_error, median_iterations."""
    d = df.assign(_failed=failed(df))
    ok = d[~d["_failed"]]
    g = d.groupby(["solver", "dtype"], sort=True)
    out = pd.DataFrame({"cases": g.size(), "failure_rate": g["_failed"].mean()})
    gok = ok.groupby(["solver", "dtype"], sort=True)
    out["median_error"] = gok["relative_forward_error"].median()
    out["max_error"] = gok["relative_forward_error"].max()
    out["median_iterations"] = gok["iterations"].median() if "iterations" in ok else np.nan
    return out.reset_index()


def headline_error(df: pd.DataFrame) -> pd.Series:
    """Error vs the unregularised root where it exists, else vs the root of A + eps I."""
    if "forward_error_total" in df:
        return df["forward_error_total"].where(
            df["forward_error_total"].notna(), df["relative_forward_error"]
        )
    return df["relative_forward_error"]


def _dtype_rank(names: pd.Series) -> pd.Series:
    """Precision order of dtype names (fp64, fp32, fp16, bf16): by unit roundoff."""
    from ..core import precision

    return names.map(lambda d: precision.unit_roundoff(d))


def _cost_column(df: pd.DataFrame) -> str:
    """GEMM-equivalents (CPU seconds / one GEMM, measured in the same unit) where the rows have them;
    wall seconds otherwise (rows of sweeps run before the cost columns existed)."""
    if "gemm_equivalents" in df and df["gemm_equivalents"].notna().any():
        return "gemm_equivalents"
    return "seconds"


def _solver_stats(grp: pd.DataFrame, accuracy: float, cost: str) -> pd.DataFrame:
    """One row per solver of a cell (a group of :func:`best_solver_table`): whether every case
    succeeded within ``accuracy`` (``ok``), the median ``cost``, seconds and matmuls of its successful
    cases, its worst error (inf for a failed case) and worst successful error, and its failure rate."""
    stats = []
    for solver, s in grp.groupby("solver"):
        ok = not s["_failed"].any() and bool((s["_err"] <= accuracy).all())
        good = s[~s["_failed"]]
        stats.append(
            {
                "solver": solver,
                "ok": ok,
                "cost": float(good[cost].median()) if len(good) else np.nan,
                "max_error": float(s["_err"].max()),
                "max_ok_error": float(good["_err"].max()) if len(good) else np.nan,
                "failure_rate": float(s["_failed"].mean()),
                "median_seconds": float(good["seconds"].median()) if len(good) else np.nan,
                "median_matmuls": float(good["matmuls"].median())
                if len(good) and "matmuls" in good
                else np.nan,
            }
        )
    return pd.DataFrame(stats)


def _cell_choice(st: pd.DataFrame, accuracy: float, cost: str, where: str) -> dict[str, Any]:
    """A cell's decision from its :func:`_solver_stats`: the cheapest solver meeting ``accuracy`` on
    every case and the runner-up, or "NA" with the reason naming the most accurate solver (``where``:
    the cell, as the reason prints it)."""
    passing = st[st["ok"]].sort_values(["cost", "max_error"])
    if len(passing):
        b, r = passing.iloc[0], passing.iloc[1] if len(passing) > 1 else None
        return {
            "best_solver": b["solver"],
            f"median_{cost}": b["cost"],
            "median_seconds": b["median_seconds"],
            "max_error": b["max_error"],
            "median_matmuls": b["median_matmuls"],
            "runner_up": r["solver"] if r is not None else "NA",
            f"runner_up_{cost}": r["cost"] if r is not None else np.nan,
            "reason": f"cheapest of {len(passing)} solvers meeting {accuracy:g} on every case",
        }
    be = st.sort_values(["failure_rate", "max_ok_error"]).iloc[0]
    err = be["max_error"] if np.isfinite(be["max_error"]) else be["max_ok_error"]
    fails = f" (fails {be['failure_rate']:.0%} of cases)" if be["failure_rate"] > 0 else ""
    err_txt = "NA" if not np.isfinite(err) else f"{err:.2g}"
    return {
        "best_solver": "NA",
        f"median_{cost}": np.nan,
        "median_seconds": np.nan,
        "max_error": np.nan,
        "median_matmuls": np.nan,
        "runner_up": "NA",
        f"runner_up_{cost}": np.nan,
        "reason": f"no solver meets {accuracy:g} at {where}; best is {be['solver']} at {err_txt}{fails}",
    }


def best_solver_table(df: pd.DataFrame, accuracy: float = DEFAULT_ACCURACY) -> pd.DataFrame:
    """Cheapest solver meeting ``accuracy`` per (dtype, p, kappa band, eps), a decision table.

    * kappa bands hold several of the sweep's kappas each (:func:`kappa_band_edges`) and sort
      numerically; dtypes come in precision order (fp64, fp32, fp16, bf16), then p, then eps;
    * "cheapest" is the median GEMM-equivalents (else median seconds) over the band's cases, among the
      solvers whose every case in the band succeeded with error <= ``accuracy``
      (:func:`headline_error`); the runner-up is the next cheapest such solver;
    * where no solver qualifies, ``best_solver`` is "NA" and ``reason`` names the most accurate solver
      and its worst error (e.g. "no solver meets 0.01 at bf16 p=4 kappa [1e3,1e6); best is eigh at
      0.031"); missing numbers are NaN (printed as NA).
    """
    cost = _cost_column(df)
    edges = kappa_band_edges(df["kappa"])
    d = df.assign(
        band=kappa_band(df["kappa"], edges),
        _klo=pd.cut(df["kappa"], bins=list(edges), labels=edges[:-1], right=False).astype(float),
        eps_label=eps_label(df),
        _failed=failed(df),
        _err=headline_error(df),
    )
    d["_err"] = d["_err"].where(~d["_failed"], np.inf).fillna(np.inf)
    rows = []
    for (dtype, p, klo, band, eps_v, eps), grp in d.groupby(
        ["dtype", "p", "_klo", "band", "eps", "eps_label"], sort=True
    ):
        st = _solver_stats(grp, accuracy, cost)
        where = f"{dtype} p={int(p)} kappa {band.split(' ')[0]}" + ("" if eps == "0" else f" eps {eps}")
        base = {
            "dtype": dtype,
            "p": int(p),
            "kappa_band": band,
            "eps": eps,
            "cases": int(grp["unit"].nunique()) if "unit" in grp else len(grp),
            "kappa_lo": float(klo),
            "eps_value": float(eps_v),
        }
        rows.append(base | _cell_choice(st, accuracy, cost, where))
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out = out.assign(_d=_dtype_rank(out["dtype"]))
    out = out.sort_values(["_d", "p", "kappa_lo", "eps_value"], kind="stable")
    return out.drop(columns=["_d", "kappa_lo", "eps_value"]).reset_index(drop=True)


#: Columns of the printed report: its tables fit a terminal this wide (report.txt too).
WIDTH = 100


def fit_table(table: pd.DataFrame, fmt: Any, width: int = WIDTH) -> str:
    """``table`` as text no wider than ``width``: the leading columns that fit side by side, and
    under each row the values of the others as wrapped "column value" lines (NA ones left out);
    the CSV files keep every column."""
    cols = list(table.columns)

    def render(cs: list[str]) -> str:
        return table[cs].to_string(index=False, float_format=fmt, na_rep="NA")

    def wide(text: str) -> int:
        return max((len(line) for line in text.splitlines()), default=0)

    keep = cols[:1]
    for c in cols[1:]:
        if wide(render([*keep, c])) > width:
            break
        keep.append(c)
    text = render(keep)
    rest = cols[len(keep) :]
    if not rest:
        return text
    lines = text.splitlines()
    out = [lines[0]]
    for line, (_, row) in zip(lines[1:], table.iterrows(), strict=True):
        out.append(line)
        values = [
            f"{c} {fmt(row[c]) if isinstance(row[c], float) else row[c]}"
            for c in rest
            if not (pd.isna(row[c]) or row[c] == "NA")
        ]
        if values:
            out.extend(
                textwrap.wrap(", ".join(values), width, initial_indent="    ", subsequent_indent="      ")
            )
    return "\n".join(out)


def _prose(text: str, width: int = WIDTH) -> str:
    return "\n".join(textwrap.wrap(" ".join(text.split()), width))


def format_report(df: pd.DataFrame, accuracy: float = DEFAULT_ACCURACY) -> str:
    """The text ``matroots report`` prints (missing values as NA)."""
    with pd.option_context("display.width", 250, "display.max_colwidth", 90):  # no global pandas state
        return _format_report(df, accuracy)


def _format_report(df: pd.DataFrame, accuracy: float) -> str:
    s = summary(df)
    s = s.assign(_d=_dtype_rank(s["dtype"])).sort_values(["solver", "_d"]).drop(columns="_d")
    b = best_solver_table(df, accuracy)
    fmt = lambda x: "NA" if pd.isna(x) else f"{x:.3g}"  # noqa: E731
    cost = _cost_column(df)
    unit = "GEMM-equivalents (CPU seconds / one GEMM of that n)" if cost == "gemm_equivalents" else "seconds"
    dts = ", ".join(sorted(df["dtype"].unique(), key=lambda x: _dtype_rank(pd.Series([x]))[0]))
    best_intro = _prose(
        f"Best solver per (dtype, p, kappa band, eps): cheapest by median {unit} among solvers whose "
        f"every case succeeded with relative forward error <= {accuracy:g} (vs the unregularised root "
        "where A has one); kappa bands list the sweep's kappas they hold (every column: best_solver.csv):"
    )
    return (
        f"{len(df)} rows, {df['solver'].nunique()} solvers, dtypes {dts}\n\n"
        + _prose(
            "Per solver x dtype (errors over non-failed cases; relative forward error vs the reference):"
        )
        + f"\n{fit_table(s, fmt)}\n\n{best_intro}\n{fit_table(b, fmt)}\n"
    )
