"""The study's units run on one thread: torch's pool and numpy's/scipy's BLAS pools (matroots.study.threads).

Each check runs in a fresh interpreter whose BLAS pools start at 2 threads (OPENBLAS_NUM_THREADS=2, set
explicitly: the suite's own workers pass 1 to the processes they start), runs one real unit the way a
worker does, and reads the pools back with threadpoolctl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys, tomllib
sys.path.insert(0, {tests!r})
import numpy, scipy.linalg, torch
from threadpoolctl import threadpool_info
def pools():
    return {{"torch": torch.get_num_threads(),
             "blas": sorted({{i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}})}}
before = pools()
{run}
print(json.dumps({{"before": before, "after": pools()}}))
"""

SWEEP = """
from _tiny_sweep import TINY
from matroots.study import grid, sweep
g = grid.from_dict(tomllib.loads(TINY))
sweep.run_unit(g, grid.units(g)[0])
"""

VALIDATION = """
from _tiny_validation import tiny_config
from matroots.study.validation import config, training
g = config.from_dict(tomllib.loads(tiny_config(["digits"], steps=2, freq=2)))
training.run_unit(g.units()[-1])
"""


def _pools_around(run: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env |= {"OPENBLAS_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    code = PROBE.format(tests=str(ROOT / "tests"), run=textwrap.dedent(run))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("run", [SWEEP, VALIDATION], ids=["sweep_unit", "validation_unit"])
def test_a_unit_runs_torch_and_the_blas_pools_on_one_thread(run: str) -> None:
    got = _pools_around(run)
    assert got["before"]["blas"] and max(got["before"]["blas"]) == 2, got  # the probe starts at 2
    assert got["after"] == {"torch": 1, "blas": [1]}, got


def test_one_thread_limits_the_pools_of_a_forked_worker_again() -> None:
    got = _pools_around(
        """
        import os
        from matroots.study.threads import one_thread
        one_thread()
        r, w = os.pipe()
        if os.fork() == 0:
            from threadpoolctl import threadpool_limits
            threadpool_limits(limits=2, user_api="blas")  # a child whose pools were changed after the fork
            one_thread()
            n = {i["num_threads"] for i in __import__("threadpoolctl").threadpool_info() if i["user_api"] == "blas"}
            os.write(w, json.dumps(sorted(n)).encode()); os._exit(0)
        os.wait()
        child = json.loads(os.read(r, 100))
        assert child == [1], child
        """
    )
    assert got["after"]["blas"] == [1], got
