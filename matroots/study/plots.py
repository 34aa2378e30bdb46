"""Figures of a sweep: one function per figure, each ``fig_*(df) -> matplotlib Figure``.

``matroots plot RUN_DIR`` writes them as PNG and PDF under RUN_DIR/figures (:func:`plot_all`);
``paper_figs/figures.py`` builds the paper set from the same functions; the notebooks display them
inline. Importing this module does not choose a matplotlib backend (matplotlib falls back to Agg on a
headless machine by itself), so figures display inline in notebooks.

Conventions shared by every figure: one colour per solver (:func:`solver_color`, the same in every
figure and run), medians drawn as lines with interquartile bands (not min-max), failed cases marked
(a red x in a strip at the top of the panel, with their count), never silently dropped, shared axes
where panels compare, titles saying what is shown. Kappa is the measured condition number of the
matrix solved, binned to decades. Bootstrap intervals use a fixed seed, so figures are reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..core import precision
from .figure_style import (
    BOOTSTRAP_SEED,
    DTYPE_ORDER,
    ERROR_FLOOR,
    FAILURE_MEANING,
    KAPPA_CAP,
    PAGE_WIDTH_IN,
    _band,
    _dtypes,
    _error,
    _mark_failures,
    _no_data,
    _panels,
    _solver_legend,
    _solvers,
    dtype_color,
    failed,
    kappa_bin,
    save,
    solver_color,
)

__all__ = [
    "DTYPE_ORDER",
    "FAILURE_MEANING",
    "RUN_FIGURES",
    "dtype_color",
    "failed",
    "kappa_bin",
    "plot_all",
    "save",
    "solver_color",
]


# --- figures ---------------------------------------------------------------------------------------------


def fig_error_vs_kappa(df: pd.DataFrame) -> plt.Figure:
    """Forward error vs kappa, one panel per dtype (shared axes), median + IQR per solver, against the
    (kappa/p) u line (the SPD inverse-root special case) and cond(f, A) u (the root's own condition
    number times u, when the rows carry it)."""
    d = df.assign(_k=kappa_bin(df))
    dtypes = _dtypes(d)
    fig, axes = _panels(len(dtypes))
    solvers = _solvers(d)
    for ax, t in zip(axes, dtypes, strict=False):
        sub = d[d["dtype"] == t]
        ok = sub[~failed(sub) & sub["relative_forward_error"].notna()].assign(_e=lambda x: _error(x))
        for s in solvers:
            _band(ax, ok[ok["solver"] == s], "_k", "_e", solver_color(s), s)
        _mark_failures(ax, sub, "_k")
        u = precision.unit_roundoff(t)
        kap = np.array(sorted(d["_k"].unique()))
        ps = sorted(d["p"].unique())
        for p in ps:
            line = kap / p * u
            keep = line <= 1
            ax.plot(kap[keep], line[keep], ls="--", lw=0.8, color="grey")
        ax.text(
            0.02,
            0.02,
            f"dashed: (κ/p)u, p = {', '.join(map(str, ps))}",
            transform=ax.transAxes,
            fontsize=6,
            color="grey",
        )
        if "cond_u_line" in sub and sub["cond_u_line"].notna().any():
            cl = sub.groupby("_k")["cond_u_line"].median()
            cl = cl[cl <= 1]
            ax.plot(cl.index, cl.values, ls=":", lw=1.2, color="black")
        ax.set(xscale="log", yscale="log", title=f"{t} (u = {u:.1e})", xlabel="κ(A) (measured, per decade)")
    axes[0].set_ylabel("relative forward error")
    extra = [
        ("(κ/p)u", {"ls": "--", "color": "grey"}),
        ("cond(f,A)·u", {"ls": ":", "color": "black"}),
        ("failed/total cases", {"marker": "x", "color": "red", "ls": ""}),
    ]
    _solver_legend(fig, solvers, extra)
    fig.suptitle("Forward error vs conditioning, per working precision (median, IQR band)")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def _bootstrap_median_ci(v: np.ndarray, rng: np.random.Generator, reps: int = 400) -> tuple[float, float]:
    if len(v) < 2:
        return float(np.median(v)), float(np.median(v))
    meds = np.median(rng.choice(v, size=(reps, len(v)), replace=True), axis=1)
    return float(np.quantile(meds, 0.05)), float(np.quantile(meds, 0.95))


def fig_cond_error_ratio(df: pd.DataFrame) -> plt.Figure:
    """Error / (cond(f, A) u) per solver (one panel each, shared axes), per dtype: the constant C of
    "converged means within C cond u". Median with a seeded bootstrap 90 % interval."""
    col = "cond_u_line" if "cond_u_line" in df and df["cond_u_line"].notna().any() else "kappa_u_line"
    d = df[~failed(df) & df["relative_forward_error"].notna() & df[col].notna()].assign(_k=kappa_bin(df))
    d = d.assign(_r=_error(d) / d[col].clip(lower=1e-300))
    solvers = _solvers(df)
    fig, axes = _panels(len(solvers), width=3.2)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    for ax, s in zip(axes, solvers, strict=False):
        sub = d[d["solver"] == s]
        for t in _dtypes(df):
            st = sub[sub["dtype"] == t]
            if st.empty:
                continue
            ks, med, lo, hi = [], [], [], []
            for k, g in st.groupby("_k"):
                v = g["_r"].to_numpy()
                ks.append(k)
                med.append(np.median(v))
                a, b = _bootstrap_median_ci(v, rng)
                lo.append(a)
                hi.append(b)
            ax.errorbar(
                ks,
                med,
                yerr=[np.subtract(med, lo), np.subtract(hi, med)],
                marker="o",
                ms=3,
                capsize=2,
                lw=1,
                color=dtype_color(t),
                label=t,
            )
        ax.axhline(1, color="black", lw=0.8)
        nfail = int(failed(df[df["solver"] == s]).sum())
        ax.set(
            xscale="log", yscale="log", title=f"{s}\n({nfail} failed cases not in the ratio)", xlabel="κ(A)"
        )
        ax.title.set_color(solver_color(s))
        ax.title.set_fontsize(8)
    axes[0].set_ylabel(f"error / ({'cond(f,A)' if col == 'cond_u_line' else '(κ/p)'} · u)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Condition-aware error ratio per solver (median, bootstrap 90 % interval of the median)")
    fig.tight_layout()
    return fig


def fig_iterations_vs_kappa(df: pd.DataFrame) -> plt.Figure:
    """Iterations vs kappa per dtype (shared axes) for the iterative solvers; Schur-Newton's count
    includes its square-root stage (``iterations_total``)."""
    y = "iterations_total" if "iterations_total" in df else "iterations"
    d = df.assign(_k=kappa_bin(df))
    d = d[d[y].fillna(0) > 0] if y in d else d.iloc[:0]
    dtypes = _dtypes(df)
    fig, axes = _panels(len(dtypes))
    solvers = sorted(d["solver"].unique()) if len(d) else []
    for ax, t in zip(axes, dtypes, strict=False):
        sub = d[d["dtype"] == t]
        for s in solvers:
            ss = sub[sub["solver"] == s]
            _band(ax, ss[~failed(ss)], "_k", y, solver_color(s), s, ls="--" if "schur" in s else "-")
        _mark_failures(ax, sub, "_k")
        if not len(sub):
            _no_data(ax, "no iterative solves")
        ax.set(xscale="log", title=t, xlabel="κ(A)")
    axes[0].set_ylabel("iterations (Schur–Newton: + square roots)")
    _solver_legend(fig, solvers)
    fig.suptitle("Iterations vs conditioning (median, IQR band; failed runs marked)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def fig_eps_bias_vs_rounding(df: pd.DataFrame, solver: str | None = None) -> plt.Figure:
    """What eps costs and buys: the eps bias ||(A+eps I)^{-1/p} - A^{-1/p}|| / ||A^{-1/p}|| (exact),
    the rounding error against the regularised root, and the total error against A^{-1/p}, vs the
    relative eps; one panel per (kappa, dtype), shared axes; a star at the eps of least total error."""
    d = df[(df["eps"] > 0) & (df["eps_mode"] == "relative")].assign(_k=kappa_bin(df))
    if solver is None:
        solver = "eigh" if "eigh" in set(d["solver"]) else (sorted(d["solver"].unique()) or ["?"])[0]
    d = d[d["solver"] == solver]
    kappas = sorted(d["_k"].unique())
    if len(kappas) > 3:
        kappas = [kappas[0], kappas[len(kappas) // 2], kappas[-1]]
    dtypes = _dtypes(df)
    fig, axes = plt.subplots(
        max(len(kappas), 1),
        max(len(dtypes), 1),
        figsize=(3.2 * max(len(dtypes), 1), 2.6 * max(len(kappas), 1)),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    series = [
        ("eps_bias", "eps bias (exact)", "#9467bd", "-"),
        ("relative_forward_error", "rounding error", "#1f77b4", "--"),
        ("forward_error_total", "total error vs A^(-1/p)", "black", "-"),
    ]
    for r, k in enumerate(kappas or [None]):
        for c, t in enumerate(dtypes):
            ax = axes[r][c]
            sub = d[(d["_k"] == k) & (d["dtype"] == t)] if k is not None else d.iloc[:0]
            ok = sub[~failed(sub)]
            for col, lab, color, ls in series:
                if col in ok and ok[col].notna().any():
                    _band(ax, ok.assign(_v=ok[col].clip(lower=ERROR_FLOOR)), "eps", "_v", color, lab, ls=ls)
            _mark_failures(ax, sub, "eps")
            if "forward_error_total" in ok and ok["forward_error_total"].notna().any():
                med = ok.groupby("eps")["forward_error_total"].median()
                ax.scatter(
                    [med.idxmin()],
                    [max(med.min(), ERROR_FLOOR)],
                    marker="*",
                    s=90,
                    color="gold",
                    edgecolor="black",
                    zorder=6,
                )
            if sub.empty:
                _no_data(ax, "no eps > 0 rows")
            ax.set(xscale="log", yscale="log")
            if r == 0:
                ax.set_title(t)
            if c == 0:
                ax.set_ylabel(f"κ ≈ {k:.0e}\nrelative error" if k is not None else "relative error")
            if r == len(kappas) - 1:
                ax.set_xlabel("relative eps (eps / λmax)")
    handles = [plt.Line2D([], [], color=c, ls=ls, label=lab) for _, lab, c, ls in series]
    handles.append(
        plt.Line2D([], [], marker="*", color="gold", mec="black", ls="", ms=10, label="least total error")
    )
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(f"eps regularisation: bias vs rounding ({solver}; median, IQR band)")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def fig_failure_heatmap(df: pd.DataFrame) -> plt.Figure:
    """Failure rate over solver x kappa, one panel per dtype, with the most common failure type."""
    d = df.assign(_k=kappa_bin(df), _f=failed(df).astype(float), _why=df["failure"].fillna("").astype(str))
    dtypes = _dtypes(d)
    solvers = _solvers(d)
    ks = sorted(d["_k"].unique())
    fig, axes = _panels(
        len(dtypes),
        width=0.5 * len(ks) + 2.2,
        height=0.45 * len(solvers) + 1.6,
        layout="constrained",
        ncols=1,
    )
    # the failure kind under the rate where a cell is wide enough for it at the page's font size
    cell_pt = 72 * (PAGE_WIDTH_IN - 2.2) / max(len(ks), 1)
    im = None
    for ax, t in zip(axes, dtypes, strict=False):
        sub = d[d["dtype"] == t]
        rate = sub.pivot_table(index="solver", columns="_k", values="_f", aggfunc="mean").reindex(
            index=solvers, columns=ks
        )
        im = ax.imshow(rate.to_numpy(dtype=float), vmin=0, vmax=1, cmap="Reds", aspect="auto")
        for i, s in enumerate(solvers):
            for j, k in enumerate(ks):
                cell = sub[(sub["solver"] == s) & (sub["_k"] == k)]
                if cell.empty:
                    continue
                r = cell["_f"].mean()
                why = cell.loc[cell["_f"] > 0, "_why"].mode()
                kind = r > 0 and len(why) and cell_pt >= 45
                txt = f"{r:.0%}" + (f"\n{_short_failure(why.iloc[0])}" if kind else "")
                ax.text(
                    j, i, txt, ha="center", va="center", fontsize=5, color="white" if r > 0.6 else "black"
                )
        ax.set_xticks(range(len(ks)), [f"{k:.0e}" for k in ks], rotation=60, fontsize=6)
        ax.set_yticks(range(len(solvers)), solvers, fontsize=6)
        ax.set(title=t, xlabel="κ(A)")
    if im is not None:
        fig.colorbar(im, ax=axes, fraction=0.02, label="failure rate")
    fig.suptitle("Where each solver fails (failure rate; most common failure)")
    fig.supxlabel(FAILURE_MEANING, fontsize=7)
    return fig


_SHORT = {
    "NotPositiveDefiniteError": "not PD",
    "NotConverged": "no conv.",
    "NonFiniteRoot": "non-finite",
    "FormatRangeError": "range",
    "NegativeRealEigenvalueError": "neg. eig.",
    "NotSymmetricError": "not sym.",
    "ConvergenceError": "no conv.",
    "WorkerCrashed": "crash",
}


def _short_failure(name: str) -> str:
    return _SHORT.get(name, name.removesuffix("Error")[:9])


def fig_residual_vs_error(df: pd.DataFrame) -> plt.Figure:
    """Residual ||X^p A - I|| against the forward error, per dtype (shared axes), coloured by
    log10 cond(f, A): the outliers far above the diagonal are ill-conditioned roots, whose forward error
    is about cond times the residual, which is why the residual is not an accuracy proxy."""
    d = df[~failed(df) & df["relative_forward_error"].notna() & df["residual"].notna()]
    cond = "cond_rel" if "cond_rel" in d and d["cond_rel"].notna().any() else "condition_number"
    dtypes = _dtypes(df)
    fig, axes = _panels(len(dtypes), sharex=True, layout="constrained")
    sc = None
    for ax, t in zip(axes, dtypes, strict=False):
        sub = d[d["dtype"] == t]
        if sub.empty:
            _no_data(ax, "no successful solves")
            continue
        res = sub["residual"].astype(float).clip(lower=ERROR_FLOOR)
        err = _error(sub)
        c = np.log10(sub[cond].astype(float).replace(np.inf, KAPPA_CAP).clip(lower=1.0))
        sc = ax.scatter(res, err, c=c, cmap="viridis", s=8, vmin=0, vmax=16, alpha=0.8)
        below = res > 100 * err  # accurate roots with a large residual
        above = err > 100 * res  # inaccurate roots with a small residual
        for mask, color, why in (
            (below, "red", "residual ≫ error\n(X^p A − I amplifies the\nerror of X by up to ~p κ(A))"),
            (above, "darkorange", "error ≫ residual\n(ill-conditioned root:\nerror ≈ cond(f,A) · residual)"),
        ):
            if mask.any():
                ax.scatter(res[mask], err[mask], facecolors="none", edgecolors=color, s=26, lw=0.7)
                note = ax.annotate(
                    f"{int(mask.sum())} outliers: {why}\nmedian log10 cond {np.median(c[mask]):.0f}",
                    (0.03, 0.97 if color == "red" else 0.62),
                    xycoords="axes fraction",
                    va="top",
                    fontsize=6,
                    color=color,
                )
                # inside the panel, so not a decoration to make room for: counted, its width at
                # 8 pt (figure_style.readable) left no width to a panel of 4 and no figure was laid out
                note.set_in_layout(False)
        lim = [ERROR_FLOOR, 10]
        ax.plot(lim, lim, color="grey", lw=0.8, ls="--")
        ax.set(xscale="log", yscale="log", title=t, xlabel="residual ||X^p A − I||")
    axes[0].set_ylabel("relative forward error")
    if sc is not None:
        fig.colorbar(sc, ax=axes, fraction=0.02, label=f"log10 {cond}")
    fig.suptitle(
        "The residual is not an accuracy proxy (dashed: error = residual; circled: outliers by 100x)"
    )
    return fig


def fig_cost_accuracy(df: pd.DataFrame) -> plt.Figure:
    """Cost-accuracy frontier per dtype (shared axes): median GEMM-equivalents (CPU time of the solve
    / CPU time of one n x n GEMM in that dtype) vs median forward error per solver, IQR bars both
    ways, the Pareto frontier drawn; each solver's failure rate in its label."""
    cost = (
        "gemm_equivalents" if "gemm_equivalents" in df and df["gemm_equivalents"].notna().any() else "matmuls"
    )
    dtypes = _dtypes(df)
    fig, axes = _panels(len(dtypes))
    solvers = _solvers(df)
    for ax, t in zip(axes, dtypes, strict=False):
        sub = df[df["dtype"] == t]
        pts = []
        for s in solvers:
            ss = sub[sub["solver"] == s]
            ok = ss[~failed(ss) & ss["relative_forward_error"].notna() & ss[cost].notna()]
            if ok.empty:
                continue
            x, e = ok[cost].astype(float), _error(ok)
            mx, me = x.median(), e.median()
            ax.errorbar(
                [mx],
                [me],
                xerr=[[mx - x.quantile(0.25)], [x.quantile(0.75) - mx]],
                yerr=[[me - e.quantile(0.25)], [e.quantile(0.75) - me]],
                marker="o",
                ms=5,
                color=solver_color(s),
                capsize=2,
                lw=1,
            )
            fr = failed(ss).mean()
            ax.annotate(
                f"{fr:.0%} fail",
                (mx, me),
                fontsize=5,
                xytext=(3, 3),
                textcoords="offset points",
                color=solver_color(s),
            )
            pts.append((mx, me))
        front, best = [], np.inf
        for x, e in sorted(pts):
            if e < best:
                front.append((x, e))
                best = e
        if front:
            fx, fe = zip(*front, strict=True)
            ax.step(fx, fe, where="post", color="black", lw=0.8, ls=":")
        else:
            _no_data(ax, "no successful solves")
        ax.set(
            xscale="log",
            yscale="log",
            title=t,
            xlabel="cost (GEMM-equivalents)" if cost != "matmuls" else "matmuls",
        )
    axes[0].set_ylabel("relative forward error")
    _solver_legend(fig, solvers, [("Pareto frontier", {"ls": ":", "color": "black"})])
    fig.suptitle("Cost–accuracy frontier per working precision (median, IQR bars)")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig


def fig_shampoo_factors(df: pd.DataFrame | None = None) -> plt.Figure:
    """Real Shampoo Kronecker factors (the shipped set): their normalised spectra by training stage,
    and the forward error of each solver on them per dtype (from rows of family "shampoo")."""
    from . import matrices

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    stage_color = {"early": "#d62728", "mid": "#ff7f0e", "late": "#2ca02c"}
    try:
        from ._shampoo_io import SHAMPOO_DATA

        factors = matrices.load_shampoo_factors(SHAMPOO_DATA)
    except (OSError, ValueError) as exc:
        factors = []
        _no_data(a1, f"no shipped factors ({exc})")
    for item in factors:
        A, meta = item if isinstance(item, tuple) else (item, {})
        ev = meta.get("eigenvalues")
        ev = np.asarray(ev, dtype=float) if ev is not None else np.linalg.eigvalsh(np.asarray(A, dtype=float))
        lam = np.sort(np.abs(ev))[::-1]
        lam = np.clip(lam / max(lam[0], 1e-300), 1e-20, None)
        a1.plot(
            np.linspace(0, 1, len(lam)),
            lam,
            lw=0.6,
            alpha=0.6,
            color=stage_color.get(meta.get("stage"), "grey"),
        )
    a1.set(
        yscale="log", xlabel="i / n", ylabel="λ_i / λ_max", title=f"spectra of {len(factors)} real factors"
    )
    a1.legend(handles=[plt.Line2D([], [], color=c, label=s) for s, c in stage_color.items()], fontsize=7)
    d = df[df["family"] == "shampoo"] if df is not None and "family" in df else pd.DataFrame()
    if d.empty:
        _no_data(a2, "no rows of family 'shampoo' in this run\n(add it to the sweep's families)")
    else:
        solvers, dtypes = _solvers(d), _dtypes(d)
        w = 0.8 / max(len(dtypes), 1)
        for j, t in enumerate(dtypes):
            for i, s in enumerate(solvers):
                ss = d[(d["solver"] == s) & (d["dtype"] == t)]
                ok = ss[~failed(ss) & ss["relative_forward_error"].notna()]
                x = i + (j - (len(dtypes) - 1) / 2) * w
                if len(ok):
                    e = _error(ok)
                    a2.vlines(x, e.quantile(0.25), e.quantile(0.75), color=dtype_color(t), lw=3, alpha=0.5)
                    a2.scatter([x], [e.median()], color=dtype_color(t), s=12, zorder=4)
                nf = int(failed(ss).sum())
                if nf:
                    a2.annotate(
                        f"{nf}×",
                        (x, 0.97),
                        xycoords=("data", "axes fraction"),
                        fontsize=5,
                        color="red",
                        ha="center",
                    )
        a2.set_xticks(range(len(solvers)), solvers, rotation=30, ha="right", fontsize=6)
        for lab, s in zip(a2.get_xticklabels(), solvers, strict=True):
            lab.set_color(solver_color(s))
        a2.set(
            yscale="log",
            ylabel="relative forward error",
            title="solver error on real factors (median, IQR; red: failures)",
        )
        a2.legend(
            handles=[plt.Line2D([], [], color=dtype_color(t), marker="o", ls="", label=t) for t in dtypes],
            fontsize=7,
        )
    fig.suptitle("Real Shampoo factors: rank-deficient early in training, and what each solver makes of them")
    fig.tight_layout()
    return fig


#: The figures of a sweep run, by file name (``matroots plot`` writes these).
RUN_FIGURES: dict[str, Callable[[pd.DataFrame], plt.Figure]] = {
    "error_vs_kappa": fig_error_vs_kappa,
    "cond_error_ratio": fig_cond_error_ratio,
    "iterations_vs_kappa": fig_iterations_vs_kappa,
    "eps_bias_vs_rounding": fig_eps_bias_vs_rounding,
    "failure_heatmap": fig_failure_heatmap,
    "residual_vs_error": fig_residual_vs_error,
    "cost_accuracy": fig_cost_accuracy,
    "shampoo_factors": fig_shampoo_factors,
}


def plot_all(df: pd.DataFrame, run_dir: str | Path) -> list[Path]:
    """Write every figure of a run under RUN_DIR/figures; return their paths."""
    out = Path(run_dir) / "figures"
    paths: list[Path] = []
    with plt.rc_context({"font.size": 8}):
        for name, fn in RUN_FIGURES.items():
            paths += save(fn(df), out, name)
    return paths
