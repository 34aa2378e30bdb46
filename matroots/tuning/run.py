"""``matroots tune CONFIG --out DIR``: run (or resume) the tune sweeps and write the selection table.

Layout of DIR:

* ``sweeps/<sweep name>/``: one ordinary sweep folder per ``[[sweeps]]`` grid (parts, results.parquet,
  provenance.json), run by :func:`matroots.sweep.run_sweep` (so resume, worker recovery and dask work
  as for any sweep);
* ``selection.csv``: the selection table (:mod:`matroots.tuning.select`), one row per
  (device, dtype, p, n band, kappa band, target);
* ``selection.json``: its provenance: the tune config (parsed and raw), its hash, git commit, machine,
  versions, command line, UTC date, the GEMM timings, and what was left out;
* ``summary.txt``: the human-readable summary (:func:`matroots.tuning.summary.format_summary`).

``matroots.tuning.table.SHIPPED`` is such a table copied into the package
(``make tune`` regenerates it from ``experiments/configs/tune_default.toml``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from .. import provenance, sweep
from .select import select
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
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / f"{stem}.csv"
    tmp = csv_path.with_suffix(".csv.tmp")
    table.to_csv(tmp, index=False, float_format="%.6g", na_rep="NA")
    os.replace(tmp, csv_path)
    jpath = out / f"{stem}.json"
    tmp = jpath.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(prov, indent=2, default=str) + "\n")
    os.replace(tmp, jpath)
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
) -> tuple[pd.DataFrame, Path]:
    """Run (or resume) every sweep of ``spec`` into ``out_dir`` and write the selection table.

    ``install``: also copy the table and its provenance there (e.g. the package's data folder).
    Returns (table, path of selection.csv).
    """
    from .summary import format_summary

    out = Path(out_dir)
    for g in spec.sweeps:
        sweep.run_sweep(
            g,
            out / "sweeps" / g.name,
            workers=workers or spec.workers,
            resume=resume,
            progress=progress,
            scheduler=scheduler,
        )
    rows = load_rows(spec, out)
    table, summary = select(rows, spec)
    prov = provenance_record(spec, rows, summary)
    path = write_table(table, prov, out)
    text = format_summary(table, prov)
    (out / "summary.txt").write_text(text)
    if install is not None:
        dest = Path(install)
        dest.mkdir(parents=True, exist_ok=True)
        stem = f"selection_{spec.device}"
        shutil.copyfile(path, dest / f"{stem}.csv")
        shutil.copyfile(out / "selection.json", dest / f"{stem}.json")
        log.info("installed the table as %s", dest / f"{stem}.csv")
    return table, path


__all__ = ["load_rows", "provenance_record", "run_tune", "write_table"]
