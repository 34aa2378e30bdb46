"""Execute the notebooks users open first (small parameters), headless, and check they show figures.

Each notebook is a jupytext percent-format ``.py`` paired with its ``.ipynb``: the two must hold the
same cells, the notebook must run from a clean state without writing into ``runs/demo``, and its
output cells must contain images (figures displayed inline, not only saved).
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["root_accuracy", "precision_study", "eps_regularisation"]


def _images(nb: nbformat.NotebookNode) -> int:
    return sum(
        1
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_paired(name: str) -> None:
    import jupytext  # in the notebooks extra that make test installs: a missing pairing check must fail

    ipynb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    py = jupytext.read(ROOT / "notebooks" / f"{name}.py")
    src = [(c.cell_type, c.source.strip()) for c in ipynb.cells]
    assert src == [(c.cell_type, c.source.strip()) for c in py.cells], (
        "run: jupytext --sync notebooks/*.ipynb"
    )
    assert "py:percent" in ipynb.metadata["jupytext"]["formats"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_and_shows_figures(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MATROOTS_NB_SIZE", "small")
    monkeypatch.setenv("MATROOTS_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("MATROOTS_WORKERS", "2")
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    demo = ROOT / "runs" / "demo"
    before = sorted(p.stat().st_mtime_ns for p in demo.rglob("*")) if demo.exists() else []
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    t = time.perf_counter()
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()
    print(f"{name}: executed in {time.perf_counter() - t:.1f} s")
    shown = sum(c.source.count("plt.show()") for c in nb.cells if c.cell_type == "code")
    assert shown >= 2
    assert _images(nb) == shown, "every figure the notebook shows must display inline"
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # Issue 29: quiet output. A text progress bar (no TqdmWarning about ipywidgets), and the sweeps'
    # expected non-convergence summarised in one line per run instead of a warning per solve (258 lines
    # in eps_regularisation before)
    text = "\n".join(
        o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "stream"
    )
    assert "TqdmWarning" not in text and "IProgress not found" not in text, text[-3000:]
    per_solve = [ln for ln in text.splitlines() if "did not converge" in ln]
    assert len(per_solve) <= 1, per_solve[:5]
    assert (tmp_path / "run" / "results.parquet").exists()
    after = sorted(p.stat().st_mtime_ns for p in demo.rglob("*")) if demo.exists() else []
    assert before == after, "the notebook must not write into runs/demo"
