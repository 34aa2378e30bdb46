"""Test helper: run a function on N local gloo ranks (CPU, 127.0.0.1 only) with a hard time limit.

``run_ranks(fn, world_size, *args)`` spawns ``world_size`` processes; each calls
``fn(rank, world_size, *args)`` after ``init_process_group("gloo")`` with one intra-op thread. The
function must be importable (module level). Results travel through files: ``fn`` returns a picklable
value which is ``torch.save``d and handed back as a list indexed by rank. A rank that raises fails the
call with its traceback; a run that exceeds ``timeout`` is killed and fails.

Ranks are forked from a multiprocessing *forkserver* that has imported torch, shampoo and matroots once
(per pytest process), instead of spawned fresh interpreters: a spawned rank spends 4.4-4.6 s of CPU
importing them (``python -c "import torch, torch.distributed, shampoo, matroots"``), which was most of
the cost of the suite's distributed tests (test_distributed_gather: 76 s -> 32 s wall). The forkserver
(``matroots.study.forkserver``, reaped at exit so that the ranks' CPU time is counted) is a fresh
process started from this process's environment, so a forked rank sees the same libraries and
settings as a spawned one; what it does not see is an environment variable set here after the server
started, which no caller of ``run_ranks`` does.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from matroots.study import forkserver

# imported once in the forkserver; each rank is a fork of it (see the module docstring)
PRELOAD = ["torch", "torch.distributed", "matroots", "shampoo", "_dist"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(
    rank: int, fn: Any, world_size: int, port: int, outdir: str, pg_timeout: float, args: tuple
) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=pg_timeout),
    )
    out = Path(outdir)
    try:
        result = fn(rank, world_size, *args)
        torch.save({"ok": True, "result": result}, out / f"rank{rank}.pt")
    except BaseException as err:  # report any failure of the test body to the parent
        torch.save({"ok": False, "error": repr(err), "tb": traceback.format_exc()}, out / f"rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # The result is on disk. Leave without running interpreter/C++ static teardown: gloo's background
    # threads can abort there ("terminate called without an active exception", SIGABRT) after the test
    # body has finished, which made the parent see a crashed rank with a complete result.
    os._exit(0)


def run_ranks(fn: Any, world_size: int, *args: Any, timeout: float = 120.0, pg_timeout: float = 60.0) -> list:
    """``[fn(0, ws, *args), ..., fn(ws-1, ws, *args)]`` computed on ``world_size`` gloo ranks.

    Raises AssertionError with the failing rank's traceback if a rank raised, or if the run took
    longer than ``timeout`` seconds.
    """
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(
            _entry,
            args=(fn, world_size, free_port(), tmp, pg_timeout, args),
            nprocs=world_size,
            join=False,
            start_method=forkserver.start_method(PRELOAD),
        )
        deadline = timeout
        t0 = time.monotonic()
        while not ctx.join(timeout=max(0.1, deadline - (time.monotonic() - t0))):
            if time.monotonic() - t0 > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise AssertionError(f"distributed test did not finish within {timeout} s")
        results = []
        for r in range(world_size):
            path = Path(tmp) / f"rank{r}.pt"
            if not path.exists():
                raise AssertionError(f"rank {r} wrote no result")
            rec = torch.load(path, weights_only=False)
            if not rec["ok"]:
                raise AssertionError(f"rank {r} raised {rec['error']}\n{rec['tb']}")
            results.append(rec["result"])
        return results
