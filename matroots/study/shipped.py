"""Shipped results: the compact form of a finished run that the figures and findings are built from.

A sweep's run folder (``runs/NAME``: one parquet part per unit, the run's ``provenance.json``) is
hundreds of files and carries every diagnostic column. :func:`ship` reduces it to what the figures
and ``docs/findings.md`` read (:data:`COLUMNS`), as one zstd parquet, and writes beside it a
provenance record that says where the rows came from: the config's name and hash, every commit the
run was started or resumed at, machines, dates, units done and rows failed, wall and CPU time.
:func:`load` reads a shipped set back and refuses one whose config no longer matches the config of
the same name in the repository (a shipped result must be reproducible from the repo's config).

A shipped set is also where a lost run starts again: ``matroots sweep CONFIG --out RUN --resume
--seed-from results/NAME`` (:mod:`matroots.study.seeding`) writes its rows back as RUN's parts, and a
later ship of RUN keeps the set's commits, dates and CPU totals (:func:`run_summary`).

The shipper itself (:func:`run_summary`, :func:`write_set`, :func:`load_set`) serves every kind of set:
the sweep's here, the validation protocol's in :mod:`matroots.study.validation.ship`.

    matroots ship runs/precision_full results/precision_full --config experiments/configs/precision_full.toml
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.errors import MatrootsInputError
from . import atomic, grid, provenance, runner
from .seed_record import summarize

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


# ------------------------------------------------------------------------------- the shipper of any set
def repo_relative(config: str | Path) -> str:
    """``config`` relative to this checkout's root when it lies inside it (as a provenance names it,
    so that a set's config is found in any checkout), else as given."""
    root = Path(__file__).resolve().parents[2]  # matroots/study/shipped.py -> the checkout
    p = Path(config).resolve()
    return p.relative_to(root).as_posix() if p.is_relative_to(root) else Path(config).as_posix()


def check_run_config(run: Path, prov: dict[str, Any], config: str | Path, want: str) -> None:
    """Refuse to ship a run that was not made from ``config`` (whose hash is ``want``)."""
    if prov.get("config_hash") != want:
        raise ShippedResultsError(
            f"{run} was run from config hash {prov.get('config_hash')}, but {config} hashes to {want}: "
            "ship a run of the repository's config (or rerun it)"
        )


def run_summary(
    run: Path, prov: dict[str, Any], rows: pd.DataFrame, units_total: int, *, allow_partial: bool, resume: str
) -> dict[str, Any]:
    """What a provenance records of the run: commits, starts, units done / total (one row per unit at
    least, in ``rows``), failures by type, CPU and wall time. A run that has not done every unit is
    refused unless ``allow_partial``; ``resume`` is the command that finishes it. A run seeded from a
    shipped set (:mod:`matroots.study.seeding`) adds its sources' commits, starts and unit CPU / wall
    totals, and a ``seeded`` entry (units seeded, and per source its sha256, dates and share)."""
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
    if units_done < units_total and not allow_partial:
        raise ShippedResultsError(
            f"{run} has {units_done} of {units_total} units; finish it with `{resume}`, "
            "or pass allow_partial=True (--partial)"
        )
    starts = [
        {k: r.get(k) for k in ("event", "started", "finished", "command", "machine", "versions")}
        for r in runs
    ]
    # rows seeded from a shipped set (matroots.study.seeding) were computed by the source's runs: its
    # commits, starts, dates and unit CPU / wall totals (the share of its units still seeded) count here
    seeded = summarize(prov, rows)
    record = {
        "commits": sorted(set(commits) | seeded.get("commits", set())),
        "dirty": dirty or seeded.get("dirty", False),
        "starts": seeded.get("starts", []) + starts,
        "units_done": units_done,
        "units_total": units_total,
        "complete": units_done >= units_total,
        "rows": len(rows),
        "rows_failed_by_type": {k: int(v) for k, v in failures[failures != ""].value_counts().items()},
        "unit_cpu_seconds": float(per_unit.get("unit_cpu_seconds", pd.Series(dtype=float)).sum())
        + seeded.get("unit_cpu_seconds", 0.0),
        "unit_wall_seconds": float(per_unit.get("unit_wall_seconds", pd.Series(dtype=float)).sum())
        + seeded.get("unit_wall_seconds", 0.0),
        "run_wall_seconds": wall + seeded.get("run_wall_seconds", 0.0),
    }
    if seeded:
        record["seeded"] = {"units": seeded["units"], "sources": seeded["sources"]}
        if seeded["created"]:
            record["seeded"]["created"] = seeded["created"]
    return record


def set_record(
    kind: str, name: str, config: str | Path, config_hash: str, prov: dict[str, Any], summary: dict[str, Any]
) -> dict[str, Any]:
    """The provenance record of any shipped set: kind, name, the config (repository-relative) and its
    hash, the run's creation date (a seeded run's: its earliest source's, when earlier), the ship's
    date and :func:`run_summary`'s ``summary``."""
    return {
        "kind": kind,
        "name": name,
        "config": repo_relative(config),
        "config_hash": config_hash,
        "created": _earliest(prov.get("created"), summary.get("seeded", {}).get("created")),
        "shipped": provenance.now(),
        **summary,
    }


def _earliest(*dates: str | None) -> str | None:
    """The earliest of some ISO dates (None where none is given)."""
    given = [d for d in dates if d]
    return min(given, key=pd.Timestamp) if given else None


def write_set(dest: str | Path, tables: dict[str, pd.DataFrame], record: dict[str, Any]) -> dict[str, Any]:
    """Write each table as ``dest/<name>.parquet`` (zstd) and then ``dest/provenance.json``: ``record``
    with the sha256 of every file (each written atomically, :mod:`matroots.study.atomic`)."""
    out = Path(dest)
    digests = {}
    for name, df in tables.items():
        buf = io.BytesIO()
        df.to_parquet(buf, compression="zstd", index=False)
        data = buf.getvalue()
        atomic.write_bytes(out / f"{name}.parquet", data)
        digests[name] = hashlib.sha256(data).hexdigest()
    record = {**record, "sha256": digests}
    atomic.write_text(out / PROVENANCE, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def read_provenance(dest: str | Path) -> dict[str, Any]:
    """The provenance record of a shipped set."""
    path = Path(dest) / PROVENANCE
    if not path.exists():
        raise ShippedResultsError(f"{dest} is not a shipped results set (no {PROVENANCE})")
    return json.loads(path.read_text())


def load_set(
    dest: str | Path,
    names: tuple[str, ...],
    *,
    kind: str,
    config_hash: Callable[[Path], str],
    repo_root: str | Path | None = None,
    require_complete: bool = False,
    reship: str,
) -> dict[str, pd.DataFrame]:
    """The tables ``names`` of a shipped set of ``kind``, after checking each file's sha256 against the
    provenance, with ``repo_root`` that the config it names still hashes (``config_hash``) to the
    recorded hash in that checkout, and with ``require_complete`` that every unit was done.
    ``reship``: the command that ships the set again."""
    prov = read_provenance(dest)
    if prov.get("kind") != kind:
        raise ShippedResultsError(f"{dest} holds {prov.get('kind')!r} results, not {kind} results")
    # a set shipped before the per-file record held one table, rows, under rows_sha256
    recorded = prov.get("sha256") or {"rows": prov.get("rows_sha256")}
    out = {}
    for name in names:
        path = Path(dest) / f"{name}.parquet"
        if not path.exists():
            raise ShippedResultsError(f"{dest} has a provenance record but no {path.name}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != recorded.get(name):
            raise ShippedResultsError(
                f"{path} is not the file its provenance describes (sha256 {digest[:12]}, recorded "
                f"{str(recorded.get(name))[:12]}): reship it with `{reship}`"
            )
        out[name] = pd.read_parquet(path)
    if repo_root is not None:
        now = config_hash(Path(repo_root) / prov["config"])
        if now != prov["config_hash"]:
            raise ShippedResultsError(
                f"{dest} was shipped from {prov['config']} with hash {prov['config_hash']}, which now "
                f"hashes to {now}: rerun and reship, or restore the config"
            )
    if require_complete and not prov.get("complete"):
        raise ShippedResultsError(
            f"{dest} is partial ({prov.get('units_done')} of {prov.get('units_total')} units)"
        )
    return out


# ------------------------------------------------------------------------------------ a sweep's set
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


def ship(
    run_dir: str | Path, dest: str | Path, *, config: str | Path, allow_partial: bool = False
) -> dict[str, Any]:
    """Write ``dest/rows.parquet`` and ``dest/provenance.json`` from the sweep run in ``run_dir``.

    ``config`` is the repository's config the run was made from; its hash must equal the run's.
    A run that has not done every unit is refused unless ``allow_partial`` (then ``complete`` is
    false in the provenance and :func:`load` says so). Returns the provenance record written.
    """
    run = Path(run_dir)
    prov = runner.read_provenance(run)
    spec = grid.load_config(config)
    want = spec.config_hash()
    check_run_config(run, prov, config, want)
    rows = _read_rows(run)
    summary = run_summary(
        run, prov, rows, len(grid.units(spec)), allow_partial=allow_partial,
        resume="matroots sweep CONFIG --out RUN --resume",
    )  # fmt: skip
    keep = [c for c in COLUMNS if c in rows.columns]
    compact = rows[keep].copy()
    for c in _CATEGORICAL:
        if c in compact:
            compact[c] = compact[c].astype("category")
    record = set_record(prov.get("kind", "sweep"), spec.name, config, want, prov, summary)
    return write_set(dest, {"rows": compact}, {**record, "columns": keep})


def load(
    dest: str | Path, *, repo_root: str | Path | None = None, require_complete: bool = False
) -> pd.DataFrame:
    """The rows of a shipped sweep set, after checking them against their provenance
    (:func:`load_set`)."""
    return load_set(
        dest, ("rows",), kind="sweep", config_hash=config_hash_of, repo_root=repo_root,
        require_complete=require_complete, reship="matroots ship",
    )["rows"]  # fmt: skip


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
