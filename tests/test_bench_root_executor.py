"""experiments/bench_root_executor.py: both executors it times compute the round the training thread
would (the same roots, bit for bit: the same eigh calls on the same inputs, one thread each), count
their rounds, and stop cleanly."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import bench_root_executor as bre


def _stacks() -> dict:
    g = torch.Generator().manual_seed(0)
    G = torch.randn(3, 12, 4, generator=g)
    H = torch.randn(2, 6, 9, generator=g)
    return bre.groups(
        [(x @ x.T, (1e-6, "relative"), 4) for x in G] + [(y @ y.T, (1e-12, "absolute"), 2) for y in H]
    )


def _until(ex, rounds: int) -> None:
    deadline = time.monotonic() + 120
    while ex.rounds < rounds and time.monotonic() < deadline:
        ex.poll()
        time.sleep(0.01)
    assert ex.rounds >= rounds


def test_grouping_stacks_per_shape_eps_and_p() -> None:
    stacks = _stacks()
    assert {k: tuple(v.shape) for k, v in stacks.items()} == {
        (12, (1e-6, "relative"), 4): (3, 12, 12),
        (6, (1e-12, "absolute"), 2): (2, 6, 6),
    }


def test_process_executor_returns_the_training_threads_roots() -> None:
    torch.set_num_threads(1)
    stacks = _stacks()
    want = bre.solve(stacks)
    ex = bre.ProcessExecutor(stacks)
    try:
        _until(ex, 2)
    finally:
        ex.close()
    assert not ex._p.is_alive()
    for k, X in want.items():
        assert torch.equal(ex.roots[k], X), k


def test_thread_executor_solves_fresh_snapshots_and_stops() -> None:
    stacks = _stacks()
    ex = bre.ThreadExecutor(stacks)
    try:
        _until(ex, 2)
        assert all(torch.equal(ex._snap[k], v) and ex._snap[k] is not v for k, v in stacks.items())
    finally:
        ex.close()
    assert not ex._t.is_alive() and ex.fg > 0
