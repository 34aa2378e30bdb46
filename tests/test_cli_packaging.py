"""Packaging: SPDX license with its file, version, and submodules reachable after `import matroots`."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_spdx_license_and_file() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["license"] == "MIT"  # an SPDX expression, not the deprecated {text = ...} table
    assert project["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert "dask[distributed]" in " ".join(project["optional-dependencies"]["dask"])


def test_submodules_are_attributes_and_cheap() -> None:
    code = (
        "import sys, matroots\n"
        "heavy = [m for m in ('matroots.truth.reference', 'matroots.truth.metrics', 'mpmath', 'pandas') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert callable(matroots.metrics.relative_forward_error)\n"
        "assert callable(matroots.reference.inverse_root)\n"
        "assert 'metrics' in dir(matroots)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
