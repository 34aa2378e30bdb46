"""Figures of a sweep (``matroots plot RUN_DIR``), saved as PNG and PDF under RUN_DIR/figures."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from . import precision
from .report import failed

DTYPE_ORDER = ["fp64", "fp32", "bf16", "fp16"]


def _save(fig: plt.Figure, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for p in paths:
        fig.savefig(p, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return paths


def error_vs_kappa(df: pd.DataFrame, out: Path) -> list[Path]:
    """Relative forward error vs kappa, one panel per dtype, with the (kappa/p) u lines."""
    d = df[~failed(df) & df["relative_forward_error"].notna()]
    dtypes = [t for t in DTYPE_ORDER if t in set(d["dtype"])]
    fig, axes = plt.subplots(1, max(len(dtypes), 1), figsize=(4.2 * max(len(dtypes), 1), 3.6), squeeze=False)
    kap = np.logspace(0, np.log10(max(df["kappa"].max(), 10)), 50)
    for ax, t in zip(axes[0], dtypes, strict=False):
        sub = d[d["dtype"] == t]
        sns.lineplot(
            data=sub,
            x="kappa",
            y="relative_forward_error",
            hue="solver",
            estimator="median",
            errorbar=("pi", 100),
            marker="o",
            ax=ax,
            legend=ax is axes[0][0],
        )
        u = precision.unit_roundoff(t)
        for p in sorted(d["p"].unique()):
            line = kap / p * u
            keep = line <= 10  # beyond O(1) relative error the line says nothing
            ax.plot(kap[keep], line[keep], ls="--", lw=1, color="grey")
            ax.annotate(f"(κ/{p})u", (kap[keep][-1], line[keep][-1]), fontsize=7, color="grey")
        ax.set(xscale="log", yscale="log", title=t, xlabel="κ(A)", ylabel="relative forward error")
    return _save(fig, out, "error_vs_kappa")


def iterations_vs_kappa(df: pd.DataFrame, out: Path) -> list[Path]:
    """Iterations vs kappa per Newton solver/scaling (fp64 and fp32 cases that did not fail)."""
    d = df[~failed(df) & (df["iterations"].fillna(0) > 0)]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    if len(d):
        sns.lineplot(data=d, x="kappa", y="iterations", hue="solver", style="p", marker="o", ax=ax)
    ax.set(xscale="log", xlabel="κ(A)", ylabel="iterations", title="Newton iterations vs κ")
    return _save(fig, out, "iterations_vs_kappa")


def failure_heatmap(df: pd.DataFrame, out: Path) -> list[Path]:
    """Failure rate over kappa x dtype, one panel per solver."""
    d = df.assign(_failed=failed(df).astype(float))
    solvers = sorted(d["solver"].unique())
    fig, axes = plt.subplots(1, len(solvers), figsize=(3.4 * len(solvers), 3.2), squeeze=False)
    for ax, s in zip(axes[0], solvers, strict=True):
        piv = d[d["solver"] == s].pivot_table(
            index="dtype", columns="kappa", values="_failed", aggfunc="mean"
        )
        piv = piv.reindex([t for t in DTYPE_ORDER if t in piv.index])
        piv.columns = [f"{c:.0e}" for c in piv.columns]
        sns.heatmap(piv, vmin=0, vmax=1, cmap="Reds", annot=True, fmt=".2f", cbar=False, ax=ax)
        ax.set(title=s, xlabel="κ", ylabel="dtype")
    return _save(fig, out, "failure_heatmap")


def residual_vs_error(df: pd.DataFrame, out: Path) -> list[Path]:
    """Residual ||X^p A - I|| against the forward error: the residual is not an accuracy proxy."""
    d = df[~failed(df) & df["relative_forward_error"].notna() & df["residual"].notna()]
    fig, ax = plt.subplots(figsize=(5, 4))
    if len(d):
        sns.scatterplot(
            data=d, x="residual", y="relative_forward_error", hue="dtype", style="method", ax=ax, s=18
        )
    ax.set(xscale="log", yscale="log", xlabel="residual ||X^p A - I||_F", ylabel="relative forward error")
    return _save(fig, out, "residual_vs_error")


def plot_all(df: pd.DataFrame, run_dir: str | Path) -> list[Path]:
    """Write every figure; return their paths."""
    out = Path(run_dir) / "figures"
    sns.set_theme(style="whitegrid", context="paper")
    paths: list[Path] = []
    for fn in (error_vs_kappa, iterations_vs_kappa, failure_heatmap, residual_vs_error):
        paths += fn(df, out)
    return paths
