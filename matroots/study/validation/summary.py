"""Summaries of a validation run, computed from its curves and run rows only.

Definitions (per task):

* **target**: AdamW's best final validation loss -- over AdamW's learning rates, the lowest median
  (over seeds) final validation loss. A failed run (diverged, aborted) counts as +inf.
* **steps-to-target** of a (task, config, lr): the first evaluation step at which the median over
  seeds of the validation loss is <= the target (+inf when never reached; a seed that failed counts
  as +inf from its failure on). AdamW at its best lr reaches it by its last step by construction.
  **time-to-target**: the median over seeds of the cumulative training wall / CPU time at that step
  (evaluation time excluded). Per seed (``steps_to_target_per_seed``: the median over seeds of each
  seed's own first step <= target) is reported too, but with few seeds it is +inf for AdamW itself
  half of the time (the target is a median), so it is not the headline.
* per (task, config, lr): medians over seeds; the **best lr** of a config is the one with the lowest
  median final validation loss (ties: fewer steps-to-target).
* **steps_ratio** = steps-to-target of the config at its best lr / that of AdamW at its best lr;
  **min_steps_ratio** = the fewest steps-to-target over the config's lrs (at ``min_steps_lr``) / the
  fewest over AdamW's lrs (the "tuned for speed" comparison);
  **time_ratio**: median over seeds of the unit's interleaved step-time ratio against AdamW (measured
  inside the unit, same process; ``time_ratio_cpu`` the same in process CPU time, which other
  processes' load does not inflate); ``time_to_target_ratio`` = steps_ratio x time_ratio_cpu.

The accuracy table relates each Shampoo config's measured root forward error to its training outcome;
a config is *degraded* when its final validation loss exceeds that of the task's most accurate Shampoo
config by more than the seed noise (twice that config's interquartile range over seeds, at least 0.5%).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .config import BASELINE

KEYS = ["task", "optimizer", "config", "root_solver", "root_method", "root_dtype", "eps", "eps_mode",
        "precondition_frequency"]  # fmt: skip


def _final(runs: pd.DataFrame) -> pd.Series:
    bad = runs["failure"].fillna("").astype(str) != ""
    return runs["final_val_loss"].where(~bad & runs["final_val_loss"].notna(), math.inf)


def targets(runs: pd.DataFrame) -> pd.DataFrame:
    """Per task: the target (AdamW's best median final validation loss), its config and lr."""
    r = runs[runs["optimizer"] == BASELINE].assign(final=_final(runs))
    if r.empty:
        raise ValueError("no AdamW runs: the target of steps-to-target is AdamW's best final validation loss")
    med = r.groupby(["task", "config", "lr"], as_index=False)["final"].median()
    best = med.loc[med.groupby("task")["final"].idxmin()]
    return best.rename(columns={"final": "target", "config": "target_config", "lr": "target_lr"}).reset_index(
        drop=True
    )


def steps_to_target(curves: pd.DataFrame, target: float) -> dict[str, Any]:
    """First eval step (and cumulative wall/CPU time) of one unit's curve with val_loss <= target."""
    c = curves.sort_values("step")
    hit = c[c["val_loss"] <= target]
    if hit.empty or not math.isfinite(target):
        return {"steps_to_target": math.inf, "time_to_target_s": math.inf, "cpu_to_target_s": math.inf}
    h = hit.iloc[0]
    return {"steps_to_target": float(h["step"]), "time_to_target_s": float(h["wall_s"]),
            "cpu_to_target_s": float(h["cpu_s"])}  # fmt: skip


def median_curve_steps(curves: pd.DataFrame, target: float) -> dict[str, Any]:
    """Steps/time-to-target of the median-over-seeds validation curve of one (task, config, lr)."""
    never = {"steps_to_target": math.inf, "time_to_target_s": math.inf, "cpu_to_target_s": math.inf}
    if curves.empty or not math.isfinite(target):
        return never
    val = curves.pivot_table(index="step", columns="unit", values="val_loss", aggfunc="first")
    val = val.fillna(math.inf).where(~val.isna().cummax(), math.inf)  # a seed that stopped stays +inf
    med = val.apply(lambda r: _q(r, 0.5), axis=1)
    hit = med[med <= target]
    if hit.empty:
        return never
    step = hit.index[0]
    at = curves[curves["step"] == step]
    return {"steps_to_target": float(step), "time_to_target_s": float(at["wall_s"].median()),
            "cpu_to_target_s": float(at["cpu_s"].median())}  # fmt: skip


def unit_table(curves: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per unit: its run row plus target, steps- and time-to-target."""
    tg = targets(runs).set_index("task")["target"]
    rows = []
    by_unit = dict(tuple(curves.groupby("unit"))) if not curves.empty else {}
    for _, r in runs.iterrows():
        t = float(tg.get(r["task"], math.nan))
        c = by_unit.get(r["unit"])
        st = steps_to_target(c, t) if c is not None else steps_to_target(curves.iloc[0:0], math.nan)
        rows.append({**r.to_dict(), "target": t, **st})
    out = pd.DataFrame(rows)
    out["final"] = _final(out)
    return out


_BIG = 1e300


def _q(v: pd.Series, q: float) -> float:
    """Quantile that treats +inf (never reached, failed) as a value larger than all others."""
    a = v.to_numpy(dtype=float)
    a = a[~np.isnan(a)]
    if not a.size:
        return math.nan
    x = float(np.quantile(np.where(np.isposinf(a), _BIG, a), q))
    return math.inf if x >= _BIG / 4 else x  # an interpolation with +inf is +inf


def summarize(curves: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (task, config, lr): medians over seeds; ``best_lr`` marks each config's best lr; the
    ratios against AdamW are filled in on every row (see the module docstring)."""
    u = unit_table(curves, runs)
    by_unit = dict(tuple(curves.groupby("unit"))) if not curves.empty else {}
    keys = [k for k in KEYS if k in u]
    for k in keys:
        u[k] = u[k].fillna("") if u[k].dtype == object else u[k]
    rows = []
    for key, g in u.groupby([*keys, "lr"], dropna=False, sort=True):
        row = dict(zip([*keys, "lr"], key, strict=True))
        fin = g["final"]
        row.update(
            seeds=len(g),
            failures=int((g["failure"].fillna("").astype(str) != "").sum()),
            final_val_loss=_q(fin, 0.5),
            final_val_loss_q25=_q(fin, 0.25),
            final_val_loss_q75=_q(fin, 0.75),
            final_metric=float(g["final_metric"].median()) if "final_metric" in g else math.nan,
            metric_name=g["metric_name"].iloc[0] if "metric_name" in g else "",
            target=float(g["target"].iloc[0]),
            steps_to_target_per_seed=_q(g["steps_to_target"], 0.5),
            reached=int(np.isfinite(g["steps_to_target"]).sum()),
        )
        cs = [by_unit[k] for k in g["unit"] if k in by_unit]
        row.update(median_curve_steps(pd.concat(cs) if cs else curves.iloc[0:0], row["target"]))
        for c in ("time_ratio", "time_ratio_cpu", "opt_time_ratio", "step_s", "adamw_step_s", "step_cpu_s"):
            row[c] = float(g[c].median()) if c in g and g[c].notna().any() else math.nan
        for c in ("forward_error_median", "forward_error_total_median", "forward_error_max",
                  "forward_error_total_max", "primary_failures", "fallback_uses", "root_failures"):  # fmt: skip
            if c in g:
                row[c] = float(g[c].median()) if g[c].notna().any() else math.nan
        rows.append(row)
    s = pd.DataFrame(rows)
    s["spread"] = s["final_val_loss_q75"] - s["final_val_loss_q25"]
    order = s.sort_values(["final_val_loss", "steps_to_target"], kind="stable")
    best_idx = order.groupby(keys[:3], dropna=False).head(1).index
    s["best_lr"] = s.index.isin(best_idx)
    base = s[s["best_lr"] & (s["optimizer"] == BASELINE)]
    tg = targets(runs)
    ref = {}
    for _, t in tg.iterrows():
        b = base[(base["task"] == t["task"]) & (base["config"] == t["target_config"])]
        ref[t["task"]] = b.iloc[0] if len(b) else None
    s["adamw_steps_to_target"] = [
        float(ref[t]["steps_to_target"]) if ref.get(t) is not None else math.nan for t in s["task"]
    ]
    s["adamw_cpu_to_target_s"] = [
        float(ref[t]["cpu_to_target_s"]) if ref.get(t) is not None else math.nan for t in s["task"]
    ]
    # The lr that reaches the target soonest (may differ from the best-final lr), per config.
    fastest = s.sort_values(["steps_to_target", "final_val_loss"], kind="stable").groupby(
        keys[:3], dropna=False
    )
    fast = fastest.head(1).set_index(keys[:3])
    idx = pd.MultiIndex.from_frame(s[keys[:3]])
    s["min_steps_to_target"] = fast["steps_to_target"].reindex(idx).to_numpy()
    s["min_steps_lr"] = fast["lr"].reindex(idx).to_numpy()
    ad_fast = fast.reset_index()
    ad_fast = ad_fast[ad_fast["optimizer"] == BASELINE].groupby("task")["steps_to_target"].min()
    s["adamw_min_steps_to_target"] = s["task"].map(ad_fast).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        s["steps_ratio"] = (s["steps_to_target"] / s["adamw_steps_to_target"]).where(
            np.isfinite(s["adamw_steps_to_target"])
        )
        s["min_steps_ratio"] = (s["min_steps_to_target"] / s["adamw_min_steps_to_target"]).where(
            np.isfinite(s["adamw_min_steps_to_target"])
        )
        s["time_to_target_ratio"] = s["steps_ratio"] * s["time_ratio_cpu"]
        s["cpu_to_target_ratio"] = s["cpu_to_target_s"] / s["adamw_cpu_to_target_s"]
    return s


def best(summary: pd.DataFrame) -> pd.DataFrame:
    """Each config at its best lr (the steps-to-target table)."""
    return summary[summary["best_lr"]].reset_index(drop=True)


def accuracy_table(summary: pd.DataFrame, roots: pd.DataFrame) -> pd.DataFrame:
    """Per task and Shampoo config (at its best lr): root forward errors against training outcome.

    ``forward_error`` / ``forward_error_total`` / ``forward_error_solved`` (see
    :func:`matroots.study.validation.training.root_forward_errors`): median over the sampled factors of every
    root round of the config's best-lr units (all seeds); ``_p90``: their 90th percentile. ``delta_final`` is the
    relative change of the final validation loss against the task's most accurate config (lowest
    median ``forward_error_total``); ``degraded`` is the noise test of the module docstring.
    """
    b = best(summary)
    b = b[b["optimizer"] == "shampoo"]
    if b.empty:
        return pd.DataFrame()
    samp = (
        roots[roots.get("sampled", pd.Series(False, index=roots.index)).astype(bool)] if len(roots) else roots
    )
    rows = []
    for _, r in b.iterrows():
        if len(samp):
            m = samp[(samp["task"] == r["task"]) & (samp["config"] == r["config"]) & (samp["lr"] == r["lr"])]
        else:
            m = samp
        row = {k: r[k] for k in (*KEYS, "lr", "final_val_loss", "spread", "final_metric", "steps_to_target",
                                 "steps_ratio", "failures", "seeds") if k in r}  # fmt: skip
        for col in ("forward_error", "forward_error_total", "forward_error_solved"):
            v = m[col].to_numpy(dtype=float) if col in m else np.array([])
            v = v[~np.isnan(v)]
            row[col] = float(np.median(v)) if v.size else math.nan
            row[f"{col}_p90"] = float(np.quantile(v, 0.9)) if v.size else math.nan
        for col in ("primary_failures", "fallback_uses", "root_failures"):
            row[col] = r.get(col, math.nan)
        if len(m) and "kappa" in m:
            row["kappa_median"] = float(np.nanmedian(m["kappa"].to_numpy(dtype=float)))
        rows.append(row)
    a = pd.DataFrame(rows)
    out = []
    for _task, g in a.groupby("task", sort=True):
        g = g.copy()
        ok = g[np.isfinite(g["final_val_loss"])]
        ref = (ok if len(ok) else g).sort_values("forward_error_total", na_position="last").iloc[0]
        tol = max(
            2 * float(ref["spread"]) if math.isfinite(ref["spread"]) else 0.0,
            0.005 * abs(ref["final_val_loss"]),
        )
        g["reference_config"] = ref["config"]
        with np.errstate(invalid="ignore"):
            g["delta_final"] = (g["final_val_loss"] - ref["final_val_loss"]) / abs(ref["final_val_loss"])
        g["degraded"] = ~(g["final_val_loss"] <= ref["final_val_loss"] + tol)
        out.append(g)
    return pd.concat(out, ignore_index=True).sort_values(["task", "forward_error_total"], kind="stable")


def degradation_threshold(acc: pd.DataFrame) -> pd.DataFrame:
    """Per task: the largest root error (``forward_error_total``) with undegraded training below the
    smallest error at which training degraded, and that smallest degraded error."""
    rows = []
    for task, g in acc.groupby("task", sort=True):
        e = g["forward_error_total"]
        bad = g[g["degraded"]]
        first_bad = float(bad["forward_error_total"].min()) if len(bad) else math.inf
        ok = g[~g["degraded"] & (e < first_bad)]
        rows.append(
            {
                "task": task,
                "max_ok_error": float(ok["forward_error_total"].max()) if len(ok) else math.nan,
                "min_degraded_error": first_bad,
                "configs": len(g),
                "degraded_configs": len(bad),
            }
        )
    return pd.DataFrame(rows)


__all__ = [
    "accuracy_table",
    "best",
    "degradation_threshold",
    "steps_to_target",
    "summarize",
    "targets",
    "unit_table",
]
