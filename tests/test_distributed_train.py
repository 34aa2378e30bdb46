"""experiments/train.py: the same command line in one process and under torchrun (2 ranks, gloo)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

pytest.importorskip("sklearn")

import train  # noqa: E402

ARGS = ["--task", "digits", "--steps", "20", "--log-every", "20", "--threads", "1"]


def test_torchrun_matches_single_process_and_checkpoint_moves_to_one_rank(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*cmd, str(ROOT / "experiments" / "train.py"), *ARGS, "--save", str(ckpt)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = re.findall(r"step\s+20\s+loss\s+([0-9.]+)", proc.stdout + proc.stderr)
    assert losses, proc.stderr[-3000:]
    single = train.main(ARGS)
    assert abs(float(losses[-1]) - single) < 1e-3, (losses, single)
    # The 2-rank checkpoint continues in one process like an uninterrupted single-process run.
    resumed = train.main([*ARGS[:2], "--steps", "5", "--threads", "1", "--resume", str(ckpt)])
    straight = train.main([*ARGS[:2], "--steps", "25", "--threads", "1"])
    assert abs(resumed - straight) < 1e-3, (resumed, straight)


LAUNCHES = 3


def test_torchrun_exits_cleanly_on_every_launch():
    """Issue 29: in 1 launch of 5, rank 1 aborted at exit after training had finished (SIGABRT,
    "terminate called without an active exception": gloo's threads torn down during C++ static
    destruction) and torchrun exited 1. train.py now tears the process group down in order
    (``shutdown_distributed``); every one of several short launches must exit 0 with no abort."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    args = ["--task", "digits", "--steps", "2", "--log-every", "2", "--threads", "1"]
    for launch in range(LAUNCHES):
        proc = subprocess.run(
            [*cmd, str(ROOT / "experiments" / "train.py"), *args],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
            cwd=ROOT,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, (launch, out[-3000:])
        assert "terminate called" not in out and "SIGABRT" not in out, (launch, out[-3000:])
