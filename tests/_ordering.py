"""Longest first: the order in which ``make test``'s xdist workers take the tests.

pytest-xdist (``--dist loadgroup``) hands out work units (a file's tests that share a fixture, else one
test each) in collection order, a unit to a worker as it frees up. In file order the suite's slowest
single tests (the full figure set from the shipped results, the SIGKILL-and-resume runs, the torchrun
launches: 1-2 minutes each) came late, and the run ended with one worker finishing them while the
other had nothing left (a tail of minutes). Sorting the units by their measured cost, longest first
(Graham's LPT rule: at most 4/3 of the optimal makespan), puts the tail on the short tests.

The costs are ``tests/durations.json``: seconds per test id (setup + call + teardown), from a whole run
with ``--store-durations tests/durations.json`` (tests under a second are left out: they sort last, in
file order). A stale or missing entry changes only the order, never what runs or its result.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"
MIN_STORED_S = 1.0


def load(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def longest_first(items: list, group_of, costs: dict[str, float]) -> None:
    """Sort ``items`` in place: units (``group_of(item)``: a group name, or None for a test alone) by
    their total cost, longest first; within a unit and among equal costs the collection order stays."""
    total: dict[str, float] = defaultdict(float)
    for it in items:
        total[group_of(it) or it.nodeid] += costs.get(it.nodeid, 0.0)
    items.sort(key=lambda it: -total[group_of(it) or it.nodeid])  # stable


class Recorder:
    """Collects each test's seconds (every phase) as the reports arrive; ``write`` keeps the ones over
    ``MIN_STORED_S``, rounded to 0.1 s, sorted by id (a small, reviewable diff)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, report) -> None:
        self.seconds[report.nodeid] += float(getattr(report, "duration", 0.0) or 0.0)

    def write(self, path: Path) -> int:
        kept = {k: round(v, 1) for k, v in sorted(self.seconds.items()) if v >= MIN_STORED_S}
        path.write_text(json.dumps(kept, indent=0) + "\n")
        return len(kept)
