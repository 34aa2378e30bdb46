"""`make figures` (paper_figs/figures.py:build) on a tiny grid writes every figure of the set, PNG and
PDF, marks failures instead of dropping them, and notes the validation figures it had to skip."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # the test writes files; the library itself never forces a backend

import pytest
from _figfonts import record_fonts
from _tiny_sweep import TINY

ROOT = Path(__file__).resolve().parents[1]

# The tiny grid plus real Shampoo factors of order 10 (3 ship) and a fixed-kappa gallery family.
TINY_FIGS = (
    TINY.replace('families = ["randsvd"]', 'families = ["randsvd", "shampoo"]')
    + """
[per_family.shampoo]
n = [10]
kappa = [1.0]
"""
)


def _figures_module():
    spec = importlib.util.spec_from_file_location("paper_figures", ROOT / "paper_figs" / "figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_make_figures_writes_every_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))
    import matplotlib.image as mimg

    from matroots.study import figure_style

    fonts = record_fonts(monkeypatch)  # the smallest font of each figure as saved
    figs = _figures_module()
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_FIGS)
    out = tmp_path / "out"
    written = figs.build([cfg], out_dir=out, runs_dir=tmp_path / "runs", workers=2, progress=False)
    assert set(written) == set(figs.FIGURES)
    for name in figs.FIGURES:
        png, pdf = out / f"{name}.png", out / f"{name}.pdf"
        assert png.stat().st_size > 5000, name
        assert pdf.read_bytes()[:5] == b"%PDF-", name
        # readable at 16 cm page width: every font >= 8 pt once the saved figure is scaled to the page
        width_in = mimg.imread(png).shape[1] / 130  # figure_style.save writes the PNG at 130 dpi
        at_page = fonts[name] * figure_style.PAGE_WIDTH_IN / max(width_in, figure_style.PAGE_WIDTH_IN)
        assert at_page >= figure_style.MIN_FONT_PT, (name, width_in, fonts[name])
    index = (out / "index.md").read_text()
    assert "skipped optimizer_curves, accuracy_vs_training" in index and "matroots validate" in index
    assert "failure = " in index


def test_figures_are_reproducible_and_mark_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt
    import pandas as pd

    from matroots.study import grid, plots, sweep

    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    df = sweep.run_sweep(grid.load_config(cfg), tmp_path / "run", workers=2, progress=False)
    assert plots.failed(df).any()  # bf16 at kappa 1e8 fails: the figures must show it
    fig = plots.fig_error_vs_kappa(df)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    n_fail = int(plots.failed(df).sum())
    marked = sum(int(t.split("/")[0]) for t in texts if "/" in t and t.split("/")[0].isdigit())
    assert marked == n_fail
    plt.close(fig)
    # every failure mark lies inside its panel, also where no accurate case reaches its kappa (the
    # strip's blended transform used not to widen the x limits: marks beyond them were clipped away)
    sub = df[(df["dtype"] == "bf16") & ~(plots.failed(df) & (df["kappa"] < 1e4))]
    sub = sub[plots.failed(sub) | (sub["kappa"] < 1e4)]
    assert plots.failed(sub).any() and not plots.failed(sub[sub["kappa"] < 1e4]).any()
    fig = plots.fig_error_vs_kappa(sub)
    fig.canvas.draw()
    anchors = [(ax, t.xy[0]) for ax in fig.axes for t in ax.texts if hasattr(t, "xy")]
    assert anchors and all(ax.get_xlim()[0] <= x <= ax.get_xlim()[1] for ax, x in anchors), anchors
    plt.close(fig)
    # same rows -> byte-identical PNG (seeded bootstrap, fixed metadata)
    a = plots.save(plots.fig_cond_error_ratio(df), tmp_path / "a", "r")[0].read_bytes()
    b = plots.save(plots.fig_cond_error_ratio(pd.DataFrame(df)), tmp_path / "b", "r")[0].read_bytes()
    assert a == b
    # one colour per solver, whatever else is in the run
    assert plots.solver_color("eigh") == plots.solver_color("eigh")
    assert plots.solver_color("my_solver[x=1]") == plots.solver_color("my_solver[x=1]")
    assert plots.solver_color("eigh") != plots.solver_color("schur_newton")


def test_importing_plots_does_not_force_a_backend() -> None:
    import subprocess
    import sys

    code = (
        "import matplotlib; matplotlib.use('svg'); import matroots.study.plots; "
        "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_residual_figure_with_outliers_in_every_panel_is_laid_out_and_its_notes_fit(tmp_path: Path) -> None:
    """Outlier notes in all four panels (what `make demo` draws): the figure is laid out (no
    "constrained_layout not applied" warning: counted as decorations, the notes' width at 8 pt once
    left the panels none) and each note lies inside its panel."""
    import warnings

    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    from matroots.study import plots

    rng = np.random.default_rng(0)
    rows = []
    for t in ("fp64", "fp32", "bf16", "fp16"):
        for k in range(60):
            err = 10.0 ** rng.uniform(-15, -2)
            res = err * 10.0 ** (4 if k % 3 == 0 else (-4 if k % 3 == 1 else 0))
            rows.append(
                dict(dtype=t, failure="", relative_forward_error=err, residual=res, cond_rel=10.0 ** (k % 9))
            )
    df = pd.DataFrame(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.fig_residual_vs_error(df)
        plots.save(fig, tmp_path, "residual_vs_error", close=False)
    renderer = fig.canvas.get_renderer()
    notes = [(ax, t) for ax in fig.axes for t in ax.texts if "outliers" in t.get_text()]
    assert len(notes) == 8  # both kinds in each of the 4 panels
    for ax, t in notes:
        box, panel = t.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert panel.x0 - 1 <= box.x0 and box.x1 <= panel.x1 + 1 and box.y0 >= panel.y0 - 1, t.get_text()
    plt.close(fig)
