"""Validation grid: a TOML config expanded into training units (task x optimizer config x lr x seed).

A config looks like (see ``experiments/configs/validate_demo.toml``)::

    name = "validate_demo"
    seeds = [0, 1, 2]
    order = "task"           # or "seed": every task's first seed first (useful partial runs)

    [timing]                 # the in-unit interleaved step timing against AdamW
    rounds = 3               # alternating (this optimizer, AdamW) chunks
    chunk_steps = 10         # steps per chunk (default: the config's precondition frequency)

    [diagnostics]
    root_error_samples = 4   # factors per root round checked against a float64 eigh reference
    reference_eps = 1e-6     # the common reference root of forward_error_total (all configs alike)
    reference_eps_mode = "relative"

    [tasks.digits]           # one table per task; all keys optional
    steps = 300
    eval_every = 20
    size = { hidden = 128 }  # keyword arguments of get_task
    seeds = [0]              # this task's seeds (default: the grid's)

    [[optimizers]]
    name = "adamw"           # "adamw", "sgd" (momentum) or "shampoo"
    lr = [1e-3, 3e-3, 1e-2]  # a list, or a table of lists per task: { digits = [...], default = [...] }
    options = { weight_decay = 0.0 }

    [[optimizers]]
    name = "shampoo"
    lr = [1e-3, 3e-3]
    root_solver = ["eigh", { name = "coupled_newton", options = { scaling = "frobenius" } }]
    root_dtype = ["fp32", "bf16"]
    eps = [{ value = 1e-12, mode = "absolute" }, { value = 1e-6, mode = "relative" }]
    precondition_frequency = [10]
    max_root_delay = ["sync", 1]   # optional: "sync" (default) or k: roots in the background, k steps stale
    tasks = ["digits"]       # optional: only these tasks
    options = { grafting = "adam", max_preconditioner_dim = 256 }

    [[optimizers]]
    name = "soap"            # eigenvalue-corrected Shampoo (shampoo.SOAP as the group's preconditioner)
    lr = [1e-3, 3e-3]
    basis_update = ["eigh_warm", "qr"]   # shampoo.SOAP.basis_update values
    precondition_frequency = [10]
    eps = [1e-8]             # SOAP's Adam eps
    options = { betas = [0.95, 0.95] }   # Shampoo keyword arguments (defaults below)

With a ``[protocol]`` table the grid is the tuning protocol of :mod:`matroots.study.validation.protocol`
instead: optimizer entries give no ``lr`` list but a search space (``space``, ``fixed``, ``tune``), and
the units are quasi-random trials (phase ``"tune"``) and, once those are done, the chosen point of each
optimizer at the final seeds (phase ``"final"``, :meth:`ValidationGrid.final_units`). ``name = "peer"``
entries (``peer = "heavyball_soap"`` or ``"meta_shampoo"``, :mod:`matroots.study.validation.peers`) run the
optimizers of other packages through the same harness.

Every Shampoo entry is the cross product of its root solvers, dtypes, eps and frequencies (``"all"``
as ``root_solver`` means every registered solver); every SOAP entry the cross product of its basis
updates, eps and frequencies (SOAP defaults: ``grafting="none"``, ``start_preconditioning_step=1``,
``max_preconditioner_dim=256``: SOAP as published). Every optimizer config of a task runs on the same
seeds, hence the same initial weights and data order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...core.errors import InvalidArgumentError
from ...core.options import EPS_MODES
from . import protocol as proto
from .protocol_config import protocol_entries
from .specs import (
    BASELINE,
    DTYPES,
    OPTIMIZERS,
    OptimizerSpec,
    ProtocolEntry,
    TaskSpec,
    Unit,
    _delays,
    _int,
    _label,
    _list,
    _lr_table,
    _solvers,
    _table,
    _task_names,
    bad_config,
)
from .tasks import TASKS


@dataclass(frozen=True, kw_only=True)
class ValidationGrid:
    name: str
    seeds: tuple[int, ...]
    tasks: tuple[TaskSpec, ...]
    entries: tuple[tuple[OptimizerSpec, dict[str, tuple[float, ...]], tuple[str, ...]], ...]
    timing_rounds: int = 3
    timing_chunk: int = 0
    root_error_samples: int = 4
    reference_eps: float = 1e-6
    reference_eps_mode: str = "relative"
    order: str = "task"
    raw: dict[str, Any] = field(default_factory=dict)
    protocol: proto.Protocol | None = None
    protocol_entries: tuple[ProtocolEntry, ...] = ()

    def config_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.raw, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)

    def lrs(self, entry_lrs: dict[str, tuple[float, ...]], task: str) -> tuple[float, ...]:
        return entry_lrs.get(task, entry_lrs.get("default", ()))

    def units(self) -> list[Unit]:
        """All units, baseline (AdamW) first within each task and seed, so targets exist early.

        ``order = "task"`` (default) runs task by task; ``order = "seed"`` runs seed by seed (every task's
        first seed first), so that an interrupted or partial run already covers every task.

        Under the protocol: the tuning trials (every tuned optimizer x trial x tuning seed) and the
        untuned entries' fixed points at the final seeds; :meth:`final_units` adds the rest."""
        if self.protocol is not None:
            return self._tuning_units()
        out: list[Unit] = []
        rank = {n: i for i, n in enumerate((BASELINE, "sgd", "shampoo", "soap"))}
        entries = sorted(self.entries, key=lambda e: rank[e[0].name])
        pairs = [(t, seed) for t in self.tasks for seed in (t.seeds or self.seeds)]
        if self.order == "seed":
            pairs.sort(key=lambda ts: sorted(ts[0].seeds or self.seeds).index(ts[1]))
        for task, seed in pairs:
            for spec, lrs, only in entries:
                if only and task.name not in only:
                    continue
                for lr in self.lrs(lrs, task.name):
                    out.append(self._unit(task, spec, lr, seed))
        keys = [u.key for u in out]
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise InvalidArgumentError(f"validation config {self.name!r} repeats runs: {dup[:3]}")
        return out

    def _entries_of(self, task: TaskSpec) -> list[ProtocolEntry]:
        return [e for e in self.protocol_entries if not e.only or task.name in e.only]

    def _tuning_units(self) -> list[Unit]:
        assert self.protocol is not None
        out = []
        for task in self.tasks:
            for e in self._entries_of(task):
                pts = e.points(self.protocol)
                seeds = self.protocol.tuning_seeds if e.tune else self.protocol.final_seeds
                phase = "tune" if e.tune else "final"
                for seed in seeds:
                    for k, hp in enumerate(pts):
                        out.append(self._protocol_unit(task, e, hp, seed, phase, k if e.tune else -1))
        return self._unique(out)

    def final_units(self, chosen: Any) -> list[Unit]:
        """The chosen point of each tuned (task, optimizer) at the final seeds; ``chosen`` is the table
        of :func:`matroots.study.validation.protocol.select` (rows whose status is not ``"chosen"`` add none)."""
        assert self.protocol is not None
        ok = chosen[chosen["status"] == "chosen"] if len(chosen) else chosen
        pick = {(r["task"], r["config"]): int(r["trial"]) for _, r in ok.iterrows()}
        out = []
        for task in self.tasks:
            for e in self._entries_of(task):
                k = pick.get((task.name, e.spec.label))
                if not e.tune or k is None:
                    continue
                hp = e.points(self.protocol)[k]
                out.extend(
                    self._protocol_unit(task, e, hp, seed, "final", k) for seed in self.protocol.final_seeds
                )
        return self._unique(out)

    def final_unit_count(self) -> int:
        """Units of the final phase when every tuned optimizer has a chosen point."""
        assert self.protocol is not None
        return sum(len(self.protocol.final_seeds) for t in self.tasks for e in self._entries_of(t) if e.tune)

    def _protocol_unit(
        self, task: TaskSpec, e: ProtocolEntry, hp: dict[str, Any], seed: int, phase: str, trial: int
    ) -> Unit:
        spec = e.trial_spec(hp)
        extra = {"phase": phase, "trial": trial, "schedule": self.protocol.schedule if self.protocol else "",
                 "warmup_fraction": float(hp.get("warmup_fraction", 0.0)), "hparams": dict(hp)}  # fmt: skip
        return self._unit(task, spec, float(hp["lr"]), seed, **extra)

    def _unique(self, out: list[Unit]) -> list[Unit]:
        keys = [u.key for u in out]
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise InvalidArgumentError(f"validation config {self.name!r} repeats runs: {dup[:3]}")
        return out

    def _unit(self, task: TaskSpec, spec: OptimizerSpec, lr: float, seed: int, **extra: Any) -> Unit:
        chunk = self.timing_chunk or spec.precondition_frequency or 10
        parts: list[Any] = [asdict(task), asdict(spec), float(lr), int(seed)]
        if extra:  # protocol units: the phase, trial and schedule are part of the identity too
            parts.append(extra)
        ident = json.dumps(parts, sort_keys=True, default=str)
        digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
        key = f"{task.name}.s{seed}.{re.sub(r'[^A-Za-z0-9_-]+', '_', spec.name)}.{digest}"
        return Unit(
            key=key,
            task=task,
            optimizer=spec,
            lr=float(lr),
            seed=int(seed),
            timing_rounds=self.timing_rounds,
            timing_chunk=int(chunk),
            root_error_samples=self.root_error_samples,
            reference_eps=self.reference_eps,
            reference_eps_mode=self.reference_eps_mode,
            **extra,
        )


def _soap_specs(o: dict[str, Any], opts: dict[str, Any], where: str) -> list[OptimizerSpec]:
    """The SOAP configs of an entry: basis updates x eps x precondition frequencies."""
    from shampoo.transforms.soap import BASIS_UPDATES

    bases = _list(o.get("basis_update", ["eigh_warm"]))
    for b in bases:
        if not isinstance(b, str) or b not in BASIS_UPDATES:
            raise bad_config(f"{where}: basis_update {b!r} not one of {BASIS_UPDATES}")
    epss = o.get("eps", [1e-8])
    epss = epss if isinstance(epss, list) else [epss]
    for e in epss:
        if isinstance(e, bool) or not isinstance(e, int | float) or e < 0:
            raise bad_config(f"{where}: SOAP eps must be numbers >= 0, got {e!r}")
        if not math.isfinite(e):
            raise bad_config(f"{where}: SOAP eps must be finite numbers >= 0, got {e!r}")
    freqs = [
        _int(f, f"{where}.precondition_frequency", 1) for f in _list(o.get("precondition_frequency", [10]))
    ]
    label = _label(o, where)
    out = []
    for b, e, f in itertools.product(bases, epss, freqs):
        spec = OptimizerSpec(
            name="soap", options=opts, root_solver=b, solver_label=b, root_dtype="fp32", eps=float(e),
            precondition_frequency=f,
        )  # fmt: skip
        if label:
            spec = dataclasses.replace(spec, label=label + spec.default_label()[len("soap") :])
        out.append(spec)
    return out


def from_dict(raw: dict[str, Any]) -> ValidationGrid:
    """Validate a parsed config (see the module docstring) and build the grid."""
    known = {"name", "seeds", "tasks", "optimizers", "timing", "diagnostics", "order", "protocol"}
    extra = set(raw) - known
    if extra:
        raise bad_config(f"unknown keys {sorted(extra)}; allowed: {sorted(known)}")
    name = str(raw.get("name", "validate"))
    seeds = tuple(_int(s, "seeds", 0) for s in _list(raw.get("seeds", [0])))
    if not seeds:
        raise bad_config("seeds must not be empty")
    tasks = _parse_tasks(_table(raw.get("tasks") or {}, "tasks", "[tasks.NAME] tables"))
    protocol = None
    pentries: tuple[ProtocolEntry, ...] = ()
    entries = []
    if "protocol" in raw:
        protocol = proto.parse_protocol(raw["protocol"])
        tasks = [dataclasses.replace(t, size={**t.size, "holdout": True}) for t in tasks]

        pentries = protocol_entries(raw, protocol)
        entries = [(e.spec, {}, e.only) for e in pentries]
    for i, o in enumerate([] if protocol else _list(raw.get("optimizers") or [])):
        entries.extend(_optimizer_entries(o, f"optimizers[{i}]"))
    _check_entries(entries)
    timing, diag, order = _parse_settings(raw)
    return ValidationGrid(
        name=name,
        seeds=seeds,
        tasks=tuple(tasks),
        entries=tuple(entries),
        timing_rounds=int(timing.get("rounds", 3)),
        timing_chunk=int(timing.get("chunk_steps", 0)),
        root_error_samples=int(diag.get("root_error_samples", 4)),
        reference_eps=float(diag.get("reference_eps", 1e-6)),
        reference_eps_mode=str(diag.get("reference_eps_mode", "relative")),
        order=order,
        raw=raw,
        protocol=protocol,
        protocol_entries=pentries,
    )


def _parse_tasks(table: dict[str, Any]) -> list[TaskSpec]:
    """The ``[tasks.NAME]`` tables: one TaskSpec each (at least one)."""
    tasks = [_parse_task(tname, t) for tname, t in table.items()]
    if not tasks:
        raise bad_config(f"no [tasks.NAME] tables; available tasks: {sorted(TASKS)}")
    return tasks


def _parse_task(tname: str, t: Any) -> TaskSpec:
    """One ``[tasks.NAME]`` table: steps, eval_every, size and seeds (each optional)."""
    if tname not in TASKS:
        raise bad_config(f"unknown task {tname!r}; available: {sorted(TASKS)}")
    t = t or {}
    if not isinstance(t, dict):
        raise bad_config(f"tasks.{tname} must be a table (steps, eval_every, size, seeds), got {t!r}")
    bad = set(t) - {"steps", "eval_every", "size", "seeds"}
    if bad:
        raise bad_config(
            f"tasks.{tname}: unknown keys {sorted(bad)}; allowed: steps, eval_every, size, seeds"
        )
    cls = TASKS[tname]
    steps = _int(t.get("steps", cls.default_steps), f"tasks.{tname}.steps", 1)
    every = _int(t.get("eval_every", cls.default_eval_every), f"tasks.{tname}.eval_every", 1)
    tseeds = tuple(_int(x, f"tasks.{tname}.seeds", 0) for x in _list(t.get("seeds", [])))
    if not isinstance(t.get("size", {}), dict):
        raise bad_config(f"tasks.{tname}.size must be a table of size options, got {t['size']!r}")
    return TaskSpec(name=tname, steps=steps, eval_every=every, size=dict(t.get("size", {})), seeds=tseeds)


_Entry = tuple[OptimizerSpec, dict[str, tuple[float, ...]], tuple[str, ...]]


def _optimizer_entries(o: Any, where: str) -> list[_Entry]:
    """One ``[[optimizers]]`` table of a grid config: its configs, each with its lr table and tasks."""
    if not isinstance(o, dict):
        raise bad_config(f"{where} must be a table ([[optimizers]] with name, lr, ...), got {o!r}")
    oname = o.get("name")
    if not isinstance(oname, str) or oname not in OPTIMIZERS:
        raise bad_config(f"{where}: name must be one of {OPTIMIZERS}, got {oname!r}")
    allowed = {"name", "lr", "options", "tasks", "label"}
    if oname == "shampoo":
        allowed |= {"root_solver", "root_dtype", "eps", "precondition_frequency", "max_root_delay"}
    if oname == "soap":
        allowed |= {"basis_update", "eps", "precondition_frequency"}
    bad = set(o) - allowed
    if bad:
        raise bad_config(f"{where}: unknown keys {sorted(bad)} for {oname}; allowed: {sorted(allowed)}")
    if "lr" not in o:
        raise bad_config(f"{where}: lr is required (a small log sweep, e.g. [1e-3, 3e-3, 1e-2])")
    lrs = _lr_table(o["lr"], where)
    only = _task_names(o.get("tasks", ()), where)
    if not isinstance(o.get("options", {}), dict):
        raise bad_config(
            f"{where}: options must be a table of optimizer keyword arguments, got {o['options']!r}"
        )
    opts = dict(o.get("options", {}))
    if oname == "soap":
        return [(spec, lrs, only) for spec in _soap_specs(o, opts, where)]
    if oname != "shampoo":
        return [(OptimizerSpec(name=oname, options=opts, label=_label(o, where)), lrs, only)]
    return [(spec, lrs, only) for spec in _shampoo_specs(o, opts, where)]


def _shampoo_eps(o: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The eps of a Shampoo entry as ``{value, mode}`` tables (a bare number is an absolute eps)."""
    epss = _list(o.get("eps", [{"value": 1e-12, "mode": "absolute"}]))
    epss = [e if isinstance(e, dict) else {"value": e} for e in epss]
    for e in epss:
        bad = set(e) - {"value", "mode"}
        if bad:
            raise bad_config(f"{where}: eps tables have keys value and mode, got {sorted(bad)} in {e!r}")
        v = e.get("value", 0.0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise bad_config(f"{where}: eps values must be finite numbers >= 0, got {v!r}")
        if not isinstance(e.get("mode", "absolute"), str) or e.get("mode", "absolute") not in EPS_MODES:
            raise bad_config(
                f"{where}: eps mode must be {' or '.join(map(repr, EPS_MODES))}, got {e.get('mode')!r}"
            )
    return epss


def _shampoo_specs(o: dict[str, Any], opts: dict[str, Any], where: str) -> list[OptimizerSpec]:
    """The Shampoo configs of an entry: root solvers x dtypes x eps x frequencies x root delays."""
    dts = _list(o.get("root_dtype", ["fp32"]))
    for d in dts:
        if not isinstance(d, str) or d not in DTYPES:
            raise bad_config(f"{where}: root_dtype {d!r} not one of {sorted(DTYPES)}")
    epss = _shampoo_eps(o, where)
    freqs = [
        _int(f, f"{where}.precondition_frequency", 1) for f in _list(o.get("precondition_frequency", [10]))
    ]
    delays = _delays(o.get("max_root_delay", ["sync"]), where)
    label = _label(o, where)
    out = []
    for (sname, sopts, slabel), d, e, f, k in itertools.product(
        _solvers(o.get("root_solver", ["eigh"]), where), dts, epss, freqs, delays
    ):
        async_opts = {} if k == "sync" else {"root_schedule": "async", "max_root_delay": k}
        spec = OptimizerSpec(
            name="shampoo",
            options={**opts, **async_opts},
            root_solver=sname,
            solver_options=sopts,
            solver_label=slabel,
            root_dtype=d,
            eps=float(e.get("value", 0.0)),
            eps_mode=e.get("mode", "absolute"),
            precondition_frequency=f,
        )
        if label:  # a name for the entry: it replaces "shampoo" in each config's label
            spec = dataclasses.replace(spec, label=label + spec.default_label()[len("shampoo") :])
        if k != "sync":  # the roots' schedule: computed in the background, installed k steps later
            spec = dataclasses.replace(spec, label=f"{spec.label[:-1]}|async={k}]")
        out.append(spec)
    return out


def _check_entries(entries: list[_Entry]) -> None:
    """The grid's optimizer configs: an AdamW baseline among them, and no two with the same label."""
    if not any(e[0].name == BASELINE for e in entries):
        raise bad_config("the grid needs an 'adamw' entry: its best final validation loss is the target")
    labels = [(e[0].label, e[2]) for e in entries]
    if len({lab for lab, _ in labels}) != len(labels):
        dup = sorted({lab for lab, _ in labels if [x for x, _ in labels].count(lab) > 1})
        raise bad_config(f"optimizer configs with the same label {dup[:3]}: give them distinct 'label's")


def _parse_settings(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The ``[timing]`` and ``[diagnostics]`` tables and ``order``, validated."""
    timing = _table(raw.get("timing", {}), "[timing]", "rounds and chunk_steps")
    diag = _table(
        raw.get("diagnostics", {}), "[diagnostics]", "root_error_samples, reference_eps, reference_eps_mode"
    )
    order = raw.get("order", "task")
    if not isinstance(order, str) or order not in ("task", "seed"):
        raise bad_config(f"order must be 'task' or 'seed', got {order!r}")
    bad = set(timing) - {"rounds", "chunk_steps"}
    bad |= set(diag) - {"root_error_samples", "reference_eps", "reference_eps_mode"}
    if bad:
        raise bad_config(f"unknown [timing]/[diagnostics] keys {sorted(bad)}")
    if diag.get("reference_eps_mode", "relative") not in EPS_MODES:
        raise bad_config(f"diagnostics.reference_eps_mode must be {' or '.join(map(repr, EPS_MODES))}")
    _int(timing.get("rounds", 3), "timing.rounds", 1)
    _int(timing.get("chunk_steps", 0), "timing.chunk_steps", 0)
    _int(diag.get("root_error_samples", 4), "diagnostics.root_error_samples", 0)
    ref_eps = diag.get("reference_eps", 1e-6)
    if isinstance(ref_eps, bool) or not isinstance(ref_eps, int | float) or not 0 <= ref_eps < math.inf:
        raise bad_config(f"diagnostics.reference_eps must be a number >= 0, got {ref_eps!r}")
    return timing, diag, order


def load_config(path: str | Path) -> ValidationGrid:
    """Read and validate a validation TOML config."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no validation config {p}")
    with p.open("rb") as fh:
        try:
            raw = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise bad_config(f"{p} is not valid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise bad_config(f"{p} is not a text file (not UTF-8); give a TOML config") from None
    try:
        return from_dict(raw)
    except InvalidArgumentError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a value of the wrong shape
        raise bad_config(f"{p}: malformed value ({type(exc).__name__}: {exc})") from None


__all__ = [
    "BASELINE", "OptimizerSpec", "ProtocolEntry", "TaskSpec", "Unit", "ValidationGrid", "bad_config", "from_dict", "load_config",
]  # fmt: skip
