"""Test helpers of the generated pages' scripts (paper_figs/findings.py and its abstract): load a
paper_figs script by path (paper_figs is a folder of scripts, not a package) and build one row of a
synthetic shipped frame."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str, file: str) -> Any:
    """The module of ``paper_figs/<file>``, imported under ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "paper_figs" / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(**kw: Any) -> dict[str, Any]:
    """One row of a shipped frame: an fp32 randsvd solve at kappa 1, eps 0, nothing measured yet,
    with ``kw`` set."""
    base = {
        "family": "randsvd",
        "kappa": 1.0,
        "kappa_actual": 1.0,
        "eps": 0.0,
        "eps_mode": "absolute",
        "eps_abs": 0.0,
        "eps_bias": np.nan,
        "failure": "",
        "relative_forward_error": np.nan,
        "forward_error_total": np.nan,
        "cond_u_line": np.nan,
        "gemm_equivalents": np.nan,
        "solver": "a",
        "dtype": "fp32",
    }
    base.update(kw)
    return base
