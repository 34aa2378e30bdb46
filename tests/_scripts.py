"""Test helper: load a script of experiments/ or paper_figs/ (not a package) as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str | None = None) -> ModuleType:
    """The module of ``ROOT/relpath`` (e.g. ``"experiments/time_claims.py"``), executed afresh."""
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec and spec.loader, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
