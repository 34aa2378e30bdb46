"""The validation config's data types and the small parsers its sections share: what a unit and an
optimizer configuration are (:class:`TaskSpec`, :class:`OptimizerSpec`, :class:`Unit`,
:class:`ProtocolEntry`), the typed error of a bad config (:func:`bad_config`), and the checks of
learning rates, whole numbers, root delays and root solvers. :mod:`.config` expands a TOML file into a
grid of them, :mod:`.protocol_config` parses the tuning protocol's optimizer entries with them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ...core import arguments
from ...core.errors import InvalidArgumentError
from . import protocol as proto
from .tasks import TASKS

OPTIMIZERS = ("adamw", "sgd", "shampoo", "soap", "peer")
DTYPES = {"fp64": "fp64", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}
BASELINE = "adamw"  # the optimizer whose best final validation loss is every task's target


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    name: str
    steps: int
    eval_every: int
    size: dict[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()  # empty: the grid's seeds


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """One optimizer configuration without its learning rate (Shampoo: one solver/dtype/eps/frequency)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    root_solver: str = ""
    solver_options: dict[str, Any] = field(default_factory=dict)
    solver_label: str = ""
    root_dtype: str = ""
    eps: float = 0.0
    eps_mode: str = ""
    precondition_frequency: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.default_label())

    def default_label(self) -> str:
        if self.name == "peer":
            return self.root_solver
        if self.name == "soap":
            return f"soap[{self.solver_label}|eps={self.eps:g}|f={self.precondition_frequency}]"
        if self.name != "shampoo":
            return self.name
        mode = "rel" if self.eps_mode == "relative" else "abs"
        return f"shampoo[{self.solver_label}|{self.root_dtype}|eps={self.eps:g}{mode}|f={self.precondition_frequency}]"


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One training run: a task, an optimizer config, a learning rate and a seed."""

    key: str
    task: TaskSpec
    optimizer: OptimizerSpec
    lr: float
    seed: int
    timing_rounds: int
    timing_chunk: int
    root_error_samples: int
    reference_eps: float = 1e-6
    reference_eps_mode: str = "relative"
    phase: str = ""  # the protocol's "tune" or "final" ("" outside the protocol)
    trial: int = -1  # the protocol's trial index (-1: an untuned entry's fixed point)
    schedule: str = ""  # "warmup_cosine" (peak lr = lr) or "" (constant lr)
    warmup_fraction: float = 0.0
    hparams: dict[str, Any] = field(default_factory=dict)  # the protocol's point (lr, beta2, ...)


@dataclass(frozen=True, kw_only=True)
class ProtocolEntry:
    """One optimizer of the protocol: a spec template, its search space and its fixed values."""

    spec: OptimizerSpec
    space: dict[str, Any]
    fixed: dict[str, Any]
    tune: bool
    only: tuple[str, ...] = ()
    #: its own default point (trial 0 under the protocol's default_trial): protocol.DEFAULT_POINTS of
    #: its optimizer (a peer: of the peer) updated by the entry's ``default`` table
    default: dict[str, Any] = field(default_factory=dict)

    def points(self, protocol: proto.Protocol) -> list[dict[str, Any]]:
        if not self.tune:
            return [{**{k: proto.DEFAULTS[k] for k in proto.OPTIMIZER_DIMS[self.spec.name]
                        if k in proto.DEFAULTS}, **self.fixed}]  # fmt: skip
        return proto.trial_points(protocol, self.spec.name, self.space, self.fixed, self.default or None)

    def trial_spec(self, hp: dict[str, Any]) -> OptimizerSpec:
        """The optimizer config of one point: beta2, weight decay, grafting and frequency as options."""
        s = self.spec
        opts = dict(s.options)
        b1 = float(opts.get("betas", [0.9])[0])
        if s.name != "sgd":
            opts["betas"] = [b1, float(hp["beta2"])]
        opts["weight_decay"] = float(hp.get("weight_decay", 0.0))
        if s.name == "shampoo":
            opts["grafting"] = hp.get("grafting", "adam")
            opts["grafting_beta2"] = float(hp["beta2"])
        if s.name == "soap":
            opts["soap_beta2"] = float(hp["beta2"])
        freq = int(hp.get("precondition_frequency", 0)) if s.name in ("shampoo", "soap", "peer") else 0
        return dataclasses.replace(s, options=opts, precondition_frequency=freq, label=s.label)


def bad_config(msg: str) -> InvalidArgumentError:
    """The typed error of a bad validation config (one line at the command line)."""
    return InvalidArgumentError(f"validation config: {msg}")


def _lrs(values: list[Any], where: str) -> tuple[float, ...]:
    """Learning rates: a non-empty list of finite numbers > 0."""
    if not values:
        raise bad_config(f"{where}: lr lists no learning rate; give e.g. [1e-3, 3e-3]")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise bad_config(f"{where}: lr values must be finite numbers > 0, got {v!r}")
    return tuple(float(v) for v in values)


def _int(value: Any, where: str, lo: int) -> int:
    """A whole number >= lo (TOML integers; a float with an integer value is accepted)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)  # int(inf) raises OverflowError, int(nan) ValueError
        or value != int(value)
        or value < lo
    ):
        raise bad_config(f"{where} must be a whole number >= {lo}, got {value!r}")
    return int(value)


def _delays(value: Any, where: str) -> list[Any]:
    """``max_root_delay`` of a Shampoo entry: ``"sync"`` (roots in the step, the default) or an integer
    k >= 0 (``root_schedule="async"``, roots installed k steps after their factors), or a list of them."""
    out = _list(value)
    for k in out:
        if k != "sync" and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise bad_config(f'{where}: max_root_delay values are "sync" or integers >= 0, got {k!r}')
    return out


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _table(value: Any, where: str, what: str) -> dict[str, Any]:
    """A TOML table (``what`` says what it holds, for the message)."""
    if not isinstance(value, dict):
        raise bad_config(f"{where} must be a table of {what}, got {value!r}")
    return value


def _str(value: Any, where: str, allowed: Any = None) -> str:
    """A string (one of ``allowed`` when given: a collection of names; matroots' one choice rule)."""
    if allowed is not None:
        try:
            return arguments.choice(where, value, sorted(allowed))
        except InvalidArgumentError as e:
            raise bad_config(str(e)) from None
    if not isinstance(value, str):
        raise bad_config(f"{where} must be a string, got {value!r}")
    return value


def _number(value: Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite number in [lo, hi] (matroots' one rule for real arguments: core.arguments.real)."""
    try:
        return arguments.real(
            where, value, minimum=lo if math.isfinite(lo) else None, maximum=hi if math.isfinite(hi) else None
        )
    except InvalidArgumentError as e:
        raise bad_config(str(e)) from None


def _task_names(value: Any, where: str) -> tuple[str, ...]:
    """The ``tasks`` of an optimizer entry: a list of task names."""
    if not isinstance(value, list | tuple):
        raise bad_config(f"{where}.tasks must be a list of task names ({sorted(TASKS)}), got {value!r}")
    for t in value:
        if not isinstance(t, str) or t not in TASKS:
            raise bad_config(f"{where}: tasks lists unknown task {t!r}")
    return tuple(value)


def _label(o: dict[str, Any], where: str, default: str = "") -> str:
    """The ``label`` of an optimizer entry: a string."""
    label = o.get("label", default)
    if not isinstance(label, str):
        raise bad_config(f"{where}.label must be a string naming the entry, got {label!r}")
    return label


def _lr_table(value: Any, where: str) -> dict[str, tuple[float, ...]]:
    if isinstance(value, list):
        return {"default": _lrs(value, where)}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k != "default" and k not in TASKS:
                raise bad_config(
                    f"{where}: lr table key {k!r} is not a task; tasks: {sorted(TASKS)} or 'default'"
                )
            out[k] = _lrs(_list(v), f"{where}.lr.{k}")
        return out
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"default": _lrs([value], where)}
    raise bad_config(f"{where}: lr must be a list of numbers or a table of lists per task, got {value!r}")


def _solvers(value: Any, where: str) -> list[tuple[str, dict[str, Any], str]]:
    from ...solvers import registry

    items = value if isinstance(value, list) else [value]
    out: list[tuple[str, dict[str, Any], str]] = []
    for it in items:
        if it == "all":  # every registered solver; "auto" only selects one of them
            out.extend((n, {}, n) for n in registry.available() if n != "auto")
            continue
        if isinstance(it, str):
            it = {"name": it}
        if not isinstance(it, dict) or "name" not in it:
            raise bad_config(
                f"{where}: root_solver entries are names or {{name=..., options={{...}}}}, got {it!r}"
            )
        name = it["name"]
        opts = dict(_table(it.get("options", {}), f"{where}.root_solver.options", "solver options"))
        if not isinstance(name, str) or name not in registry.available():
            raise bad_config(
                f"{where}: unknown root solver {name!r}; available: {registry.available()} or 'all'"
            )
        label = _label(it, f"{where}.root_solver") or (
            f"{name}({','.join(f'{k}={v}' for k, v in sorted(opts.items()))})" if opts else name
        )
        out.append((name, opts, label))
    return out
