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

Axes can be replaced for one family or one order n (real factors come in fixed orders; larger n
on a budget)::

    [per_family.shampoo]
    n = [32, 64]
    kappa = [1.0]          # a real factor's kappa is its own; seeds draw different factors
    seeds = [0, 1, 2, 3]

    [per_n.256]
    seeds = [0]
    p = [2, 4]

One *unit* of work is a (matrix, p, eps) triple: its reference is computed once, then every
(solver, dtype) pair runs on it and yields one row.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core import precision
from ..core.errors import InvalidArgumentError, MatrootsError
from ..core.options import EPS_MODES
from ..solvers import registry

REFERENCE_BACKENDS = ("auto", "flint", "mpmath")


class ConfigError(InvalidArgumentError):
    """A sweep config is wrong; the message names the field, what is allowed and how to fix it."""


def _suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _solver_fields(name: str) -> list[str]:
    cls = registry._REGISTRY[name]
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    return sorted(set(names) | set(SOLVE_OPTIONS))


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
        if not isinstance(self.name, str) or self.name not in registry.available():
            raise ConfigError(
                f"unknown solver {self.name!r}{_suggest(self.name, registry.available())}; "
                f"use one of {', '.join(registry.available())}"
            )
        if not isinstance(self.options, dict):
            raise ConfigError(
                f"solver {self.name!r}: options must be a table, e.g. options = {{ tol = 1e-6 }}"
            )
        if not isinstance(self.label, str):
            raise ConfigError(f"solver {self.name!r}: label must be a string, got {self.label!r}")
        allowed = _solver_fields(self.name)
        unknown = sorted(set(self.options) - set(allowed))
        if unknown:
            raise ConfigError(
                f"solver {self.name!r}: unknown option {unknown[0]!r}{_suggest(unknown[0], allowed)}; "
                f"its options are {', '.join(allowed)}"
            )
        try:  # validates the option values now, not mid-sweep
            registry.get(self.name, **self.config_options)
        except MatrootsError as exc:
            raise ConfigError(f"solver {self.name!r}: {exc}") from None
        if not self.label:
            opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
            object.__setattr__(self, "label", f"{self.name}[{opts}]" if opts else self.name)


@dataclass(frozen=True, kw_only=True)
class EpsSpec:
    """Regularisation eps with its mode ("absolute" or "relative")."""

    value: float = 0.0
    mode: str = "relative"

    def __post_init__(self) -> None:
        if self.mode not in EPS_MODES:
            raise ConfigError(
                f"eps mode {self.mode!r}{_suggest(self.mode, EPS_MODES)} is unknown; use {' or '.join(map(repr, EPS_MODES))}"
            )
        if not isinstance(self.value, int | float) or isinstance(self.value, bool) or not self.value >= 0:
            raise ConfigError(f"eps value {self.value!r} must be a number >= 0, e.g. {{ value = 1e-12 }}")
        if not math.isfinite(self.value):
            raise ConfigError(
                f"eps value {self.value!r} must be a finite number >= 0, e.g. {{ value = 1e-12 }}"
            )


@dataclass(frozen=True, kw_only=True)
class GridSpec:
    """The whole grid. Every list is one axis of the cartesian product; ``per_family`` and ``per_n``
    replace axes for one family or one order n (see :meth:`axes`)."""

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
    #: where the solvers run: "cpu", "cuda" or "cuda:N" (matrices, references and metrics stay on the
    #: CPU in fp64; only the solve and its timing move). Left out of :meth:`to_dict` when "cpu", so the
    #: hash of every CPU grid is the one it had before the field existed (shipped runs keep matching).
    device: str = "cpu"
    family_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Axis overrides for one family (``[per_family.shampoo]`` with n/kappa/p/eps/seeds), e.g. the orders
    #: real factors come in; and for one order n (``[per_n.256]`` with kappa/p/eps/seeds: larger n on
    #: a budget). Where both set an axis, the family's value wins (it is a property of the data).
    per_family: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict)
    per_n: dict[int, dict[str, tuple[Any, ...]]] = field(default_factory=dict)

    def axes(self, family: str | None = None, n: int | None = None) -> dict[str, tuple[Any, ...]]:
        """The effective axes (n, kappa, p, eps, seeds) for one family and one order n."""
        ax: dict[str, tuple[Any, ...]] = {a: getattr(self, a) for a in ("n", "kappa", "p", "eps", "seeds")}
        if n is not None:
            ax.update(self.per_n.get(n, {}))
        if family is not None:  # the family's own constraints win over the per-n budget
            ax.update(self.per_family.get(family, {}))
        return ax

    def __post_init__(self) -> None:
        if not self.solvers:
            raise ConfigError('a grid needs at least one solver: add a [[solvers]] table with name = "eigh"')
        for axis in ("dtypes", "families", "n", "kappa", "p", "eps", "seeds"):
            if not getattr(self, axis):
                raise ConfigError(f"grid axis {axis!r} is empty; give it at least one value")
        names = sorted({precision.info(d).name for d in precision.FORMATS})
        for d in self.dtypes:
            if not isinstance(d, str):
                raise ConfigError(f"unknown dtype {d!r}; use one of {', '.join(names)}")
            try:
                precision.as_dtype(d)
            except MatrootsError:
                raise ConfigError(
                    f"unknown dtype {d!r}{_suggest(d, names)}; use one of {', '.join(names)}"
                ) from None
        from . import matrices

        fams = sorted(matrices.FAMILIES)
        for fam in self.families:
            if not isinstance(fam, str) or matrices._ALIASES.get(fam, fam) not in matrices.FAMILIES:
                raise ConfigError(
                    f"unknown matrix family {fam!r}{_suggest(fam, fams)}; use one of {', '.join(fams)}"
                )
        for fam in self.family_options:
            if fam not in self.families:
                raise ConfigError(
                    f"[family_options.{fam}] names a family that is not in families = {list(self.families)}; "
                    "add it there or remove the table"
                )
        if self.reference_backend not in REFERENCE_BACKENDS:
            raise ConfigError(
                f"unknown reference_backend {self.reference_backend!r}"
                f"{_suggest(self.reference_backend, REFERENCE_BACKENDS)}; use one of {', '.join(REFERENCE_BACKENDS)}"
            )
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        _check_axes(self.axes(), "")
        for fam, ov in self.per_family.items():
            if fam not in self.families:
                raise ConfigError(
                    f"[per_family.{fam}] names a family that is not in families = {list(self.families)}; "
                    "add it there or remove the table"
                )
            _check_override(ov, _FAMILY_AXES, f"[per_family.{fam}] ")
        for n, ov in self.per_n.items():
            if not any(n in self.axes(f)["n"] for f in self.families):
                raise ConfigError(
                    f"[per_n.{n}] names an order n that no family uses; add it to n or remove it"
                )
            _check_override(ov, _N_AXES, f"[per_n.{n}] ")
        labels = [s.label for s in self.solvers]
        dup = sorted({lab for lab in labels if labels.count(lab) > 1})
        if dup:
            raise ConfigError(
                f'two [[solvers]] entries are labelled {dup[0]!r}; give each a distinct label = "..."'
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["device"] == "cpu":
            del d["device"]
        return d

    def config_hash(self) -> str:
        """Stable hash of the grid (sorted JSON), recorded in every row."""
        blob = json.dumps(self.to_dict(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


_FAMILY_AXES = ("n", "kappa", "p", "eps", "seeds")
_N_AXES = ("kappa", "p", "eps", "seeds")


def _check_axes(ax: dict[str, tuple[Any, ...]], where: str) -> None:
    for axis, typ, ok, rule in (
        ("n", int, lambda v: v >= 1, "integers >= 1"),
        ("p", int, lambda v: v >= 1, "integers >= 1"),
        ("seeds", int, lambda v: v >= 0, "integers >= 0"),
        ("kappa", float, lambda v: v >= 1, "numbers >= 1"),
    ):
        for v in ax.get(axis, ()):
            if isinstance(v, bool) or not isinstance(v, typ) or not ok(v):
                raise ConfigError(f"{where}{axis} = {v!r} is not allowed; {axis} values must be {rule}")
    for e in ax.get("eps", ()):
        if not isinstance(e, EpsSpec):
            raise ConfigError(f"{where}eps entry {e!r} must be {{ value = ..., mode = ... }}")


def _check_override(ov: dict[str, tuple[Any, ...]], allowed: tuple[str, ...], where: str) -> None:
    bad = sorted(set(ov) - set(allowed))
    if bad:
        raise ConfigError(
            f"{where}unknown axis {bad[0]!r}{_suggest(bad[0], allowed)}; it may set {', '.join(allowed)}"
        )
    for axis, vals in ov.items():
        if not vals:
            raise ConfigError(f"{where}{axis} is empty; give it at least one value or remove it")
    _check_axes(ov, where)


def _parse_eps(entries: Any) -> tuple[EpsSpec, ...]:
    if not isinstance(entries, list | tuple):
        raise ConfigError(
            f'eps must be a list, e.g. eps = [{{ value = 1e-12, mode = "relative" }}], got {entries!r}'
        )
    eps = []
    for e in entries:
        if isinstance(e, EpsSpec):
            eps.append(e)
        elif isinstance(e, dict):
            bad = sorted(set(e) - {"value", "mode"})
            if bad:
                raise ConfigError(
                    f'eps entry {e}: unknown key {bad[0]!r}; use {{ value = 1e-12, mode = "relative" }}'
                )
            eps.append(EpsSpec(**e))
        elif isinstance(e, int | float) and not isinstance(e, bool):
            eps.append(EpsSpec(value=float(e)))
        else:
            raise ConfigError(f"eps entry {e!r} must be a number or {{ value = ..., mode = ... }}")
    return tuple(eps)


def _parse_axis(axis: str, v: Any) -> tuple[Any, ...]:
    if axis == "eps":
        return _parse_eps(v)
    if not isinstance(v, list | tuple):
        raise ConfigError(f"{axis} must be a list, e.g. {axis} = [{v!r}]")
    if axis == "kappa":
        return tuple(float(k) if isinstance(k, int | float) and not isinstance(k, bool) else k for k in v)
    return tuple(v)


def _parse_overrides(table: Any, name: str, key_type: type) -> dict[Any, dict[str, tuple[Any, ...]]]:
    if not isinstance(table, dict) or not all(isinstance(t, dict) for t in table.values()):
        raise ConfigError(f"{name} must be a table of tables, e.g. [{name}.KEY] with axis lists")
    out: dict[Any, dict[str, tuple[Any, ...]]] = {}
    for key, ov in table.items():
        try:
            k = key_type(key)
        except ValueError:
            raise ConfigError(f"[{name}.{key}]: {key!r} is not a valid {key_type.__name__}") from None
        out[k] = {axis: _parse_axis(axis, v) for axis, v in ov.items()}
    return out


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
    """Read a TOML grid spec (see the module docstring).

    Raises:
        ConfigError: naming the file and the problem (missing file, TOML syntax, unknown key, solver,
            option, family, dtype or backend, duplicate labels, bad values).
    """
    path = Path(path)
    if path.is_dir() or not path.exists():
        raise ConfigError(
            f"config {path} does not exist; give the path of a .toml grid (see experiments/configs/)"
        )
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}; fix the syntax there") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    try:
        return from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"config {path}: {exc}") from None


def from_dict(raw: dict[str, Any]) -> GridSpec:
    """Build a GridSpec from plain data (TOML/JSON), validating every field."""
    raw = dict(raw)
    known = sorted(GridSpec.__dataclass_fields__)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown grid keys {unknown}{_suggest(unknown[0], known)}; known keys: {', '.join(known)}"
        )
    solvers = []
    entries = raw.pop("solvers", [])
    if not isinstance(entries, list | tuple):  # a list from TOML/JSON, a tuple from GridSpec.to_dict
        raise ConfigError(
            f'solvers must be a list of [[solvers]] tables with name = "..." (e.g. name = "eigh"), '
            f"not {type(entries).__name__}"
        )
    for s in entries:
        if not isinstance(s, dict) or "name" not in s:
            raise ConfigError('each [[solvers]] entry needs name = "..." (e.g. name = "eigh")')
        bad = sorted(set(s) - {"name", "options", "label"})
        if bad:
            raise ConfigError(
                f"[[solvers]] {s['name']!r}: unknown key {bad[0]!r}; use name, label and options = {{ ... }}"
            )
        solvers.append(SolverSpec(**s))
    eps = _parse_eps(raw.pop("eps", [{}]))
    per_family = _parse_overrides(raw.pop("per_family", {}), "per_family", str)
    per_n = _parse_overrides(raw.pop("per_n", {}), "per_n", int)
    kw: dict[str, Any] = {}
    for k, v in raw.items():
        kw[k] = tuple(v) if isinstance(v, list) else v
    for axis in ("dtypes", "families", "n", "kappa", "p", "seeds"):
        if axis in kw and not isinstance(kw[axis], tuple):
            raise ConfigError(f"{axis} must be a list, e.g. {axis} = [{kw[axis]!r}]")
    if "kappa" in kw:
        kw["kappa"] = tuple(
            float(k) if isinstance(k, int | float) and not isinstance(k, bool) else k for k in kw["kappa"]
        )
    if not isinstance(kw.get("family_options", {}), dict):
        raise ConfigError("family_options must be a table of tables, e.g. [family_options.lowrank]")
    return GridSpec(solvers=tuple(solvers), eps=eps, per_family=per_family, per_n=per_n, **kw)


def check_families(grid: GridSpec) -> None:
    """Build one small matrix of each family with its options, so an unknown family option or a value
    the generator refuses is reported before any worker starts."""
    import numpy as np

    from . import matrices

    for fam in grid.families:
        opts = grid.family_options.get(fam, {})
        for n in grid.axes(fam)["n"]:
            kappa = min(grid.axes(fam, n)["kappa"])
            try:
                matrices.generate(fam, n, kappa, np.random.default_rng(0), **opts)
            except TypeError as exc:
                raise ConfigError(
                    f"[family_options.{fam}]: {exc}; see matroots.study.matrices.{matrices._ALIASES.get(fam, fam)} "
                    "for its options"
                ) from None
            except (ValueError, MatrootsError) as exc:
                raise ConfigError(
                    f"family {fam!r} with n={n}, kappa={kappa:g}: {exc}; restrict its orders with "
                    f"[per_family.{fam}] n = [...]"
                ) from None


def units(grid: GridSpec) -> list[Unit]:
    """The work units of a grid, in a deterministic order."""
    out = []
    for fam in grid.families:
        for n in grid.axes(fam)["n"]:
            ax = grid.axes(fam, n)
            for kappa, seed, p, e in itertools.product(ax["kappa"], ax["seeds"], ax["p"], ax["eps"]):
                out.append(Unit(family=fam, n=n, kappa=kappa, seed=seed, p=p, eps=e.value, eps_mode=e.mode))
    return out


def case_count(grid: GridSpec) -> int:
    """Number of (case, solver) rows the grid produces."""
    return len(units(grid)) * len(grid.dtypes) * len(grid.solvers)
