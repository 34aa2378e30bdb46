"""The runners under outside faults: workers SIGKILLed from outside, Ctrl-C, and resume.

* A crash counts against a unit only when the unit kills a fresh worker of its own, and a resume
  retries the units recorded as ``WorkerCrashed`` (unless told not to): a real ``matroots tune`` whose
  worker is SIGKILLed from outside until its unit is recorded, then resumed, ends with the rows of an
  uninterrupted run; until then its selection table says which cells miss cases.
* Ctrl-C (SIGINT to the process group, as a terminal sends it) stops a sweep, a tune and a validation
  run promptly, keeps the finished parts, and the resume gives the uninterrupted run's rows.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from _tiny_sweep import TINY, drop_timing
from _tiny_validation import tiny_config

from matroots.study import grid, runner, sweep
from matroots.study.tuning import run as tune_run
from matroots.study.tuning import spec as tune_spec
from matroots.study.validation import config as vconfig

ROOT = Path(__file__).resolve().parents[1]

#: Liveness bound for a Ctrl-C: generous for a loaded 2-core machine (the runner terminates its
#: workers at once; the bound covers interpreter and pool teardown), not a performance claim.
SIGINT_BOUND_S = 10.0

TUNE = """
name = "tune_faults"
device = "cpu"
targets = [1e-2, 1e-8]
n_bands = [6, 12]
kappa_bands = [1, 1e2]
workers = 2
[defaults]
dtypes = ["fp64"]
p = [2]
seeds = [0, 1]
reference_backend = "mpmath"
[[candidates]]
name = "eigh"
[[candidates]]
name = "coupled_newton"
options = { scaling = ["frobenius"] }
[[sweeps]]
name = "spd"
families = ["randsvd"]
n = [8]
kappa = [10.0]
"""


@dataclass(frozen=True)
class _Toy:
    key: str
    x: int


def _job(unit: _Toy) -> list[dict[str, int]]:
    return [{"x": unit.x, "k": k} for k in range(2)]


def _crashing_job(unit: _Toy) -> list[dict[str, int]]:
    if unit.x == 1:
        os._exit(3)  # this unit kills every worker it runs in
    return _job(unit)


def test_resume_retries_units_recorded_as_crashed_unless_told_not_to(tmp_path: Path) -> None:
    units = [_Toy(key=f"u{i}", x=i) for i in range(3)]
    out = runner.open_run(tmp_path / "toy", kind="toy", config={}, config_hash="h", resume=False)
    stats = runner.run_units(units, _crashing_job, out, workers=2, progress=False)
    assert stats.crashed == 1 and runner.crashed_parts(out) == ["u1"]
    kept = runner.run_units(units, _job, out, workers=1, progress=False, retry_crashed=False)
    assert kept.ran == 0 and runner.crashed_parts(out) == ["u1"]
    again = runner.run_units(units, _job, out, workers=1, progress=False)
    assert again.retried_crashed == 1 and again.ran == 1 and runner.crashed_parts(out) == []
    df = runner.read_parts(out, order=("x", "k"))
    assert list(zip(df["x"], df["k"], strict=True)) == [(i, k) for i in range(3) for k in range(2)]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def _workers_of(pid: int) -> list[int]:
    """Pool worker processes of ``pid``: the children of its multiprocessing forkserver (the runner's
    pool context), or its spawn children; not the forkserver itself, nor the resource tracker."""
    procs: dict[int, tuple[int, bytes]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                procs[int(d.name)] = (ppid, (d / "cmdline").read_bytes())
    servers = {q for q, (pp, cmd) in procs.items() if pp == pid and b"forkserver" in cmd}
    return [
        q for q, (pp, cmd) in procs.items()
        if pp in servers or (pp == pid and b"spawn_main" in cmd)
    ]  # fmt: skip


def test_outside_kills_charge_nobody_and_resume_recomputes(tmp_path: Path) -> None:
    cfg = tmp_path / "tune.toml"
    cfg.write_text(TUNE)
    ts = tune_spec.from_dict(tomllib.loads(TUNE))
    keys = [u.key for u in grid.units(ts.sweeps[0])]
    victim = keys[0]
    env = _env(MATROOTS_CACHE_DIR=str(tmp_path / "cache"), MATROOTS_SWEEP_HOLD_DIR=str(tmp_path / "hold"))
    (tmp_path / "hold").mkdir()
    (tmp_path / "hold" / victim).touch()  # the victim's unit waits, so the kills land while it runs
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "matroots.cli", "tune", str(cfg), "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = out / "sweeps" / ts.sweeps[0].name / ".started" / victim
    kills, last = 0, 0.0
    deadline = time.monotonic() + 400
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            started = marker.stat().st_mtime if marker.exists() else 0.0
            if started > last:  # the victim is running in a (fresh) worker: kill -9 it from outside
                time.sleep(0.2)
                for w in _workers_of(proc.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w, signal.SIGKILL)
                kills += 1
                last = time.time()
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    # One kill of the batch (charges nobody) + MAX_CRASHES kills of its solo retries: recorded.
    assert kills == 1 + runner.MAX_CRASHES, kills
    rows = tune_run.load_rows(ts, out)
    assert set(rows.loc[rows["unit"] == victim, "failure"]) == {"WorkerCrashed"}
    # Never silent: a warning, the summary, and the column (1 of the cell's 2 cases missing).
    assert "fewer cases than the config asks for" in stderr and "WARNING" in stdout
    tab = pd.read_csv(out / "selection.csv")
    assert (tab["missing_cases"] == 1).all() and (tab["cases"] == 1).all()
    assert tab["reason"].str.contains("built from 1 of 2 cases").all()
    # --resume retries the crashed unit: every row of an uninterrupted run, a complete table.
    (tmp_path / "hold" / victim).unlink()
    res = subprocess.run([*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    tab = pd.read_csv(out / "selection.csv")
    assert (tab["missing_cases"] == 0).all() and (tab["cases"] == 2).all()
    os.environ["MATROOTS_CACHE_DIR"] = env["MATROOTS_CACHE_DIR"]
    try:
        tune_run.run_tune(ts, tmp_path / "straight", workers=2, progress=False)
    finally:
        os.environ.pop("MATROOTS_CACHE_DIR")
    order = ["unit", "dtype", "solver"]
    a = drop_timing(tune_run.load_rows(ts, out)).sort_values(order).reset_index(drop=True)
    b = drop_timing(tune_run.load_rows(ts, tmp_path / "straight")).sort_values(order).reset_index(drop=True)
    pd.testing.assert_frame_equal(a.drop(columns="versions"), b.drop(columns="versions"))


# --- Ctrl-C ------------------------------------------------------------------------------------------


#: ``python -m matroots.cli ARGS`` as a terminal starts it: with SIGINT raising KeyboardInterrupt. A
#: process started from one whose SIGINT is ignored inherits SIG_IGN across exec (a pytest-xdist
#: worker, a background job `cmd &`, a CI runner), and Python then leaves it ignored: the Ctrl-C these
#: tests send would do nothing. The CLI rightly keeps an inherited SIG_IGN (nohup'd runs must survive
#: it), so the launcher, not the library, restores what a terminal gives.
_AS_FROM_A_TERMINAL = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from matroots.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _interrupt(cmd: list[str], env: dict[str, str], out: Path, hold: Path, keys: list[str]) -> float:
    """Start ``cmd`` (``python -m matroots.cli ...``) with every unit but the first held; once the first
    part exists, send SIGINT to the process group (as a terminal's Ctrl-C does); return the seconds
    from SIGINT to exit."""
    assert cmd[1:3] == ["-m", "matroots.cli"], cmd
    cmd = [cmd[0], "-c", _AS_FROM_A_TERMINAL, *cmd[3:]]
    for k in keys[1:]:
        (hold / k).touch()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 300
        while not runner.done_units(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        time.sleep(0.5)  # the held units are now running in the workers
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=120)
        finally:
            elapsed = time.monotonic() - t0
        err = proc.stderr.read().decode() if proc.stderr else ""
    finally:
        for k in keys:
            (hold / k).unlink(missing_ok=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    # the measurement behind the issue 29 closing note: `pytest -s -p no:xdist -k sigint` prints it
    print(f"SIGINT to exit: {elapsed:.2f} s ({cmd[3]}, load average {os.getloadavg()[0]:.1f})")
    assert proc.returncode == 130, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in err, err[-3000:]
    assert elapsed < SIGINT_BOUND_S, f"exited {elapsed:.1f} s after SIGINT"
    assert runner.done_units(out) == {keys[0]}  # finished work kept, the held units left no part
    assert not list((out / "parts").glob(".tmp-*"))
    # Nothing of the run is left computing: its whole process group is gone (the pool's resource
    # tracker may need a moment to notice its parent is gone).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("processes of the interrupted run are still alive")
    return elapsed


def test_sigint_stops_a_sweep_promptly_and_resume_is_identical(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    spec = grid.load_config(cfg)
    hold = tmp_path / "hold"
    hold.mkdir()
    env = _env(MATROOTS_CACHE_DIR=str(tmp_path / "cache"), MATROOTS_SWEEP_HOLD_DIR=str(hold))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "matroots.cli", "sweep", str(cfg), "--out", str(out), "--workers", "2"]
    _interrupt([*cmd, "--no-progress"], env, out, hold, [u.key for u in grid.units(spec)])
    res = subprocess.run(
        [*cmd, "--no-progress", "--resume"], cwd=ROOT, env=env, capture_output=True, timeout=300
    )
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    os.environ["MATROOTS_CACHE_DIR"] = env["MATROOTS_CACHE_DIR"]
    try:
        ref = sweep.run_sweep(spec, tmp_path / "ref", workers=2, progress=False)
    finally:
        os.environ.pop("MATROOTS_CACHE_DIR")
    pd.testing.assert_frame_equal(drop_timing(sweep.load(out)), drop_timing(ref))


def test_sigint_stops_tune_and_validate_promptly(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    env = _env(MATROOTS_CACHE_DIR=str(tmp_path / "cache"), MATROOTS_SWEEP_HOLD_DIR=str(hold))
    cfg = tmp_path / "tune.toml"
    cfg.write_text(TUNE)
    ts = tune_spec.from_dict(tomllib.loads(TUNE))
    out = tmp_path / "tune"
    cmd = [sys.executable, "-m", "matroots.cli", "tune", str(cfg), "--out", str(out), "--no-progress"]
    _interrupt(cmd, env, out / "sweeps" / ts.sweeps[0].name, hold, [u.key for u in grid.units(ts.sweeps[0])])
    text = tiny_config(["digits"], name="sigint")
    vcfg = tmp_path / "v.toml"
    vcfg.write_text(text)
    keys = [u.key for u in vconfig.from_dict(tomllib.loads(text)).units()]
    out = tmp_path / "val"
    cmd = [sys.executable, "-m", "matroots.cli", "validate", str(vcfg), "--out", str(out), "--workers", "2"]
    _interrupt([*cmd, "--no-progress"], env, out, hold, keys)


def test_exit_after_interrupt_runs_atexit_handlers_and_skips_finalisation(tmp_path: Path) -> None:
    """An interrupted command ends without the interpreter's finalisation (the seconds between the
    "interrupted" line and the exit under load were the collection of every module's objects): the
    atexit handlers still run and the output is flushed, but no object is finalised."""
    code = (
        "import atexit, sys\n"
        "from matroots.study.runner import exit_after_interrupt\n"
        "class Finalised:\n"
        "    def __del__(self):\n"
        "        print('finalised', flush=True)\n"
        "keep = Finalised()\n"
        "atexit.register(print, 'atexit ran')\n"
        "print('interrupted', file=sys.stderr, end='')\n"
        "sys.stdout.write('unflushed')\n"
        "exit_after_interrupt(130)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, timeout=120)
    assert res.returncode == 130
    assert res.stdout.decode().split() == ["unflushedatexit", "ran"]
    assert res.stderr.decode() == "interrupted"


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_stopped_pool_has_released_its_queues_before_stop_pool_returns() -> None:
    """After Ctrl-C the CLI leaves with os._exit: the pool's manager thread must have finished tearing
    down its queues by then (else the resource tracker reports a leaked semaphore on the terminal,
    as CI saw). _stop_pool terminates running units and waits for that thread."""
    import concurrent.futures as cf
    import multiprocessing as mp

    pool = cf.ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context("spawn"))
    futs = [pool.submit(_sleep, 30.0) for _ in range(4)]
    deadline = time.monotonic() + 120
    while not any(f.running() for f in futs) and time.monotonic() < deadline:
        time.sleep(0.05)
    manager = pool._executor_manager_thread
    assert manager is not None and manager.is_alive()
    t0 = time.monotonic()
    runner._stop_pool(pool)
    assert time.monotonic() - t0 < runner.MANAGER_JOIN_SECONDS + 3.0  # terminated, not waited for
    assert not manager.is_alive()
    assert all(f.done() for f in futs)


# --- a dask scheduler that dies mid-run ------------------------------------------------------------


def test_dask_scheduler_killed_mid_run_is_one_line_and_resume_is_identical(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    addr = f"tcp://127.0.0.1:{port}"
    hold = tmp_path / "hold"
    hold.mkdir()
    env = _env(MATROOTS_CACHE_DIR=str(tmp_path / "cache"), MATROOTS_SWEEP_HOLD_DIR=str(hold))
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    spec = grid.load_config(cfg)
    keys = [u.key for u in grid.units(spec)]
    for k in keys[1:]:
        (hold / k).touch()
    quiet = {"cwd": tmp_path, "env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    pym = [sys.executable, "-m"]
    sched = subprocess.Popen(
        [*pym, "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--dashboard-address", ":0"], **quiet,
    )  # fmt: skip
    work = subprocess.Popen([*pym, "distributed.cli.dask_worker", addr, "--nthreads", "1"], **quiet)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "matroots.cli", "sweep", str(cfg), "--out", str(out), "--no-progress"]
    try:
        proc = subprocess.Popen(
            [*cmd, "--scheduler", addr], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while not runner.done_units(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        sched.kill()  # the scheduler dies while the other units are running
        _, err = proc.communicate(timeout=200)
    finally:
        for p in (sched, work):
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        for k in keys:
            (hold / k).unlink(missing_ok=True)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, err[-3000:]
    assert "lost the dask scheduler" in lines[0] and "--resume" in lines[0]
    assert runner.done_units(out) == {keys[0]}
    # Resumed on the local pool: the rows of an uninterrupted run.
    res = subprocess.run([*cmd, "--resume"], cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    os.environ["MATROOTS_CACHE_DIR"] = env["MATROOTS_CACHE_DIR"]
    try:
        ref = sweep.run_sweep(spec, tmp_path / "ref", workers=2, progress=False)
    finally:
        os.environ.pop("MATROOTS_CACHE_DIR")
    pd.testing.assert_frame_equal(drop_timing(sweep.load(out)), drop_timing(ref))
