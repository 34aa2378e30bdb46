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
# # eps regularisation: bias against rounding
#
# **Question.** Shampoo's factors are PSD and rank-deficient, so their inverse roots exist only after a
# shift A + εI. How does the error split into the **eps bias** (the exact difference between
# (A+εI)^{-1/p} and A^{-1/p}) and the **rounding error** (of the computed root against the exact root
# of the regularised matrix); which ε minimises the total error for each format and κ; and what does
# this look like on real Kronecker factors dumped from training?
#
# Both regularisation modes are covered: relative (ε·λ_max, the same meaning for factors of any scale)
# and absolute. Companion notebooks: [root_accuracy](root_accuracy.ipynb),
# [precision_study](precision_study.ipynb), [optimizer_validation](optimizer_validation.ipynb).
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
from IPython.display import display

from matroots.study import grid, matrices, plots, sweep

SIZE = os.environ.get("MATROOTS_NB_SIZE", SIZE)
root = Path.cwd()
while not (root / "pyproject.toml").exists() and root != root.parent:
    root = root.parent
rel = [1e-14, 1e-12, 1e-10, 1e-8, 1e-6, 1e-4, 1e-2] if SIZE == "default" else [1e-12, 1e-8, 1e-4, 1e-2]
size = {
    "small": {"n": [8], "kappa": [1e4, 1e10], "p": [2], "seeds": [0], "shampoo_seeds": [0]},
    "default": {"n": [32], "kappa": [1e2, 1e6, 1e10, 1e14], "p": [2, 4], "seeds": [0, 1],
                "shampoo_seeds": [0, 1, 2, 3, 4, 5]},
}[SIZE]
# real factors ship at orders 10, 32 and 64; the small run uses the order-10 ones
shampoo_n = [10] if SIZE == "small" else [32]
spec = grid.from_dict({
    "name": f"nb_eps_regularisation_{SIZE}",
    "families": ["randsvd", "lowrank", "shampoo"],
    "n": size["n"], "kappa": size["kappa"], "p": size["p"], "seeds": size["seeds"],
    "dtypes": ["fp64", "fp32", "bf16", "fp16"],
    "eps": [{"value": 0.0, "mode": "absolute"}]
    + [{"value": e, "mode": "relative"} for e in rel]
    + [{"value": e, "mode": "absolute"} for e in (1e-8, 1e-4)],
    "per_family": {"shampoo": {"n": shampoo_n, "kappa": [1.0], "seeds": size["shampoo_seeds"]}},
    "solvers": [{"name": "eigh"}, {"name": "coupled_newton", "label": "coupled_newton[optimal]",
                 "options": {"scaling": "optimal"}}],
})
RUN_DIR = Path(os.environ.get("MATROOTS_RUN_DIR") or RUN_DIR or root / "runs" / "notebooks" / spec.name)
WORKERS = int(os.environ.get("MATROOTS_WORKERS") or WORKERS or os.cpu_count() or 1)
df = sweep.run_sweep(spec, RUN_DIR, workers=WORKERS, resume=True, progress=False)
df["failed"] = plots.failed(df)
print(f"{len(df)} rows in {RUN_DIR}")

# %% [markdown]
# ## 1. Bias vs rounding as ε varies (relative ε)
#
# Rows: κ; columns: format (shared axes); eigh. Purple: the eps bias (exact, independent of the
# format); blue dashed: the rounding error against the regularised root; black: the total error
# against A^{-1/p}. The star is the ε of least total error.

# %%
full_rank = df[df.family == "randsvd"]
fig = plots.fig_eps_bias_vs_rounding(full_rank)
plt.show()

# %% [markdown]
# **What it shows.** The bias grows like ε·κ/p (the small eigenvalues dominate the inverse root), the
# rounding error falls as the shift improves the conditioning, and the total error is least where the
# two cross. A shift below u·λ_max of the working format is lost to rounding (no bias, no help).
#
# ## 2. The ε of least total error, per format and κ
#
# Median total error (against the unregularised root) per ε; in absolute terms the same table uses
# ε_abs = ε·λ_max.

# %%
def best_eps(d):
    ok = d[~d.failed & d.forward_error_total.notna()]
    med = ok.groupby(["dtype", "kappa", "eps_mode", "eps"]).forward_error_total.median().reset_index()
    idx = med.groupby(["dtype", "kappa", "eps_mode"]).forward_error_total.idxmin()
    return med.loc[idx].rename(columns={"eps": "best_eps", "forward_error_total": "total_error"})


best = best_eps(full_rank[full_rank.eps > 0])
display(best.pivot_table(index=["eps_mode", "dtype"], columns="kappa", values="best_eps").style.format("{:.0e}"))
display(best.pivot_table(index=["eps_mode", "dtype"], columns="kappa", values="total_error").style.format("{:.1e}"))

# %% [markdown]
# **What it shows.** The best relative ε grows with the unit roundoff (larger for bf16/fp16 than for
# fp32) and shrinks as κ grows; an absolute ε only means the same thing for matrices of the same
# scale, which is why the relative mode is the default for Shampoo.
#
# ## 3. Absolute and relative errors on rank-deficient factors
#
# For a rank-deficient PSD factor A^{-1/p} does not exist, so the only meaningful reference is the
# regularised root: the rounding error is relative to it, and the bias is measured against the
# smallest-ε root instead. Low-rank synthetic factors (G Gᵀ) and the real Shampoo factors:

# %%
fig = plots.fig_shampoo_factors(df)
plt.show()
rd = df[df.family.isin(["lowrank", "shampoo"]) & (df.eps_mode == "relative") & (df.eps > 0)]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
for ax, fam in zip(axes, ["lowrank", "shampoo"], strict=True):
    sub = rd[(rd.family == fam) & ~rd.failed]
    for t, g in sub.groupby("dtype"):
        med = g.groupby("eps").relative_forward_error.median()
        absolute = g.groupby("eps").apply(lambda x: (x.relative_forward_error * x.eps_abs).median(),
                                          include_groups=False)
        ax.plot(med.index, med.clip(lower=1e-18), marker="o", ms=3, color=plots.dtype_color(t), label=f"{t} relative")
        ax.plot(absolute.index, absolute.clip(lower=1e-18), ls=":", color=plots.dtype_color(t))
    fails = rd[rd.family == fam].groupby("eps").failed.mean()
    ax.set(xscale="log", yscale="log", xlabel="relative ε", title=f"{fam}: failure rate " + ", ".join(
        f"{e:.0e}: {f:.0%}" for e, f in fails.items() if f > 0)[:60])
axes[0].set_ylabel("rounding error (solid: relative; dotted: × ε_abs)")
axes[0].legend(fontsize=7)
fig.suptitle("Rank-deficient factors: the regularised root is the only reference")
plt.show()

# %% [markdown]
# **What it shows.** Without ε the rank-deficient factors fail in every format (or return roots of
# size 1/√ε_machine); with a relative ε above a few u of the working format every solver returns the
# regularised root to about cond(A+εI)·u. The real factors behave like the synthetic low-rank ones
# early in training and like full-rank ill-conditioned matrices later. How much of this matters for
# training is the subject of [optimizer_validation](optimizer_validation.ipynb).
