"""Shipped validation results: a protocol run reduced to what the report, figures and notebook read.

    matroots validate experiments/configs/validate_full.toml --out runs/validate_full --ship results/validation

writes into DEST (zstd parquet, only the needed columns):

* ``curves.parquet``: the final seeds' curves (:data:`CURVE_COLUMNS`: held-out and validation loss,
  cumulative CPU / wall time per evaluation step);
* ``runs.parquet``: one row per unit, tuning trials included (:data:`RUN_COLUMNS`: phase, trial, the
  hyperparameter point, final validation / held-out loss, failure);
* ``protocol.parquet``: the per-task table of :func:`matroots.study.validation.protocol_report.protocol_summary`;
* ``provenance.json``: config name, path and hash, every commit and machine the run was started or
  resumed on, dates, units done / expected, CPU and wall time, and the sha256 of each file.

:func:`load` refuses a set whose files are not the ones recorded, or (given the repository root) whose
config no longer hashes to the recorded hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd

from .. import provenance, runner
from ..shipped import ShippedResultsError, _summary
from .config import load_config

CURVE_COLUMNS = ("task", "config", "optimizer", "seed", "step", "test_loss", "test_metric", "val_loss",
                 "cpu_s", "wall_s")  # fmt: skip
RUN_COLUMNS = ("unit", "task", "config", "optimizer", "phase", "trial", "seed", "lr", "hparams", "steps",
               "steps_done", "failure", "failure_message", "final_val_loss", "final_test_loss",
               "final_test_metric", "metric_name", "train_cpu_s", "train_wall_s", "time_ratio_cpu",
               "unit_cpu_seconds", "unit_wall_seconds", "machine")  # fmt: skip
FILES = ("curves", "runs", "protocol")
PROVENANCE = "provenance.json"


def ship(
    run_dir: str | Path, dest: str | Path, *, config: str | Path, allow_partial: bool = False
) -> dict[str, Any]:
    """Write the shipped set of the protocol run in ``run_dir`` (made from ``config``) into ``dest``."""
    from . import run as vrun

    run, out = Path(run_dir), Path(dest)
    prov = runner.read_provenance(run)
    grid = load_config(config)
    if grid.protocol is None:
        raise ShippedResultsError(f"{config} is not a protocol config: only protocol runs are shipped")
    if prov.get("config_hash") != grid.config_hash():
        raise ShippedResultsError(
            f"{run} was run from config hash {prov.get('config_hash')}, but {config} hashes to "
            f"{grid.config_hash()}: ship a run of the repository's config"
        )
    tables = vrun.collect(run)
    if tables["runs"].empty:
        raise ShippedResultsError(f"{run} holds no finished unit")
    expected = len(grid.units()) + len(grid.final_units(tables["chosen"]))
    summary = _summary(prov, tables["runs"], expected)
    if not summary["complete"] and not allow_partial:
        raise ShippedResultsError(
            f"{run} has {summary['units_done']} of {expected} units; resume it, or ship with --partial"
        )
    curves = tables["curves"]
    compact = {
        "curves": curves[curves["phase"] == "final"][[c for c in CURVE_COLUMNS if c in curves]],
        "runs": tables["runs"][[c for c in RUN_COLUMNS if c in tables["runs"]]],
        "protocol": tables["protocol"],
    }
    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name, df in compact.items():
        tmp = out / f".{name}.parquet.tmp"
        df.reset_index(drop=True).to_parquet(tmp, compression="zstd", index=False)
        tmp.replace(out / f"{name}.parquet")
        digests[name] = hashlib.sha256((out / f"{name}.parquet").read_bytes()).hexdigest()
    record = {
        "kind": "validation",
        "name": grid.name,
        "config": _repo_relative(config),
        "config_hash": grid.config_hash(),
        "created": prov.get("created"),
        "shipped": provenance.now(),
        "sha256": digests,
        **summary,
    }
    (out / PROVENANCE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def _repo_relative(config: str | Path) -> str:
    """``config`` relative to this checkout's root when it lies inside it (as the provenance names it)."""
    root = Path(__file__).resolve().parents[3]  # matroots/study/validation/ship.py -> the checkout
    p = Path(config).resolve()
    return p.relative_to(root).as_posix() if p.is_relative_to(root) else Path(config).as_posix()


def read_provenance(dest: str | Path) -> dict[str, Any]:
    path = Path(dest) / PROVENANCE
    if not path.exists():
        raise ShippedResultsError(f"{dest} is not a shipped validation set (no {PROVENANCE})")
    return json.loads(path.read_text())


def load(dest: str | Path, *, repo_root: str | Path | None = None) -> dict[str, pd.DataFrame]:
    """The tables of a shipped set (``curves``, ``runs``, ``protocol``) after checking each file's sha256
    and, with ``repo_root``, that the config it names still hashes to the recorded hash there."""
    prov = read_provenance(dest)
    if prov.get("kind") != "validation":
        raise ShippedResultsError(f"{dest} holds {prov.get('kind')!r} results, not validation results")
    out = {}
    for name in FILES:
        path = Path(dest) / f"{name}.parquet"
        if not path.exists():
            raise ShippedResultsError(f"{dest} has a provenance record but no {path.name}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != prov["sha256"].get(name):
            raise ShippedResultsError(f"{path} is not the file its provenance describes: reship it")
        out[name] = pd.read_parquet(path)
    if repo_root is not None:
        now = load_config(Path(repo_root) / prov["config"]).config_hash()
        if now != prov["config_hash"]:
            raise ShippedResultsError(
                f"{dest} was shipped from {prov['config']} with hash {prov['config_hash']}, which now hashes "
                f"to {now}: rerun and reship, or restore the config"
            )
    out["curves"] = out["curves"].assign(phase="final")
    return out


__all__ = ["CURVE_COLUMNS", "RUN_COLUMNS", "load", "read_provenance", "ship"]
