"""Sweep grid specification: TOML file or dataclasses, expanded into cases.

A TOML config looks like::

    name = "demo"
    families = ["randsvd", "clustered"]
    n = [32]
    kappa = [1e0, 1e3, 1e6]
    p = [2, 4]
    dtypes = ["fp64", "fp32", "bf16", "fp16"]
    seeds = [0]
    eps = [{value = 0.0}, {value = 1e-12, mode = "relative"}]
    reference_backend = "auto"

    [[solvers]]
    name = "eigh"

    [[solvers]]
    name = "coupled_newton"
    label = "cn-frobenius"
    options = { scaling = "frobenius" }

One *unit* of work is a (matrix, p, eps) triple: its reference is computed once, then every
(solver, dtype) pair runs on it and yields one row.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import precision
from .solvers import registry

#: Options of a SolverSpec that are arguments of ``solve`` (not fields of the solver's config).
SOLVE_OPTIONS = ("tol", "max_iter", "compute_dtype")


@dataclass(frozen=True, kw_only=True)
class SolverSpec:
    """A solver by registry name, with options and a label naming it in the results.

    ``options`` are fields of the solver's config, plus the solve arguments in :data:`SOLVE_OPTIONS`
    (``tol``, ``max_iter``, ``compute_dtype``), which are passed to ``solve`` instead.
    """

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def config_options(self) -> dict[str, Any]:
        """The options that are fields of the solver's config."""
        return {k: v for k, v in self.options.items() if k not in SOLVE_OPTIONS}

    @property
    def solve_options(self) -> dict[str, Any]:
        """The options that are arguments of ``solve`` (tol, max_iter, compute_dtype)."""
        return {k: v for k, v in self.options.items() if k in SOLVE_OPTIONS}

    def __post_init__(self) -> None:
        if self.name not in registry.available():
            raise ValueError(f"unknown solver {self.name!r}; available: {registry.available()}")
        registry.get(self.name, **self.config_options)  # validates the options now, not mid-sweep
        if not self.label:
            opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
            object.__setattr__(self, "label", f"{self.name}[{opts}]" if opts else self.name)


@dataclass(frozen=True, kw_only=True)
class EpsSpec:
    """Regularisation eps with its mode ("absolute" or "relative")."""

    value: float = 0.0
    mode: str = "relative"

    def __post_init__(self) -> None:
        if self.mode not in ("absolute", "relative") or self.value < 0:
            raise ValueError(f"bad eps spec: value={self.value!r} mode={self.mode!r}")


@dataclass(frozen=True, kw_only=True)
class GridSpec:
    """The whole grid. Every list is one axis of the cartesian product."""

    name: str = "sweep"
    solvers: tuple[SolverSpec, ...]
    dtypes: tuple[str, ...] = ("fp64",)
    families: tuple[str, ...] = ("randsvd",)
    n: tuple[int, ...] = (32,)
    kappa: tuple[float, ...] = (1e2,)
    p: tuple[int, ...] = (4,)
    eps: tuple[EpsSpec, ...] = (EpsSpec(),)
    seeds: tuple[int, ...] = (0,)
    reference_backend: str = "auto"
    family_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.solvers:
            raise ValueError("a grid needs at least one solver")
        for d in self.dtypes:
            precision.as_dtype(d)
        for axis in ("dtypes", "families", "n", "kappa", "p", "eps", "seeds"):
            if not getattr(self, axis):
                raise ValueError(f"grid axis {axis!r} is empty")
        if any(k < 1 for k in self.kappa) or any(n < 1 for n in self.n) or any(p <= 0 for p in self.p):
            raise ValueError("kappa must be >= 1, n >= 1 and p > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def config_hash(self) -> str:
        """Stable hash of the grid (sorted JSON), recorded in every row."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Unit:
    """One (matrix, p, eps) work unit; all (solver, dtype) pairs run on it."""

    family: str
    n: int
    kappa: float
    seed: int
    p: int
    eps: float
    eps_mode: str

    @property
    def key(self) -> str:
        """Deterministic file-safe id, used to name the unit's parquet part (resume key)."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:20]


def load_config(path: str | Path) -> GridSpec:
    """Read a TOML grid spec (see the module docstring)."""
    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    return from_dict(raw)


def from_dict(raw: dict[str, Any]) -> GridSpec:
    """Build a GridSpec from plain data (TOML/JSON), validating every field."""
    raw = dict(raw)
    known = set(GridSpec.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown grid keys {sorted(unknown)}; known: {sorted(known)}")
    solvers = tuple(SolverSpec(**s) for s in raw.pop("solvers", []))
    eps = tuple(
        EpsSpec(**e) if isinstance(e, dict) else EpsSpec(value=float(e)) for e in raw.pop("eps", [{}])
    )
    kw: dict[str, Any] = {}
    for k, v in raw.items():
        kw[k] = tuple(v) if isinstance(v, list) else v
    if "kappa" in kw:
        kw["kappa"] = tuple(float(k) for k in kw["kappa"])
    return GridSpec(solvers=solvers, eps=eps, **kw)


def units(grid: GridSpec) -> list[Unit]:
    """The work units of a grid, in a deterministic order."""
    out = []
    for fam, n, kappa, seed, p, e in itertools.product(
        grid.families, grid.n, grid.kappa, grid.seeds, grid.p, grid.eps
    ):
        out.append(Unit(family=fam, n=n, kappa=kappa, seed=seed, p=p, eps=e.value, eps_mode=e.mode))
    return out


def case_count(grid: GridSpec) -> int:
    """Number of (case, solver) rows the grid produces."""
    return len(units(grid)) * len(grid.dtypes) * len(grid.solvers)
