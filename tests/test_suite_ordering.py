"""tests/_ordering.py: make test's work units sorted by measured cost, longest first, and the durations
file it reads written by --store-durations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import _ordering

ROOT = Path(__file__).resolve().parents[1]


def _item(nodeid: str, group: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, group=group)


def test_units_sort_by_their_total_cost_longest_first_and_keep_their_order_within() -> None:
    items = [_item("a"), _item("g1", "G"), _item("b"), _item("g2", "G"), _item("c"), _item("d")]
    costs = {"a": 5.0, "b": 30.0, "g1": 10.0, "g2": 15.0, "c": 5.0}  # G: 25 in all; d: unmeasured
    _ordering.longest_first(items, lambda it: it.group, costs)
    assert [it.nodeid for it in items] == ["b", "g1", "g2", "a", "c", "d"]  # a before c: equal, stable


def test_a_missing_or_broken_durations_file_orders_nothing(tmp_path: Path) -> None:
    assert _ordering.load(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert _ordering.load(tmp_path / "bad.json") == {}
    (tmp_path / "list.json").write_text("[1, 2]")
    assert _ordering.load(tmp_path / "list.json") == {}


def test_the_recorder_sums_the_phases_and_keeps_tests_over_a_second(tmp_path: Path) -> None:
    rec = _ordering.Recorder()
    for nodeid, secs in (("t::slow", 0.7), ("t::slow", 0.6), ("t::fast", 0.2), ("t::slow", 0.04)):
        rec.add(SimpleNamespace(nodeid=nodeid, duration=secs))
    assert rec.write(tmp_path / "d.json") == 1
    assert json.loads((tmp_path / "d.json").read_text()) == {"t::slow": 1.3}


def test_store_durations_writes_the_file_a_run_reads(tmp_path: Path) -> None:
    test = tmp_path / "test_two.py"
    test.write_text("import time\n\ndef test_slow():\n    time.sleep(1.1)\n\ndef test_fast():\n    pass\n")
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "_ordering.py").write_text((ROOT / "tests" / "_ordering.py").read_text())
    out = tmp_path / "durations.json"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test), "--store-durations", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    stored = json.loads(out.read_text())
    assert list(stored) == ["test_two.py::test_slow"] and 1.1 <= stored["test_two.py::test_slow"] < 60
