"""``matroots tune CONFIG --out DIR``: run (or resume) the tune sweeps and write the selection table.

Layout of DIR:

* ``sweeps/<sweep name>/``: one ordinary sweep folder per ``[[sweeps]]`` grid (parts, results.parquet,
  provenance.json), run by :func:`matroots.study.sweep.run_sweep` (so resume, worker recovery and dask work
  as for any sweep);
* ``selection.csv``: the selection table (:mod:`matroots.study.tuning.select`), one row per
  (device, dtype, p, n band, kappa band, target);
* ``selection.json``: its provenance: the tune config (parsed and raw), its hash, git commit, machine,
  versions, command line, UTC date, the GEMM timings, and what was left out;
* ``summary.txt``: the human-readable summary (:func:`matroots.study.tuning.summary.format_summary`).

Every file is written atomically (:mod:`matroots.study.atomic`: temp file, fsync, rename), so a kill
leaves the previous table in place. The shipped table (:func:`matroots.solvers.auto_table.shipped_path`) is such a table copied into the package
(``make tune`` regenerates it from ``experiments/configs/tune_default.toml``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd

from .. import atomic, provenance, sweep
from .cost import require_device
from .select import planned_cases, select
from .spec import TuneSpec

log = logging.getLogger("matroots.tune")


def _gemm_timings(rows: pd.DataFrame) -> list[dict[str, Any]]:
    if "gemm_seconds" not in rows:
        return []
    g = rows.groupby(["dtype", "n"])["gemm_seconds"].median().reset_index()
    return [{"dtype": r.dtype, "n": int(r.n), "gemm_seconds": float(r.gemm_seconds)} for r in g.itertuples()]


def provenance_record(spec: TuneSpec, rows: pd.DataFrame, summary: dict[str, Any]) -> dict[str, Any]:
    """The provenance written next to a selection table."""
    return {
        "name": spec.name,
        "description": spec.description,
        "device": spec.device,
        "config_hash": spec.config_hash(),
        "config": spec.raw,
        "candidates": [s.label for s in spec.candidates],
        "candidate_specs": [
            {"label": s.label, "name": s.name, "options": s.options} for s in spec.candidates
        ],
        "targets": list(spec.targets),
        "n_bands": list(spec.n_bands),
        "kappa_bands": [str(k) if k == float("inf") else k for k in spec.kappa_bands],
        "git": provenance.git(),
        "machine": provenance.machine(),
        "versions": provenance.versions(),
        "command": provenance.command_line(),
        "date": provenance.now(),
        "rows": len(rows),
        "units": int(rows["unit"].nunique()) if "unit" in rows else 0,
        "cpu_seconds_solves": float(rows["cpu_seconds"].sum()) if "cpu_seconds" in rows else None,
        "reference_seconds": float(rows.groupby("unit")["reference_seconds"].first().sum())
        if "reference_seconds" in rows
        else None,
        "gemm_timings": _gemm_timings(rows),
        "selection": summary,
    }


def write_table(table: pd.DataFrame, prov: dict[str, Any], out: Path, stem: str = "selection") -> Path:
    """Write ``<stem>.csv`` and ``<stem>.json`` atomically into ``out``; returns the CSV path."""
    csv_path = out / f"{stem}.csv"
    atomic.write_csv(csv_path, table, index=False, float_format="%.6g", na_rep="NA")
    atomic.write_json(out / f"{stem}.json", prov)
    return csv_path


def load_rows(spec: TuneSpec, out: Path) -> pd.DataFrame:
    """All sweep rows of a tune folder (complete or not)."""
    frames = []
    for g in spec.sweeps:
        d = out / "sweeps" / g.name
        if d.exists():
            frames.append(sweep.load(d))
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_tune(
    spec: TuneSpec,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    resume: bool = False,
    progress: bool = True,
    scheduler: Any = None,
    install: str | Path | None = None,
    retry_crashed: bool = True,
) -> tuple[pd.DataFrame, Path]:
    """Run (or resume) every sweep of ``spec`` into ``out_dir`` and write the selection table.

    ``install``: also copy the table and its provenance there (e.g. the package's data folder).
    ``retry_crashed``: rerun units an earlier run recorded as ``WorkerCrashed`` (default).
    Returns (table, path of selection.csv).
    """
    from .summary import format_summary

    out = Path(out_dir)
    require_device(spec.device)  # a CUDA table needs a GPU here: refuse before the first sweep starts
    for g in spec.sweeps:
        sweep.run_sweep(
            g,
            out / "sweeps" / g.name,
            workers=workers or spec.workers,
            resume=resume,
            progress=progress,
            scheduler=scheduler,
            retry_crashed=retry_crashed,
        )
    rows = load_rows(spec, out)
    table, summary = select(rows, spec, planned=planned_cases(spec))
    prov = provenance_record(spec, rows, summary)
    path = write_table(table, prov, out)
    text = format_summary(table, prov)
    atomic.write_text(out / "summary.txt", text)
    if install is not None:
        dest = Path(install)
        stem = f"selection_{spec.device}"
        atomic.copy_file(path, dest / f"{stem}.csv")
        atomic.copy_file(out / "selection.json", dest / f"{stem}.json")
        log.info("installed the table as %s", dest / f"{stem}.csv")
    return table, path


__all__ = ["load_rows", "provenance_record", "run_tune", "write_table"]
