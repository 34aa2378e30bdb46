"""Figures of a validation run: learning curves and the root-accuracy-vs-training-outcome link.

Each function returns a matplotlib Figure (so notebooks display it inline; no backend is forced);
:func:`save_all` writes PNG and PDF files under ``RUN/figures``.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..figure_style import MIN_FONT_PT, _no_data, _panels, save
from .summary import best

DTYPE_MARKERS = {"fp64": "o", "fp32": "s", "bf16": "^", "fp16": "v"}


def curve_configs(summary: pd.DataFrame, task: str) -> pd.DataFrame:
    """The configs drawn in a task's learning curves, each at its best lr: every non-Shampoo config
    and, per root solver, the Shampoo config with the lowest final validation loss."""
    b = best(summary)
    b = b[b["task"] == task]
    sh = b[b["optimizer"] == "shampoo"].sort_values("final_val_loss", kind="stable")
    return pd.concat([b[b["optimizer"] != "shampoo"], sh.groupby("root_solver").head(1)], ignore_index=True)


def learning_curves(curves: pd.DataFrame, summary: pd.DataFrame, column: str = "val_loss") -> plt.Figure:
    """Validation loss against step per task: median over seeds (line) and interquartile range (band),
    each optimizer config at its best lr; the dashed line is the target (AdamW's best final loss)."""
    tasks = sorted(summary["task"].unique())
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for _, cfg in curve_configs(summary, task).iterrows():
            c = curves[
                (curves["task"] == task) & (curves["config"] == cfg["config"]) & (curves["lr"] == cfg["lr"])
            ]
            if c.empty:
                continue
            g = c.groupby("step")[column]
            med, lo, hi = g.median(), g.quantile(0.25), g.quantile(0.75)
            (line,) = ax.plot(med.index, med.to_numpy(), label=f"{cfg['config']} lr={cfg['lr']:g}")
            ax.fill_between(med.index, lo.to_numpy(), hi.to_numpy(), color=line.get_color(), alpha=0.2)
        tg = summary.loc[summary["task"] == task, "target"]
        if len(tg) and math.isfinite(float(tg.iloc[0])):
            ax.axhline(float(tg.iloc[0]), color="k", ls="--", lw=0.8, label="target (AdamW best)")
        ax.set_title(f"{task}: {column.replace('_', ' ')}")
        ax.set_xlabel("step")
        ax.set_ylabel(f"{column.replace('_', ' ')} (median, IQR over seeds)")
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    fig.suptitle("Learning curves at each optimizer's best learning rate")
    fig.tight_layout()
    return fig


def accuracy_vs_outcome(acc: pd.DataFrame) -> plt.Figure:
    """Per task: relative change of the final validation loss (top) and steps-to-target ratio against
    AdamW (bottom) versus the median root forward error against the common reference root; marker =
    root dtype, colour = root solver, open markers = degraded beyond the seed noise."""
    tasks = sorted(acc["task"].unique()) if len(acc) else []
    n = max(len(tasks), 1)
    fig, axes = plt.subplots(2, n, figsize=(4.6 * n, 7.0), squeeze=False)
    solvers = sorted(acc["root_solver"].unique()) if len(acc) else []
    colours = {s: f"C{i}" for i, s in enumerate(solvers)}
    for j, task in enumerate(tasks):
        g = acc[acc["task"] == task]
        for row, (col, label) in enumerate(
            (("delta_final", "final val loss, relative change"), ("steps_ratio", "steps-to-target / AdamW"))
        ):
            ax = axes[row][j]
            for _, r in g.iterrows():
                x, y = r["forward_error_total"], r[col]
                if not (np.isfinite(x) and x > 0):
                    continue
                y = y if np.isfinite(y) else np.nan
                face = "none" if r["degraded"] else colours[r["root_solver"]]
                ax.scatter(x, y, marker=DTYPE_MARKERS.get(r["root_dtype"], "o"), s=46,
                           edgecolors=colours[r["root_solver"]], facecolors=face)  # fmt: skip
            ax.set_xscale("log")
            ax.set_xlabel("root forward error vs reference (median)")
            ax.set_ylabel(label)
            ax.set_title(f"{task}")
            if col == "steps_ratio":
                ax.axhline(1.0, color="k", lw=0.6)
                ax.axhline(0.7, color="k", ls=":", lw=0.6)
            else:
                ax.axhline(0.0, color="k", lw=0.6)
    handles = [plt.Line2D([], [], color=colours[s], marker="o", ls="", label=s) for s in solvers]
    handles += [plt.Line2D([], [], color="grey", marker=m, ls="", label=d) for d, m in DTYPE_MARKERS.items()
                if len(acc) and d in set(acc["root_dtype"])]  # fmt: skip
    handles.append(plt.Line2D([], [], color="grey", marker="o", mfc="none", ls="", label="degraded"))
    axes[0][0].legend(handles=handles, fontsize=7)
    fig.suptitle("Root accuracy vs training outcome (Shampoo configs at their best lr)")
    fig.tight_layout()
    return fig


def held_out_curves(
    curves: pd.DataFrame, protocol: pd.DataFrame, x: str = "step", tasks: list[str] | None = None
) -> plt.Figure:
    """The protocol's held-out loss per task against ``x`` ("step" or "cpu_s": cumulative training CPU
    seconds): each optimizer at its chosen point, median over the final seeds (line) and their range
    (band; CPU time on the x axis is the seeds' median at each step); dashed: the target. Laid out two
    panels a row, a page (16 cm) wide, one legend below; ``tasks`` (default: those in ``protocol``) may
    name tasks without final seeds, whose panel says so."""
    fc = curves[curves["phase"] == "final"] if "phase" in curves else curves.iloc[:0]
    tasks = list(tasks) if tasks is not None else (sorted(protocol["task"].unique()) if len(protocol) else [])
    configs = list(dict.fromkeys(protocol["config"])) if len(protocol) else []
    colour = {c: f"C{i % 10}" for i, c in enumerate(configs)}
    fig, axes = _panels(max(len(tasks), 1), sharex=False, sharey=False, height=2.9)
    drawn: dict[str, plt.Line2D] = {}
    for ax, task in zip(axes, tasks, strict=False):
        lines = 0
        for cfg in protocol.loc[protocol["task"] == task, "config"]:
            c = fc[(fc["task"] == task) & (fc["config"] == cfg)]
            if c.empty:
                continue
            g = c.groupby("step")
            xs = (
                g[x].median().to_numpy()
                if x != "step"
                else np.asarray(sorted(c["step"].unique()), dtype=float)
            )
            med, lo, hi = g["test_loss"].median(), g["test_loss"].min(), g["test_loss"].max()
            (line,) = ax.plot(xs, med.to_numpy(), color=colour[cfg], lw=1.2, label=cfg)
            ax.fill_between(xs, lo.to_numpy(), hi.to_numpy(), color=colour[cfg], alpha=0.2)
            drawn.setdefault(cfg, line)
            lines += 1
        ax.set_title(task)
        if not lines:
            _no_data(ax, "final seeds not yet run")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        tg = protocol.loc[protocol["task"] == task, "target"]
        if len(tg) and math.isfinite(float(tg.iloc[0])):
            t = ax.axhline(float(tg.iloc[0]), color="k", ls="--", lw=0.8, label="target")
            drawn.setdefault("target", t)
        ax.set_xlabel("step" if x == "step" else "training CPU s (one thread)")
        ax.set_ylabel("held-out loss")
        ax.set_yscale("log")
    if drawn:
        fig.legend(handles=list(drawn.values()), labels=list(drawn), loc="lower center", ncol=3,
                   fontsize=MIN_FONT_PT, frameon=False, bbox_to_anchor=(0.5, 0.0))  # fmt: skip
    rows_of_legend = -(-len(drawn) // 3)
    fig.suptitle("Held-out loss at the tuned points" + (" vs steps" if x == "step" else " vs CPU time"))
    fig.tight_layout(rect=(0, 0.05 * rows_of_legend, 1, 1))
    return fig


def save_all(tables: dict[str, pd.DataFrame], run_dir: str | Path) -> list[Path]:
    """Write learning_curves, train_curves and accuracy_vs_outcome (PNG + PDF) under RUN/figures."""
    out = Path(run_dir) / "figures"
    if "protocol" in tables:
        paths = save(held_out_curves(tables["curves"], tables["protocol"]), out, "held_out_vs_steps")
        return paths + save(
            held_out_curves(tables["curves"], tables["protocol"], "cpu_s"), out, "held_out_vs_cpu"
        )
    paths = save(learning_curves(tables["curves"], tables["summary"]), out, "learning_curves")
    paths += save(learning_curves(tables["curves"], tables["summary"], "train_loss"), out, "train_curves")
    if len(tables.get("accuracy", [])):
        paths += save(accuracy_vs_outcome(tables["accuracy"]), out, "accuracy_vs_outcome")
    return paths


__all__ = ["accuracy_vs_outcome", "curve_configs", "held_out_curves", "learning_curves", "save_all"]
