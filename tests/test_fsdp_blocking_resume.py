"""experiments/fsdp_blocking.py keeps each finished curve as it lands and a rerun with the same
arguments reuses them (the W1 comparison takes hours and died with a session once)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    sys.path.insert(0, str(ROOT / "experiments"))
    spec = importlib.util.spec_from_file_location("fsdp_blocking", ROOT / "experiments" / "fsdp_blocking.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_curves_are_saved_per_run_and_reused_only_for_the_same_arguments(tmp_path, monkeypatch) -> None:
    mod = _module()
    calls: list[tuple[int, int]] = []
    real = mod.run

    def counted(seed, row_shards, args):
        calls.append((row_shards, seed))
        return real(seed, row_shards, args)

    monkeypatch.setattr(mod, "run", counted)
    out = tmp_path / "b.json"
    argv = ["--row-shards", "2", "--seeds", "2", "--steps", "3", "--block", "32", "--json", str(out)]
    first = mod.main(argv)
    assert sorted(calls) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    saved = json.loads(Path(str(out) + ".curves.json").read_text())
    assert sorted(saved["curves"]) == ["1:0", "1:1", "2:0", "2:1"]
    calls.clear()
    again = mod.main(argv)  # same arguments: every curve reused, nothing trained
    assert calls == []
    assert again["rows"] == first["rows"]
    mod.main([*argv[:-2], "--lr", "1e-2", "--json", str(out)])  # other arguments: all trained again
    assert sorted(calls) == [(1, 0), (1, 1), (2, 0), (2, 1)]
