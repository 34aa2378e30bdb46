"""notebooks/optimizer_validation.ipynb executes on a tiny validation grid and displays its figures."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from _tiny_validation import NOTEBOOK
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def test_optimizer_validation_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "nb.toml"
    cfg.write_text(NOTEBOOK)
    monkeypatch.setenv("MATROOTS_VALIDATION_CONFIG", str(cfg))
    monkeypatch.setenv("MATROOTS_VALIDATION_RUN", str(tmp_path / "run"))
    monkeypatch.setenv("MATROOTS_WORKERS", "2")
    nb = nbformat.read(ROOT / "notebooks" / "optimizer_validation.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # validation curves, training curves, accuracy vs outcome, inline
    text = "".join(str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "reaches AdamW's best final validation loss" in text
    assert (tmp_path / "run" / "summary.parquet").exists()


def test_notebook_and_script_are_paired() -> None:
    """The .ipynb is generated from the percent-format .py (jupytext); their code cells agree."""
    import jupytext

    py = jupytext.read(ROOT / "notebooks" / "optimizer_validation.py")
    ipynb = nbformat.read(ROOT / "notebooks" / "optimizer_validation.ipynb", as_version=4)
    src = [c.source for c in py.cells if c.cell_type == "code"]
    assert src == [c.source for c in ipynb.cells if c.cell_type == "code"]
