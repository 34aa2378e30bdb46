"""Regenerate notebooks/root_accuracy.ipynb from this script (keeps the notebook reviewable as code).

Run: .venv/bin/python notebooks/_build_root_accuracy.py
"""

from pathlib import Path

import nbformat as nbf

cells = []


def md(s: str) -> None:
    cells.append(nbf.v4.new_markdown_cell(s.strip()))


def code(s: str) -> None:
    cells.append(nbf.v4.new_code_cell(s.strip()))


md("""
# Root accuracy across precision, conditioning and regularisation

This notebook reads a `matroots sweep` run (by default the demo run that `make demo` writes to
`runs/demo`; it runs the demo sweep first if no run exists) and shows

1. how the forward error of each solver tracks the conditioning line (κ/p)·u in fp64,
2. where fp32, bf16 and fp16 stop being usable,
3. what eps regularisation buys (cases that no longer fail) and what it costs (the eps bias).

Set `MATROOTS_RUN_DIR` / `MATROOTS_CONFIG` to point it at another run or config.
""")

code("""
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
from IPython.display import Image, display

from matroots import grid, plots, report, sweep

root = Path.cwd()
while not (root / "pyproject.toml").exists() and root != root.parent:
    root = root.parent
RUN_DIR = Path(os.environ.get("MATROOTS_RUN_DIR", root / "runs" / "demo"))
CONFIG = Path(os.environ.get("MATROOTS_CONFIG", root / "experiments" / "configs" / "demo.toml"))
WORKERS = int(os.environ.get("MATROOTS_WORKERS", os.cpu_count() or 1))
if not (RUN_DIR / "results.parquet").exists():
    print(f"no run in {RUN_DIR}: running {CONFIG.name} first")
    sweep.run_sweep(grid.load_config(CONFIG), RUN_DIR, workers=WORKERS, resume=True, progress=False)
df = sweep.load(RUN_DIR)
df["failed"] = report.failed(df)
print(f"{len(df)} rows: solvers {sorted(df.solver.unique())}, dtypes {sorted(df.dtype.unique())}, "
      f"kappa {sorted(df.kappa.unique())}")
""")

md("""
## Summary per solver and precision

Median and maximum relative forward error against the high-precision reference (over the cases that did
not fail), failure rate (typed error, non-convergence or a non-finite root) and median iterations.
""")

code("""
report.summary(df).style.format({"failure_rate": "{:.0%}", "median_error": "{:.2e}", "max_error": "{:.2e}"})
""")

md("""
## 1. Error tracks (κ/p)·u in fp64

The relative condition number of A^{-1/p} for SPD A is about κ(A)/p, so a backward-stable method
cannot beat a forward error near (κ/p)·u. The dashed lines are (κ/p)·u for each p; the ratio below
says how far above that line each solver sits (a ratio near 1–10 means the solver is as accurate as
the problem allows).
""")

code("""
fp64 = df[(df.dtype == "fp64") & ~df.failed & (df.eps == 0)]
plots.error_vs_kappa(df[df.eps == 0], RUN_DIR / "figures")
ratio = (fp64.relative_forward_error / fp64.kappa_u_line.clip(lower=np.finfo(float).eps)).groupby(fp64.solver).median()
display(ratio.rename("median error / ((kappa/p) u), fp64").to_frame())
Image(filename=str(RUN_DIR / "figures" / "error_vs_kappa.png"))
""")

md("""
## 2. Where fp32, bf16 and fp16 stop being usable

Rounding A to a format with unit roundoff u moves its eigenvalues by about u·‖A‖, so once κ ≳ 1/u the
rounded matrix can be indefinite and no method can recover the root. The table gives the failure
rate and the median error per precision and κ without regularisation; a precision is usable at a κ
where failures are rare and the error is below what the application needs.
""")

code("""
noeps = df[df.eps == 0]
usable = noeps.groupby(["dtype", "kappa"]).agg(
    failure_rate=("failed", "mean"),
    median_error=("relative_forward_error", "median"),
).unstack("kappa")
usable
""")

md("""
## 3. What eps buys and what it costs

Adding eps·λ_max·I lifts the eigenvalues that rounding pushed through zero, so failures disappear; the
price is the eps bias ‖(A+εI)^{-1/p} − A^{-1/p}‖/‖A^{-1/p}‖, which grows with κ because the small
eigenvalues dominate the inverse root. Left: failure rate per eps; right: the bias (a property of the
matrix and eps, not of the solver).
""")

code("""
df["eps_label"] = report.eps_label(df)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
fr = df.groupby(["dtype", "eps_label"])["failed"].mean().unstack()
sns.heatmap(fr, annot=True, fmt=".2f", cmap="Reds", vmin=0, vmax=1, ax=axes[0])
axes[0].set_title("failure rate")
bias = df[df.eps > 0].drop_duplicates(["unit"])
if len(bias) and bias["eps_bias"].notna().any():
    sns.lineplot(data=bias, x="kappa", y="eps_bias", hue="eps_label", marker="o", ax=axes[1])
    axes[1].set(xscale="log", yscale="log", title="eps bias vs κ")
plt.tight_layout()
""")

md("""
## Which solver to use

The cheapest solver (median seconds) whose every case met a relative forward error of 1e-2 against the
unregularised root, per precision, κ band and eps. "none" means no solver met it: use a wider format or
a larger eps.
""")

code("""
report.best_solver_table(df)
""")

md("""
## The residual is not an accuracy proxy

‖X^p A − I‖ can be large while the forward error is small (and vice versa): report forward errors.
""")

code("""
plots.residual_vs_error(df, RUN_DIR / "figures")
Image(filename=str(RUN_DIR / "figures" / "residual_vs_error.png"))
""")

nb = nbf.v4.new_notebook(
    cells=cells,
    metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
)
nbf.write(nb, Path(__file__).with_name("root_accuracy.ipynb"))
