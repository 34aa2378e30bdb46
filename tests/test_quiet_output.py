"""What a person reads: a sweep summarises its failed solves in one line (no warning line per solve),
``matroots solve`` prints data entries of ``info`` as a summary (``--json`` prints all), and the report
fits a 100-column terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _scripts import load_script

from matroots.study import report

ROOT = Path(__file__).resolve().parents[1]

# demo-like, one unit: coupled Newton capped at one iteration cannot converge, eigh always does
GRID = """
name = "quiet"
families = ["randsvd"]
n = [6]
kappa = [1e4]
p = [2]
dtypes = ["fp64", "fp32"]
seeds = [0]
eps = [{ value = 0.0, mode = "absolute" }]
reference_backend = "mpmath"

[[solvers]]
name = "eigh"

[[solvers]]
name = "coupled_newton"
label = "capped"
options = { max_iter = 1 }
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "matroots.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("quiet")
    (tmp / "quiet.toml").write_text(GRID)
    out = tmp / "run"
    proc = _cli("sweep", str(tmp / "quiet.toml"), "--out", str(out), "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_a_sweep_says_once_how_many_solves_did_not_converge(run) -> None:
    out, proc = run
    lines = proc.stderr.replace("\r", "\n").splitlines()
    assert not [line for line in lines if "did not converge" in line]
    (summary,) = [line for line in lines if "solves failed" in line]
    assert "NotConverged 2 (capped/fp32 1, capped/fp64 1)" in summary
    warnings = [line for line in lines if "WARNING" in line or "Warning" in line]
    assert warnings == [summary]
    df = pd.read_parquet(out / "results.parquet")
    assert (df.loc[df["solver"] == "capped", "failure"] == "NotConverged").all()  # details in the rows


def test_the_report_fits_100_columns(run) -> None:
    out, _ = run
    proc = _cli("report", str(out))
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= report.WIDTH
    assert "Best solver" in proc.stdout


def test_fit_table_moves_the_columns_that_do_not_fit_under_their_row() -> None:
    t = pd.DataFrame(
        {"solver": ["a" * 30, "b"], "x": [1.0, 2.0], "y": [np.nan, 3.0], "reason": ["why " * 40, "NA"]}
    )
    text = report.fit_table(t, lambda v: f"{v:.3g}", width=60)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 60
    assert lines[0].split() == ["solver", "x", "y"]
    assert lines[2].startswith("    reason why") and lines[3].startswith("      why")
    assert lines[-1].split() == ["b", "2", "3"]  # its reason is NA: no line under it


def test_solve_prints_a_summary_of_eigenvectors_and_json_prints_them(tmp_path: Path) -> None:
    g = np.random.default_rng(0)
    G = g.standard_normal((64, 128))
    np.save(tmp_path / "A.npy", G @ G.T / 128 + 0.1 * np.eye(64))
    proc = _cli("solve", str(tmp_path / "A.npy"), "-p", "4", "--method", "eigh_warm")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) < 3000  # 64 x 64 eigenvectors in full would be ~80 KB
    assert "info.eigenvectors" in proc.stdout and "(64, 64); --json prints it" in proc.stdout
    proc = _cli("solve", str(tmp_path / "A.npy"), "-p", "4", "--method", "eigh_warm", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert np.asarray(record["info"]["eigenvectors"]).shape == (64, 64) and record["converged"] is True


def _time_claims():
    return load_script("experiments/time_claims.py")


def test_warning_lines_split_progress_bars_and_match_both_kinds() -> None:
    tc = _time_claims()
    text = "run:  10%|#\rrun: 100%|##| WARNING x: 3 of 9 solves failed\nok\nsolve did not converge\nUserWarning: y\n"
    assert tc.warning_lines(text) == [
        "run: 100%|##| WARNING x: 3 of 9 solves failed", "solve did not converge", "UserWarning: y"
    ]  # fmt: skip


def test_make_demo_as_last_measured_printed_one_warning_line() -> None:
    """What `make demo` printed when experiments/time_claims.py last ran it (the record the README's
    durations come from): one warning line, its summary of the solves that failed, and no
    "did not converge" line per solve."""
    demo = json.loads((ROOT / "experiments" / "time_claims.json").read_text())["demo"]
    assert "warning_lines" in demo, "rerun `python experiments/time_claims.py --only demo`"
    assert demo["warning_lines"] <= 1, demo["warnings"]
    assert all("solves failed" in line for line in demo["warnings"]), demo["warnings"]
