"""Shared style and helpers of the sweep figures (:mod:`matroots.study.plots`): one colour per solver in every
figure, decade-binned kappa, median lines with interquartile bands, failures marked in a strip at the
top of a panel, and PNG/PDF output with fixed metadata (reruns give the same files)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.text as mtext
import matplotlib.transforms as mtransforms
import numpy as np
import pandas as pd

DTYPE_ORDER = ["fp64", "fp32", "tf32", "bf16", "fp16"]
ERROR_FLOOR = 1e-18  # exact results drawn here on log axes
KAPPA_CAP = 1e17  # condition numbers beyond (or infinite: singular factors) are binned here
BOOTSTRAP_SEED = 0

_SOLVER_COLORS = {
    "eigh": "#1f77b4",
    "eigh[pseudo_inverse]": "#17becf",
    "coupled_newton": "#ff7f0e",
    "coupled_newton[optimal]": "#ff7f0e",
    "coupled_newton[frobenius]": "#2ca02c",
    "coupled_newton[scaling=frobenius]": "#2ca02c",
    "coupled_newton[power]": "#bcbd22",
    "coupled_newton[dynamic]": "#8c564b",
    "schur_newton": "#9467bd",
    "auto": "#7f7f7f",
}
_DTYPE_COLORS = {
    "fp64": "#1f77b4",
    "fp32": "#2ca02c",
    "tf32": "#17becf",
    "bf16": "#d62728",
    "fp16": "#ff7f0e",
}
FAILURE_MEANING = (
    "failure = the solver raised a typed numerical error (NotPositiveDefinite, FormatRange, "
    "NegativeRealEigenvalue, ...), stopped unconverged, or returned a non-finite root"
)


def solver_color(label: str) -> str:
    """The solver's colour, identical in every figure (known labels fixed, others by a stable hash)."""
    if label in _SOLVER_COLORS:
        return _SOLVER_COLORS[label]
    tab = plt.get_cmap("tab20").colors
    h = int(hashlib.sha1(label.encode()).hexdigest(), 16)
    return tuple(tab[h % len(tab)])  # type: ignore[return-value]


def dtype_color(dtype: str) -> str:
    return _DTYPE_COLORS.get(dtype, "#333333")


# --- data helpers --------------------------------------------------------------------------------------


def failed(df: pd.DataFrame) -> pd.Series:
    """True where the solve failed (its ``failure`` field is set)."""
    return df["failure"].fillna("").astype(str) != ""


def kappa_bin(df: pd.DataFrame) -> pd.Series:
    """Measured condition number of the matrix solved (nominal kappa when absent), binned to decades."""
    k = df["kappa"].astype(float)
    for col in ("kappa_actual", "condition_number"):
        if col in df:
            v = df[col].astype(float)
            k = v.where(v.notna() & (v > 0), k)
    k = k.replace([np.inf], KAPPA_CAP).clip(lower=1.0, upper=KAPPA_CAP)
    return 10.0 ** np.round(np.log10(k))


def _dtypes(df: pd.DataFrame) -> list[str]:
    present = set(df["dtype"])
    return [t for t in DTYPE_ORDER if t in present] + sorted(present - set(DTYPE_ORDER))


def _solvers(df: pd.DataFrame) -> list[str]:
    return sorted(df["solver"].unique())


def _error(df: pd.DataFrame) -> pd.Series:
    return df["relative_forward_error"].astype(float).clip(lower=ERROR_FLOOR)


def _band(ax: plt.Axes, d: pd.DataFrame, x: str, y: str, color: str, label: str, **kw) -> None:
    """Median line with its interquartile band."""
    g = d.groupby(x)[y]
    med, q1, q3 = g.median(), g.quantile(0.25), g.quantile(0.75)
    if med.empty:
        return
    ax.plot(med.index, med.values, marker=kw.pop("marker", "o"), ms=3, color=color, label=label, **kw)
    ax.fill_between(med.index, q1.values, q3.values, color=color, alpha=0.15, lw=0)


def _mark_failures(ax: plt.Axes, d: pd.DataFrame, x: str) -> int:
    """Failed cases of the panel as a red x per x value in a strip at its top, labelled failed/total."""
    f = failed(d)
    if not f.any():
        return 0
    fails, total = d[f].groupby(x).size(), d.groupby(x).size()
    trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    ax.scatter(fails.index, [0.96] * len(fails), marker="x", s=18, color="red", transform=trans, zorder=5)
    # the strip's x values are data: widen the x limits to them (a blended transform does not), else a
    # failure beyond the last accurate case falls outside the panel, its mark clipped away
    xs = np.asarray(fails.index, dtype=float)
    ax.update_datalim(np.column_stack([xs, np.ones_like(xs)]), updatey=False)
    ax.autoscale_view(scaley=False)
    for xv, c in fails.items():
        ax.annotate(
            f"{c}/{total[xv]}",
            (xv, 0.96),
            xycoords=trans,
            fontsize=5,
            color="red",
            xytext=(0, -8),
            textcoords="offset points",
            ha="center",
        )
    return int(fails.sum())


def _no_data(ax: plt.Axes, why: str) -> None:
    ax.text(
        0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=8, color="grey", wrap=True
    )


#: Every figure is laid out for a page: PAGE_WIDTH_IN wide (16 cm), its text >= MIN_FONT_PT there.
PAGE_WIDTH_IN = 16 / 2.54
MIN_FONT_PT = 8.0
_PAD_IN = 0.1  # savefig's pad_inches around the tight bounding box


def _panels(
    n: int,
    *,
    width: float = 3.6,
    height: float = 3.2,
    sharey: bool = True,
    sharex: bool = True,
    layout=None,
    ncols: int = 2,
):
    """n panels of aspect width:height in rows of at most ``ncols``, the figure a page wide."""
    n = max(n, 1)
    ncols = min(n, ncols)
    nrows = -(-n // ncols)
    panel_w = PAGE_WIDTH_IN / ncols
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(PAGE_WIDTH_IN, nrows * height * panel_w / width + 0.6),
        squeeze=False,
        sharey=sharey,
        sharex=sharex,
        layout=layout,
    )
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def readable(fig: plt.Figure) -> None:
    """Make ``fig`` readable at page width: every text at least MIN_FONT_PT, figure-level texts wrapped,
    and the figure shrunk (text sizes kept) until its saved, tight-cropped width is <= PAGE_WIDTH_IN."""
    for t in fig.findobj(mtext.Text):
        if t.get_fontsize() < MIN_FONT_PT:
            t.set_fontsize(MIN_FONT_PT)
    for t in fig.texts:
        t.set_wrap(True)
    for ax in fig.axes:
        for axis in ("x", "y"):
            labels = getattr(ax, f"get_{axis}ticklabels")()
            if labels and labels[0].get_fontsize() < MIN_FONT_PT:
                ax.tick_params(axis=axis, which="both", labelsize=MIN_FONT_PT)
    limit = PAGE_WIDTH_IN - 0.05  # margin for the saved file's rounding to whole pixels
    for _ in range(4):
        width = saved_width(fig)
        if width <= limit:
            break
        k = (limit - 0.05 - 2 * _PAD_IN) / (width - 2 * _PAD_IN)
        w, h = fig.get_size_inches()
        fig.set_size_inches(w * k, h * k)


def saved_width(fig: plt.Figure) -> float:
    """Width in inches of ``fig`` saved with ``bbox_inches="tight"`` (default padding)."""
    fig.canvas.draw()
    return fig.get_tightbbox(fig.canvas.get_renderer()).width + 2 * _PAD_IN


def min_font_size(fig: plt.Figure) -> float:
    """The smallest font size (pt) of the visible, non-empty texts of a drawn figure."""
    sizes = [
        t.get_fontsize()
        for t in fig.findobj(mtext.Text)
        if t.get_visible() and t.get_text().strip() and t.figure is not None
    ]
    return min(sizes, default=MIN_FONT_PT)


def _solver_legend(fig: plt.Figure, solvers: list[str], extra: list[tuple[str, dict]] = ()) -> None:
    handles = [plt.Line2D([], [], color=solver_color(s), marker="o", ms=4, label=s) for s in solvers]
    handles += [plt.Line2D([], [], label=lab, **kw) for lab, kw in extra]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=min(len(handles), 3),
        fontsize=MIN_FONT_PT,
        frameon=False,
        bbox_to_anchor=(0.5, -0.02 - 0.035 * ((len(handles) - 1) // 3)),
    )


def save(fig: plt.Figure, out: str | Path, name: str, *, close: bool = True) -> list[Path]:
    """Write ``fig`` as OUT/NAME.png and OUT/NAME.pdf (fixed metadata, so reruns give the same files)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    readable(fig)
    fig.savefig(paths[0], dpi=130, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(
        paths[1], bbox_inches="tight", metadata={"Creator": None, "Producer": None, "CreationDate": None}
    )
    if close:
        plt.close(fig)
    return paths
