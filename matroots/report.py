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

import numpy as np
import pandas as pd

KAPPA_BANDS = (1.0, 1e3, 1e6, 1e9, 1e12, np.inf)
DEFAULT_ACCURACY = 1e-2


def kappa_band(kappa: pd.Series) -> pd.Series:
    """Label of the decade band [1e0,1e3), [1e3,1e6), ... each kappa falls in."""
    labels = [
        f"[{lo:.0e},{hi:.0e})" if np.isfinite(hi) else f">={lo:.0e}"
        for lo, hi in itertools.pairwise(KAPPA_BANDS)
    ]
    return pd.cut(kappa, bins=list(KAPPA_BANDS), labels=labels, right=False).astype(str)


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


def best_solver_table(df: pd.DataFrame, accuracy: float = DEFAULT_ACCURACY) -> pd.DataFrame:
    """Cheapest solver meeting ``accuracy`` per (dtype, kappa band, eps); 'none' where none does."""
    d = df.assign(
        band=kappa_band(df["kappa"]), eps_label=eps_label(df), _failed=failed(df), _err=headline_error(df)
    )
    rows = []
    for (dtype, band, eps), grp in d.groupby(["dtype", "band", "eps_label"], sort=True):
        best = None
        for solver, s in grp.groupby("solver"):
            ok = (not s["_failed"].any()) and bool((s["_err"] <= accuracy).all())
            if ok:
                cost = float(s["seconds"].median())
                if best is None or cost < best[1]:
                    best = (solver, cost, float(s["_err"].max()), float(s["matmuls"].median()))
        rows.append(
            {
                "dtype": dtype,
                "kappa_band": band,
                "eps": eps,
                "best_solver": best[0] if best else "none",
                "median_seconds": best[1] if best else np.nan,
                "max_error": best[2] if best else np.nan,
                "median_matmuls": best[3] if best else np.nan,
            }
        )
    return pd.DataFrame(rows)


def format_report(df: pd.DataFrame, accuracy: float = DEFAULT_ACCURACY) -> str:
    """The text ``matroots report`` prints."""
    pd.set_option("display.width", 200)
    s = summary(df)
    b = best_solver_table(df, accuracy)
    return (
        f"{len(df)} rows, {df['solver'].nunique()} solvers, dtypes {sorted(df['dtype'].unique())}\n\n"
        "Per solver x dtype (errors over non-failed cases; relative forward error vs the reference):\n"
        f"{s.to_string(index=False, float_format=lambda x: f'{x:.3g}')}\n\n"
        f"Best solver per (dtype, kappa band, eps): cheapest by median seconds among solvers whose every\n"
        f"case succeeded with relative forward error <= {accuracy:g} (vs the unregularised root where A has one):\n"
        f"{b.to_string(index=False, float_format=lambda x: f'{x:.3g}')}\n"
    )
