"""Run a validation grid with the shared resumable runner and turn its parts into tidy tables.

``run_validation(grid, out)`` runs every unit (:func:`matroots.validation.training.run_unit`) through
:func:`matroots.runner.run_units` -- the same process pool, dead-worker recovery, atomic per-unit
parts, resume and dask support as ``matroots sweep`` -- then :func:`collect` writes

* ``curves.parquet``: one row per (unit, eval step): train/val loss, the task metric, wall and CPU time;
* ``runs.parquet``: one row per unit: final/best validation loss, failure, timing against AdamW,
  Shampoo's root totals;
* ``roots.parquet``: one row per (unit, root round, factor): ``opt.diagnostics()`` and forward errors;
* ``summary.parquet``, ``accuracy.parquet``: see :mod:`matroots.validation.summary`;

with ``provenance.json`` (kind ``"validation"``, config, hash, one record per start/resume).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pandas as pd

from .. import runner
from .config import Unit, ValidationGrid
from .training import crash_rows, run_unit

log = logging.getLogger("matroots.validation")

KIND = "validation"
TABLES = ("curves", "runs", "roots")
_TAG = {"curve": "curves", "run": "runs", "root": "roots"}
ORDER = ("task", "optimizer", "config", "lr", "seed", "step")


def run_validation(
    grid: ValidationGrid,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    resume: bool = False,
    progress: bool = True,
    scheduler: Any = None,
    csv: bool = False,
) -> dict[str, pd.DataFrame]:
    """Run (or resume) a validation grid into ``out_dir``; return its tables (see :func:`collect`)."""
    out = runner.open_run(
        out_dir, kind=KIND, config=grid.to_dict(), config_hash=grid.config_hash(), resume=resume
    )
    units = grid.units()
    stats = runner.run_units(
        units,
        run_unit,
        out,
        workers=workers,
        scheduler=scheduler,
        progress=progress,
        desc=f"validate {grid.name}",
        crash_rows=crash_rows,
    )
    runner.close_run(out, stats)
    return collect(out, csv=csv)


def is_validation_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a validation run (by its provenance)."""
    try:
        return runner.read_provenance(run_dir).get("kind") == KIND
    except (OSError, ValueError):
        return False


def split_tables(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The runner's mixed rows split by their ``table`` tag, each without the other tables' columns."""
    out = {}
    for tag, name in _TAG.items():
        part = rows[rows["table"] == tag] if "table" in rows else rows.iloc[0:0]
        part = part.dropna(axis=1, how="all").drop(columns=["table"], errors="ignore")
        cols = [c for c in ORDER if c in part]
        out[name] = part.sort_values(cols, kind="stable").reset_index(drop=True) if cols else part
    return out


def load(run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The tables of a validation run from its parts (complete or not); writes nothing."""
    run = Path(run_dir)
    if not run.exists():
        raise FileNotFoundError(f"no run folder {run}")
    return split_tables(runner.read_parts(run))


def collect(out_dir: str | Path, *, csv: bool = False) -> dict[str, pd.DataFrame]:
    """Write curves/runs/roots/summary/accuracy parquet files of a run folder and return them."""
    from . import summary

    out = Path(out_dir)
    tables = load(out)
    if tables["runs"].empty:
        return tables
    tables["summary"] = summary.summarize(tables["curves"], tables["runs"])
    tables["accuracy"] = summary.accuracy_table(tables["summary"], tables["roots"])
    for name, df in tables.items():
        runner.atomic_write_parquet(df, out / f"{name}.parquet")
        if csv:
            df.to_csv(out / f"{name}.csv", index=False)
    return tables


# ----------------------------------------------------------------------------------------------------
# dry run


def _cost_key(unit: Unit) -> tuple[Any, ...]:
    s = unit.optimizer
    return (unit.task.name, tuple(sorted(unit.task.size.items())), s.name, s.root_solver, s.root_dtype,
            s.precondition_frequency, tuple(sorted(s.solver_options.items())))  # fmt: skip


def _probe(unit: Unit) -> dict[str, float]:
    """Time a short version of ``unit`` on this machine: per-step time (with one root round per
    precondition_frequency steps), evaluation time and build time."""
    import torch

    from .tasks import get_task
    from .training import interleaved_timing, make_optimizer

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    task = get_task(unit.task.name, **unit.task.size)
    model = task.build_model(unit.seed)
    opt = make_optimizer(unit, model)
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    task.evaluate(model)
    ev = time.perf_counter() - t0
    batches = task.batches(unit.seed)
    for _ in range(max(unit.optimizer.precondition_frequency, 2)):  # past Shampoo's first root round
        opt.zero_grad(set_to_none=True)
        task.loss(model, next(batches)).backward()
        opt.step()
    probe = Unit(**{**unit.__dict__, "timing_rounds": 1})
    t = interleaved_timing(task, model, opt, probe)
    return {"build_s": build, "eval_s": ev, "step_s": t["step_s"], "adamw_step_s": t["adamw_step_s"]}


def estimate(grid: ValidationGrid, *, cores: int = 2) -> dict[str, Any]:
    """Estimated cost of a grid, from short timed probes of each distinct (task, optimizer cost class).

    Per unit: build + steps x step time (Shampoo's including its root rounds, amortised) + evaluations
    + the interleaved timing (2 x rounds x chunk steps). Wall time assumes ``cores`` workers kept busy
    (the total divided by ``cores``, never less than the longest unit). Measured with one thread on this
    machine as loaded now: a busier machine makes it pessimistic, a quieter one optimistic.
    """
    units = grid.units()
    probes: dict[tuple[Any, ...], dict[str, float]] = {}
    per_task: dict[str, float] = {}
    total, longest = 0.0, 0.0
    for u in units:
        k = _cost_key(u)
        if k not in probes:
            probes[k] = _probe(u)
        p = probes[k]
        evals = u.task.steps // u.task.eval_every + 2
        secs = (
            p["build_s"]
            + u.task.steps * p["step_s"]
            + evals * p["eval_s"]
            + u.timing_rounds * u.timing_chunk * (p["step_s"] + p["adamw_step_s"])
        )
        total += secs
        longest = max(longest, secs)
        per_task[u.task.name] = per_task.get(u.task.name, 0.0) + secs
    return {
        "units": len(units),
        "core_seconds": total,
        "cores": cores,
        "wall_seconds": max(total / cores, longest),
        "per_task_core_seconds": per_task,
        "probes": len(probes),
    }


__all__ = ["KIND", "collect", "estimate", "is_validation_run", "load", "run_validation", "split_tables"]
