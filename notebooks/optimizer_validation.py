# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Does Shampoo beat AdamW here, and does the root solver's accuracy matter?
#
# This notebook reads a `matroots validate` run (by default `runs/validate_demo`; when it does not
# exist, it runs `experiments/configs/validate_demo.toml` first, a few minutes on 2 cores) and shows
#
# 1. **steps-to-target**: how many steps each optimizer, at its best learning rate, needs to reach
#    AdamW's best final validation loss (the target), and its time per step against AdamW measured
#    in the same process;
# 2. **learning curves** per optimizer: median and interquartile range over seeds;
# 3. **root accuracy vs training outcome**: for every Shampoo configuration (root solver x root dtype x
#    eps), the measured forward error of its inverse roots against a float64 reference of the same
#    Kronecker factor, next to its final validation loss and steps-to-target.
#
# First, when `results/validation` holds shipped results of the tuning protocol
# (`experiments/configs/validate_full.toml`, shipped with `matroots validate CONFIG --out RUN --ship
# results/validation`), it shows them: per task, each optimizer at the point chosen on the validation
# split, its held-out loss over the final seeds, and its steps and CPU time to the target against
# AdamW's with bootstrap 95% intervals.
#
# Environment variables: `MATROOTS_VALIDATION_RESULTS` (a shipped results folder),
# `MATROOTS_VALIDATION_RUN` (a run folder to read or create), `MATROOTS_VALIDATION_CONFIG` (the
# config to run when the folder holds no run), `MATROOTS_WORKERS`.

# %%
import math
import os
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from matroots.study.validation import config, figures, report, ship, summary
from matroots.study.validation import run as vrun
from matroots.study.validation.protocol_report import format_protocol_report

ROOT = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
RUN = Path(os.environ.get("MATROOTS_VALIDATION_RUN", ROOT / "runs" / "validate_demo"))
CONFIG = Path(os.environ.get("MATROOTS_VALIDATION_CONFIG", ROOT / "experiments" / "configs" / "validate_demo.toml"))
WORKERS = int(os.environ.get("MATROOTS_WORKERS", "2"))
RESULTS = Path(os.environ.get("MATROOTS_VALIDATION_RESULTS", ROOT / "results" / "validation"))
pd.set_option("display.width", 200)
pd.set_option("display.max_colwidth", 60)

# %% [markdown]
# ## Shipped results of the tuning protocol
#
# Read from the shipped set (its files checked against their recorded sha256, its config against the
# repository's). Every tuned optimizer had the same number of quasi-random trials and the same
# warmup + cosine schedule; `x AdamW` is the ratio of steps (CPU seconds) to reach the held-out loss
# that every AdamW final seed reaches, with its percentile-bootstrap 95% interval over seeds.

# %%
shipped = ship.load(RESULTS, repo_root=ROOT) if (RESULTS / "provenance.json").exists() else None
if shipped is None:
    print(f"no shipped protocol results in {RESULTS}; run experiments/configs/validate_full.toml and ship it")
else:
    prov = ship.read_provenance(RESULTS)
    state = "complete" if prov["complete"] else "PARTIAL"
    print(f"shipped: {prov['name']} ({prov['units_done']}/{prov['units_total']} units, {state}), commits "
          f"{', '.join(c[:10] for c in prov['commits'])}, shipped {prov['shipped']}")
    print(format_protocol_report(shipped["protocol"]))

# %%
if shipped is not None:
    fig = figures.held_out_curves(shipped["curves"], shipped["protocol"])
    plt.show()
    fig = figures.held_out_curves(shipped["curves"], shipped["protocol"], "cpu_s")
    plt.show()

# %% [markdown]
# ## A small run: steps-to-target and the root-accuracy link
#
# The rest of the notebook reads (or runs) a small `matroots validate` grid.

# %%
if vrun.is_validation_run(RUN) and len(vrun.load(RUN)["runs"]) == len(
    config.load_config(CONFIG).units()
):
    tables = vrun.collect(RUN)
else:
    grid = config.load_config(CONFIG)
    tables = vrun.run_validation(grid, RUN, workers=WORKERS, resume=True, progress=False)
curves, runs, s, acc = tables["curves"], tables["runs"], tables["summary"], tables["accuracy"]
print(f"{len(runs)} training runs, {runs['task'].nunique()} tasks, seeds {sorted(runs['seed'].unique())}")

# %% [markdown]
# ## Steps-to-target
#
# One row per optimizer configuration at its best learning rate (lowest median final validation
# loss over seeds). Steps-to-target is read off the median-over-seeds validation curve.
# `steps_ratio` < 1 means fewer steps than AdamW to reach AdamW's own best final loss (each at its
# best-final lr); `min_steps_ratio` compares the fastest lr of each (`min_steps_lr`); `time_ratio_cpu` is the median over seeds of the per-step CPU-time ratio against AdamW,
# timed interleaved inside each unit (one thread, so CPU time is compute time; the wall-clock ratio
# `time_ratio` is shown too, but on a shared machine it carries other processes' load).

# %%
table = report.steps_table(s)
display(table)

# %%
lines = []
for task, g in summary.best(s).groupby("task"):
    sh = g[g["optimizer"] == "shampoo"].sort_values(["min_steps_ratio", "final_val_loss"])
    ad = g[g["optimizer"] == "adamw"].iloc[0]
    if sh.empty:
        continue
    b = sh.iloc[0]
    verdict = "meets" if b["min_steps_ratio"] <= 0.7 else "misses"
    lines.append(
        f"* **{task}**: the fastest Shampoo config, `{b['config']}`, reaches AdamW's best final validation "
        f"loss {b['target']:.4f} in {b['min_steps_to_target']:.0f} steps (lr {b['min_steps_lr']:g}) against "
        f"AdamW's {ad['min_steps_to_target']:.0f} (**{b['min_steps_ratio']:.2f}x**, {verdict} the 0.7x "
        f"target; {b['steps_ratio']:.2f}x at each one's best-final lr), ending at {b['final_val_loss']:.4f} "
        f"vs {ad['final_val_loss']:.4f}; one Shampoo step costs {b['time_ratio_cpu']:.1f}x an AdamW step "
        f"in CPU time."
    )
display(Markdown("\n".join(lines) if lines else "No Shampoo runs in this grid."))

# %% [markdown]
# ## Learning curves
#
# Validation loss (top) and training loss (bottom) against step: each optimizer at its best
# learning rate and, for Shampoo, the best configuration of each root solver; line = median over
# seeds, band = interquartile range, dashed = the target.

# %%
fig = figures.learning_curves(curves, s)
plt.show()
fig = figures.learning_curves(curves, s, "train_loss")
plt.show()

# %% [markdown]
# ## Root accuracy vs training outcome
#
# `forward_error` is measured against the root of the factor regularised as configured,
# `forward_error_solved` against the matrix Shampoo reports it actually solved (rank-deficiency
# shift + eps: only the solver's and the format's error), and `forward_error_total` against one
# common reference root for every configuration (eps = 1e-6 relative by default), so that a large
# eps counts as error too. `delta_final` is the relative change of the final validation loss against
# the task's most accurate configuration; `degraded` means beyond the seed noise.

# %%
cols = ["task", "config", "lr", "forward_error", "forward_error_total", "final_val_loss", "delta_final",
        "steps_ratio", "fallback_uses", "degraded"]  # fmt: skip
display(acc[[c for c in cols if c in acc]] if len(acc) else "no Shampoo configs")

# %%
if len(acc):
    fig = figures.accuracy_vs_outcome(acc)
    plt.show()

# %%
lines = []
if len(acc):
    for _, d in summary.degradation_threshold(acc).iterrows():
        if math.isinf(d["min_degraded_error"]):
            lines.append(
                f"* **{d['task']}**: no configuration degraded training beyond the seed noise; "
                f"the largest root error measured was {d['max_ok_error']:.1e}."
            )
        else:
            lines.append(
                f"* **{d['task']}**: training is unaffected up to a root forward error of "
                f"{d['max_ok_error']:.1e} and degrades from {d['min_degraded_error']:.1e} "
                f"({int(d['degraded_configs'])} of {int(d['configs'])} configurations degraded)."
            )
display(Markdown("\n".join(lines) if lines else "No Shampoo configurations to compare."))

# %% [markdown]
# **Reading the results.** The steps-to-target ratio is the optimizer's statistical efficiency; the
# time ratio is its cost on this machine (small models pay Shampoo's per-step overhead in full, so the
# CPU ratio is largest on the smallest tasks). In the accuracy table, fp32 and fp64 roots of every
# solver sit at forward errors orders of magnitude below the point where training changes: on these
# tasks the choice between eigh, coupled Newton and Schur-Newton is a question of cost, not of
# training outcome. Training only moves once the root is wrong at the 10-100% level -- a bf16/fp16
# root, or an eps so large that the preconditioner is mostly the identity (a large eps pulls Shampoo
# towards its grafted Adam direction). The noise floor is the seed spread: differences inside it are
# not evidence.
