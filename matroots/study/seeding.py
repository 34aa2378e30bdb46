"""Seeding a sweep's run folder from a shipped results set, so that a lost run folder costs nothing.

A long sweep (``precision_full.toml``: many CPU-hours) outlives a session, and its run folder
(``runs/NAME``) lives on one machine. What survives a lost machine is the shipped set committed in the
repository (``results/NAME``, :mod:`matroots.study.shipped`, often shipped with ``--partial``). Seeding
turns that set back into the parts of a run folder, so the resume only computes the units the set
does not hold::

    matroots sweep experiments/configs/precision_full.toml --out runs/precision_full --resume \\
        --seed-from results/precision_full

What is checked first (each a :class:`SeedSourceError`, one line and exit code 2 from the CLI; nothing
is written): the set is a sweep's (``kind``), its ``rows.parquet`` is the file its provenance describes
(sha256), and its config hash is the grid hash of CONFIG.

How the rows map back to units: every row's (family, n, kappa, seed, p, eps, eps_mode) must be a
:class:`matroots.study.grid.Unit` of CONFIG's grid, compared exactly; a row that matches none is an
error (the set is not of this grid, whatever its hash says). A unit is seeded only when its rows are
exactly the (solver, dtype) rows the grid produces for it, each once; a unit whose rows are not that
set is **skipped and counted** (``units_incomplete``) and the resume computes it afresh, so nothing
wrong or partial is kept. A unit whose part is already in RUN is never overwritten
(``units_present``); unreadable parts there are moved to ``quarantine/`` first, as a resume does.

What is written:

* ``parts/<unit key>.parquet`` per seeded unit, atomically, in the runner's part format: the set's
  columns (its categoricals back to plain strings, values bit for bit), plus ``unit`` (the key),
  ``config_hash`` and ``seeded_from`` (the sha256 of the set's rows: which rows were not computed in
  this run). Columns the set does not ship (timings of whole units, versions, messages) are absent.
* a ``seeded`` event in RUN's ``provenance.json`` (a list beside ``runs``, one entry per source set,
  recorded before the first part is written): the source's path, name, sha256, config hash, dates,
  commits, starts, units done / total and its unit CPU / wall totals, and one ``seedings`` entry per
  call (when, the command, units written / present / incomplete).

The reading of a set (:func:`load_source`), the part writer with its provenance event
(:func:`write_parts`) and the account line (:func:`describe`, which names the set's commits when they are
not the running code's: a set is never refused for its commits) serve every seeder: the validation's is
:mod:`matroots.study.validation.seed`.

A later ``matroots ship RUN DEST`` (:func:`matroots.study.shipped.run_summary`) folds the event in: the
source's commits, starts and creation date, and its unit CPU / wall totals in the share of its units
whose seeded rows are still in RUN (all of them unless some were recomputed, e.g. a retried
``WorkerCrashed`` unit; a share below one is recorded as such). The seeded units' rows of that ship
equal the source set's, column for column; a column whose integers the source stored as int64 becomes
float64 when rows computed later leave it empty somewhere (as it would in an uninterrupted run).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from . import grid as gridmod
from . import provenance, runner, shipped
from .seed_record import SEEDED, SEEDED_FROM

log = logging.getLogger("matroots.study.seeding")

#: The row columns that name a unit (the fields of :class:`matroots.study.grid.Unit`).
UNIT_FIELDS = ("family", "n", "kappa", "seed", "p", "eps", "eps_mode")


class SeedSourceError(shipped.ShippedResultsError):
    """A shipped set cannot seed this sweep: not a sweep's set, rows not those of its provenance,
    another config, or rows that are no unit of the grid. Nothing was written."""


@dataclass(frozen=True)
class SeedSource:
    """A checked shipped set: where it is, its provenance and its tables (a sweep's: ``rows``).
    ``digest``: the table whose sha256 names the set in the seeded rows (``seeded_from``)."""

    path: Path
    provenance: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    digest: str = "rows"

    @property
    def rows(self) -> pd.DataFrame:
        return self.tables["rows"]

    @property
    def sha256(self) -> str:
        recorded = self.provenance.get("sha256") or {"rows": self.provenance.get("rows_sha256")}
        return str(recorded.get(self.digest))


@dataclass(frozen=True)
class SeedStats:
    """What one seeding did."""

    units_written: int
    rows_written: int
    units_present: int
    units_incomplete: int
    units_in_source: int


def load_source(
    source: str | Path,
    names: tuple[str, ...],
    *,
    kind: str,
    want: str,
    what: str,
    config_hash: Callable[[Path], str],
    reship: str,
    optional: tuple[str, ...] = (),
    digest: str = "rows",
) -> SeedSource:
    """The shipped set of ``kind`` at ``source`` whose config hash is ``want`` (that of the ``what``
    being run): its tables ``names``, and those of ``optional`` its provenance records, each checked
    against its recorded sha256 (:func:`matroots.study.shipped.load_set`). Shared by every seeder.

    Raises :class:`SeedSourceError` (one line, naming the fix)."""
    path = Path(source)
    try:
        recorded = shipped.read_provenance(path).get("sha256") or {}
        names = (*names, *(n for n in optional if n in recorded))
        tables = shipped.load_set(
            path, names, kind=kind, config_hash=config_hash, repo_root=None, reship=reship
        )  # fmt: skip
    except shipped.ShippedResultsError as exc:
        raise SeedSourceError(f"cannot seed from {path}: {exc}") from None
    prov = shipped.read_provenance(path)
    if prov.get("config_hash") != want:
        raise SeedSourceError(
            f"cannot seed from {path}: it was shipped from config hash {prov.get('config_hash')} "
            f"({prov.get('config')}), but the {what}'s config hashes to {want}: seed only from a set of "
            "the same grid"
        )
    return SeedSource(path=path, provenance=prov, tables=tables, digest=digest)


def read_source(source: str | Path, spec: gridmod.GridSpec) -> SeedSource:
    """The shipped sweep set at ``source`` after the checks of the module docstring, for ``spec``'s grid.

    Raises :class:`SeedSourceError` (one line, naming the fix)."""
    src = load_source(
        source, ("rows",), kind="sweep", want=spec.config_hash(), what="sweep",
        config_hash=shipped.config_hash_of, reship="matroots ship RUN DEST --config CONFIG",
    )  # fmt: skip
    missing = [c for c in (*UNIT_FIELDS, "solver", "dtype") if c not in src.rows.columns]
    if missing:
        raise SeedSourceError(
            f"cannot seed from {src.path}: its rows lack the column(s) {', '.join(missing)}"
        )
    return src


def _plain(df: pd.DataFrame) -> pd.DataFrame:
    """The shipped rows with their categoricals back to plain strings (the runner's part format)."""
    out = df.copy()
    for c in out.columns:
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype("str")
    return out


def unit_rows(src: SeedSource, spec: gridmod.GridSpec) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The source's rows by unit key, for the units whose rows are exactly the (solver, dtype) rows
    the grid produces (each once), and the keys of the units whose rows are not that set.

    Raises :class:`SeedSourceError` when a row matches no unit of the grid."""
    rows = _plain(src.rows).reset_index(drop=True)
    units = gridmod.units(spec)
    by_fields = {tuple(getattr(u, f) for f in UNIT_FIELDS): u.key for u in units}
    fields = rows[list(UNIT_FIELDS)].astype(object)
    keys = [by_fields.get(t) for t in fields.itertuples(index=False, name=None)]
    unknown = [i for i, k in enumerate(keys) if k is None]
    if unknown:
        first = dict(zip(UNIT_FIELDS, fields.iloc[unknown[0]].tolist(), strict=True))
        raise SeedSourceError(
            f"cannot seed from {src.path}: {len(unknown)} of its {len(rows)} rows are no unit of the grid "
            f"(first: {first}); reship the set from a run of this config"
        )
    expected = {(s.label, _dtype_name(d)) for s in spec.solvers for d in spec.dtypes}
    out: dict[str, pd.DataFrame] = {}
    incomplete: list[str] = []
    rows["unit"] = keys
    for key, part in rows.groupby("unit", sort=False):
        pairs = list(zip(part["solver"], part["dtype"], strict=True))
        if len(pairs) == len(expected) and set(pairs) == expected:
            out[str(key)] = part
        else:
            incomplete.append(str(key))
    return out, incomplete


def _dtype_name(d: str) -> str:
    from ..core import precision

    return precision.info(d).name


def _event(src: SeedSource, units_in_rows: int) -> dict[str, Any]:
    p = src.provenance
    return {
        "event": SEEDED,
        "source": shipped.repo_relative(src.path),
        "name": p.get("name"),
        "sha256": src.sha256,
        "config": p.get("config"),
        "config_hash": p.get("config_hash"),
        "created": p.get("created"),
        "shipped": p.get("shipped"),
        "commits": list(p.get("commits", [])),
        "dirty": bool(p.get("dirty")),
        "starts": list(p.get("starts", [])),
        "rows": p.get("rows"),
        "units_done": p.get("units_done", units_in_rows),
        "units_in_rows": units_in_rows,
        "units_total": p.get("units_total"),
        "complete": p.get("complete"),
        "unit_cpu_seconds": float(p.get("unit_cpu_seconds") or 0.0),
        "unit_wall_seconds": float(p.get("unit_wall_seconds") or 0.0),
        "run_wall_seconds": float(p.get("run_wall_seconds") or 0.0),
        "seedings": [],
    }


def _record(out: Path, src: SeedSource, units_in_rows: int, seeding: dict[str, Any] | None) -> None:
    """Add the source's event to RUN's provenance (once per source sha256), and ``seeding`` to it."""
    prov = runner.read_provenance(out)
    events = prov.setdefault(SEEDED, [])
    ev = next((e for e in events if e.get("sha256") == src.sha256), None)
    if ev is None:
        ev = _event(src, units_in_rows)
        events.append(ev)
    if seeding is not None:
        ev.setdefault("seedings", []).append(seeding)
    runner._atomic_write_json(prov, out / runner.PROVENANCE)


def seed(out_dir: str | Path, spec: gridmod.GridSpec, src: SeedSource) -> SeedStats:
    """Write one part per seedable unit of ``src`` that ``out_dir`` does not hold yet, and record the
    source in its provenance (see the module docstring). ``out_dir`` must be opened first
    (:func:`matroots.study.runner.open_run`, as :func:`matroots.study.sweep.run_sweep` does)."""
    by_unit, incomplete = unit_rows(src, spec)
    return write_parts(out_dir, src, by_unit, incomplete, assign={"config_hash": spec.config_hash()})


def write_parts(
    out_dir: str | Path,
    src: SeedSource,
    by_unit: dict[str, pd.DataFrame],
    incomplete: list[str],
    *,
    assign: dict[str, Any] | None = None,
    what: str = "rows of the grid's full (solver, dtype) set",
) -> SeedStats:
    """The seeding of any run kind: write ``by_unit`` (rows by unit key) as the parts ``out_dir`` does
    not hold yet, each with ``assign``'s columns and ``seeded_from``, atomically and never over a part
    there (unreadable parts are quarantined first), and record the source and this call in the run's
    provenance (``seeded``) before the first part. ``incomplete``: the source's units not seeded
    (``what`` they lack), counted and logged."""
    out = Path(out_dir)
    runner.clean_temp_files(out)
    runner.quarantine_corrupt_parts(out)  # a corrupt part is replaced by the seeded rows, not kept
    present = runner.done_units(out)
    todo = {k: v for k, v in by_unit.items() if k not in present}
    started = provenance.now()
    in_rows = len(by_unit) + len(incomplete)
    _record(out, src, in_rows, None)  # before any part: no seeded row is ever without its source's record
    n_rows = 0
    for key, part in todo.items():
        part = part.assign(**(assign or {}), **{SEEDED_FROM: src.sha256})
        runner.atomic_write_parquet(part.reset_index(drop=True), runner.part_path(out, key))
        n_rows += len(part)
    stats = SeedStats(
        units_written=len(todo),
        rows_written=n_rows,
        units_present=len(by_unit) - len(todo),
        units_incomplete=len(incomplete),
        units_in_source=in_rows,
    )
    _record(
        out,
        src,
        in_rows,
        {
            "started": started,
            "finished": provenance.now(),
            "command": provenance.command_line(),
            "units_written": stats.units_written,
            "rows_written": stats.rows_written,
            "units_present": stats.units_present,
            "units_incomplete": stats.units_incomplete,
        },
    )
    if incomplete:
        log.warning(
            "%s: %d unit(s) whose %s were not seeded; the resume computes them",
            src.path,
            len(incomplete),
            what,
        )
    log.info(
        "seeded %d units (%d rows) from %s; %d already in %s",
        stats.units_written,
        stats.rows_written,
        src.path,
        stats.units_present,
        out,
    )
    return stats


def commits_note(src: SeedSource) -> str:
    """What the one-line account says when the set's units were computed at other commits than the
    code now running (both are kept: the seeded event and a later ship record the set's commits), or
    ``""``. Seeding never refuses a set for its commits: a set made over several sessions holds several
    (results/validation: two), and the code that resumes it is always newer."""
    theirs = [str(c) for c in src.provenance.get("commits", [])]
    here = provenance.git().get("commit")
    if not theirs or not here or set(theirs) == {here}:
        return ""
    return (
        f"; its units were computed at commit(s) {', '.join(c[:12] for c in theirs)}, this code is at "
        f"{here[:12]} (both recorded in the run's provenance)"
    )


def describe(stats: SeedStats, src: SeedSource, out: str | Path) -> str:
    """One line for the command line: what a seeding wrote, and from which commits."""
    skipped = (
        f"; {stats.units_incomplete} unit(s) with incomplete rows not seeded (the run computes them)"
        if stats.units_incomplete
        else ""
    )
    return (
        f"seeded {stats.units_written} units ({stats.rows_written} rows) from {src.path} "
        f"({src.digest} sha256 {src.sha256[:12]}) into {out}; {stats.units_present} already there"
        f"{skipped}{commits_note(src)}"
    )
