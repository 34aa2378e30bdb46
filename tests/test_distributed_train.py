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
