"""The study's findings, computed from the shipped results: the generated blocks of docs/findings.md.

    python paper_figs/findings.py            # print every finding's block
    python paper_figs/findings.py --write    # regenerate the blocks of docs/findings.md in place
    python paper_figs/findings.py --check    # exit 1 when docs/findings.md differs from the results

Each finding is one function of the shipped rows (``results/<name>/``, read with
:func:`matroots.study.shipped.load`, which checks them against their provenance and the repository's config)
returning markdown: its table(s), a computed one-line reading, the coverage of the rows it used
(units done / total from the provenance: a partial study says so) and the figure and command it goes
with. docs/findings.md holds the hand-written prose; between ``<!-- finding:NAME BEGIN -->`` and
``<!-- finding:NAME END -->`` it holds exactly what :data:`FINDINGS` ``[NAME]`` returns, so no number
in a block is typed by hand and ``--check`` (run by tests/test_findings.py) fails when the document and
the data disagree.

Conventions shared by every table: kappa is the measured condition number of A binned to decades
(:func:`matroots.study.figure_style.kappa_bin`, as in the figures); a failed solve (its ``failure`` field set)
counts as an infinite error in every median, so a median is finite only where at least half the cases
solved; "err" is the relative forward error in the Frobenius norm.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
DOC = ROOT / "docs" / "findings.md"
EPS_STUDY = "eps_regularisation"
PRECISION_STUDY = "precision_full"
SELECTION_TABLE = ROOT / "matroots" / "data" / "selection_cpu.csv"
FIGS = "paper_figs/out/full"
FIG_COMMAND = "make figures FULL=1"
COMMAND = "python paper_figs/findings.py --write"

#: Meta's distributed_shampoo: ``epsilon = 1e-12`` added to the factor (A + eps I, absolute), root
#: by eigendecomposition in the factor's dtype (fp32), retried in fp64 only when the eigensolver fails.
META_EPS, META_MODE, META_SOLVER = 1e-12, "absolute", "eigh"
#: Google's scalable_shampoo: ``matrix_epsilon = 1e-6`` times lambda_max (power iteration;
#: ``relative_matrix_epsilon = True``), root by the coupled Newton iteration.
GOOGLE_EPS, GOOGLE_MODE, GOOGLE_SOLVER = 1e-6, "relative", "coupled_newton"

DTYPES = ("fp64", "fp32", "bf16", "fp16")
#: kappa bands of the accuracy table: [lo, hi) in decades of the measured kappa
BANDS = ((1.0, 1e4), (1e4, 1e8), (1e8, 1e12), (1e12, math.inf))


# --- the rows ------------------------------------------------------------------------------------------


def _style():
    from matroots.study import figure_style

    return figure_style


def load(name: str, results: Path = RESULTS) -> tuple[pd.DataFrame, dict]:
    """The shipped rows of study ``name`` and their provenance (checked against the repo's config)."""
    from matroots.study import shipped

    where = results / name
    rows = shipped.load(where, repo_root=ROOT)
    for c in rows.columns:
        if isinstance(rows[c].dtype, pd.CategoricalDtype):
            rows[c] = rows[c].astype(str)
    return rows, shipped.read_provenance(where)


def coverage(prov: dict) -> str:
    """One line: which rows a block used, and whether the study they come from is complete."""
    done, total = prov.get("units_done"), prov.get("units_total")
    state = (
        "complete"
        if prov.get("complete")
        else "**PARTIAL**: the numbers below change as the study completes (reship, then rerun the command)"
    )
    commits = ", ".join(c[:10] for c in prov.get("commits", []))
    return (
        f"_Rows: `results/{prov['name']}` ({prov['config']}, hash {prov['config_hash']}), "
        f"{done}/{total} units ({state}), {prov.get('rows')} rows, commit {commits}, "
        f"shipped {prov.get('shipped', '?')[:10]}._"
    )


def failed(df: pd.DataFrame) -> pd.Series:
    return _style().failed(df)


def is_refusal(df: pd.DataFrame) -> pd.Series:
    """True where the solver refused an input outside its domain (a :class:`MatrootsInputError`:
    e.g. ``UnsupportedExponentError`` for newton_schulz at p = 3, ``NotSymmetricError`` for the SPD
    methods on a non-symmetric matrix). Those cases say nothing about accuracy or precision, so the
    precision study's tables leave them out (and count them); numerical failures stay in."""
    from matroots.core import errors

    def refusal(name: str) -> bool:
        cls = getattr(errors, name, None) if name else None
        return isinstance(cls, type) and issubclass(cls, errors.MatrootsInputError)

    names = df["failure"].fillna("").astype(str)
    return names.map({n: refusal(n) for n in names.unique()}).astype(bool)


def in_domain(df: pd.DataFrame) -> pd.DataFrame:
    return df[~is_refusal(df)]


def _refusals_line(rows: pd.DataFrame) -> str:
    r = rows[is_refusal(rows)]
    if r.empty:
        return "No solve was refused as outside its method's domain."
    kinds = r.groupby(["solver", "failure"]).size()
    return (
        "Left out as outside the method's domain (typed refusals, not failures): "
        + ", ".join(f"{s} {f} {n}" for (s, f), n in kinds.items() if n)
        + "."
    )


def kappa_decade(df: pd.DataFrame) -> pd.Series:
    return _style().kappa_bin(df)


def error_or_inf(df: pd.DataFrame, col: str = "relative_forward_error") -> pd.Series:
    """``col`` with failed solves (and solves with no error measured) as +inf."""
    e = df[col].astype(float)
    return e.where(~failed(df) & e.notna(), np.inf)


def total_error(df: pd.DataFrame) -> pd.Series:
    """Error against the root of the unregularised A (eps bias + rounding); at eps = 0 that is the
    error against the matrix solved. NaN where A itself has no root (rank-deficient A)."""
    tot = df["forward_error_total"].astype(float)
    at0 = df["eps_abs"].astype(float) == 0
    return tot.where(~at0, df["relative_forward_error"].astype(float))


def total_or_inf(df: pd.DataFrame) -> pd.Series:
    """:func:`total_error` with failed solves as +inf; NaN (skipped by the medians) where A has no
    root to compare with (a singular A regularised by eps: a success, but no total error)."""
    return total_error(df).where(~failed(df), np.inf)


def _by_kappa_dtype(tab: pd.DataFrame, kappa: pd.Series) -> pd.DataFrame:
    """Rows ordered family, numeric kappa, dtype (fp64 first)."""
    key = tab.assign(_k=kappa.to_numpy(), _o=tab["dtype"].map({t: i for i, t in enumerate(DTYPES)}))
    return key.sort_values(["family", "_k", "_o"], kind="stable").drop(columns=["_k", "_o"])


def full_rank(df: pd.DataFrame) -> pd.DataFrame:
    """The rows whose A has an inverse root (finite kappa of A): the only ones with a total error, so
    that medians over eps = 0 and eps > 0 are over the same matrices."""
    return df[np.isfinite(df["kappa_actual"].astype(float))]


def eps_label(eps: float, mode: str) -> str:
    return "0" if eps == 0 else f"{eps:.0e} {'rel' if mode == 'relative' else 'abs'}"


def fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return "fail"
    return "0" if x == 0 else f"{x:.1e}"


def pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.0f}%"


def kfmt(k: float) -> str:
    return "none" if k is None or (isinstance(k, float) and math.isnan(k)) else f"1e{round(math.log10(k))}"


def table(df: pd.DataFrame) -> str:
    """A plain markdown table of a frame (index dropped; every cell already a string)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _order(values: Iterable[str], first: Iterable[str] = DTYPES) -> list[str]:
    vals = list(dict.fromkeys(values))
    return [v for v in first if v in vals] + sorted(v for v in vals if v not in first)


def _figure(name: str, what: str) -> str:
    return f"Figure: [`{FIGS}/{name}.png`](../{FIGS}/{name}.png) ({what}; `{FIG_COMMAND}`)."


# --- computations (tested on synthetic frames in tests/test_findings.py) -------------------------------


def precision_limits(df: pd.DataFrame, threshold: float = 1e-2, fail_rate: float = 0.1) -> pd.DataFrame:
    """Per solver x dtype, where the working precision stops being enough, at eps = 0.

    Columns: ``kappa_err``, the smallest kappa decade whose median error (failures infinite) exceeds
    ``threshold``; ``kappa_fail``, the smallest decade whose failure rate exceeds ``fail_rate``;
    ``kappa_theory``, the smallest decade whose median cond(f, A) u exceeds ``threshold`` (where no
    stable method can be expected to meet it); ``kappa_max``, the largest decade measured. NaN where
    no decade measured crosses.
    """
    df = in_domain(df)
    d = df[df["eps"] == 0].assign(_k=kappa_decade(df), _e=error_or_inf(df), _f=failed(df))
    out = []
    for (s, t), g in d.groupby(["solver", "dtype"], sort=True):
        per = g.groupby("_k").agg(e=("_e", "median"), f=("_f", "mean"), c=("cond_u_line", "median"))
        per = per.sort_index()

        def first(mask: pd.Series, index: pd.Index = per.index) -> float:
            hit = index[mask.to_numpy()]
            return float(hit[0]) if len(hit) else math.nan

        out.append(
            {
                "solver": s,
                "dtype": t,
                "kappa_err": first(per["e"] > threshold),
                "kappa_fail": first(per["f"] > fail_rate),
                "kappa_theory": first(per["c"] > threshold),
                "kappa_max": float(per.index.max()),
            }
        )
    return pd.DataFrame(out)


def least_error_eps(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: the eps (value, mode) whose median total error (failures infinite) is least.

    Total error is measured against the root of the unregularised A (:func:`total_error`), so it is
    the eps bias plus the rounding error. Ties go to the smaller eps. Columns: ``by`` + eps, eps_mode,
    error (that median), fail (its failure rate), error_eps0 (the median at eps = 0).
    """
    d = df.assign(_t=total_error(df))
    d = d[d["_t"].notna() | failed(d)]
    d = d.assign(_t=d["_t"].where(~failed(d), np.inf), _f=failed(d))
    per = d.groupby([*by, "eps", "eps_mode"], observed=True).agg(error=("_t", "median"), fail=("_f", "mean"))
    per = per.reset_index().sort_values([*by, "error", "eps"], kind="stable")
    best = per.groupby(by, observed=True).head(1).reset_index(drop=True)
    zero = per[per["eps"] == 0].groupby(by, observed=True)["error"].min().rename("error_eps0")
    return best.merge(zero.reset_index(), on=by, how="left")


def pareto(points: pd.DataFrame, cost: str = "cost", error: str = "error") -> pd.Series:
    """True for the points no other point beats in both cost and error (ties in cost: least error)."""
    order = points.sort_values([cost, error], kind="stable")
    best, keep = math.inf, pd.Series(False, index=points.index)
    for i, e in zip(order.index, order[error], strict=True):
        if e < best:
            keep[i] = True
            best = e
    return keep


# --- the findings --------------------------------------------------------------------------------------


def accuracy_vs_cond(rows: pd.DataFrame, prov: dict) -> str:
    """Accuracy per solver x dtype x kappa band against the cond(f, A) u line (eps = 0)."""
    d = in_domain(rows[rows["eps"] == 0])
    d = d.assign(_k=kappa_decade(d), _e=error_or_inf(d), _f=failed(d))
    d = d.assign(_r=(d["_e"] / d["cond_u_line"].astype(float).clip(lower=1e-300)))
    out = []
    for t in _order(d["dtype"]):
        for s in sorted(d.loc[d["dtype"] == t, "solver"].unique()):
            g = d[(d["dtype"] == t) & (d["solver"] == s)]
            row = {"dtype": t, "solver": s}
            for lo, hi in BANDS:
                b = g[(g["_k"] >= lo) & (g["_k"] < hi)]
                label = f"κ {kfmt(lo)}–{kfmt(hi)}" if math.isfinite(hi) else f"κ ≥ {kfmt(lo)}"
                if b.empty:
                    row[label] = "–"
                    continue
                ok = b[~b["_f"]]
                ratio = ok["_r"].median() if len(ok) else math.nan
                row[label] = f"{fmt(b['_e'].median())} ({fmt(ratio)}×, {pct(b['_f'].mean())})"
            out.append(row)
    tab = pd.DataFrame(out)
    ok = d[~d["_f"] & np.isfinite(d["_r"])]
    within = (ok["_r"] <= 10).mean() if len(ok) else math.nan
    reading = (
        f"Reading: of {len(ok)} successful solves at eps = 0, {pct(within)} are within 10 cond(f,A)·u "
        f"of the reference; {int(d['_f'].sum())} of {len(d)} solves failed (typed)."
    )
    return "\n\n".join(
        [
            coverage(prov),
            "Cell: median error (failures infinite) · (median error / cond(f,A)·u over the successful "
            "solves) · failure rate; eps = 0, every family and n shipped, refusals of inputs outside a "
            "method's domain left out (listed below the table).",
            table(tab),
            reading,
            _refusals_line(rows[rows["eps"] == 0]),
            _figure("error_vs_kappa", "error vs κ per dtype against (κ/p)u and cond(f,A)·u")
            + " "
            + _figure("cond_error_ratio", "error / cond(f,A)·u per solver"),
        ]
    )


def _limits_table(lim: pd.DataFrame, dtypes: Iterable[str]) -> str:
    d = lim[lim["dtype"].isin(list(dtypes))]
    out = []
    for s in sorted(d["solver"].unique()):
        row = {"solver": s}
        for t in _order(d["dtype"]):
            r = d[(d["solver"] == s) & (d["dtype"] == t)]
            if r.empty:
                row[t] = "–"
                continue
            r = r.iloc[0]
            row[t] = (
                f"{kfmt(r['kappa_err'])} / {kfmt(r['kappa_fail'])} / {kfmt(r['kappa_theory'])} "
                f"(≤ {kfmt(r['kappa_max'])})"
            )
        out.append(row)
    return table(pd.DataFrame(out))


def fp32_limit(rows: pd.DataFrame, prov: dict, threshold: float = 1e-2, fail_rate: float = 0.1) -> str:
    """Where fp32 stops being enough for each method (Anil et al. 2020 §3), with fp64 beside it."""
    lim = precision_limits(rows, threshold, fail_rate)
    f32 = lim[lim["dtype"] == "fp32"]
    reading = "Reading: no fp32 rows."
    if len(f32):
        ke = f32["kappa_err"]
        kt = f32["kappa_theory"].dropna()
        match = int((f32["kappa_err"] >= f32["kappa_theory"]).sum())
        reading = (
            f"Reading: in fp32 the median error first exceeds {threshold:g} at κ = {kfmt(ke.min())} "
            f"(the earliest method) to {kfmt(ke.max())} (the latest); cond(f,A)·u itself passes "
            f"{threshold:g} at κ = {kfmt(kt.min() if len(kt) else math.nan)}; {match} of {len(f32)} "
            "methods hold out until the conditioning limit."
        )
        d32 = in_domain(rows[(rows["dtype"] == "fp32") & (rows["eps"] == 0)])
        kinds = d32.loc[failed(d32), "failure"].value_counts()
        reading += (
            " fp32 failures at eps = 0 by type: "
            + (", ".join(f"{k} {v}" for k, v in kinds.items()) or "none")
            + "."
        )
    return "\n\n".join(
        [
            coverage(prov),
            f"Cell: κ where the median error exceeds {threshold:g} / κ where more than "
            f"{100 * fail_rate:.0f}% of the solves fail / κ where cond(f,A)·u exceeds {threshold:g} "
            "(no method can be expected to do better) (largest κ measured); eps = 0.",
            _limits_table(lim, ("fp64", "fp32")),
            reading,
            _figure("failure_heatmap", "failure rate per solver × κ × dtype"),
        ]
    )


def low_precision(rows: pd.DataFrame, prov: dict, threshold: float = 1e-1, fail_rate: float = 0.1) -> str:
    """bf16 / fp16 limits: the same table as fp32's at a looser target."""
    lim = precision_limits(rows, threshold, fail_rate)
    d = in_domain(rows[rows["dtype"].isin(["bf16", "fp16"])])
    kinds = d.loc[failed(d), "failure"].value_counts()
    fails = ", ".join(f"{k} {v}" for k, v in kinds.items()) or "none"
    lo = lim[lim["dtype"].isin(["bf16", "fp16"])]
    reading = (
        f"Reading: in 16-bit formats the median error first exceeds {threshold:g} at κ = "
        f"{kfmt(lo['kappa_err'].min())} (earliest method) to {kfmt(lo['kappa_err'].max())}; "
        f"failures by type: {fails}."
        if len(lo)
        else "Reading: no 16-bit rows."
    )
    return "\n\n".join(
        [
            coverage(prov),
            f"Cell as in the fp32 table, at the target {threshold:g}.",
            _limits_table(lim, ("bf16", "fp16")),
            reading,
            _figure("error_vs_kappa", "bf16 and fp16 panels"),
        ]
    )


def _solvers_no_pinv(rows: pd.DataFrame) -> pd.DataFrame:
    # eigh's pseudo-inverse policy solves another matrix (the root on the range of A): never a
    # candidate for "least error against A^(-1/p)" (docs/design.md §7, best effort)
    return rows[~rows["solver"].astype(str).str.contains("pseudo_inverse")]


def eps_bias(rows: pd.DataFrame, prov: dict) -> str:
    """Bias vs rounding across eps on full-rank matrices (randsvd, lambda_max = 1: eps relative =
    absolute), per kappa and dtype; solvers pooled (not eigh's pseudo-inverse policy)."""
    d = _solvers_no_pinv(rows)
    d = d[(d["family"] == "randsvd") & ((d["eps_mode"] == "relative") | (d["eps"] == 0))]
    d = d.assign(_t=total_or_inf(d), _r=error_or_inf(d), _f=failed(d))
    out = []
    for (k, e), g in d.groupby(["kappa", "eps"], sort=True):
        row = {"κ": kfmt(k), "eps (rel)": fmt(e), "bias (exact)": fmt(g["eps_bias"].median() if e else 0.0)}
        for t in _order(g["dtype"]):
            h = g[g["dtype"] == t]
            row[t] = f"{fmt(h['_t'].median())} / {fmt(h['_r'].median())} · {pct(h['_f'].mean())}"
        out.append(row)
    tab = pd.DataFrame(out)
    # where the bias alone passes the fp64 rounding error: eps buys nothing there but bias
    f64 = d[(d["dtype"] == "fp64") & (d["eps"] == 0)].groupby("kappa")["_r"].median()
    b = d[d["eps"] > 0].groupby(["kappa", "eps"])["eps_bias"].median()
    ratio = {k: b.xs(k, level="kappa").loc[1e-12] / f64.loc[k] for k in f64.index if (k, 1e-12) in b.index}
    reading = "Reading: " + "; ".join(
        f"at κ = {kfmt(k)} the smallest eps (1e-12 rel) adds a bias {r:.0e}× the fp64 rounding error"
        for k, r in ratio.items()
    )
    return "\n\n".join(
        [
            coverage(prov),
            "Cell (per dtype): median total error against A^(-1/p) / median rounding error against "
            "(A + eps I)^(-1/p) · failure rate; the bias column is ‖(A+eps I)^(-1/p) − A^(-1/p)‖/‖A^(-1/p)‖ "
            "from the references (no rounding). randsvd, n = 64, p ∈ {2, 4}, 2 seeds, eigh / coupled "
            "Newton / Schur–Newton pooled.",
            table(tab),
            reading + ".",
            _figure("eps_bias_vs_rounding", "bias, rounding and total error vs eps, least-error eps starred"),
        ]
    )


def eps_minimiser(rows: pd.DataFrame, prov: dict) -> str:
    """The eps of least total error per family/kappa x dtype x solver (all eps settings, both modes)."""
    d = _solvers_no_pinv(rows)
    d = full_rank(d[d["family"].isin(["randsvd", "shampoo"])])
    best = least_error_eps(d, ["family", "kappa", "dtype", "solver"])
    out, kap = [], []
    for (f, k, t), g in best.groupby(["family", "kappa", "dtype"], sort=False):
        row = {"family": f, "κ": kfmt(k) if f != "shampoo" else "real factors", "dtype": t}
        for r in g.itertuples():
            row[r.solver] = f"{eps_label(r.eps, r.eps_mode)} ({fmt(r.error)}; eps=0: {fmt(r.error_eps0)})"
        out.append(row)
        kap.append(k)
    tab = _by_kappa_dtype(pd.DataFrame(out), pd.Series(kap))
    zero_best = int((best["eps"] == 0).sum())
    rescue = best[(best["eps"] > 0) & np.isinf(best["error_eps0"])]
    better = best[(best["eps"] > 0) & np.isfinite(best["error_eps0"])]
    gain = (better["error_eps0"] / better["error"]).max() if len(better) else math.nan
    reading = (
        f"Reading: of {len(best)} (family, κ, dtype, solver) cells, the least total error is at eps = 0 "
        f"(or tied with it) in {zero_best}; eps rescues a failing eps = 0 in {len(rescue)} (of which "
        f"{int((rescue['error'] > 0.1).sum())} still with a total error above 0.1); eps beats a "
        f"successful eps = 0 in {len(better)}, by at most a factor {gain:.1f}."
    )
    return "\n\n".join(
        [
            coverage(prov),
            "Cell: the eps (of the 9 settings) of least median total error against A^(-1/p) (failures "
            "infinite; ties to the smaller eps) (that error; the error at eps = 0). Full-rank matrices "
            "only: singular ones (lowrank, 4 of the real factors) have no A^(-1/p) and are in the next "
            "table.",
            table(tab),
            reading,
            _figure("eps_bias_vs_rounding", "least-error eps starred"),
        ]
    )


def eps_rank_deficient(rows: pd.DataFrame, prov: dict) -> str:
    """What eps buys where A is singular (lowrank and singular real factors): which eps lets each
    solver succeed, and absolute vs relative eps on the real factors' scales."""
    d = _solvers_no_pinv(rows)
    low = d[d["family"] == "lowrank"].assign(_f=failed(d))
    out = []
    for t in _order(low["dtype"]):
        row = {"dtype": t}
        for s in sorted(low["solver"].unique()):
            g = low[(low["dtype"] == t) & (low["solver"] == s)]
            rate = g.groupby(["eps_mode", "eps"])["_f"].mean()
            rel = (
                rate.xs("relative", level="eps_mode")
                if "relative" in rate.index.get_level_values(0)
                else rate
            )
            ok = rel[(rel.index > 0) & (rel == 0)]
            row[s] = fmt(float(ok.index.min())) + " rel" if len(ok) else "none"
        out.append(row)
    # absolute vs relative: one absolute eps is a different relative eps on each real factor
    sh = rows[(rows["family"] == "shampoo") & (rows["eps_mode"] == "relative") & (rows["eps"] > 0)]
    lam = (sh["eps_abs"] / sh["eps"]).groupby([sh["n"], sh["seed"]]).median()
    spread = (
        f"The {len(lam)} real factors have λmax from {lam.min():.1e} to {lam.max():.1e}: an absolute eps "
        f"of 1e-8 is a relative eps from {1e-8 / lam.max():.0e} to {1e-8 / lam.min():.0e} on them, and "
        f"Meta's absolute {META_EPS:g} is a relative {META_EPS / lam.max():.0e} to {META_EPS / lam.min():.0e}."
        if len(lam)
        else ""
    )
    return "\n\n".join(
        [
            coverage(prov),
            "Cell: the smallest relative eps at which every solve of the rank-deficient G Gᵀ "
            "(family lowrank, n = 64, κ of the range 1e4/1e8/1e12, p ∈ {2, 4}) succeeds ('none': no "
            "eps in the grid does).",
            table(pd.DataFrame(out)),
            spread,
            _figure("failure_heatmap", "failure rate per solver × κ × dtype"),
        ]
    )


def eps_defaults(rows: pd.DataFrame, prov: dict) -> str:
    """Meta's and Google's eps defaults against the least-error eps, on randsvd (lambda_max = 1, so
    Meta's absolute 1e-12 is the relative 1e-12 row) and on the real factors (Google's only: Meta's
    1e-12 absolute is no grid point there)."""
    d = _solvers_no_pinv(rows)
    d = full_rank(d[d["family"].isin(["randsvd", "shampoo"])])
    d = d.assign(_t=total_or_inf(d), _f=failed(d))

    def cell(g: pd.DataFrame) -> str:
        return f"{fmt(g['_t'].median())} · {pct(g['_f'].mean())}" if len(g) else "–"

    best = least_error_eps(d, ["family", "kappa", "dtype"])
    out, kap = [], []
    for r in best.itertuples():
        kap.append(r.kappa)
        g = d[(d["family"] == r.family) & (d["kappa"] == r.kappa) & (d["dtype"] == r.dtype)]
        meta = g[(g["solver"] == META_SOLVER) & (g["eps"] == META_EPS)]
        # randsvd has lambda_max = 1 (relative = absolute); on the real factors 1e-12 abs is no grid point
        meta = meta[meta["eps_mode"] == "relative"] if r.family == "randsvd" else meta.iloc[:0]
        goo = g[(g["solver"] == GOOGLE_SOLVER) & (g["eps"] == GOOGLE_EPS) & (g["eps_mode"] == GOOGLE_MODE)]
        e0 = g[g["eps"] == 0]
        out.append(
            {
                "family": r.family,
                "κ": kfmt(r.kappa) if r.family != "shampoo" else "real factors",
                "dtype": r.dtype,
                "eps = 0 (all solvers)": cell(e0),
                "Meta: eigh, 1e-12": cell(meta),
                "Google: coupled Newton, 1e-6 rel": cell(goo),
                "least-error eps (all solvers)": f"{eps_label(r.eps, r.eps_mode)}: {fmt(r.error)} · {pct(r.fail)}",
            }
        )
    tab = _by_kappa_dtype(pd.DataFrame(out), pd.Series(kap))
    return "\n\n".join(
        [
            coverage(prov),
            "Cell: median total error against A^(-1/p) (failures infinite) · failure rate; full-rank "
            "matrices only (singular factors have no A^(-1/p)).",
            table(tab),
            _figure("eps_bias_vs_rounding", "bias vs rounding per κ and dtype"),
        ]
    )


def shampoo_factors(rows: pd.DataFrame, prov: dict) -> str:
    """The real Shampoo factors: their conditioning, and each solver's error and failures on them."""
    d = rows[rows["family"] == "shampoo"]
    if d.empty:
        return "\n\n".join([coverage(prov), "No rows of family `shampoo` shipped yet."])
    units = d.drop_duplicates(["n", "seed"])
    k = units["kappa_actual"].astype(float)
    info = (
        f"{len(units)} factors (n ∈ {sorted(units['n'].unique().tolist())}): {int(np.isinf(k).sum())} "
        f"singular (rank-deficient); κ of the others from {k[np.isfinite(k)].min():.1e} to "
        f"{k[np.isfinite(k)].max():.1e}."
    )
    d = d.assign(_r=error_or_inf(d), _t=total_or_inf(d), _f=failed(d))
    settings = [(0.0, "absolute"), (1e-8, "absolute"), (GOOGLE_EPS, GOOGLE_MODE)]
    out = []
    for s in sorted(d["solver"].unique()):
        for t in _order(d["dtype"]):
            row = {"solver": s, "dtype": t}
            for e, m in settings:
                g = d[(d["solver"] == s) & (d["dtype"] == t) & (d["eps"] == e)]
                g = g if e == 0 else g[g["eps_mode"] == m]
                col = "_r" if e == 0 else "_t"
                err = full_rank(g)[col].median()
                row[f"eps {eps_label(e, m)}"] = f"{fmt(err)} · {pct(g['_f'].mean())}"
            out.append(row)
    return "\n\n".join(
        [
            coverage(prov),
            info,
            "Cell: median error over the full-rank factors (failures infinite; eps = 0: against the "
            "factor's root; eps > 0: total, against the unregularised factor's root) · failure rate over "
            "all factors (the singular ones fail at eps = 0 by construction).",
            table(pd.DataFrame(out)),
            _figure("shampoo_factors", "spectra by training stage, solver errors on them"),
        ]
    )


def band_costs(rows: pd.DataFrame) -> dict[tuple[str, float, float], pd.DataFrame]:
    """Per (dtype, kappa band below 1e8) with rows: each solver's median cost (GEMM-equivalents), median
    error (failures infinite) and failure rate at eps = 0 on the symmetric families, in its domain."""
    rows = in_domain(rows)
    d = rows[(rows["eps"] == 0)].assign(_k=kappa_decade(rows), _e=error_or_inf(rows), _f=failed(rows))
    d = d[d["family"] != "nonsymmetric"]
    out = {}
    for t in _order(d["dtype"]):
        for lo, hi in BANDS[:2]:
            b = d[(d["dtype"] == t) & (d["_k"] >= lo) & (d["_k"] < hi)]
            if b.empty:
                continue
            pts = b.groupby("solver").agg(
                cost=("gemm_equivalents", "median"), error=("_e", "median"), fail=("_f", "mean")
            )
            out[(t, lo, hi)] = pts[pts["cost"].notna()]
    return out


def cost_frontier(rows: pd.DataFrame, prov: dict) -> str:
    """Cost (GEMM-equivalents) against accuracy per dtype and kappa band, with the Pareto frontier."""
    out = []
    for (t, lo, hi), pts in band_costs(rows).items():
        front = pareto(pts)
        for s, r in pts.sort_values("cost").iterrows():
            out.append(
                {
                    "dtype": t,
                    "κ band": f"{kfmt(lo)}–{kfmt(hi)}",
                    "solver": s,
                    "GEMM-eq. (median)": f"{r['cost']:.0f}",
                    "err (median)": fmt(r["error"]),
                    "fail": pct(r["fail"]),
                    "frontier": "yes" if front[s] else "",
                }
            )
    return "\n\n".join(
        [
            coverage(prov),
            "Cost: CPU time of the solve / CPU time of one n × n GEMM in that dtype, one thread. eps = 0, "
            "symmetric families; each solver over the cases in its domain (newton_schulz: p a power of 2); "
            "frontier = no other solver is both cheaper and more accurate.",
            table(pd.DataFrame(out)),
            _figure("cost_accuracy", "GEMM-equivalents vs error, Pareto frontier"),
        ]
    )


def selection(table_path: Path = SELECTION_TABLE, target: float = 1e-2) -> str:
    """The shipped CPU selection table (matroots/data/selection_cpu.csv, its provenance in the .json
    beside it) summarised: per dtype and target, how many cells each method wins and how many no
    candidate meets; and per dtype x kappa band at ``target``, which methods win."""
    import json

    s = pd.read_csv(table_path)
    meta_path = table_path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    s["winner"] = s["method"].fillna("(none meets)")
    cnt = s.groupby(["dtype", "target", "winner"]).size().unstack("winner", fill_value=0)
    cnt = cnt.reindex(sorted(cnt.columns, key=lambda c: (c == "(none meets)", c)), axis=1)
    tab = cnt.reset_index()
    tab["_o"] = tab["dtype"].map({t: i for i, t in enumerate(DTYPES)})
    tab = tab.sort_values(["_o", "target"], ascending=[True, False]).drop(columns="_o")
    tab["target"] = tab["target"].map(lambda x: f"{x:g}")
    tab = tab.astype(str)
    at = s[np.isclose(s["target"], target)]
    bands = []
    for t in _order(at["dtype"]):
        row = {"dtype": t}
        for (lo, hi), g in at[at["dtype"] == t].groupby(["kappa_lo", "kappa_hi"]):
            wins = g["winner"].value_counts()
            row[f"κ {lo:.0e}–{hi:.0e}"] = ", ".join(f"{k} {v}" for k, v in wins.items())
        bands.append(row)
    eigh_share = (s["method"] == "eigh").sum() / max(s["method"].notna().sum(), 1)
    src = (
        f"`{meta.get('name', '?')}` (config hash {meta.get('config_hash', '?')}, {meta.get('units', '?')} "
        f"units, {meta.get('rows', '?')} rows, {str(meta.get('date', '?'))[:10]})"
    )
    return "\n\n".join(
        [
            f"_Table: `matroots/data/selection_cpu.csv` ({len(s)} cells: {s['dtype'].nunique()} dtypes × "
            f"p ∈ {sorted(s['p'].unique().tolist())} × {s[['n_lo', 'n_hi']].drop_duplicates().shape[0]} n "
            f"bands × {s[['kappa_lo', 'kappa_hi']].drop_duplicates().shape[0]} κ bands × "
            f"{s['target'].nunique()} targets), from the tune run {src}; rebuilt by "
            "`matroots tune experiments/configs/tune_default.toml --out runs/tune_default --install`._",
            "Cell: number of (p, n band, κ band) cells whose cheapest candidate meeting the target on "
            "every case is that method; '(none meets)': no candidate does (auto then returns the best "
            "effort and warns, docs/design.md §7).",
            table(tab),
            f"At the target {target:g}, the winners per κ band (counts over p and n bands):",
            table(pd.DataFrame(bands).fillna("–")),
            f"Reading: eigh (some rank policy) is the choice in {pct(eigh_share)} of the cells with a choice.",
        ]
    )


#: block name -> (study whose rows it reads, or None, function)
FINDINGS: dict[str, tuple[str | None, Callable]] = {
    "accuracy": (PRECISION_STUDY, accuracy_vs_cond),
    "fp32_limit": (PRECISION_STUDY, fp32_limit),
    "low_precision": (PRECISION_STUDY, low_precision),
    "eps_bias": (EPS_STUDY, eps_bias),
    "eps_minimiser": (EPS_STUDY, eps_minimiser),
    "eps_rank_deficient": (EPS_STUDY, eps_rank_deficient),
    "eps_defaults": (EPS_STUDY, eps_defaults),
    "shampoo_factors": (EPS_STUDY, shampoo_factors),
    "cost_frontier": (PRECISION_STUDY, cost_frontier),
    "selection": (None, None),
}


#: the block of the three headline findings (paper_figs/findings_abstract.py), built from both studies
ABSTRACT = "abstract"


def _abstract_module():
    """paper_figs/findings_abstract.py, loaded by path (paper_figs is a folder of scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "paper_findings_abstract", Path(__file__).with_name("findings_abstract.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def blocks(results: Path = RESULTS) -> dict[str, str]:
    """Every finding's generated markdown, by block name (the abstract first)."""
    cache: dict[str, tuple[pd.DataFrame, dict]] = {}
    for study in (PRECISION_STUDY, EPS_STUDY):
        cache[study] = load(study, results)
    helpers = SimpleNamespace(**globals())  # this page's helpers, however this file was loaded
    text = _abstract_module().abstract(helpers, cache[PRECISION_STUDY], cache[EPS_STUDY])
    out = {ABSTRACT: text + f"\n\n_Command: `{COMMAND}` (block `{ABSTRACT}`)._"}
    for name, (study, fn) in FINDINGS.items():
        if study is None:
            out[name] = selection()
            continue
        if study not in cache:
            cache[study] = load(study, results)
        rows, prov = cache[study]
        out[name] = fn(rows, prov) + f"\n\n_Command: `{COMMAND}` (block `{name}`)._"
    return out


def _marker(name: str, end: bool = False) -> str:
    return f"<!-- finding:{name} {'END' if end else 'BEGIN'} -->"


def render(doc: str, generated: dict[str, str], doc_name: str = DOC.name) -> str:
    """``doc`` with each marked block replaced by its generated text; every block must be marked."""
    for name, text in generated.items():
        pat = re.compile(re.escape(_marker(name)) + r".*?" + re.escape(_marker(name, True)), re.S)
        if not pat.search(doc):
            raise SystemExit(f"findings: {doc_name} has no block {_marker(name)} ... {_marker(name, True)}")
        doc = pat.sub(lambda _m, n=name, t=text: f"{_marker(n)}\n{t}\n{_marker(n, True)}", doc)
    return doc


def block_cli(
    argv: list[str] | None,
    blocks_of: Callable[[Path], dict[str, str]],
    *,
    doc: Path,
    results: Path,
    command: str,
    label: str,
    description: str | None,
) -> int:
    """The command line of a generated page (this one, paper_figs/validation_findings.py): print the
    blocks, ``--write`` them into ``doc`` or ``--check`` (exit 1) that ``doc`` holds them."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"regenerate the blocks of docs/{doc.name}")
    g.add_argument("--check", action="store_true", help=f"exit 1 when docs/{doc.name} is out of date")
    ap.add_argument("--doc", type=Path, default=doc)
    ap.add_argument("--results", type=Path, default=results)
    args = ap.parse_args(argv)
    generated = blocks_of(args.results)
    if not (args.write or args.check):
        for name, text in generated.items():
            print(f"{_marker(name)}\n{text}\n{_marker(name, True)}\n")
        return 0
    old = args.doc.read_text()
    new = render(old, generated, doc_name=args.doc.name)
    if args.check:
        if new != old:
            stale = [n for n, t in generated.items() if f"{_marker(n)}\n{t}\n{_marker(n, True)}" not in old]
            print(
                f"{label}: {args.doc} is out of date for block(s) {', '.join(stale)}: run `{command}`",
                file=sys.stderr,
            )
            return 1
        print(f"{label}: {args.doc} matches the shipped results ({len(generated)} blocks)")
        return 0
    args.doc.write_text(new)
    print(f"{label}: wrote {len(generated)} blocks into {args.doc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return block_cli(
        argv, blocks, doc=DOC, results=RESULTS, command=COMMAND, label="findings", description=__doc__
    )


if __name__ == "__main__":
    sys.exit(main())
