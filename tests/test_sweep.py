"""Sweep engine: grid expansion, rows, resume after killed workers/parents, determinism, report."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _tiny_sweep import TINY, drop_timing

from matroots.study import grid, report, sweep


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    return p


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))


def test_grid_expansion_counts(tiny_config: Path) -> None:
    g = grid.load_config(tiny_config)
    assert len(grid.units(g)) == 1 * 1 * 2 * 1 * 1 * 2
    assert grid.case_count(g) == 4 * 2 * 2
    big = grid.from_dict(
        {
            "solvers": [{"name": "eigh"}, {"name": "schur_newton"}],
            "dtypes": ["fp64", "fp32", "bf16"],
            "families": ["randsvd", "clustered"],
            "n": [8, 16],
            "kappa": [1, 10, 100],
            "p": [2, 4],
            "eps": [0.0, {"value": 1e-3}],
            "seeds": [0, 1, 2],
        }
    )
    assert len(grid.units(big)) == 2 * 2 * 3 * 3 * 2 * 2
    assert grid.case_count(big) == 144 * 3 * 2
    assert len({u.key for u in grid.units(big)}) == 144


def test_bad_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown solver"):
        grid.from_dict({"solvers": [{"name": "nope"}]})
    with pytest.raises(ValueError, match="unknown grid keys"):
        grid.from_dict({"solvers": [{"name": "eigh"}], "kapa": [1]})
    with pytest.raises(ValueError, match="unknown dtype 'int8'; use one of bf16, fp16, fp32, fp64"):
        grid.from_dict({"solvers": [{"name": "eigh"}], "dtypes": ["int8"]})


def _check_complete(df: pd.DataFrame, g: grid.GridSpec) -> None:
    assert len(df) == grid.case_count(g)
    key = ["unit", "dtype", "solver"]
    assert not df.duplicated(key).any()
    assert set(df["unit"]) == {u.key for u in grid.units(g)}


def test_sweep_rows_and_metrics(tiny_config: Path, tmp_path: Path) -> None:
    g = grid.load_config(tiny_config)
    df = sweep.run_sweep(g, tmp_path / "run", workers=2, progress=False)
    _check_complete(df, g)
    ok = df[df["failure"] == ""]
    assert len(ok) > 0
    fp64 = ok[ok["dtype"] == "fp64"]
    # fp64 errors sit near the conditioning line (kappa/p) u, far below 1
    assert (fp64["relative_forward_error"] <= 100 * fp64["kappa_u_line"].clip(lower=1e-15) * np.sqrt(6)).all()
    for col in (
        "iterations",
        "matmuls",
        "converged",
        "failure",
        "seconds",
        "config_hash",
        "versions",
        "machine",
        "seed",
        "residual",
        "eps_abs",
    ):
        assert col in df.columns, col
    assert (tmp_path / "run" / "provenance.json").exists()


def test_resume_after_killed_worker(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = grid.load_config(tiny_config)
    crash = tmp_path / "crash"
    crash.mkdir()
    monkeypatch.setenv("MATROOTS_SWEEP_CRASH_DIR", str(crash))
    monkeypatch.setenv("MATROOTS_SWEEP_CRASH_PREFIX", "")  # every unit's first attempt kills its worker
    df = sweep.run_sweep(g, tmp_path / "run", workers=2, progress=False)
    assert len(list(crash.iterdir())) == len(grid.units(g))  # each unit really crashed once
    _check_complete(df, g)
    assert (df["failure"] != "WorkerCrashed").all()


def test_resume_after_killed_parent(tiny_config: Path, tmp_path: Path) -> None:
    g = grid.load_config(tiny_config)
    out = tmp_path / "run"
    env = dict(os.environ, MATROOTS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "matroots.cli",
            "sweep",
            str(tiny_config),
            "--out",
            str(out),
            "--workers",
            "1",
            "--no-progress",
        ],
        env=env,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(sweep.done_units(out)) < 1 and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # kill -9 of the parent only
    proc.wait()
    time.sleep(0.5)
    first = sweep.done_units(out)
    assert len(first) >= 1
    with pytest.raises(sweep.SweepError, match="--resume"):
        sweep.run_sweep(g, out, workers=1, progress=False)
    df = sweep.run_sweep(g, out, workers=2, resume=True, progress=False)
    _check_complete(df, g)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # reap any orphaned worker


def test_same_config_same_rows(tiny_config: Path, tmp_path: Path) -> None:
    g = grid.load_config(tiny_config)
    a = drop_timing(sweep.run_sweep(g, tmp_path / "a", workers=1, progress=False))
    b = drop_timing(sweep.run_sweep(g, tmp_path / "b", workers=2, progress=False))
    pd.testing.assert_frame_equal(a, b)


def test_report_recomputed_from_rows(tiny_config: Path, tmp_path: Path) -> None:
    g = grid.load_config(tiny_config)
    df = sweep.run_sweep(g, tmp_path / "run", workers=2, progress=False)
    s = report.summary(df).set_index(["solver", "dtype"])
    for (solver, dtype), grp in df.groupby(["solver", "dtype"]):
        fail = grp["failure"] != ""
        assert s.loc[(solver, dtype), "failure_rate"] == pytest.approx(fail.mean())
        assert s.loc[(solver, dtype), "cases"] == len(grp)
        ok = grp[~fail]
        if len(ok):
            assert s.loc[(solver, dtype), "median_error"] == pytest.approx(
                np.median(ok["relative_forward_error"])
            )
            assert s.loc[(solver, dtype), "max_error"] == pytest.approx(ok["relative_forward_error"].max())
    best = report.best_solver_table(df, accuracy=1e-2)
    for _, r in best.iterrows():
        if r["best_solver"] == "none":
            continue
        grp = df[
            (df["dtype"] == r["dtype"])
            & (df["solver"] == r["best_solver"])
            & (report.kappa_band(df["kappa"]) == r["kappa_band"])
            & (report.eps_label(df) == r["eps"])
        ]
        assert (grp["failure"] == "").all()
        assert (report.headline_error(grp) <= 1e-2).all()
    text = report.format_report(df)
    assert "Best solver" in text and "failure_rate" in text


def test_cli_end_to_end(tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from matroots import cli

    out = tmp_path / "run"

    def run(*args: str) -> str:
        assert cli.main(list(args)) == 0
        return capsys.readouterr().out

    assert "16 (case, solver) rows" in run("sweep", str(tiny_config), "--dry-run")
    run("sweep", str(tiny_config), "--out", str(out), "--workers", "2", "--no-progress", "--csv")
    assert (out / "results.parquet").exists() and (out / "results.csv").exists()
    assert "Best solver" in run("report", str(out))
    run("plot", str(out))
    for name in ("error_vs_kappa", "iterations_vs_kappa", "failure_heatmap", "residual_vs_error"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000
        assert (out / "figures" / f"{name}.pdf").exists()
    A = np.diag([1.0, 16.0, 81.0])
    np.save(tmp_path / "a.npy", A)
    sol = run(
        "solve",
        str(tmp_path / "a.npy"),
        "-p",
        "4",
        "--method",
        "coupled_newton",
        "--dtype",
        "fp32",
        "--save",
        str(tmp_path / "x.npy"),
        "--reference",
    )
    assert "converged   True" in sol and "forward error" in sol
    np.testing.assert_allclose(np.load(tmp_path / "x.npy"), np.diag([1.0, 0.5, 1 / 3]), rtol=1e-6)
    parser = cli.build_parser()
    for sub in ("sweep", "report", "plot", "solve"):
        with pytest.raises(SystemExit):
            parser.parse_args([sub, "--help"])
        assert "usage" in capsys.readouterr().out
    assert cli.main(["solve", str(tmp_path / "a.npy"), "-p", "-1"]) == 2
    assert "UnsupportedExponentError" in capsys.readouterr().err
    # the installed console script runs the same main
    env = dict(os.environ, MATROOTS_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, "-m", "matroots.cli", "report", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "Best solver" in r.stdout
