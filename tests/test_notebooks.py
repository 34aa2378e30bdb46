"""Execute the notebooks users open first, on a tiny sweep, and fail on any cell error."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from _tiny_sweep import TINY
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["root_accuracy.ipynb"])
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    monkeypatch.setenv("MATROOTS_CONFIG", str(cfg))
    monkeypatch.setenv("MATROOTS_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("MATROOTS_WORKERS", "2")
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    ).execute()
    assert (tmp_path / "run" / "results.parquet").exists()
    assert os.path.exists(tmp_path / "run" / "figures" / "error_vs_kappa.png")
