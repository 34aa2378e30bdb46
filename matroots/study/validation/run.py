"""Run a validation grid with the shared resumable runner and turn its parts into tidy tables.

``run_validation(grid, out)`` runs every unit (:func:`matroots.study.validation.training.run_unit`) through
:func:`matroots.study.runner.run_units` -- the same process pool, dead-worker recovery, atomic per-unit
parts, resume and dask support as ``matroots sweep`` -- then :func:`collect` writes

* ``curves.parquet``: one row per (unit, eval step, step 0 included): ``train_loss`` (mean minibatch
  loss since the previous evaluation), ``val_loss``, ``metric`` (the task's metric, named in the run
  row's ``metric_name``), ``wall_s`` / ``cpu_s`` (cumulative training time, evaluations excluded);
* ``runs.parquet``: one row per unit: final/best validation loss, failure, timing against AdamW,
  Shampoo's root totals (:data:`RUN_COLUMNS`, :data:`SHAMPOO_RUN_COLUMNS`);
* ``roots.parquet``: one row per (unit, root round, factor): every field of ``opt.diagnostics()``
  and the forward errors of the sampled factors (:data:`ROOT_COLUMNS`);
* ``summary.parquet``, ``accuracy.parquet``: see :mod:`matroots.study.validation.summary`;

with ``provenance.json`` (kind ``"validation"``, config, hash, one record per start/resume).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from .. import atomic, runner
from .config import ValidationGrid
from .estimate import estimate, format_estimate  # the dry run, re-exported
from .preflight import check
from .training import crash_rows, run_unit

log = logging.getLogger("matroots.study.validation")

KIND = "validation"

#: Columns every row of a table has (``identity`` columns name the unit in all three).
IDENTITY_COLUMNS = ("unit", "task", "optimizer", "config", "lr", "seed")
CURVE_COLUMNS = (*IDENTITY_COLUMNS, "step", "train_loss", "val_loss", "metric", "wall_s", "cpu_s")
RUN_COLUMNS = (
    *IDENTITY_COLUMNS,
    "steps",
    "steps_done",
    "failure",
    "final_val_loss",
    "final_metric",
    "metric_name",
    "best_val_loss",
    "train_wall_s",
    "train_cpu_s",
    "step_s",
    "adamw_step_s",
    "time_ratio",
    "step_cpu_s",
    "adamw_step_cpu_s",
    "time_ratio_cpu",
    "opt_time_ratio",
    "versions",
    "machine",
)
#: Run columns of Shampoo units only.
SHAMPOO_RUN_COLUMNS = (
    "root_solver",
    "root_dtype",
    "eps",
    "eps_mode",
    "precondition_frequency",
    "root_rounds",
    "root_failures",
    "primary_failures",
    "fallback_uses",
    "forward_error_median",
    "forward_error_total_median",
)
ROOT_COLUMNS = (
    *IDENTITY_COLUMNS,
    "step",
    "param",
    "block",
    "dim",
    "n",
    "solver",
    "iterations",
    "converged",
    "failures",
    "primary_failures",
    "fallback_uses",
    "kappa",
    "sampled",
    "forward_error",
    "forward_error_total",
    "forward_error_solved",
)
#: Columns measured with a clock (differ between otherwise identical runs).
TIMING_COLUMNS = (
    "wall_s", "cpu_s", "train_wall_s", "train_cpu_s", "step_s", "adamw_step_s", "time_ratio", "step_cpu_s",
    "adamw_step_cpu_s", "time_ratio_cpu", "opt_step_s", "adamw_opt_step_s", "opt_time_ratio", "root_seconds",
    "seconds", "unit_wall_seconds", "unit_cpu_seconds",
)  # fmt: skip
TABLES = ("curves", "runs", "roots")
_TAG = {"curve": "curves", "run": "runs", "root": "roots"}
ORDER = ("task", "optimizer", "config", "phase", "trial", "lr", "seed", "step")


def run_validation(
    grid: ValidationGrid,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    resume: bool = False,
    progress: bool = True,
    scheduler: Any = None,
    csv: bool = False,
    retry_crashed: bool = True,
    prepare: Callable[[Path], None] | None = None,
) -> dict[str, pd.DataFrame]:
    """Run (or resume) a validation grid into ``out_dir``; return its tables (see :func:`collect`).

    The whole config is checked first (:func:`matroots.study.validation.preflight.check`: every task builds,
    every optimizer config constructs and steps), so a mistake stops the run before any unit starts.
    ``retry_crashed``: rerun units an earlier run recorded as ``WorkerCrashed`` (default).
    ``prepare(out)`` runs once the folder is opened, before any unit: the seeding of
    ``--seed-from`` (:func:`matroots.study.validation.seed.seeder`)."""
    check(grid)
    runner.check_scheduler(scheduler)
    out = runner.open_run(
        out_dir, kind=KIND, config=grid.to_dict(), config_hash=grid.config_hash(), resume=resume
    )
    if prepare is not None:
        prepare(out)
    kw = {"workers": workers, "scheduler": scheduler, "progress": progress, "crash_rows": crash_rows}
    units = grid.units()
    if grid.protocol is None:
        stats = runner.run_units(
            units, run_unit, out, desc=f"validate {grid.name}", retry_crashed=retry_crashed, **kw
        )
    else:  # task by task, optimizer by optimizer: its tuning trials, then its chosen point's seeds
        from .protocol import select

        stats = runner.RunStats()
        retry = retry_crashed  # once per run: a later call would drop crash rows this run recorded
        for task in grid.tasks:
            mine = [u for u in units if u.task.name == task.name]
            # config order: AdamW (the target) and the first optimizers are complete, final seeds
            # included, before the next optimizer's trials start, so a long task's partial set already
            # holds whole comparisons (the units and their results do not depend on the order)
            for label in dict.fromkeys(u.optimizer.label for u in mine):
                name = f"validate {grid.name} {task.name} {label}"
                trials = [u for u in mine if u.optimizer.label == label]
                part = runner.run_units(trials, run_unit, out, desc=name, retry_crashed=retry, **kw)
                retry = False
                final = [
                    u
                    for u in grid.final_units(select(load(out)["runs"]))
                    if u.task.name == task.name and u.optimizer.label == label
                ]
                more = runner.run_units(
                    final, run_unit, out, desc=f"{name} (final)", retry_crashed=False, **kw
                )
                for f in ("units", "skipped", "ran", "crashed", "recomputed_corrupt", "retried_crashed",
                          "removed_temp", "seconds"):  # fmt: skip
                    setattr(stats, f, getattr(stats, f) + getattr(part, f) + getattr(more, f))
                stats.scheduler = part.scheduler
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
    if "phase" in tables["runs"]:  # a protocol run
        from .protocol import select
        from .protocol_report import protocol_summary

        tables["chosen"] = select(tables["runs"])
        tables["protocol"] = protocol_summary(tables["curves"], tables["runs"])
        for name, df in tables.items():
            runner.atomic_write_parquet(df, out / f"{name}.parquet")
        return tables
    tables["summary"] = summary.summarize(tables["curves"], tables["runs"])
    tables["accuracy"] = summary.accuracy_table(tables["summary"], tables["roots"])
    for name, df in tables.items():
        runner.atomic_write_parquet(df, out / f"{name}.parquet")
        if csv:
            atomic.write_csv(out / f"{name}.csv", df, index=False)
    return tables


__all__ = [
    "CURVE_COLUMNS",
    "IDENTITY_COLUMNS",
    "KIND",
    "ROOT_COLUMNS",
    "RUN_COLUMNS",
    "SHAMPOO_RUN_COLUMNS",
    "TIMING_COLUMNS",
    "collect",
    "estimate",
    "format_estimate",
    "is_validation_run",
    "load",
    "run_validation",
    "split_tables",
]
