"""notebooks/optimizer_validation.ipynb executes on a tiny validation grid and displays its figures."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from _tiny_validation import NOTEBOOK, synthetic_protocol_tables
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def _shipped_set(dest: Path) -> None:
    """A shipped protocol set built from synthetic tables, with a valid provenance for validate_tiny."""
    import hashlib
    import json

    from matroots.study.validation import config
    from matroots.study.validation.protocol_report import protocol_summary

    runs, curves = synthetic_protocol_tables()
    tables = {"curves": curves[curves["phase"] == "final"].drop(columns="phase"), "runs": runs,
              "protocol": protocol_summary(curves, runs, b=50)}  # fmt: skip
    dest.mkdir()
    sha = {}
    for name, df in tables.items():
        df.to_parquet(dest / f"{name}.parquet")
        sha[name] = hashlib.sha256((dest / f"{name}.parquet").read_bytes()).hexdigest()
    cfg = "experiments/configs/validate_tiny.toml"
    prov = {"kind": "validation", "name": "validate_tiny", "config": cfg, "sha256": sha, "complete": True,
            "config_hash": config.load_config(ROOT / cfg).config_hash(), "units_done": len(runs),
            "units_total": len(runs), "commits": ["synthetic"], "shipped": "now"}  # fmt: skip
    (dest / "provenance.json").write_text(json.dumps(prov))


def test_optimizer_validation_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _shipped_set(tmp_path / "shipped")
    monkeypatch.setenv("MATROOTS_VALIDATION_RESULTS", str(tmp_path / "shipped"))
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
    assert (
        len(images) >= 5
    )  # shipped held-out curves (2), validation and training curves, accuracy vs outcome
    stream = "".join(str(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")
    assert "shipped: validate_tiny" in stream and "target = held-out loss" in stream  # the shipped set shown
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
