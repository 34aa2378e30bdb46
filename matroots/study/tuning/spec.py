"""The tune config: candidate solvers x sweep grids x the cells of the selection table.

A tune config (TOML) is a list of sweep grids (:mod:`matroots.study.grid`, one per group of matrix families
that share an eps/p/n layout) over one list of candidate configurations, plus the cells of the table::

    name = "tune_default"
    device = "cpu"
    targets = [1e-1, 1e-2, 1e-4, 1e-6, 1e-8]      # relative forward error levels
    n_bands = [12, 24, 48, 96, 192, 384]           # band edges: [12, 24), [24, 48), ...
    kappa_bands = [1, 1e2, 1e4, 1e6, 1e8, 1e10, 1e13]
    margin = 0.5                                   # a choice must reach margin * target on every case
    cost_tolerance = 0.1                           # costs within 10% tie; the first candidate listed wins

    [defaults]                                     # keys of a sweep grid, shared by every sweep
    dtypes = ["fp64", "fp32", "bf16"]
    p = [2, 4]
    reference_backend = "auto"

    [[candidates]]                                 # a list-valued option is an axis: one candidate each
    name = "eigh"
    options = { rank_policy = ["perturb", "clamp"] }

    [[candidates]]
    name = "coupled_newton"
    options = { scaling = ["optimal", "frobenius"], tol = [1e-3] }   # tol/max_iter go to solve()

    [[sweeps]]
    name = "spd"
    families = ["randsvd", "clustered"]
    n = [16, 32]
    kappa = [1e1, 1e3, 1e5]

Every sweep runs every candidate; its grid is ``defaults`` updated by the sweep's own keys. The kappa
of a case, for the bands, is the condition number of the matrix actually solved (A + eps I). A candidate
is chosen for a target only when its worst error on the cell's cases is <= ``margin`` * target (default
1: the target itself), so that the promise carries over to matrices the tuning did not see.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ...core import arguments
from ...core.errors import InvalidArgumentError
from .. import grid as gridmod

TUNE_KEYS = {
    "name",
    "description",
    "device",
    "targets",
    "n_bands",
    "kappa_bands",
    "workers",
    "margin",
    "cost_tolerance",
}


@dataclass(frozen=True, kw_only=True)
class TuneSpec:
    """A parsed tune config (see the module docstring)."""

    name: str
    description: str = ""
    device: str = "cpu"
    targets: tuple[float, ...]
    n_bands: tuple[int, ...]
    kappa_bands: tuple[float, ...]
    candidates: tuple[gridmod.SolverSpec, ...]
    sweeps: tuple[gridmod.GridSpec, ...]
    workers: int | None = None
    margin: float = 1.0
    cost_tolerance: float = 0.1
    raw: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.targets or any(not (0 < t < 1) for t in self.targets):
            raise InvalidArgumentError(f"targets must be relative errors in (0, 1), got {self.targets}")
        for axis, edges in (("n_bands", self.n_bands), ("kappa_bands", self.kappa_bands)):
            if len(edges) < 2 or any(b <= a for a, b in itertools.pairwise(edges)):
                raise InvalidArgumentError(f"{axis} must be >= 2 increasing band edges, got {edges}")
        if not (0 <= self.cost_tolerance < 1):
            raise InvalidArgumentError(f"cost_tolerance must be in [0, 1), got {self.cost_tolerance}")
        if not (0 < self.margin <= 1):
            raise InvalidArgumentError(f"margin must be in (0, 1], got {self.margin}")
        if self.kappa_bands[0] < 1:
            raise InvalidArgumentError(f"kappa_bands must start at >= 1, got {self.kappa_bands[0]}")
        if not self.sweeps or not self.candidates:
            raise InvalidArgumentError("a tune config needs at least one [[sweeps]] and one [[candidates]]")
        if self.device not in ("cpu", "cuda"):
            raise InvalidArgumentError(
                f"device {self.device!r}: a selection table is for device kind 'cpu' or 'cuda'"
            )

    def config_hash(self) -> str:
        """Hash of the whole tune config (recorded in the table's provenance)."""
        d = asdict(self) | {"raw": None, "sweeps": [g.to_dict() for g in self.sweeps]}
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _bad(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"tune config: {msg}")


def _numbers(raw: dict[str, Any], key: str, kind: type = float, inf: bool = False) -> list[Any]:
    """A list of finite numbers (``kind=int``: whole numbers; ``inf``: "inf" or inf allowed too)."""
    values = raw.get(key, [])
    if not isinstance(values, list):
        raise _bad(f"{key} must be a list of numbers, got {values!r}")
    for v in values:
        if inf and (v == math.inf or (isinstance(v, str) and v.lower() == "inf")):
            continue
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (kind is int and v != int(v)):
            what = "whole numbers" if kind is int else "finite numbers" + (' (or "inf")' if inf else "")
            raise _bad(f"{key} values must be {what}, got {v!r}")
    return values


def _scalar(raw: dict[str, Any], key: str, default: float) -> float:
    """``raw[key]`` (or ``default``) as a finite number (core.arguments.real, the one rule)."""
    try:
        return arguments.real(key, raw.get(key, default))
    except InvalidArgumentError as e:
        raise _bad(str(e)) from None


def _tables(raw: dict[str, Any], key: str, hint: str) -> list[Any]:
    """A list (``[[key]]`` tables; each entry is checked where it is read)."""
    values = raw.get(key, [])
    if not isinstance(values, list):
        raise _bad(f"{key} must be a list of [[{key}]] tables ({hint}), got {values!r}")
    return values


def expand_candidates(raw: list[dict[str, Any]]) -> tuple[gridmod.SolverSpec, ...]:
    """One SolverSpec per combination of the list-valued options of each ``[[candidates]]`` entry."""
    out: list[gridmod.SolverSpec] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise _bad(f"candidates[{i}] must be a table with name = ..., options = {{...}}, got {entry!r}")
        entry = dict(entry)
        unknown = set(entry) - {"name", "options", "label"}
        if unknown:
            raise InvalidArgumentError(
                f"unknown candidate keys {sorted(unknown)}; known: name, options, label"
            )
        if "name" not in entry:
            raise _bad(f'candidates[{i}] needs name = "..." (a registered solver, e.g. "eigh")')
        opts = entry.get("options", {})
        if not isinstance(opts, dict):
            raise _bad(f"candidates[{i}].options must be a table of option values or lists, got {opts!r}")
        keys = sorted(opts)
        axes = [opts[k] if isinstance(opts[k], list) else [opts[k]] for k in keys]
        combos = list(itertools.product(*axes))
        for combo in combos:
            label = entry.get("label", "") if len(combos) == 1 else ""
            out.append(
                gridmod.SolverSpec(
                    name=entry["name"], options=dict(zip(keys, combo, strict=True)), label=label
                )
            )
    labels = [s.label for s in out]
    dup = {x for x in labels if labels.count(x) > 1}
    if dup:
        raise InvalidArgumentError(f"duplicate candidate labels {sorted(dup)}; give each a distinct label")
    return tuple(out)


def from_dict(raw: dict[str, Any]) -> TuneSpec:
    """Build a TuneSpec from plain data (TOML), validating every sweep grid now."""
    known = TUNE_KEYS | {"defaults", "candidates", "sweeps"}
    unknown = set(raw) - known
    if unknown:
        raise InvalidArgumentError(f"unknown tune config keys {sorted(unknown)}; known: {sorted(known)}")
    if "name" not in raw:
        raise InvalidArgumentError("a tune config needs a name")
    candidates = expand_candidates(_tables(raw, "candidates", "name, options, label"))
    solvers = [{"name": s.name, "options": s.options, "label": s.label} for s in candidates]
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise _bad(f"[defaults] must be a table of sweep grid keys, got {defaults!r}")
    defaults = dict(defaults)
    device = str(raw.get("device", "cpu"))
    sweeps = []
    for i, sw in enumerate(_tables(raw, "sweeps", "name and sweep grid keys")):
        if not isinstance(sw, dict):
            raise _bad(f"sweeps[{i}] must be a table of sweep grid keys (name, families, n, ...), got {sw!r}")
        g = {**defaults, **sw}
        if "solvers" in g:
            raise InvalidArgumentError("sweeps take their solvers from [[candidates]]; remove 'solvers'")
        g["name"] = f"{raw['name']}-{sw.get('name', i)}"
        sweeps.append(gridmod.from_dict({**g, "solvers": solvers, "device": device}))
    names = [s.name for s in sweeps]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"sweep names must be distinct, got {names}")
    kb = tuple(
        math.inf if str(k).lower() == "inf" else float(k) for k in _numbers(raw, "kappa_bands", inf=True)
    )
    workers = raw.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise _bad(f"workers must be a whole number >= 1, got {workers!r}")
    return TuneSpec(
        name=str(raw["name"]),
        description=str(raw.get("description", "")),
        device=device,
        targets=tuple(sorted(float(t) for t in _numbers(raw, "targets"))),
        n_bands=tuple(int(n) for n in _numbers(raw, "n_bands", int)),
        kappa_bands=kb,
        candidates=candidates,
        sweeps=tuple(sweeps),
        workers=workers,
        margin=_scalar(raw, "margin", 1.0),
        cost_tolerance=_scalar(raw, "cost_tolerance", 0.1),
        raw=raw,
    )


def load_config(path: str | Path) -> TuneSpec:
    """Read a tune config (TOML)."""
    with open(path, "rb") as fh:
        return from_dict(tomllib.load(fh))


__all__ = ["TuneSpec", "expand_candidates", "from_dict", "load_config"]
