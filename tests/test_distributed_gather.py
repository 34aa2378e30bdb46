"""The coalesced all-gather of search directions, on 2-3 local gloo ranks (CPU)."""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
from _dist import run_ranks

from shampoo.distributed import (
    DirectionExchange,
    DistributedTimeoutError,
    RemoteRankError,
)

# Per rank, the shapes of the directions it owns (rank 2 owns nothing in the 3-rank run's last check).
SHAPES = [[(4, 3), (5,), (2, 2, 2)], [(7, 7)], [(1,), (3, 3)]]


def _directions(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(s, generator=g, dtype=torch.float32) for s in SHAPES[rank]]


def _gather_body(rank: int, ws: int) -> dict:
    calls = {"n": 0}
    for name in ("all_gather_single", "all_gather_into_tensor", "all_gather"):
        orig = getattr(dist, name, None)
        if orig is None:
            continue

        def counted(*a, _orig=orig, **k):
            calls["n"] += 1
            return _orig(*a, **k)

        setattr(dist, name, counted)
    numels = [[torch.Size(s).numel() for s in SHAPES[r]] for r in range(ws)]
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ex = DirectionExchange(numels, rank, dtype=dtype)
        before = calls["n"]
        got = ex.gather(_directions(rank))
        out[str(dtype)] = {
            "calls": calls["n"] - before,
            "got": [[t.clone() for t in per] for per in got],
            "bytes": ex.bytes_per_rank,
        }
    # A rank that owns nothing still takes part.
    numels_empty = [numels[0], numels[1]] + ([[]] if ws == 3 else [])
    local = _directions(rank) if rank < 2 else []
    got = DirectionExchange(numels_empty, rank).gather(local)
    out["empty"] = [[t.clone() for t in per] for per in got]
    return out


def test_gather_roundtrip_one_collective():
    world_size = 3  # one spawn covers 3 senders of different sizes, and a rank that owns nothing
    results = run_ranks(_gather_body, world_size)
    expect = [[d.reshape(-1) for d in _directions(r)] for r in range(world_size)]
    for res in results:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            rec = res[str(dtype)]
            assert rec["calls"] == 1, "directions must move in exactly one collective"
            seg = 1 + max(sum(torch.Size(s).numel() for s in SHAPES[r]) for r in range(world_size))
            assert rec["bytes"] == seg * torch.empty((), dtype=dtype).element_size()
            for r in range(world_size):
                assert len(rec["got"][r]) == len(expect[r])
                for g, e in zip(rec["got"][r], expect[r], strict=True):
                    assert g.dtype == dtype
                    # Exactly the sender's values rounded once to the communication dtype.
                    assert torch.equal(g, e.to(dtype))
        # Every rank holds bit-identical copies.
        for k in res:
            if k != "empty":
                for r in range(world_size):
                    for a, b in zip(res[k]["got"][r], results[0][k]["got"][r], strict=True):
                        assert torch.equal(a, b)
        assert len(res["empty"]) == world_size
        if world_size == 3:
            assert res["empty"][2] == []


def _failure_body(rank: int, ws: int) -> dict:
    ex = DirectionExchange([[3], [2]], rank, timeout=datetime.timedelta(seconds=3))
    out: dict = {}
    # 1. Rank 1 reports a numerical failure: both ranks stop at the same collective.
    try:
        if rank == 1:
            ex.gather([], error="RootComputationError: boom")
            out["status"] = "own-failure-returned"
        else:
            ex.gather([torch.ones(3)])
            out["status"] = "no-error"
    except RemoteRankError as err:
        out["status"] = f"remote: {err}"
    # 2. Rank 1 "crashes" (does not join the next collective): rank 0 gets a clear, bounded error.
    t0 = time.monotonic()
    if rank == 0:
        try:
            ex.gather([torch.ones(3)])
            out["timeout"] = "no-error"
        except DistributedTimeoutError as err:
            out["timeout"] = str(err)
        out["seconds"] = time.monotonic() - t0
    else:
        time.sleep(5)
    return out


def test_remote_failure_and_timeout_are_clear_errors():
    r0, r1 = run_ranks(_failure_body, 2, timeout=90, pg_timeout=20)
    assert r0["status"].startswith("remote:") and "rank(s) [1]" in r0["status"]
    assert r1["status"] == "own-failure-returned"
    assert "did not complete within 3 s" in r0["timeout"]
    assert r0["seconds"] < 10
