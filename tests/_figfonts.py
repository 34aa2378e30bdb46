"""Recording the smallest font of every figure as it is saved (the figure-readability tests)."""

from __future__ import annotations


def record_fonts(monkeypatch) -> dict[str, float]:
    """Patch :func:`matroots.study.plots.save` so that each saved figure's smallest font size (points)
    lands in the returned dict under the figure's name."""
    import matplotlib.pyplot as plt

    from matroots.study import figure_style, plots

    fonts: dict[str, float] = {}
    real_save = plots.save

    def save(fig, out, name, close=True):
        paths = real_save(fig, out, name, close=False)
        fonts[name] = figure_style.min_font_size(fig)
        plt.close(fig)
        return paths

    monkeypatch.setattr(plots, "save", save)
    return fonts
