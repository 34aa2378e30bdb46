"""Shipped results: the compact form of a finished run that the figures and findings are built from.

A sweep's run folder (``runs/NAME``: one parquet part per unit, the run's ``provenance.json``) is
hundreds of files and carries every diagnostic column. :func:`ship` reduces it to what the figures
and ``docs/findings.md`` read (:data:`COLUMNS`), as one zstd parquet, and writes beside it a
provenance record that says where the rows came from: the config's name and hash, every commit the
run was started or resumed at, machines, dates, units done and rows failed, wall and CPU time.
:func:`load` reads a shipped set back and refuses one whose config no longer matches the config of
the same name in the repository (a shipped result must be reproducible from the repo's config).

    matroots ship runs/precision_full results/precision_full --config experiments/configs/precision_full.toml
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.errors import MatrootsInputError
from . import grid, provenance, runner

ROWS = "rows.parquet"
PROVENANCE = "provenance.json"

#: The columns the figure set (matroots.study.plots) and the findings read; everything else stays in runs/.
COLUMNS = (
    # the case
    "family",
    "n",
    "kappa",
    "kappa_actual",
    "seed",
    "p",
    "eps",
    "eps_mode",
    "eps_abs",
    "dtype",
    "solver",
    "method",
    "options",
    # truth and its bounds
    "condition_number",
    "cond_rel",
    "cond_u_line",
    "kappa_u_line",
    "unit_roundoff",
    "eps_bias",
    "reference_digits",
    "reference_error_bound",
    "representation_error",
    # outcome
    "failure",
    "converged",
    "stop_reason",
    "relative_forward_error",
    "forward_error_total",
    "residual",
    "backward_error",
    "symmetry_defect",
    # cost
    "iterations",
    "iterations_total",
    "sqrt_stages",
    "matmuls",
    "gemm_equivalents",
    "seconds",
    "cpu_seconds",
)
#: string columns with few distinct values: stored as dictionary-encoded categoricals
_CATEGORICAL = ("family", "eps_mode", "dtype", "solver", "method", "options", "failure", "stop_reason")


class ShippedResultsError(MatrootsInputError):
    """A shipped results set is missing, incomplete, or does not match the repository's config."""


def config_hash_of(config_path: str | Path) -> str:
    """The grid hash the runner records for ``config_path`` (:meth:`matroots.study.grid.Grid.config_hash`)."""
    return grid.load_config(config_path).config_hash()


def _read_rows(run_dir: Path) -> pd.DataFrame:
    final = run_dir / "results.parquet"
    parts = sorted((run_dir / "parts").glob("*.parquet")) if (run_dir / "parts").is_dir() else []
    if parts:  # the parts are the truth while a run is resumed; results.parquet is their concatenation
        return pd.concat([pd.read_parquet(f) for f in parts], ignore_index=True)
    if final.exists():
        return pd.read_parquet(final)
    raise ShippedResultsError(f"{run_dir} holds no rows (no parts/*.parquet, no results.parquet)")


def _summary(prov: dict[str, Any], rows: pd.DataFrame, units_total: int) -> dict[str, Any]:
    runs = prov.get("runs", [])
    commits = sorted({r["git"]["commit"] for r in runs if r.get("git") and r["git"].get("commit")})
    dirty = any(bool(r.get("git", {}).get("dirty")) for r in runs)
    wall = 0.0
    for r in runs:
        if r.get("started") and r.get("finished"):
            wall += (pd.Timestamp(r["finished"]) - pd.Timestamp(r["started"])).total_seconds()
    per_unit = rows.drop_duplicates("unit") if "unit" in rows else rows.iloc[:0]
    failures = rows["failure"].fillna("").astype(str) if "failure" in rows else pd.Series([], dtype=str)
    units_done = int(per_unit.shape[0])
    return {
        "commits": commits,
        "dirty": dirty,
        "starts": [
            {k: r.get(k) for k in ("event", "started", "finished", "command", "machine", "versions")}
            for r in runs
        ],
        "units_done": units_done,
        "units_total": units_total,
        "complete": units_done >= units_total,
        "rows": len(rows),
        "rows_failed_by_type": {k: int(v) for k, v in failures[failures != ""].value_counts().items()},
        "unit_cpu_seconds": float(per_unit.get("unit_cpu_seconds", pd.Series(dtype=float)).sum()),
        "unit_wall_seconds": float(per_unit.get("unit_wall_seconds", pd.Series(dtype=float)).sum()),
        "run_wall_seconds": wall,
    }


def ship(
    run_dir: str | Path, dest: str | Path, *, config: str | Path, allow_partial: bool = False
) -> dict[str, Any]:
    """Write ``dest/rows.parquet`` and ``dest/provenance.json`` from the sweep run in ``run_dir``.

    ``config`` is the repository's config the run was made from; its hash must equal the run's.
    A run that has not done every unit is refused unless ``allow_partial`` (then ``complete`` is
    false in the provenance and :func:`load` says so). Returns the provenance record written.
    """
    run, out = Path(run_dir), Path(dest)
    prov = runner.read_provenance(run)
    spec = grid.load_config(config)
    want = spec.config_hash()
    if prov.get("config_hash") != want:
        raise ShippedResultsError(
            f"{run} was run from config hash {prov.get('config_hash')}, but {config} hashes to {want}: "
            "ship a run of the repository's config (or rerun it)"
        )
    rows = _read_rows(run)
    units_total = len(grid.units(spec))
    summary = _summary(prov, rows, units_total)
    if not summary["complete"] and not allow_partial:
        raise ShippedResultsError(
            f"{run} has {summary['units_done']} of {units_total} units; finish it with "
            "`matroots sweep CONFIG --out RUN --resume`, or pass allow_partial=True (--partial)"
        )
    keep = [c for c in COLUMNS if c in rows.columns]
    compact = rows[keep].copy()
    for c in _CATEGORICAL:
        if c in compact:
            compact[c] = compact[c].astype("category")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (ROWS + ".tmp")
    compact.to_parquet(tmp, compression="zstd", index=False)
    tmp.replace(out / ROWS)
    record = {
        "kind": prov.get("kind", "sweep"),
        "name": spec.name,
        "config": str(Path(config).as_posix()),
        "config_hash": want,
        "created": prov.get("created"),
        "shipped": provenance.now(),
        "rows_sha256": hashlib.sha256((out / ROWS).read_bytes()).hexdigest(),
        "columns": keep,
        **summary,
    }
    (out / PROVENANCE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def read_provenance(dest: str | Path) -> dict[str, Any]:
    path = Path(dest) / PROVENANCE
    if not path.exists():
        raise ShippedResultsError(f"{dest} is not a shipped results set (no {PROVENANCE})")
    return json.loads(path.read_text())


def load(
    dest: str | Path, *, repo_root: str | Path | None = None, require_complete: bool = False
) -> pd.DataFrame:
    """The rows of a shipped set, after checking them against their provenance.

    Checks that ``rows.parquet`` is the file the provenance describes (sha256) and, with
    ``repo_root``, that the config it names still hashes to the recorded hash in that checkout.
    """
    prov = read_provenance(dest)
    path = Path(dest) / ROWS
    if not path.exists():
        raise ShippedResultsError(f"{dest} has a provenance record but no {ROWS}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != prov.get("rows_sha256"):
        raise ShippedResultsError(
            f"{path} is not the file its provenance describes (sha256 {digest[:12]}, recorded "
            f"{str(prov.get('rows_sha256'))[:12]}): reship it with `matroots ship`"
        )
    if repo_root is not None:
        cfg = Path(repo_root) / prov["config"]
        now = config_hash_of(cfg)
        if now != prov["config_hash"]:
            raise ShippedResultsError(
                f"{dest} was shipped from {prov['config']} with hash {prov['config_hash']}, which now "
                f"hashes to {now}: rerun the sweep and reship, or restore the config"
            )
    if require_complete and not prov.get("complete"):
        raise ShippedResultsError(
            f"{dest} is partial ({prov.get('units_done')} of {prov.get('units_total')} units)"
        )
    return pd.read_parquet(path)


def register(sub: argparse._SubParsersAction) -> None:
    """``matroots ship RUN DEST --config CONFIG [--partial]``."""
    sp = sub.add_parser(
        "ship",
        help="write the compact, provenance-checked results set of a sweep run (for results/)",
        description="Reduce the sweep run in RUN to the columns the figures and findings read "
        "(DEST/rows.parquet, zstd) and record its provenance (DEST/provenance.json).",
    )
    sp.add_argument("run_dir", type=Path, help="the sweep's run folder (runs/NAME)")
    sp.add_argument("dest", type=Path, help="the results folder to write (results/NAME)")
    sp.add_argument("--config", type=Path, required=True, help="the repository config the run is of")
    sp.add_argument("--partial", action="store_true", help="ship a run that has not finished every unit")
    sp.set_defaults(func=_cmd_ship)


def _cmd_ship(args: argparse.Namespace) -> int:
    rec = ship(args.run_dir, args.dest, config=args.config, allow_partial=args.partial)
    size = (Path(args.dest) / ROWS).stat().st_size
    state = "complete" if rec["complete"] else "PARTIAL"
    print(
        f"{rec['name']}: {rec['rows']} rows of {rec['units_done']}/{rec['units_total']} units ({state}), "
        f"{size / 1e6:.2f} MB -> {args.dest}"
    )
    return 0
