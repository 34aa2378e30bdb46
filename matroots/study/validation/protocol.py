"""The tuning protocol of ``matroots validate``: quasi-random trials, one schedule, two splits.

In the style of AlgoPerf's external tuning ruleset (Dahl et al. 2023, "Benchmarking Neural Network
Training Algorithms", §4.2): every tuned optimizer gets the **same number of trials**, each a point of
one scrambled Sobol sequence (Owen 1998 scrambling, :class:`scipy.stats.qmc.Sobol`, fixed seed) mapped
into its search space; every optimizer trains under the **same schedule family** (linear warmup, then
cosine decay to 0, :func:`lr_factor`); the point is **chosen on the validation split** (lowest median
final validation loss over the tuning seeds, :func:`select`) and the chosen point is rerun on fresh
seeds and **reported on the held-out split** (:mod:`matroots.study.validation.protocol_report`).

The Sobol columns are fixed per hyperparameter (:data:`DIMENSIONS`), so the optimizers share the
same points on the dimensions they share (the same lr, beta2, weight decay and warmup for AdamW's
trial k and Shampoo's trial k): the comparison uses common random numbers.

With ``default_trial = true`` trial 0 of every tuned optimizer is its **own default point** (the
settings a user gets without tuning: :data:`DEFAULT_POINTS`, the constructors' defaults and the
published settings, or the entry's ``default`` table) and trials 1..T-1 are the first T-1 Sobol
points: still T trials each, and the tuned result can never be worse on the validation split than the
untuned default. (8 Sobol points alone left every optimizer on digits at one shared lr, 4.4e-3, and
SOAP's untuned published point 3x better than every tuned entry: the search, not SOAP, was short.)

A ``[protocol]`` table in a validation config switches it on (see ``experiments/configs/validate_full.toml``)::

    [protocol]
    trials = 8                   # quasi-random points per tuned optimizer (the same for all)
    sobol_seed = 0               # the scramble of the Sobol sequence
    tuning_seeds = [0]           # seeds of the tuning trials (selection: median over them)
    final_seeds = [1, 2, 3]      # fresh seeds the chosen point is rerun on (disjoint from tuning_seeds)
    default_trial = true         # trial 0: each optimizer's own default point (DEFAULT_POINTS)
    [protocol.space]             # search-space overrides for every optimizer (defaults: DEFAULT_SPACE)
    lr = [1e-4, 3e-2]

    [[optimizers]]
    name = "shampoo"
    label = "shampoo-eigh"
    root_solver = "eigh"
    space = { precondition_frequency = [10, 20] }   # this optimizer's overrides
    fixed = { grafting = "adam" }                    # dimensions held fixed (not sampled)
    default = { lr = 3e-3 }                          # its default point's overrides (default_trial)

    [[optimizers]]
    name = "soap"
    label = "soap-published"
    tune = false                                     # no trials: run `fixed` at the final seeds
    fixed = { lr = 1e-2, beta2 = 0.95, weight_decay = 0.0, warmup_fraction = 0.0, precondition_frequency = 10 }
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ...core.errors import InvalidArgumentError

#: Sobol column of each hyperparameter (never reordered: the points of a seed stay the same).
DIMENSIONS = ("lr", "beta2", "weight_decay", "warmup_fraction", "precondition_frequency", "grafting")
SCHEDULES = ("warmup_cosine",)


@dataclass(frozen=True)
class Dimension:
    """One hyperparameter's range: ``log`` (log-uniform on [low, high]), ``log1m`` (1 - x log-uniform:
    beta2 in [low, high] with 1 - beta2 log-uniform), ``linear``, or ``choice`` (one of ``choices``)."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Any, ...] = ()

    def value(self, u: float) -> Any:
        """The point of the unit interval ``u`` in this range."""
        if self.kind == "choice":
            return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]
        if self.kind == "log":
            return float(math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low))))
        if self.kind == "log1m":
            lo, hi = math.log(1.0 - self.high), math.log(1.0 - self.low)
            return float(1.0 - math.exp(hi + u * (lo - hi)))
        return float(self.low + u * (self.high - self.low))

    def contains(self, v: Any) -> bool:
        if self.kind == "choice":
            return v in self.choices
        return self.low <= v <= self.high

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.name} in {list(self.choices)}"
        scale = {"log": "log", "log1m": "log of 1 - x", "linear": "linear"}[self.kind]
        return f"{self.name} in [{self.low:g}, {self.high:g}] ({scale})"


DEFAULT_SPACE: dict[str, Dimension] = {
    "lr": Dimension("lr", "log", 1e-4, 3e-2),
    "beta2": Dimension("beta2", "log1m", 0.9, 0.999),
    "weight_decay": Dimension("weight_decay", "log", 1e-5, 1e-1),
    "warmup_fraction": Dimension("warmup_fraction", "linear", 0.0, 0.1),
    "precondition_frequency": Dimension("precondition_frequency", "choice", choices=(5, 10, 20, 50)),
    "grafting": Dimension("grafting", "choice", choices=("adam", "rmsprop")),
}

#: The hyperparameters each optimizer samples (AdamW's four are everybody's).
COMMON = ("lr", "beta2", "weight_decay", "warmup_fraction")
OPTIMIZER_DIMS: dict[str, tuple[str, ...]] = {
    "adamw": COMMON,
    "sgd": ("lr", "weight_decay", "warmup_fraction"),
    "shampoo": (*COMMON, "precondition_frequency", "grafting"),
    "soap": (*COMMON, "precondition_frequency"),
    "peer": (*COMMON, "precondition_frequency"),
}
#: Values of the dimensions an optimizer does not sample (and of a ``fixed`` table's missing keys).
DEFAULTS: dict[str, Any] = {"beta2": 0.999, "weight_decay": 0.0, "warmup_fraction": 0.0,
                            "precondition_frequency": 10, "grafting": "adam"}  # fmt: skip


#: Each optimizer's own default point (default_trial): what a user gets without tuning, no warmup.
#: adamw: torch.optim.AdamW's defaults; shampoo: shampoo.Shampoo's; soap: the published SOAP settings
#: (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam", §6: lr 3e-3, betas (0.95,
#: 0.95), weight decay 0.01, frequency 10); heavyball_soap: heavyball.SOAP's defaults (3.2.1); meta_shampoo:
#: distributed_shampoo.DistributedShampoo's (lr 1e-2, betas (0.9, 1.0): beta2 = 1 is its running sum,
#: weight decay 0, frequency 1). tests/test_validation_default_trial.py checks them against the
#: constructors that are installed.
DEFAULT_POINTS: dict[str, dict[str, Any]] = {
    "adamw": {"lr": 1e-3, "beta2": 0.999, "weight_decay": 1e-2, "warmup_fraction": 0.0},
    "sgd": {"lr": 1e-3, "weight_decay": 0.0, "warmup_fraction": 0.0},
    "shampoo": {"lr": 1e-3, "beta2": 0.999, "weight_decay": 0.0, "warmup_fraction": 0.0,
                "precondition_frequency": 100, "grafting": "adam"},
    "soap": {"lr": 3e-3, "beta2": 0.95, "weight_decay": 1e-2, "warmup_fraction": 0.0,
             "precondition_frequency": 10},
    "heavyball_soap": {"lr": 3e-3, "beta2": 0.95, "weight_decay": 1e-2, "warmup_fraction": 0.0,
                       "precondition_frequency": 2},
    "meta_shampoo": {"lr": 1e-2, "beta2": 1.0, "weight_decay": 0.0, "warmup_fraction": 0.0,
                     "precondition_frequency": 1},
}  # fmt: skip


@dataclass(frozen=True)
class Protocol:
    trials: int
    sobol_seed: int
    tuning_seeds: tuple[int, ...]
    final_seeds: tuple[int, ...]
    schedule: str = "warmup_cosine"
    space: dict[str, Dimension] = field(default_factory=lambda: dict(DEFAULT_SPACE))
    default_trial: bool = False


def _bad(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"validation config: {msg}")


def _whole(v: Any, where: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v) or v < lo:
        raise _bad(f"{where} must be a whole number >= {lo}, got {v!r}")
    return int(v)


def parse_space(raw: Any, base: dict[str, Dimension], where: str) -> dict[str, Dimension]:
    """``base`` with the ranges of ``raw`` ({name: [low, high]} or {name: [choices]} for choice dims)."""
    if raw is None:
        return dict(base)
    if not isinstance(raw, dict):
        raise _bad(f"{where} must be a table of ranges, got {raw!r}")
    out = dict(base)
    for name, v in raw.items():
        if name not in DEFAULT_SPACE:
            raise _bad(f"{where}: unknown hyperparameter {name!r}; allowed: {list(DIMENSIONS)}")
        d = DEFAULT_SPACE[name]
        vals = v if isinstance(v, list) else [v]
        if d.kind == "choice":
            if not vals:
                raise _bad(f"{where}.{name} lists no choice")
            for c in vals:  # frequencies are whole numbers, grafting types names
                if name == "precondition_frequency":
                    _whole(c, f"{where}.{name} choices", 1)
                elif not isinstance(c, str):
                    raise _bad(f"{where}.{name} choices must be names (e.g. 'adam'), got {c!r}")
            out[name] = Dimension(name, "choice", choices=tuple(vals))
            continue
        if len(vals) != 2 or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vals):
            raise _bad(f"{where}.{name} must be [low, high], got {v!r}")
        lo, hi = float(vals[0]), float(vals[1])
        ok = math.isfinite(lo) and math.isfinite(hi) and lo <= hi
        ok &= lo > 0 if d.kind == "log" else True
        ok &= lo >= 0 and hi < 1 if d.kind == "log1m" else True
        if not ok:
            allowed = {"log": "0 < low <= high", "log1m": "0 <= low <= high < 1", "linear": "low <= high"}
            raise _bad(f"{where}.{name} = {v!r}: a {d.kind} range needs {allowed[d.kind]}")
        out[name] = Dimension(name, d.kind, lo, hi)
    return out


def parse_protocol(raw: Any) -> Protocol:
    """The ``[protocol]`` table (see the module docstring)."""
    if not isinstance(raw, dict):
        raise _bad(f"[protocol] must be a table, got {raw!r}")
    allowed = {"trials", "sobol_seed", "tuning_seeds", "final_seeds", "schedule", "space", "default_trial"}
    extra = set(raw) - allowed
    if extra:
        raise _bad(f"[protocol]: unknown keys {sorted(extra)}; allowed: {sorted(allowed)}")
    trials = _whole(raw.get("trials", 8), "protocol.trials", 1)
    seed = _whole(raw.get("sobol_seed", 0), "protocol.sobol_seed", 0)

    def seeds(key: str, default: list[int]) -> tuple[int, ...]:
        v = raw.get(key, default)
        out = tuple(_whole(s, f"protocol.{key}", 0) for s in (v if isinstance(v, list) else [v]))
        if not out or len(set(out)) != len(out):
            raise _bad(f"protocol.{key} must be a non-empty list of distinct seeds, got {v!r}")
        return out

    tune, final = seeds("tuning_seeds", [0]), seeds("final_seeds", [1, 2, 3])
    if set(tune) & set(final):
        raise _bad(
            f"protocol.final_seeds {list(final)} must be disjoint from tuning_seeds {list(tune)}: the "
            "chosen point is reported on fresh seeds"
        )
    schedule = raw.get("schedule", "warmup_cosine")
    if schedule not in SCHEDULES:
        raise _bad(f"protocol.schedule must be one of {SCHEDULES}, got {schedule!r}")
    space = parse_space(raw.get("space"), DEFAULT_SPACE, "protocol.space")
    default_trial = raw.get("default_trial", False)
    if not isinstance(default_trial, bool):
        raise _bad(f"protocol.default_trial must be true or false, got {default_trial!r}")
    return Protocol(trials=trials, sobol_seed=seed, tuning_seeds=tune, final_seeds=final, schedule=schedule,
                    space=space, default_trial=default_trial)  # fmt: skip


def unit_points(n: int, seed: int) -> np.ndarray:
    """The first ``n`` points of the scrambled Sobol sequence of ``seed`` in [0, 1)^len(DIMENSIONS)."""
    from scipy.stats import qmc

    sampler = qmc.Sobol(d=len(DIMENSIONS), scramble=True, seed=np.random.default_rng(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's balance warning for n not a power of 2
        return sampler.random(n)


def trial_points(
    protocol: Protocol,
    optimizer: str,
    space: dict[str, Dimension],
    fixed: dict[str, Any],
    default: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The ``protocol.trials`` hyperparameter points of one optimizer: its sampled dimensions from the
    shared Sobol points, the ``fixed`` ones as given, the rest at :data:`DEFAULTS`. With
    ``protocol.default_trial`` the first point is ``default`` (the optimizer's own default point, with
    ``fixed`` still applied) and the Sobol points fill the other ``trials - 1``."""
    dims = OPTIMIZER_DIMS[optimizer]
    base = {k: DEFAULTS[k] for k in dims if k in DEFAULTS}
    out = []
    if protocol.default_trial:
        if default is None:
            raise _bad(f"default_trial needs a default point for {optimizer!r} (an entry's default table)")
        out.append({**base, **{k: v for k, v in default.items() if k in dims or k == "lr"}, **fixed})
    for row in unit_points(protocol.trials - len(out), protocol.sobol_seed):
        hp = dict(base)
        for j, name in enumerate(DIMENSIONS):
            if name in dims and name not in fixed:
                hp[name] = space[name].value(float(row[j]))
        hp.update(fixed)
        out.append(hp)
    return out


def lr_factor(step: int, steps: int, warmup_fraction: float) -> float:
    """The schedule's multiplier of the peak lr at ``step`` (1-based) of ``steps``: linear warmup over
    the first W = round(warmup_fraction * steps) steps (step / W), then cosine from 1 towards 0 over the
    remaining steps, 0.5 (1 + cos(pi (step - W - 1) / (steps - W)))."""
    w = round(warmup_fraction * steps)
    if w > 0 and step <= w:
        return step / w
    return 0.5 * (1.0 + math.cos(math.pi * (step - w - 1) / max(steps - w, 1)))


def _scores(runs: pd.DataFrame, column: str) -> pd.Series:
    bad = runs["failure"].fillna("").astype(str) != ""
    v = runs[column] if column in runs else pd.Series(math.nan, index=runs.index)
    return v.where(~bad & v.notna(), math.inf).astype(float)


def select(runs: pd.DataFrame) -> pd.DataFrame:
    """The chosen trial of each (task, config): the lowest median over the tuning seeds of the final
    loss on the **validation** split (``final_val_loss``; a failed trial counts as +inf), ties to the
    lower trial index. ``status`` is ``"chosen"``, ``"failed"`` (every trial failed) or ``"absent"``
    (the optimizer's package is not installed: every trial failed with ``Unavailable``)."""
    r = runs[runs["phase"] == "tune"].copy()
    cols = ["task", "config", "optimizer", "trial", "hparams", "score", "trials", "failed", "status",
            "failure_message"]  # fmt: skip
    if r.empty:
        return pd.DataFrame(columns=cols)
    r["score"] = _scores(r, "final_val_loss")
    rows = []
    for (task, cfg), g in r.groupby(["task", "config"], sort=True):
        per = g.groupby("trial", sort=True).agg(score=("score", "median"), hparams=("hparams", "first"))
        fails = g["failure"].fillna("").astype(str)
        best = per["score"].idxmin()
        status = "chosen" if math.isfinite(per.loc[best, "score"]) else "failed"
        if (fails == "Unavailable").all():
            status = "absent"
        msg = g.loc[fails != "", "failure_message"].astype(str).iloc[0] if (fails != "").any() else ""
        rows.append({"task": task, "config": cfg, "optimizer": g["optimizer"].iloc[0], "trial": int(best),
                     "hparams": per.loc[best, "hparams"], "score": float(per.loc[best, "score"]),
                     "trials": int(per.shape[0]), "failed": int((fails != "").sum()), "status": status,
                     "failure_message": msg if status != "chosen" else ""})  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


__all__ = [
    "DEFAULTS",
    "DEFAULT_POINTS",
    "DEFAULT_SPACE",
    "DIMENSIONS",
    "OPTIMIZER_DIMS",
    "Dimension",
    "Protocol",
    "lr_factor",
    "parse_protocol",
    "parse_space",
    "select",
    "trial_points",
    "unit_points",
]
