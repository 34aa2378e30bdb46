"""Shipped validation results: a protocol run reduced to what the report, figures and notebook read.

    matroots validate experiments/configs/validate_full.toml --out runs/validate_full --ship results/validation

writes into DEST (zstd parquet, only the needed columns):

* ``curves.parquet``: the final seeds' curves (:data:`CURVE_COLUMNS`: held-out and validation loss,
  cumulative CPU / wall time per evaluation step);
* ``runs.parquet``: one row per unit, tuning trials included (:data:`RUN_COLUMNS`: phase, trial, the
  hyperparameter point, final validation / held-out loss, failure);
* ``protocol.parquet``: the per-task table of :func:`matroots.study.validation.protocol_report.protocol_summary`;
* ``parts.parquet``: every curve and run row of every unit (tuning curves included, all columns; the
  ``table`` tag says which), without the per-round root rows: what
  ``matroots validate CONFIG --out RUN --resume --seed-from DEST`` (:mod:`matroots.study.validation.seed`)
  writes back as RUN's parts on another machine. Sets shipped before it existed (results/validation at
  11b2e82) seed from ``runs`` and ``curves`` instead;
* ``provenance.json``: config name, path and hash, every commit and machine the run was started or
  resumed on, dates, units done / expected, CPU and wall time, and the sha256 of each file.

:func:`load` refuses a set whose files are not the ones recorded, or (given the repository root) whose
config no longer hashes to the recorded hash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from .. import runner
from ..seed_record import SEEDED_FROM
from ..shipped import (
    ShippedResultsError,
    check_run_config,
    load_set,
    read_provenance,
    run_summary,
    set_record,
    write_set,
)
from .config import load_config

CURVE_COLUMNS = ("task", "config", "optimizer", "seed", "step", "test_loss", "test_metric", "val_loss",
                 "cpu_s", "wall_s")  # fmt: skip
RUN_COLUMNS = ("unit", "task", "config", "optimizer", "phase", "trial", "seed", "lr", "hparams", "steps",
               "steps_done", "failure", "failure_message", "final_val_loss", "final_test_loss",
               "final_test_metric", "metric_name", "train_cpu_s", "train_wall_s", "time_ratio_cpu",
               "unit_cpu_seconds", "unit_wall_seconds", "machine")  # fmt: skip
FILES = ("curves", "runs", "protocol")
#: what the seeder reads besides FILES (absent from sets shipped before it)
PARTS = "parts"
KIND = "validation"


def ship(
    run_dir: str | Path, dest: str | Path, *, config: str | Path, allow_partial: bool = False
) -> dict[str, Any]:
    """Write the shipped set of the protocol run in ``run_dir`` (made from ``config``) into ``dest``."""
    from . import run as vrun

    run = Path(run_dir)
    prov = runner.read_provenance(run)
    grid = load_config(config)
    if grid.protocol is None:
        raise ShippedResultsError(f"{config} is not a protocol config: only protocol runs are shipped")
    check_run_config(run, prov, config, grid.config_hash())
    tables = vrun.collect(run)
    if tables["runs"].empty:
        raise ShippedResultsError(f"{run} holds no finished unit")
    expected = len(grid.units()) + len(grid.final_units(tables["chosen"]))
    summary = run_summary(
        run, prov, tables["runs"], expected, allow_partial=allow_partial,
        resume="matroots validate CONFIG --out RUN --resume",
    )  # fmt: skip
    curves = tables["curves"]
    compact = {
        "curves": curves[curves["phase"] == "final"][[c for c in CURVE_COLUMNS if c in curves]],
        "runs": tables["runs"][[c for c in RUN_COLUMNS if c in tables["runs"]]],
        "protocol": tables["protocol"],
        PARTS: part_rows(run),
    }
    record = set_record(KIND, grid.name, config, grid.config_hash(), prov, summary)
    return write_set(dest, compact, record)


def part_rows(run: Path) -> pd.DataFrame:
    """The curve and run rows of every part of ``run`` as they are there (the root rows left out, and
    a seeded run's ``seeded_from`` marks: a seeding of this set marks its own)."""
    rows = runner.read_parts(run)
    rows = rows[rows["table"] != "root"].drop(columns=[SEEDED_FROM], errors="ignore")
    return rows.dropna(axis=1, how="all").reset_index(drop=True)


def _config_hash(path: Path) -> str:
    return load_config(path).config_hash()


def load(dest: str | Path, *, repo_root: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """The tables of a shipped set (``curves``, ``runs``, ``protocol``) after checking each file's sha256
    and, with ``repo_root``, that the config it names still hashes to the recorded hash there
    (:func:`matroots.study.shipped.load_set`)."""
    out = load_set(
        dest, FILES, kind=KIND, config_hash=_config_hash, repo_root=repo_root,
        reship="matroots validate CONFIG --out RUN --ship DEST",
    )  # fmt: skip
    out["curves"] = out["curves"].assign(phase="final")
    return out


__all__ = ["CURVE_COLUMNS", "RUN_COLUMNS", "load", "read_provenance", "ship"]
