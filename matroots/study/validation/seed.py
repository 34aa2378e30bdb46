"""Seeding a validation run folder from a shipped validation set, so that a run outlives its machine.

A protocol run (``validate_full.toml``: hours of CPU) spans sessions, and its run folder lives on one
machine; what survives is the set shipped into the repository (``results/validation``,
:mod:`matroots.study.validation.ship`, often ``--partial``). Seeding writes the set's units back as the
run folder's parts, so the resume only trains the units the set does not hold::

    matroots validate experiments/configs/validate_full.toml --out runs/validate_full --resume \\
        --seed-from results/validation

It is the sweep's seeding (:mod:`matroots.study.seeding`: the same checks, part writer, ``seeded``
provenance event and ship summary) with the validation's rows. Refused, before anything is written
(:class:`matroots.study.seeding.SeedSourceError`, one line and exit code 2 from the CLI): a set of
another kind, a file whose sha256 is not its provenance's, a set of another config hash, a unit key
that is none of CONFIG's units (tuning units, untuned entries' final seeds, and the final seeds of the
trials the set's own tuning rows choose), and (:class:`SeedConflictError`) a part already in RUN whose
rows disagree with the set's. A set is not refused for its commits, as the sweep's is not: the account
line names them when they are not the running code's, and the provenance keeps them.

What a seeded part holds: from a set with ``parts.parquet`` (shipped since this module), the unit's
curve and run rows as its part held them (all columns; tuning curves included), so the run folder's
curves, runs, chosen and protocol tables and its ship equal the source run's; the per-round root rows
are not shipped, so a seeded unit has none in ``roots.parquet`` (its run row keeps Shampoo's root
totals). From an older set (``runs`` and ``curves`` only: results/validation at 11b2e82) the run row
with the shipped run columns and, for a final-seed unit, its shipped curve columns: the ship of the
resumed run equals an uninterrupted run's; the run folder's own tables lack the tuning curves and the
unshipped columns of the seeded units. Every seeded row carries ``seeded_from``, the sha256 of the
set's ``runs.parquet``.

A unit is seeded only when the set holds its run row once and, where it finished training, its curve
rows (an older set: for final-seed units); any other unit is counted and left to the resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from .. import runner, seeding
from ..seed_record import SEEDED_FROM
from . import ship
from .config import ValidationGrid
from .run import TIMING_COLUMNS

log = logging.getLogger("matroots.study.validation")

#: columns of a part that a clock or the machine writes: two runs of the same unit differ there
CLOCK_COLUMNS = (*TIMING_COLUMNS, "machine", "versions")
#: run-row columns a final-seed curve row of an older set takes over from its unit's run row
_IDENTITY = ("unit", "phase", "trial", "hparams", "lr")


class SeedConflictError(seeding.SeedSourceError):
    """RUN already holds a part of a unit of the set whose rows disagree with the set's. Nothing was
    written."""


def read_source(source: str | Path, grid: ValidationGrid) -> seeding.SeedSource:
    """The shipped validation set at ``source``, checked for ``grid`` (see the module docstring)."""
    if grid.protocol is None:
        raise seeding.SeedSourceError(
            f"cannot seed from {source}: {grid.name} is not a protocol config (only protocol runs are shipped)"
        )
    return seeding.load_source(
        source, ship.FILES, kind=ship.KIND, want=grid.config_hash(), what="validation",
        config_hash=ship._config_hash, reship="matroots validate CONFIG --out RUN --ship DEST",
        optional=(ship.PARTS,), digest="runs",
    )  # fmt: skip


def _from_report_tables(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """An older set's rows as part rows: its run rows, and its final curves given their unit's
    identity (a final unit is one (task, config, seed))."""
    run_rows = runs.assign(table="run")
    final = runs[runs["phase"] == "final"]
    ident = final[["task", "config", "seed", *(c for c in _IDENTITY if c in final)]]
    curve_rows = curves.drop(columns=["phase"], errors="ignore").merge(
        ident, on=["task", "config", "seed"], how="left", validate="many_to_one"
    )
    return pd.concat([curve_rows.assign(table="curve"), run_rows], ignore_index=True)


def unit_rows(src: seeding.SeedSource, grid: ValidationGrid) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The set's rows by unit key for the units it holds whole, and the keys of those it does not.

    Raises :class:`matroots.study.seeding.SeedSourceError` when a unit is none of the grid's."""
    from .protocol import select

    t = src.tables
    old = ship.PARTS not in t
    rows = _from_report_tables(t["runs"], t["curves"]) if old else t[ship.PARTS]
    rows = rows.drop(columns=[SEEDED_FROM], errors="ignore")
    run_rows = rows[rows["table"] == "run"]
    known = {u.key for u in grid.units()} | {u.key for u in grid.final_units(select(run_rows))}
    keys = rows["unit"].astype(object).where(rows["unit"].notna(), "(a curve row of no unit)")
    unknown = sorted(set(keys.astype(str)) - known)
    if unknown:
        raise seeding.SeedSourceError(
            f"cannot seed from {src.path}: {len(unknown)} of its units are no unit of {grid.name}'s grid "
            f"(first: {unknown[0]}); reship the set from a run of this config"
        )
    out: dict[str, pd.DataFrame] = {}
    incomplete: list[str] = []
    for key, part in rows.groupby("unit", sort=True):
        run = part[part["table"] == "run"]
        trained = len(run) == 1 and str(run["failure"].fillna("").iloc[0]) == ""
        needs_curves = trained and (not old or run["phase"].iloc[0] == "final")
        if len(run) != 1 or (needs_curves and not (part["table"] == "curve").any()):
            incomplete.append(str(key))
            continue
        out[str(key)] = part.reset_index(drop=True)  # every column of the set: a concat keeps its order
    return out, incomplete


def _same(a: Any, b: Any) -> bool:
    na, nb = bool(pd.isna(a)), bool(pd.isna(b))
    return na and nb if na or nb else bool(a == b)


def _disagreement(there: pd.DataFrame, seeded: pd.DataFrame) -> str:
    """Where RUN's part of a unit and the set's rows of it differ ("" where they agree): per table the
    set holds, the same rows (by step) with the same values in every column both have, clocks aside."""
    for tag, mine in seeded.groupby("table", sort=True):
        theirs = there[there["table"] == tag] if "table" in there else there.iloc[:0]
        if len(theirs) != len(mine):
            return f"{len(theirs)} {tag} row(s) there, {len(mine)} in the set"
        order = ["step"] if "step" in mine and tag == "curve" else []
        a = theirs.sort_values(order).reset_index(drop=True) if order else theirs.reset_index(drop=True)
        b = mine.sort_values(order).reset_index(drop=True) if order else mine.reset_index(drop=True)
        for col in sorted((set(a.columns) & set(b.columns)) - {*CLOCK_COLUMNS, SEEDED_FROM}):
            for x, y in zip(a[col].tolist(), b[col].tolist(), strict=True):
                if not _same(x, y):
                    return f"{tag} column {col}: {x!r} there, {y!r} in the set"
    return ""


def check_present(out_dir: str | Path, by_unit: dict[str, pd.DataFrame], src: seeding.SeedSource) -> None:
    """Refuse (:class:`SeedConflictError`) when a readable part already in ``out_dir`` is of a unit of
    the set and disagrees with the set's rows of it (:func:`_disagreement`). Writes nothing."""
    out = Path(out_dir)
    bad = []
    for key in sorted(runner.done_units(out) & set(by_unit)):
        try:
            there = pd.read_parquet(runner.part_path(out, key))
        except (OSError, ValueError):
            continue  # unreadable: quarantined and replaced by the seeding
        why = _disagreement(there, by_unit[key])
        if why:
            bad.append((key, why))
    if bad:
        key, why = bad[0]
        raise SeedConflictError(
            f"cannot seed {out} from {src.path}: {len(bad)} of its parts disagree with the set's rows of "
            f"the same unit (first: {key}, {why}); move those parts out of {out / runner.PARTS}, or seed "
            "into another --out"
        )


def seed(out_dir: str | Path, grid: ValidationGrid, src: seeding.SeedSource) -> seeding.SeedStats:
    """Write a part per unit of ``src`` that ``out_dir`` does not hold yet (after
    :func:`check_present`) and record the source in its provenance. ``out_dir`` must be opened
    (:func:`matroots.study.runner.open_run`, as :func:`matroots.study.validation.run.run_validation` does)."""
    by_unit, incomplete = unit_rows(src, grid)
    check_present(out_dir, by_unit, src)
    return seeding.write_parts(
        out_dir, src, by_unit, incomplete, what="run row, or whose curves, the set does not hold"
    )


def seeder(
    source: str | Path,
    grid: ValidationGrid,
    out_dir: str | Path,
    on_seeded: Callable[[str], None] | None = None,
) -> Callable[[Path], None]:
    """Check ``source`` for ``grid`` and against the parts in ``out_dir`` now (each refusal before the
    folder is touched), and return the ``prepare`` of
    :func:`matroots.study.validation.run.run_validation` that seeds the opened folder and gives
    ``on_seeded`` the one-line account (:func:`matroots.study.seeding.describe`)."""
    src = read_source(source, grid)
    check_present(out_dir, unit_rows(src, grid)[0], src)

    def prepare(out: Path) -> None:
        stats = seed(out, grid, src)
        if on_seeded is not None:
            on_seeded(seeding.describe(stats, src, out))

    return prepare


__all__ = [
    "CLOCK_COLUMNS",
    "SeedConflictError",
    "check_present",
    "read_source",
    "seed",
    "seeder",
    "unit_rows",
]
