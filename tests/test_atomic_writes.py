"""Files users resume from are written atomically; a full disk is one line and leaves nothing
half-written; a trainer killed mid-save keeps its previous checkpoint.

The full disk is an ``ENOSPC`` injected at the OS boundary (``os.write`` of the atomic writer, in the
parent process or inside a pool worker), so no test needs a real small file system or root.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
from _tiny_sweep import TINY, drop_timing

from matroots import cli
from matroots.study import atomic, grid, runner, sweep

ROOT = Path(__file__).resolve().parents[1]
KEY = ["unit", "dtype", "solver"]


def _leftovers(folder: Path) -> list[Path]:
    """Half-written files: temp files, or empty files where a write started."""
    return [
        p for p in folder.rglob("*") if p.is_file() and (p.name.startswith(".tmp-") or p.stat().st_size == 0)
    ]


def _full_disk(monkeypatch: pytest.MonkeyPatch, when=lambda fd: True) -> list[int]:
    """Make the atomic writer's os.write fail with ENOSPC (for the file descriptors ``when`` accepts)."""
    real = os.write
    calls: list[int] = []

    def write(fd: int, data) -> int:
        if when(fd):
            calls.append(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(atomic.os, "write", write)
    return calls


def _target_is(name: str):
    return lambda fd: os.readlink(f"/proc/self/fd/{fd}").rsplit("/", 1)[-1].startswith(f".tmp-{name}")


def test_enospc_keeps_previous_file_and_names_folder_and_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state.json"
    atomic.write_json(target, {"v": 1})
    before = target.read_bytes()
    _full_disk(monkeypatch)
    with pytest.raises(atomic.DiskFullError) as err:
        atomic.write_bytes(target, b"x" * 5000)
    msg = str(err.value)
    assert str(tmp_path) in msg and "4.9 KiB" in msg and "--resume" in msg and "\n" not in msg
    assert target.read_bytes() == before
    assert _leftovers(tmp_path) == []


# --- a sweep on a full disk ------------------------------------------------------------------------


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    return cfg


def test_sweep_and_report_on_a_full_disk_are_one_line_and_resume_identically(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = grid.load_config(tiny)
    ref = drop_timing(sweep.run_sweep(spec, tmp_path / "ref", workers=2, progress=False))
    out = tmp_path / "run"
    argv = ["sweep", str(tiny), "--out", str(out), "--workers", "2", "--no-progress"]
    # The parts are written (by the workers), then the disk is full for results.parquet.
    with monkeypatch.context() as m:
        calls = _full_disk(m, _target_is("results.parquet"))
        rc = cli.main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert calls and rc == 2 and len(err) == 1, err
    assert "no space left" in err[0] and str(out) in err[0] and "free" in err[0]
    assert _leftovers(out) == [] and not (out / "results.parquet").exists()
    assert len(sweep.done_units(out)) == len(grid.units(spec))
    # Space freed: resume gives the uninterrupted run's rows.
    assert cli.main([*argv, "--resume"]) == 0
    pd.testing.assert_frame_equal(drop_timing(pd.read_parquet(out / "results.parquet")), ref)
    # `matroots report` on a full disk: one line, no 0-byte report.txt.
    with monkeypatch.context() as m:
        _full_disk(m)
        rc = cli.main(["report", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and "no space left" in err[0], err
    assert not (out / "report.txt").exists() and _leftovers(out) == []


@dataclass(frozen=True)
class _Toy:
    key: str
    x: int


def _toy_job(unit: _Toy) -> list[dict[str, int]]:
    return [{"x": unit.x, "k": k, "y": unit.x * k} for k in range(3)]


def _disk_fills_at(full_from: int, unit: _Toy) -> list[dict[str, int]]:
    """In the pool worker: from unit ``full_from`` on, the worker's part write finds the disk full."""
    if unit.x >= full_from:
        real = os.write

        def write(fd: int, data) -> int:
            if "/parts/.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        atomic.os.write = write
    return _toy_job(unit)


def test_full_disk_inside_a_worker_stops_the_run_and_resume_loses_nothing(tmp_path: Path) -> None:
    units = [_Toy(key=f"u{i}", x=i) for i in range(6)]
    out = runner.open_run(tmp_path / "toy", kind="toy", config={}, config_hash="h", resume=False)
    with pytest.raises(atomic.DiskFullError, match="no space left"):
        runner.run_units(units, functools.partial(_disk_fills_at, 3), out, workers=1, progress=False)
    assert sweep.done_units(out) == {"u0", "u1", "u2"}
    assert _leftovers(out / "parts") == []
    runner.run_units(units, _toy_job, out, workers=2, progress=False)
    df = runner.read_parts(out, order=("x", "k"))
    assert list(zip(df["x"], df["k"], df["y"], strict=True)) == [
        (i, k, i * k) for i in range(6) for k in range(3)
    ]


# --- experiments/train.py: killed while saving -------------------------------------------------------


pytest.importorskip("sklearn")

TRAIN = [sys.executable, str(ROOT / "experiments" / "train.py"), "--task", "digits", "--threads", "1"]
TRAIN += ["--precondition-frequency", "2", "--log-every", "100"]  # root rounds within the few steps


def _train(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TRAIN, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env or _env()
    )


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def test_trainer_killed_mid_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "ck.pt"
    assert _train("--steps", "3", "--save", str(ck)).returncode == 0
    first = ck.read_bytes()
    hold = tmp_path / "hold"
    hold.touch()  # the next save pauses half-way while this file exists
    proc = subprocess.Popen(
        [*TRAIN, "--steps", "3", "--resume", str(ck), "--save", str(ck)],
        cwd=ROOT, env=_env(MATROOTS_WRITE_HOLD=str(hold)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    writing = tmp_path / "hold.writing"
    deadline = time.monotonic() + 240
    while not writing.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert writing.exists(), "the save never started"
    os.kill(proc.pid, signal.SIGKILL)  # kill -9 of the trainer in the middle of writing the checkpoint
    proc.wait(timeout=30)
    hold.unlink()
    assert ck.read_bytes() == first  # the previous checkpoint is intact
    assert [p.name for p in tmp_path.glob(".tmp-ck.pt.*")]  # the half-written temp file, beside it
    # Resuming works and matches an uninterrupted 6-step run; the stale temp file is cleared.
    assert _train("--steps", "3", "--resume", str(ck), "--save", str(ck)).returncode == 0
    assert not list(tmp_path.glob(".tmp-*"))
    straight = tmp_path / "straight.pt"
    assert _train("--steps", "6", "--save", str(straight)).returncode == 0
    a, b = torch.load(ck, weights_only=False), torch.load(straight, weights_only=False)
    assert a["step"] == b["step"] == 6
    # Bitwise: the same operations on the same inputs in one thread (the resume restores every tensor).
    for k, v in b["model"].items():
        assert torch.equal(a["model"][k], v), k


def test_bad_resume_file_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    res = _train("--steps", "1", "--resume", str(empty))
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "not a readable checkpoint" in lines[0], res.stderr
    shutil.rmtree(tmp_path, ignore_errors=True)
