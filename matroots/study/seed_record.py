"""What a seeded run records of its source sets, read back when the run is shipped.

:mod:`matroots.study.seeding` writes, into a run folder's provenance, one ``seeded`` event per shipped
set it rebuilt parts from, and marks each seeded row with the set's sha256 (``seeded_from``);
:func:`matroots.study.shipped.run_summary` folds those events into the shipped provenance with
:func:`summarize`. This module holds only that shared record, so the shipper does not import the
seeder (which imports the shipper to read a set).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

#: the column that marks a row rebuilt from a shipped set (the set's rows sha256)
SEEDED_FROM = "seeded_from"
#: the provenance key of the list of seeding events
SEEDED = "seeded"


def summarize(prov: dict[str, Any], rows: pd.DataFrame) -> dict[str, Any]:
    """What a ship of a seeded run takes over from its sources (used by
    :func:`matroots.study.shipped.run_summary`): for each source whose seeded rows are still in
    ``rows``, its share (units still seeded / its units done) of its unit CPU and wall totals and of
    its run wall time, its commits, starts and creation date. ``{}`` for a run never seeded."""
    events = prov.get(SEEDED, [])
    if not events:
        return {}
    if SEEDED_FROM in rows and "unit" in rows:
        per_unit = rows[rows[SEEDED_FROM].notna()].drop_duplicates("unit")
        counts = per_unit[SEEDED_FROM].astype(str).value_counts().to_dict()
    else:
        counts = {}
    sources, commits, starts, created = [], set(), [], []
    cpu = wall = run_wall = 0.0
    dirty = False
    for ev in events:
        n = int(counts.get(ev.get("sha256"), 0))
        done = int(ev.get("units_done") or ev.get("units_in_rows") or 0)
        share = n / done if done else 0.0
        sources.append(
            {
                k: ev.get(k)
                for k in ("source", "name", "sha256", "config_hash", "created", "shipped", "units_done")
            }
            | {
                "units_seeded": n,
                "share": share,
                "unit_cpu_seconds": ev.get("unit_cpu_seconds", 0.0) * share,
                "unit_wall_seconds": ev.get("unit_wall_seconds", 0.0) * share,
                "seedings": ev.get("seedings", []),
            }
        )
        if n == 0:
            continue
        commits.update(ev.get("commits", []))
        dirty = dirty or bool(ev.get("dirty"))
        starts.extend(ev.get("starts", []))
        for s in ev.get("seedings", []):
            starts.append(
                {"event": SEEDED, "started": s.get("started"), "finished": s.get("finished"),
                 "command": s.get("command"), "source": ev.get("source")}
            )  # fmt: skip
        if ev.get("created"):
            created.append(ev["created"])
        cpu += ev.get("unit_cpu_seconds", 0.0) * share
        wall += ev.get("unit_wall_seconds", 0.0) * share
        run_wall += ev.get("run_wall_seconds", 0.0) * share
    return {
        "sources": sources,
        "commits": commits,
        "dirty": dirty,
        "starts": starts,
        "created": min(created, key=pd.Timestamp) if created else None,
        "unit_cpu_seconds": cpu,
        "unit_wall_seconds": wall,
        "run_wall_seconds": run_wall,
        "units": sum(s["units_seeded"] for s in sources),
    }
