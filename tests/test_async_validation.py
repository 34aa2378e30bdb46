"""Asynchronous roots in the validation harness (issue 24): a Shampoo entry's ``max_root_delay`` sweeps
the root schedule ("sync", or k: roots in the background, installed k steps later); k = 0 trains the
synchronous run bit for bit, k = 1 trains with roots one step stale."""

from __future__ import annotations

import math

import pytest

from matroots.core.errors import InvalidArgumentError
from matroots.study.validation import config
from matroots.study.validation.training import run_unit


def _grid(delays: object) -> config.ValidationGrid:
    return config.from_dict(
        {
            "seeds": [0],
            "tasks": {"digits": {"steps": 6, "eval_every": 3, "size": {"hidden": 16}}},
            "optimizers": [
                {"name": "adamw", "lr": [1e-3]},
                {"name": "shampoo", "lr": [1e-3], "precondition_frequency": 2, "max_root_delay": delays,
                 "options": {"start_preconditioning_step": 1}},
            ],
        }
    )  # fmt: skip


def test_max_root_delay_is_a_sweep_key_with_its_own_labels() -> None:
    units = _grid(["sync", 0, 1]).units()
    shampoo = [u.optimizer for u in units if u.optimizer.name == "shampoo"]
    assert [s.options.get("max_root_delay") for s in shampoo] == [None, 0, 1]
    assert [s.options.get("root_schedule") for s in shampoo] == [None, "async", "async"]
    assert shampoo[0].label == "shampoo[eigh|fp32|eps=1e-12abs|f=2]"  # unchanged without the key
    assert shampoo[2].label == "shampoo[eigh|fp32|eps=1e-12abs|f=2|async=1]"
    for bad in (-1, 1.5, True, "async"):
        with pytest.raises(InvalidArgumentError, match="max_root_delay"):
            _grid([bad])


def _losses(rows: list[dict]) -> list[float]:
    """The learning curve: (train loss, validation loss) at every evaluation after step 0."""
    return [(r["train_loss"], r["val_loss"]) for r in rows if r.get("step") and "val_loss" in r]


def test_delay_zero_trains_the_synchronous_run_and_delay_one_trains() -> None:
    units = {u.optimizer.label: u for u in _grid(["sync", 0, 1]).units()}
    runs = {lab: run_unit(u) for lab, u in units.items() if "shampoo" in lab}
    sync, d0, d1 = (runs[f"shampoo[eigh|fp32|eps=1e-12abs|f=2{s}]"] for s in ("", "|async=0", "|async=1"))
    assert _losses(sync) and _losses(d0) == _losses(sync)  # bitwise: delay 0 is the synchronous step
    assert len(_losses(d1)) == len(_losses(sync)) and all(
        math.isfinite(a) and math.isfinite(b) for a, b in _losses(d1)
    )
    assert _losses(d1) != _losses(sync)  # the roots applied are one step older
