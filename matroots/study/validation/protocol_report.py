"""The protocol's results: per task and optimizer, at its chosen point, on the held-out split.

Definitions (per task; only final-phase units, i.e. the chosen point rerun on the final seeds):

* **target**: the held-out loss every AdamW final seed reaches by its last step (the largest of their
  final ``test_loss``): a fixed loss per task, as AlgoPerf's targets are, that AdamW's median curve
  reaches in every bootstrap resample.
* **steps-to-target** of a set of seeds: the first evaluation step at which the median over those
  seeds of the held-out loss is <= the target (+inf when never; a seed that stopped, failed or
  diverged counts as +inf from then on); **CPU-time-to-target**: the median over the seeds of their
  cumulative training CPU time (process time, one thread, evaluations excluded) at that step.
* **ratios** against AdamW: steps (CPU time) to target of the optimizer / that of AdamW; the 95%
  intervals are percentile bootstrap intervals (Efron & Tibshirani 1993, ch. 13) over seeds: the two
  optimizers' seeds are resampled independently with replacement, ``B`` times with a fixed rng, and
  the interval is the ceil(B alpha/2)-th and ceil(B (1 - alpha/2))-th smallest resampled ratio
  (:func:`percentile_interval`; no interpolation, so +inf stays +inf).
* **final held-out loss**: median (and quartiles) over the final seeds of the last ``test_loss``;
  the tuned hyperparameters are the chosen trial's point (``hparams``), chosen on the validation split
  (:func:`matroots.study.validation.protocol.select`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from .config import BASELINE
from .protocol import select

B_DEFAULT = 2000
RNG_SEED = 20_261_202


def percentile_interval(stats: np.ndarray, alpha: float = 0.05) -> tuple[float, float]:
    """The percentile interval of bootstrap replicates: the ceil(B alpha/2)-th and the
    ceil(B (1 - alpha/2))-th smallest (1-based) of the ``B`` replicates."""
    s = np.sort(np.asarray(stats, dtype=float))
    b = s.size
    if not b:
        return math.nan, math.nan
    lo = s[max(math.ceil(b * alpha / 2) - 1, 0)]
    hi = s[min(math.ceil(b * (1 - alpha / 2)) - 1, b - 1)]
    return float(lo), float(hi)


def resamples(groups: list[int], *, b: int = B_DEFAULT, seed: int = RNG_SEED) -> list[np.ndarray]:
    """The ``b`` resamples of :func:`bootstrap`, one ``(b, groups[g])`` index array per group: row i of
    array g is the i-th replicate's resample of ``range(groups[g])``, drawn in the order
    :func:`bootstrap` draws them (replicate by replicate, group by group) from
    ``np.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    out = [np.empty((b, n), dtype=np.int64) for n in groups]
    for i in range(b):
        for g, n in enumerate(groups):
            out[g][i] = rng.integers(0, n, n)
    return out


def bootstrap(
    groups: list[int], stat: Callable[..., float], *, b: int = B_DEFAULT, seed: int = RNG_SEED
) -> np.ndarray:
    """``b`` replicates of ``stat(idx_0, idx_1, ...)``, each ``idx_g`` a resample with replacement of
    ``range(groups[g])`` (groups resampled independently), from ``np.random.default_rng(seed)``."""
    idx = resamples(groups, b=b, seed=seed)
    return np.array([stat(*(r[i] for r in idx)) for i in range(b)], dtype=float).reshape(b)


class Curves:
    """The held-out curves of one (task, config) at its final seeds: losses and CPU times, seeds x steps."""

    def __init__(self, curves: pd.DataFrame, steps: np.ndarray) -> None:
        loss = curves.pivot_table(index="seed", columns="step", values="test_loss", aggfunc="first")
        cpu = curves.pivot_table(index="seed", columns="step", values="cpu_s", aggfunc="first")
        loss, cpu = loss.reindex(columns=steps), cpu.reindex(columns=steps)
        stopped = loss.isna().to_numpy()
        stopped = np.maximum.accumulate(stopped, axis=1) if stopped.size else stopped
        self.loss = np.where(stopped, np.inf, np.nan_to_num(loss.to_numpy(dtype=float), nan=np.inf))
        self.cpu = cpu.to_numpy(dtype=float)
        self.steps = steps
        self.seeds = list(loss.index)

    def to_target(self, target: float, idx: np.ndarray | None = None) -> tuple[float, float]:
        """(steps, CPU seconds) to ``target`` of the seeds ``idx`` (all by default)."""
        idx = np.arange(len(self.seeds)) if idx is None else np.asarray(idx)
        steps, cpu = self.to_target_many(target, idx[None, :])
        return float(steps[0]), float(cpu[0])

    def to_target_many(self, target: float, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`to_target` of every row of ``idx`` (resamples x seeds) at once: the steps and CPU
        seconds to ``target`` per row (+inf, +inf where the median curve never reaches it; CPU NaN where
        no seed has a finite CPU time at that step). The medians are numpy's, row by row, so each row's
        values are those of the one-row call bit for bit."""
        rows = idx.shape[0]
        if not idx.shape[1] or not math.isfinite(target) or not self.steps.size:
            return np.full(rows, math.inf), np.full(rows, math.inf)
        med = np.median(self.loss[idx], axis=1)  # rows x steps
        hit = med <= target
        reached = hit.any(axis=1)
        j = hit.argmax(axis=1)
        c = np.sort(np.where(np.isfinite(cpu := self.cpu[idx, j[:, None]]), cpu, np.inf), axis=1)
        m = np.isfinite(c).sum(axis=1)  # finite CPU times per row, sorted first
        lo, hi = c[np.arange(rows), np.maximum((m - 1) // 2, 0)], c[np.arange(rows), np.maximum(m // 2, 0)]
        with np.errstate(invalid="ignore"):  # rows without a finite time (m = 0) are NaN below
            mid = np.where(m % 2 == 1, hi, (lo + hi) / 2)  # numpy's median: the mean of the middle two
        steps = np.where(reached, self.steps[j], math.inf).astype(float)
        cpu_t = np.where(reached, np.where(m > 0, mid, math.nan), math.inf)
        return steps, cpu_t


def _ratio(a: float, b: float) -> float:
    if math.isinf(a):
        return math.inf
    return a / b if b > 0 else math.nan


def _ratios(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`_ratio` elementwise."""
    return np.array([_ratio(float(x), float(y)) for x, y in zip(a, b, strict=True)])


def _q(v: pd.Series, q: float) -> float:
    a = v.to_numpy(dtype=float)
    a = np.where(np.isnan(a), np.inf, a)
    return float(np.quantile(a, q, method="inverted_cdf")) if a.size else math.nan


def protocol_summary(
    curves: pd.DataFrame, runs: pd.DataFrame, *, b: int = B_DEFAULT, seed: int = RNG_SEED
) -> pd.DataFrame:
    """One row per (task, config): status, chosen hyperparameters, final held-out loss, steps- and
    CPU-time-to-target and their ratios to AdamW with bootstrap 95% intervals (module docstring)."""
    chosen = select(runs)
    final = runs[runs["phase"] == "final"]
    fc = curves[curves["phase"] == "final"] if "phase" in curves else curves.iloc[:0]
    rows = []
    configs = runs.drop_duplicates(["task", "config"])[["task", "config", "optimizer"]]
    for task, tconf in configs.groupby("task", sort=True):
        steps = np.sort(fc.loc[fc["task"] == task, "step"].unique())
        fr = final[final["task"] == task]
        ad = fr[fr["optimizer"] == BASELINE]
        finals = ad["final_test_loss"].where(ad["failure"].fillna("").astype(str) == "", math.inf)
        target = float(finals.max()) if len(ad) else math.nan
        base = Curves(fc[(fc["task"] == task) & (fc["optimizer"] == BASELINE)], steps) if len(ad) else None
        base_t = base.to_target(target) if base is not None else (math.nan, math.nan)
        for _, c in tconf.iterrows():
            cfg = c["config"]
            ch = chosen[(chosen["task"] == task) & (chosen["config"] == cfg)]
            r = fr[fr["config"] == cfg]
            status = ch["status"].iloc[0] if len(ch) else ("fixed" if len(r) else "missing")
            if len(ch) and status == "chosen" and r.empty:
                status = "pending"  # chosen, final seeds not run yet
            row = {"task": task, "config": cfg, "optimizer": c["optimizer"], "status": status,
                   "trials": int(ch["trials"].iloc[0]) if len(ch) else 0,
                   "tuning_val_loss": float(ch["score"].iloc[0]) if len(ch) else math.nan,
                   "hparams": ch["hparams"].iloc[0] if len(ch) else (r["hparams"].iloc[0] if len(r) else ""),
                   "note": ch["failure_message"].iloc[0] if len(ch) else "", "seeds": len(r),
                   "failures": int((r["failure"].fillna("").astype(str) != "").sum()) if len(r) else 0,
                   "target": target, "metric_name": r["metric_name"].iloc[0] if len(r) else ""}  # fmt: skip
            if r.empty:
                rows.append(row)
                continue
            ft = r["final_test_loss"].where(r["failure"].fillna("").astype(str) == "", math.inf)
            row.update(final_test_loss=_q(ft, 0.5), final_test_loss_q25=_q(ft, 0.25),
                       final_test_loss_q75=_q(ft, 0.75), final_test_metric=float(r["final_test_metric"].median()),
                       final_val_loss=float(r["final_val_loss"].median()))  # fmt: skip
            cur = Curves(fc[(fc["task"] == task) & (fc["config"] == cfg)], steps)
            st, ct = cur.to_target(target)
            row.update(steps_to_target=st, cpu_to_target_s=ct)
            if base is not None and len(base.seeds) and len(cur.seeds):
                row.update(steps_ratio=_ratio(st, base_t[0]), cpu_ratio=_ratio(ct, base_t[1]))
                i, j = resamples([len(cur.seeds), len(base.seeds)], b=b, seed=seed)
                reps = zip(cur.to_target_many(target, i), base.to_target_many(target, j), strict=True)
                for name, (a, z) in zip(("steps_ratio", "cpu_ratio"), reps, strict=True):
                    lo, hi = percentile_interval(_ratios(a, z))
                    row.update({f"{name}_lo": lo, f"{name}_hi": hi})
            rows.append(row)
    return pd.DataFrame(rows)


def _f(x: float, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return format(x, spec)


def _hp(text: str) -> str:
    try:
        hp = json.loads(text)
    except (TypeError, ValueError):
        return ""
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(hp.items()))


def format_protocol_report(summary: pd.DataFrame) -> str:
    """The per-task table: status, final held-out loss, steps and CPU time to target vs AdamW."""
    lines = []
    for task, g in summary.groupby("task", sort=True):
        t = g["target"].iloc[0]
        lines.append(
            f"== {task}: target = held-out loss every AdamW final seed reaches ({_f(float(t), '.4f')}); "
            "ratios vs AdamW, [bootstrap 95% over seeds]"
        )
        lines.append(
            f"{'config':<22} {'status':<8} {'trials':>6} {'seeds':>5} {'held-out':>9} {'steps':>6} "
            f"{'x AdamW [95%]':>20} {'cpu s':>8} {'x AdamW [95%]':>20}  tuned"
        )
        for _, r in g.iterrows():

            def iv(name: str, r: pd.Series = r) -> str:
                return (f"{_f(r.get(name, math.nan), '.2f')} [{_f(r.get(name + '_lo', math.nan), '.2f')}, "
                        f"{_f(r.get(name + '_hi', math.nan), '.2f')}]")  # fmt: skip

            lines.append(
                f"{r['config']:<22} {r['status']:<8} {int(r['trials']):>6} {int(r['seeds']):>5} "
                f"{_f(r.get('final_test_loss', math.nan), '.4f'):>9} {_f(r.get('steps_to_target', math.nan), '.0f'):>6} "
                f"{iv('steps_ratio'):>20} {_f(r.get('cpu_to_target_s', math.nan), '.1f'):>8} {iv('cpu_ratio'):>20}  "
                f"{_hp(r['hparams']) if r['status'] in ('chosen', 'fixed') else r['note'][:80]}"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


__all__ = [
    "Curves",
    "bootstrap",
    "format_protocol_report",
    "percentile_interval",
    "protocol_summary",
    "resamples",
]
