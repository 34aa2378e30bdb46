"""The solver configurations ``method="auto"`` can choose: a selection-table row or a candidate label
turned into a (frozen) config plus the solve options it fixes, and the safe default outside the table.
"""

from __future__ import annotations

import functools
from typing import Any

from . import auto_table, registry
from .base import SolverConfig

#: the options a table row may fix that are solve options (:class:`matroots.SolveOptions`), not
#: config fields
SOLVE_OPTIONS = ("tol", "max_iter", "compute_dtype")


def _split(name: str, opts: dict[str, Any]) -> tuple[SolverConfig, dict[str, Any]]:
    cfg_opts = {k: v for k, v in opts.items() if k not in SOLVE_OPTIONS}
    return registry.get(name, **cfg_opts), {k: v for k, v in opts.items() if k in SOLVE_OPTIONS}


@functools.lru_cache(maxsize=256)
def config_from(label: str, method: str, options_json: str) -> tuple[SolverConfig, dict[str, Any]]:
    """The (frozen) config and solve options of a table row; memoised, callers do not mutate them."""
    return _split(method, auto_table.options_of(options_json))


@functools.lru_cache(maxsize=2)
def default_safe(symmetric: bool) -> SolverConfig:
    """eigh for symmetric input, Schur-Newton for general input (frozen configs, built once)."""
    return registry.get("eigh") if symmetric else registry.get("schur_newton")


def candidate(table: Any, label: str) -> tuple[SolverConfig, dict[str, Any]]:
    """Config and solve options of a candidate by its label: from the table's provenance
    (``candidate_specs``), else from a row of the table that chose it, else parsed from the label."""
    for c in table.provenance.get("candidate_specs", []):
        if c.get("label") == label:
            return _split(c["name"], dict(c.get("options", {})))
    r = table.first_row_where("choice", label)
    if r is not None:
        return config_from(label, r["method"], r["options"])
    name, _, rest = label.partition("[")
    opts: dict[str, Any] = {}
    for kv in rest.rstrip("]").split(",") if rest else []:
        k, _, v = kv.partition("=")
        try:
            opts[k] = float(v) if k in ("tol", "atol", "rtol") else int(v) if v.isdigit() else v
        except ValueError:
            opts[k] = v
    return _split(name, opts)


__all__ = ["SOLVE_OPTIONS", "candidate", "config_from", "default_safe"]
