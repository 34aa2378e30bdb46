"""The unit runner under the sweep: leftover temp files, corrupted parts, permissions, provenance on
resume, the generic API with a crashing unit, and the dask scheduler (equal rows; client killed and
resumed)."""

from __future__ import annotations

import contextlib
import json
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
from _tiny_sweep import TINY, drop_timing

from matroots.study import grid, runner, sweep

KEY = ["unit", "dtype", "solver"]


@pytest.fixture(scope="module")
def _module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("runner")
    (d / "tiny.toml").write_text(TINY)
    return d


@pytest.fixture
def tiny(_module_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> grid.GridSpec:
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(_module_dir / "cache"))
    shutil.copy(_module_dir / "tiny.toml", tmp_path / "tiny.toml")
    return grid.load_config(tmp_path / "tiny.toml")


@pytest.fixture(scope="module")
def _reference_run(_module_dir: Path) -> Path:
    """The tiny sweep run once, uninterrupted, on the local pool (shared by the tests of this module)."""
    old = os.environ.get("MATROOTS_CACHE_DIR")
    os.environ["MATROOTS_CACHE_DIR"] = str(_module_dir / "cache")
    try:
        sweep.run_sweep(
            grid.load_config(_module_dir / "tiny.toml"), _module_dir / "ref", workers=2, progress=False
        )
    finally:
        if old is None:
            os.environ.pop("MATROOTS_CACHE_DIR", None)
        else:
            os.environ["MATROOTS_CACHE_DIR"] = old
    return _module_dir / "ref"


@pytest.fixture
def reference_rows(_reference_run: Path, tmp_path: Path) -> pd.DataFrame:
    shutil.copytree(_reference_run, tmp_path / "ref")
    return drop_timing(sweep.load(_reference_run))


def _same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert not b.duplicated(KEY).any()
    pd.testing.assert_frame_equal(drop_timing(a), drop_timing(b))


def test_leftover_temp_file_is_ignored_and_cleaned(
    tiny: grid.GridSpec, tmp_path: Path, reference_rows: pd.DataFrame
) -> None:
    out = tmp_path / "run"
    shutil.copytree(tmp_path / "ref", out)
    parts = sorted((out / "parts").glob("*.parquet"))
    # a kill -9 between the temp write and the rename: the unit's temp file exists, its part does not
    victim = parts[0]
    os.replace(victim, out / "parts" / ".tmp-k1ll3d.parquet")
    (out / "parts" / ".tmp-empty.parquet").write_bytes(b"")  # killed mid-write
    assert sweep.done_units(out) == {p.stem for p in parts[1:]}
    assert len(sweep.load(out)) == len(reference_rows) - len(pd.read_parquet(parts[1]))  # no duplicate rows
    df = sweep.run_sweep(tiny, out, workers=2, resume=True, progress=False)
    _same_rows(reference_rows, df)
    assert not list((out / "parts").glob(".tmp-*"))
    assert runner.read_provenance(out)["runs"][-1]["stats"]["removed_temp"] == 2


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupted_part_is_recomputed(
    tiny: grid.GridSpec, tmp_path: Path, reference_rows: pd.DataFrame, damage: str
) -> None:
    out = tmp_path / "run"
    shutil.copytree(tmp_path / "ref", out)
    part = sorted((out / "parts").glob("*.parquet"))[1]
    data = part.read_bytes()
    part.write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": b"PAR1" + b"\0" * 64, "empty": b""}[damage]
    )
    with pytest.raises(runner.CorruptPartError, match="--resume"):
        sweep.load(out)
    df = sweep.run_sweep(tiny, out, workers=1, resume=True, progress=False)
    _same_rows(reference_rows, df)
    assert len(list((out / "quarantine").iterdir())) == 1
    assert runner.read_provenance(out)["runs"][-1]["stats"]["recomputed_corrupt"] == 1


def test_files_get_normal_permissions(tiny: grid.GridSpec, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        out = tmp_path / "run"
        sweep.run_sweep(tiny, out, workers=1, progress=False)
    finally:
        os.umask(old)
    files = [*(out / "parts").glob("*.parquet"), out / "results.parquet", out / "provenance.json"]
    assert len(files) == len(grid.units(tiny)) + 2
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o644, f


def test_provenance_records_start_and_appends_resume(tiny: grid.GridSpec, tmp_path: Path) -> None:
    out = tmp_path / "run"
    sweep.run_sweep(tiny, out, workers=1, progress=False)
    first = runner.read_provenance(out)
    assert first["config_hash"] == tiny.config_hash() and first["kind"] == "sweep"
    (start,) = first["runs"]
    assert start["event"] == "start" and start["finished"] >= start["started"]
    assert len(start["git"]["commit"]) == 40  # the tests run from a git checkout
    assert start["command"] and start["versions"]["matroots"]
    assert start["stats"]["ran"] == len(grid.units(tiny))
    sweep.run_sweep(tiny, out, workers=1, resume=True, progress=False)
    second = runner.read_provenance(out)
    assert second["created"] == first["created"]
    assert second["runs"][0] == start  # the original record is kept as it was
    assert second["runs"][1]["event"] == "resume"
    assert second["runs"][1]["stats"]["skipped"] == len(grid.units(tiny))


@dataclass(frozen=True)
class _Toy:
    key: str
    x: int


def _toy_job(unit: _Toy) -> list[dict[str, int]]:
    if unit.x < 0:
        os._exit(3)  # this unit always kills its worker
    return [{"x": unit.x, "k": k, "y": unit.x * k} for k in range(3)]


def test_generic_units_with_a_crashing_unit(tmp_path: Path) -> None:
    units = [_Toy(key=f"u{i}", x=i) for i in range(5)] + [_Toy(key="bad", x=-1)]
    out = runner.open_run(tmp_path / "toy", kind="toy", config={"n": 6}, config_hash="h", resume=False)
    stats = runner.run_units(units, _toy_job, out, workers=2, progress=False)
    assert stats.crashed == 1 and stats.ran == 6
    df = runner.read_parts(out, order=("unit", "k"))
    crashed = df[df["unit"] == "bad"]
    assert list(crashed["failure"]) == ["WorkerCrashed"]
    ok = df[df["unit"] != "bad"]
    assert sorted(zip(ok["x"], ok["k"], ok["y"], strict=True)) == [
        (i, k, i * k) for i in range(5) for k in range(3)
    ]
    with pytest.raises(ValueError, match="file-safe"):
        runner.run_units([_Toy(key="../x", x=1)], _toy_job, out, progress=False)
    with pytest.raises(runner.RunFolderError, match="another config"):
        runner.open_run(out, kind="toy", config={}, config_hash="other", resume=True)


def _env_job(unit: _Toy) -> list[dict[str, object]]:
    value = os.environ.get("MATROOTS_TEST_RUNNER_ENV", "unset")
    return [{"x": unit.x, "value": value, "pid": os.getpid(), "ppid": os.getppid()}]


def test_workers_see_the_environment_of_each_run_and_start_without_reimporting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's workers are forked from a forkserver that this process started at its first run; a
    variable set after that is still seen by the next run's workers (as by spawned ones), and one
    removed is gone. Where the platform has a forkserver, the workers are its children (forked from
    one server with torch imported), not spawned children of this process."""
    units = [_Toy(key=f"u{i}", x=i) for i in range(3)]
    values, parents = [], []
    for i, value in enumerate(["first", "second", None]):
        if value is None:
            monkeypatch.delenv("MATROOTS_TEST_RUNNER_ENV")
        else:
            monkeypatch.setenv("MATROOTS_TEST_RUNNER_ENV", value)
        out = runner.open_run(tmp_path / f"env{i}", kind="toy", config={}, config_hash="h", resume=False)
        runner.run_units(units, _env_job, out, workers=2, progress=False)
        df = runner.read_parts(out)
        assert len(df) == 3 and (df["pid"] != os.getpid()).all()  # computed in worker processes
        values.append(set(df["value"]))
        parents.append(set(df["ppid"]))
    assert values == [{"first"}, {"second"}, {"unset"}]
    if runner._pool_context(_env_job).get_start_method() == "forkserver":
        assert len(set.union(*parents)) == 1 and os.getpid() not in set.union(*parents)  # one server


def _burn_job(unit: _Toy) -> list[dict[str, float]]:
    t0 = time.process_time()
    while time.process_time() - t0 < 0.5:
        pass
    return [{"x": unit.x, "cpu": time.process_time() - t0}]


def test_the_workers_cpu_time_reaches_the_caller_once_the_server_is_reaped(tmp_path: Path) -> None:
    """The workers' CPU time is counted in this process's RUSAGE_CHILDREN (what `time` and
    experiments/time_claims.py read) once the forkserver is stopped and waited for, as its exit
    handler does: Python leaves its forkserver unwaited, which lost every worker's CPU time."""
    import resource

    from matroots.study import forkserver

    def children() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    units = [_Toy(key=f"u{i}", x=i) for i in range(4)]
    before = children()
    out = runner.open_run(tmp_path / "burn", kind="toy", config={}, config_hash="h", resume=False)
    runner.run_units(units, _burn_job, out, workers=2, progress=False)
    forkserver._stop_server()  # what the exit handler runs
    burnt = float(runner.read_parts(out)["cpu"].sum())
    assert burnt >= 2.0 and children() - before >= burnt  # every worker's 0.5 s, and more (imports)


# --- dask --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory):
    distributed = pytest.importorskip("distributed")
    hold = tmp_path_factory.mktemp("hold")
    old = os.environ.get("MATROOTS_SWEEP_HOLD_DIR")
    os.environ["MATROOTS_SWEEP_HOLD_DIR"] = str(hold)  # inherited by the worker processes
    try:
        with distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster:
            yield cluster, hold
    finally:
        if old is None:
            os.environ.pop("MATROOTS_SWEEP_HOLD_DIR", None)
        else:
            os.environ["MATROOTS_SWEEP_HOLD_DIR"] = old


def test_dask_sweep_equals_local_pool(
    tiny: grid.GridSpec, tmp_path: Path, reference_rows: pd.DataFrame, dask_cluster
) -> None:
    cluster, _ = dask_cluster
    df = sweep.run_sweep(tiny, tmp_path / "dask", scheduler=cluster.scheduler_address, progress=False)
    _same_rows(reference_rows, df)
    prov = runner.read_provenance(tmp_path / "dask")
    assert prov["runs"][-1]["stats"]["scheduler"] == cluster.scheduler_address
    assert all(p.stat().st_mode & 0o077 != 0 for p in (tmp_path / "dask" / "parts").glob("*.parquet"))


def test_dask_client_killed_then_resumed(
    tiny: grid.GridSpec, tmp_path: Path, reference_rows: pd.DataFrame, dask_cluster
) -> None:
    cluster, hold = dask_cluster
    keys = [u.key for u in grid.units(tiny)]
    for k in keys[1:]:
        (hold / k).touch()  # every unit but the first waits, so the client dies at a known point
    cfg = tmp_path / "tiny.toml"
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "matroots.cli", "sweep", str(cfg), "--out", str(out)]
    proc = subprocess.Popen(
        [*cmd, "--scheduler", cluster.scheduler_address, "--no-progress"], start_new_session=True
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not sweep.done_units(out) and proc.poll() is None:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # kill -9 of the dask client mid-run
        proc.wait()
    finally:
        for k in keys:
            (hold / k).unlink(missing_ok=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert sweep.done_units(out) == {keys[0]}
    assert json.loads((out / "provenance.json").read_text())["runs"][0]["event"] == "start"
    df = sweep.run_sweep(tiny, out, scheduler=cluster.scheduler_address, resume=True, progress=False)
    _same_rows(reference_rows, df)
    assert runner.read_provenance(out)["runs"][-1]["stats"]["skipped"] == 1
