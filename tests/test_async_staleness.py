"""experiments/async_staleness.py (issue 24's staleness table) and the shipped run it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from _scripts import load_script

from matroots.study.validation import config

ROOT = Path(__file__).resolve().parents[1]
st = load_script("experiments/async_staleness.py")


def _curve(task, cfg, opt, seed, losses):
    return [{"task": task, "config": cfg, "optimizer": opt, "seed": seed, "step": 10 * (i + 1),
             "val_loss": v} for i, v in enumerate(losses)]  # fmt: skip


def test_target_is_every_adamw_seeds_final_loss_and_steps_the_first_hit() -> None:
    rows = _curve("t", "adamw", "adamw", 1, [3, 2, 1.5]) + _curve("t", "adamw", "adamw", 2, [3, 2.5, 1.8])
    rows += _curve("t", "s[x]", "shampoo", 1, [2, 1.7, 1.0]) + _curve(
        "t", "s[x]", "shampoo", 2, [2.5, 1.9, 1.9]
    )
    rows += _curve("t", "s[x|async=3]", "shampoo", 1, [1.85, 1.0, 0.9])
    rows += _curve("t", "s[x|async=3]", "shampoo", 2, [1.79, 1.0, 0.9])
    t = st.table(pd.DataFrame(rows)).set_index("schedule")
    assert t.loc["AdamW", "target"] == 1.8  # the worse AdamW seed's final loss
    assert t.loc["sync", "steps"] == [20, None] and pd.isna(t.loc["sync", "median_steps"])
    assert t.loc["k = 3", "steps"] == [20, 10] and t.loc["k = 3", "median_steps"] == 15
    assert t.loc["AdamW", "steps"] == [30, 30] and t.loc["k = 3", "final"] == [0.9, 0.9]
    assert list(t.index) == ["AdamW", "sync", "k = 3"]
    assert st.delay("shampoo-eigh[eigh|fp32|f=10|async=20]") == "k = 20" and st.delay("adamw") == "sync"


def test_shipped_run_is_of_the_repositorys_config_and_complete() -> None:
    prov = json.loads((st.SHIPPED / "provenance.json").read_text())
    grid = config.load_config(ROOT / "experiments" / "configs" / "validate_async.toml")
    assert prov["config_hash"] == grid.config_hash()
    runs = pd.read_parquet(st.SHIPPED / "runs.parquet")
    assert len(runs) == len(grid.units()) == 63
    t = st.table(pd.read_parquet(st.SHIPPED / "curves.parquet"))
    assert set(t["task"]) == {"digits", "lsq", "bytes_lm"}
    assert sorted(set(t["schedule"])) == sorted(["AdamW", "sync"] + [f"k = {k}" for k in (1, 2, 5, 10, 20)])
    assert all(len(s) == 3 for s in t["steps"])
    assert st.main([]) == 0
