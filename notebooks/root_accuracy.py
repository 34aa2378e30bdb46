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
# # Root accuracy across precision, conditioning and regularisation
#
# **Question.** How accurate is each inverse p-th root solver, in each working precision, as the
# matrix gets ill-conditioned, and what does eps regularisation change?
#
# The notebook runs a sweep into its **own** run folder (`runs/notebooks/root_accuracy-<size>`; it
# never writes into the `runs/demo` that `make demo` owns) and shows its figures inline. The
# companion notebooks go deeper: [precision_study](precision_study.ipynb) (where each format stops
# working, what `compute_dtype` buys), [eps_regularisation](eps_regularisation.ipynb) (bias against
# rounding, the best eps) and [optimizer_validation](optimizer_validation.ipynb) (what root accuracy
# does to training).
#
# Parameters (the cell below; environment variables override it, as the tests do):
# `MATROOTS_NB_SIZE` = `small` (seconds) or `default` (a few minutes), `MATROOTS_CONFIG` (a sweep
# config to use instead), `MATROOTS_RUN_DIR`, `MATROOTS_WORKERS`.

# %% tags=["parameters"]
SIZE = "default"
CONFIG = None
RUN_DIR = None
WORKERS = None

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from matroots.study import grid, plots, report, sweep

SIZE = os.environ.get("MATROOTS_NB_SIZE", SIZE)
root = Path.cwd()
while not (root / "pyproject.toml").exists() and root != root.parent:
    root = root.parent
GRIDS = {
    "small": {"n": [8], "kappa": [1e0, 1e4, 1e8, 1e12], "p": [2], "families": ["randsvd"]},
    "default": {"n": [24], "kappa": [1e0, 1e3, 1e6, 1e9, 1e12, 1e15], "p": [2, 4], "families": ["randsvd", "clustered"]},
}
CONFIG = os.environ.get("MATROOTS_CONFIG", CONFIG)
if CONFIG:
    spec = grid.load_config(CONFIG)
else:
    spec = grid.from_dict({
        "name": f"nb_root_accuracy_{SIZE}",
        **GRIDS[SIZE],
        "dtypes": ["fp64", "fp32", "bf16", "fp16"],
        "eps": [{"value": 0.0, "mode": "absolute"}, {"value": 1e-12}, {"value": 1e-6}],
        "solvers": [{"name": "eigh"}, {"name": "coupled_newton", "label": "coupled_newton[optimal]",
                     "options": {"scaling": "optimal"}}, {"name": "schur_newton"}],
    })
RUN_DIR = Path(os.environ.get("MATROOTS_RUN_DIR") or RUN_DIR or root / "runs" / "notebooks" / f"root_accuracy-{spec.name}")
WORKERS = int(os.environ.get("MATROOTS_WORKERS") or WORKERS or os.cpu_count() or 1)
df = sweep.run_sweep(spec, RUN_DIR, workers=WORKERS, resume=True, progress=False)
df["failed"] = plots.failed(df)
print(f"{len(df)} rows in {RUN_DIR}: solvers {sorted(df.solver.unique())}, dtypes {sorted(df.dtype.unique())}")

# %% [markdown]
# ## Summary per solver and precision
#
# Median and maximum relative forward error against the high-precision reference of the matrix
# actually solved (over the cases that did not fail), failure rate (typed error, non-convergence or a
# non-finite root) and median iterations.

# %%
report.summary(df).style.format({"failure_rate": "{:.0%}", "median_error": "{:.2e}", "max_error": "{:.2e}"})

# %% [markdown]
# ## 1. The error tracks the conditioning of the root
#
# For SPD A the relative condition number of A^{-1/p} is about κ(A)/p, so no backward-stable method
# beats a forward error near (κ/p)·u (dashed); the dotted line is cond(f, A)·u of the root actually
# asked for. Red crosses count the failed cases at each κ instead of dropping them.

# %%
fig = plots.fig_error_vs_kappa(df[df.eps == 0])
plt.show()
fp64 = df[(df.dtype == "fp64") & ~df.failed & (df.eps == 0)]
line = "cond_u_line" if "cond_u_line" in fp64 else "kappa_u_line"
ratio = (fp64.relative_forward_error / fp64[line].clip(lower=np.finfo(float).eps)).groupby(fp64.solver).median()
display(ratio.rename(f"median error / {line}, fp64").to_frame())

# %% [markdown]
# **What it shows.** In fp64 every solver sits on or below the conditioning line: the error is what
# the problem allows. In the low-precision formats the curves stop where rounding A to the format
# makes it indefinite (κ ≳ 1/u): past that point no method can recover the root without eps.

# %% [markdown]
# ## 2. Where each format fails, and why

# %%
fig = plots.fig_failure_heatmap(df[df.eps == 0])
plt.show()

# %% [markdown]
# ## 3. What eps buys and what it costs
#
# Adding eps·λ_max·I lifts the eigenvalues rounding pushed through zero, so failures disappear; the
# price is the eps bias ‖(A+εI)^{-1/p} − A^{-1/p}‖/‖A^{-1/p}‖, drawn against the rounding error.

# %%
fig = plots.fig_eps_bias_vs_rounding(df)
plt.show()
df.groupby(["dtype", report.eps_label(df)])["failed"].mean().unstack().style.format("{:.0%}")

# %% [markdown]
# **What it shows.** A relative eps just above u of the working format removes most failures at a bias
# that grows with κ (the small eigenvalues dominate the inverse root); where the bias exceeds the
# rounding error, eps has become the main source of error. The
# [eps_regularisation](eps_regularisation.ipynb) notebook finds the eps of least total error.
#
# ## 4. The residual is not an accuracy proxy

# %%
fig = plots.fig_residual_vs_error(df)
plt.show()
