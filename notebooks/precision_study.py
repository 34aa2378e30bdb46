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
# # Precision study: where each format stops working
#
# **Question.** For A^{-1/p} of an SPD matrix with condition number κ, how does the forward error in
# fp64, fp32, bf16 and fp16 (and tf32 on a GPU) follow the conditioning lines (κ/p)·u and
# cond(f, A)·u; at which κ does each format stop giving an answer; and what does computing in a wider
# format (`compute_dtype`) buy when the data is stored in bf16 or fp16?
#
# Rounding A to a format of unit roundoff u perturbs its eigenvalues by about u‖A‖, so the relative
# error of the root cannot be below cond(f, A)·u, and once κ ≳ 1/u the rounded matrix may not be
# positive definite at all. Companion notebooks: [root_accuracy](root_accuracy.ipynb),
# [eps_regularisation](eps_regularisation.ipynb), [optimizer_validation](optimizer_validation.ipynb).
#
# Parameters: `MATROOTS_NB_SIZE` = `small` or `default`; `MATROOTS_RUN_DIR`, `MATROOTS_WORKERS`.

# %% tags=["parameters"]
SIZE = "default"
RUN_DIR = None
WORKERS = None

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import display

from matroots.core import precision
from matroots.study import grid, plots, sweep

SIZE = os.environ.get("MATROOTS_NB_SIZE", SIZE)
root = Path.cwd()
while not (root / "pyproject.toml").exists() and root != root.parent:
    root = root.parent
dtypes = ["fp64", "fp32", "bf16", "fp16"]
if torch.cuda.is_available():  # tf32 is a GPU matmul mode; the CPU sweep cannot emulate it honestly
    print("a GPU is present: tf32 is a matmul mode there; this CPU sweep reports its u line only")
size = {
    "small": {"n": [8], "kappa": [1e0, 1e2, 1e4, 1e6, 1e8, 1e12, 1e16], "p": [2], "seeds": [0]},
    "default": {"n": [32], "kappa": [10.0**k for k in range(0, 17, 2)], "p": [2, 4], "seeds": [0, 1]},
}[SIZE]
spec = grid.from_dict({
    "name": f"nb_precision_study_{SIZE}",
    "families": ["randsvd"],
    **size,
    "dtypes": dtypes,
    "eps": [{"value": 0.0, "mode": "absolute"}],
    "solvers": [
        {"name": "eigh"},
        {"name": "coupled_newton", "label": "coupled_newton[optimal]", "options": {"scaling": "optimal"}},
        {"name": "schur_newton"},
        {"name": "eigh", "label": "eigh[compute=fp32]", "options": {"compute_dtype": "fp32"}},
        {"name": "coupled_newton", "label": "coupled_newton[optimal,compute=fp32]",
         "options": {"scaling": "optimal", "compute_dtype": "fp32"}},
    ],
})
RUN_DIR = Path(os.environ.get("MATROOTS_RUN_DIR") or RUN_DIR or root / "runs" / "notebooks" / spec.name)
WORKERS = int(os.environ.get("MATROOTS_WORKERS") or WORKERS or os.cpu_count() or 1)
df = sweep.run_sweep(spec, RUN_DIR, workers=WORKERS, resume=True, progress=False)
df["failed"] = plots.failed(df)
native = df[~df.solver.str.contains("compute=")]
print(f"{len(df)} rows; unit roundoff: " + ", ".join(f"{t} {precision.unit_roundoff(t):.1e}" for t in dtypes))

# %% [markdown]
# ## 1. Error vs κ against the conditioning lines
#
# One panel per format (shared axes), median and interquartile band per solver; dashed (κ/p)·u, dotted
# cond(f, A)·u of the root itself; red crosses count the failed cases.

# %%
fig = plots.fig_error_vs_kappa(native)
plt.show()

# %% [markdown]
# **What it shows.** In every format the error of the good solvers rises with κ parallel to the
# conditioning line, a small constant above it: the methods are as accurate as the format allows. The
# lines end, and the crosses begin, where κ·u reaches O(1).
#
# ## 2. Where each format stops working
#
# The largest κ at which a solver still returns an answer with relative error below 1e-2 in every
# case, next to 1/u (the κ where rounding alone can make A indefinite).

# %%
def limit(g: pd.DataFrame, target: float = 1e-2) -> float:
    ok = g.groupby("kappa").apply(
        lambda x: bool((~x.failed).all() and (x.relative_forward_error <= target).all()), include_groups=False
    )
    good = ok[ok]
    return float(good.index.max()) if len(good) else np.nan


table = native.groupby(["dtype", "solver"]).apply(limit, include_groups=False).unstack("solver")
table.insert(0, "1/u", [1 / precision.unit_roundoff(t) for t in table.index])
display(table.reindex([t for t in dtypes if t in table.index]).style.format("{:.0e}"))

# %% [markdown]
# **What it shows.** Each format stops near κ ≈ 1/u (fp32 ~1e7, bf16 and fp16 ~1e2–1e3): the limit
# is the format, not the solver. Solvers differ only by a small factor in where they stop.
#
# ## 3. What compute_dtype buys
#
# Data stored in bf16/fp16 (rounded to the format once), arithmetic in fp32: the representation error
# of the input stays, the arithmetic error goes.

# %%
low = df[df.dtype.isin(["bf16", "fp16"]) & df.solver.str.startswith(("eigh", "coupled_newton[optimal"))]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
for ax, t in zip(axes, ["bf16", "fp16"], strict=True):
    sub = low[(low.dtype == t) & ~low.failed].assign(_k=lambda d: plots.kappa_bin(d))
    for s, g in sub.groupby("solver"):
        med = g.groupby("_k").relative_forward_error.median()
        ax.plot(med.index, med.clip(lower=1e-18), marker="o", ms=3, label=s, color=plots.solver_color(s),
                ls="--" if "compute" in s else "-")
    u = precision.unit_roundoff(t)
    ax.set(xscale="log", yscale="log", title=f"{t} storage", xlabel="κ(A)")
axes[0].set_ylabel("relative forward error (median)")
axes[0].legend(fontsize=7)
fig.suptitle("Native arithmetic (solid) vs fp32 compute on the same rounded data (dashed)")
plt.show()
gain = low[~low.failed].groupby(["dtype", "solver"]).relative_forward_error.median().unstack("dtype")
gain.style.format("{:.2e}")

# %% [markdown]
# **What it shows.** Computing in fp32 brings the error down to the representation error of the
# stored matrix (≈ cond·u of the storage format): about the same where the input rounding dominates,
# much better where the iteration's own rounding dominated. It does not move where the format stops
# working: a matrix that is indefinite once rounded stays so. For that, use eps
# ([eps_regularisation](eps_regularisation.ipynb)) or a wider storage format.
