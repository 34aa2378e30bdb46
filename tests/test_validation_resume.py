"""A validation run killed with SIGKILL mid-grid and resumed has exactly the rows of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pandas as pd
from _tiny_validation import tiny_config, tiny_protocol

from matroots.study import runner
from matroots.study.validation import config, peers, run

ROOT = Path(__file__).resolve().parents[1]
TIMING = set(run.TIMING_COLUMNS) | {"versions", "machine"}


def _deterministic(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    cols = sorted(c for c in df.columns if c not in TIMING)
    return df[cols].sort_values(keys, kind="stable").reset_index(drop=True)


def test_sigkill_mid_grid_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    text = tiny_config(["digits"], steps=20, eval_every=5, seeds="[0, 1]", freq=5, name="resume")
    cfg = tmp_path / "resume.toml"
    cfg.write_text(text)
    grid = config.from_dict(tomllib.loads(text))
    total = len(grid.units())
    assert total == 8

    killed = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "matroots.study.validation",
        str(cfg),
        "--out",
        str(killed),
        "--workers",
        "2",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*cmd, "--no-progress"], cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    n_done = 0
    while time.monotonic() < deadline and proc.poll() is None:
        n_done = len(runner.done_units(killed))
        if n_done >= 2:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the runner and its worker processes, mid-grid
    proc.wait(timeout=30)
    n_killed = len(runner.done_units(killed))
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    assert 2 <= n_killed < total, f"the kill must land mid-grid ({n_killed} of {total} units done)"

    res = subprocess.run(
        [*cmd, "--resume", "--no-progress"], cwd=ROOT, env=env, capture_output=True, timeout=600
    )
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    resumed = run.load(killed)
    prov = runner.read_provenance(killed)
    assert [r["event"] for r in prov["runs"]] == ["start", "resume"]
    assert prov["runs"][-1]["stats"]["skipped"] == n_killed

    clean = run.run_validation(grid, tmp_path / "clean", workers=2, progress=False)
    for name, keys in (
        ("runs", ["unit"]),
        ("curves", ["unit", "step"]),
        ("roots", ["unit", "step", "param", "block", "dim"]),
    ):
        a, b = _deterministic(resumed[name], keys), _deterministic(clean[name], keys)
        assert len(a) == len(b) and not a.duplicated(keys).any(), name
        pd.testing.assert_frame_equal(a, b, check_like=True, obj=name)
    assert set(resumed["runs"]["unit"]) == {u.key for u in grid.units()}
    assert not list((killed / runner.PARTS).glob(".tmp-*"))


def test_protocol_run_killed_mid_tuning_then_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    """The protocol's two phases through the runner: the kill lands among the tuning trials; the resume
    finishes them, selects on the validation split and runs the chosen points at the final seeds."""
    text = tiny_protocol(trials=2, steps=10, eval_every=5, name="presume")
    cfg = tmp_path / "presume.toml"
    cfg.write_text(text)
    grid = config.from_dict(tomllib.loads(text))
    first = len(grid.units())
    total = first + grid.final_unit_count()
    killed = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "matroots.study.validation",
        str(cfg),
        "--out",
        str(killed),
        "--workers",
        "2",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*cmd, "--no-progress"], cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if len(runner.done_units(killed)) >= 2:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    n_killed = len(runner.done_units(killed))
    assert 2 <= n_killed < first, f"the kill must land among the tuning trials ({n_killed} of {first})"
    res = subprocess.run(
        [*cmd, "--resume", "--no-progress"], cwd=ROOT, env=env, capture_output=True, timeout=600
    )
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    resumed = run.load(killed)
    clean = run.run_validation(grid, tmp_path / "clean", workers=2, progress=False)
    absent = 0 if peers.available("heavyball_soap") else 2  # an absent peer has no chosen point
    assert len(clean["runs"]) == total - absent
    for name, keys in (("runs", ["unit"]), ("curves", ["unit", "step"])):
        a, b = _deterministic(resumed[name], keys), _deterministic(clean[name], keys)
        pd.testing.assert_frame_equal(a, b, check_like=True, obj=name)
