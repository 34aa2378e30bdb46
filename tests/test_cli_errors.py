"""Every command-line and config mistake ends in one line on stderr naming the problem and the fix, exit 2.

Each case runs ``matroots.cli.main`` as a user would and checks: exit code 2, exactly one line on
stderr, no traceback, the offending name in the message and a hint of the fix. No worker starts for a
config mistake: the run folder is not even created.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _tiny_sweep import TINY
from _tiny_validation import tiny_config

from matroots import cli


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))


def _fail(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI, expect exit code 2 and one line on stderr; return that line."""
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse errors exit through SystemExit
        rc = exc.code
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert rc == 2, (rc, cap.err)
    assert len(lines) == 1, cap.err
    assert "Traceback" not in cap.err
    return lines[0]


def _config(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.toml"
    p.write_text(text)
    return p


def _sweep_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> str:
    out = tmp_path / "run"
    line = _fail(capsys, "sweep", str(_config(tmp_path, text)), "--out", str(out), "--no-progress")
    assert not out.exists(), "a config mistake must be caught before the run starts"
    return line


def test_unknown_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace('families = ["randsvd"]', 'families = ["randsdv"]'))
    assert "'randsdv'" in line and "did you mean 'randsvd'" in line and "use one of" in line


def test_unknown_solver(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace('name = "eigh"', 'name = "eig"'))
    assert "unknown solver 'eig'" in line and "eigh" in line


def test_unknown_solver_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace("scaling =", "scalling ="))
    assert "unknown option 'scalling'" in line and "did you mean 'scaling'" in line


def test_bad_solver_option_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace('"frobenius"', '"frobenious"'))
    assert "coupled_newton" in line and "frobenious" in line


def test_unknown_grid_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace("kappa =", "kapa ="))
    assert "unknown grid keys ['kapa']" in line and "did you mean 'kappa'" in line


def test_unknown_family_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TINY + "\n[family_options.randsvd]\nmodee = 3\n"
    line = _sweep_fails(tmp_path, capsys, text)
    assert "family_options.randsvd" in line and "modee" in line


def test_toml_syntax_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace("n = [6]", "n = [6"))
    assert "not valid TOML" in line and "line" in line


def test_reference_backend_typo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace('"mpmath"', '"mpmat"'))
    assert "reference_backend 'mpmat'" in line and "did you mean 'mpmath'" in line


def test_unknown_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace('"bf16"]', '"fp8"]'))
    assert "unknown dtype 'fp8'" in line and "bf16" in line


def test_bad_eps_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace('mode = "relative"', 'mode = "relativ"'))
    assert "'relativ'" in line and "'relative'" in line


def test_bad_axis_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _sweep_fails(tmp_path, capsys, TINY.replace("n = [6]", "n = [0]"))
    assert "n = 0" in line and ">= 1" in line


def test_duplicate_solver_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = TINY + '\n[[solvers]]\nname = "eigh"\n'
    line = _sweep_fails(tmp_path, capsys, text)
    assert "labelled 'eigh'" in line and "distinct label" in line


def test_missing_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(capsys, "sweep", str(tmp_path / "nope.toml"))
    assert "does not exist" in line and "nope.toml" in line


@pytest.fixture(scope="module")
def _tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished TINY sweep (its mpmath references are the cost), copied by the tests that reuse it."""
    from matroots.study import grid, sweep

    tmp = tmp_path_factory.mktemp("tiny_run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MATROOTS_CACHE_DIR", str(tmp / "cache"))
        sweep.run_sweep(grid.load_config(_config(tmp, TINY)), tmp / "run", workers=1, progress=False)
    return tmp / "run"


def test_reused_out_without_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], _tiny_run: Path
) -> None:
    cfg = _config(tmp_path, TINY)
    out = tmp_path / "run"
    shutil.copytree(_tiny_run, out)
    line = _fail(capsys, "sweep", str(cfg), "--out", str(out), "--no-progress")
    assert "--resume" in line and "another --out" in line


def test_out_holds_other_config(tmp_path: Path, capsys: pytest.CaptureFixture[str], _tiny_run: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(_tiny_run, out)
    other = tmp_path / "other.toml"
    other.write_text(TINY.replace("kappa = [1e2, 1e8]", "kappa = [1e3]"))
    line = _fail(capsys, "sweep", str(other), "--out", str(out), "--resume", "--no-progress")
    assert "another config" in line and "another --out" in line


def test_unwritable_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")  # even root cannot create a folder under a file
    line = _fail(capsys, "sweep", str(_config(tmp_path, TINY)), "--out", str(blocker / "run"))
    assert "cannot write to run folder" in line and "writable --out" in line
    line = _fail(capsys, "sweep", str(_config(tmp_path, TINY)), "--out", str(blocker))
    assert "is a file" in line


def test_bad_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(capsys, "sweep", str(_config(tmp_path, TINY)), "--workers", "0")
    assert "--workers" in line and ">= 1" in line


def test_unreachable_scheduler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("distributed")
    cfg = _config(tmp_path, TINY)
    # a port on loopback that nothing listens on
    line = _fail(
        capsys,
        "sweep",
        str(cfg),
        "--out",
        str(tmp_path / "r"),
        "--scheduler",
        "tcp://127.0.0.1:9",
        "--no-progress",
    )
    assert "dask scheduler" in line and "--scheduler" in line


@pytest.mark.parametrize("address", ["garbage::", "garbage", "tcp://host:abc"])
def test_malformed_scheduler_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str
) -> None:
    pytest.importorskip("distributed")
    out = tmp_path / "r"
    for cmd in ("sweep", "validate"):
        cfg = _config(tmp_path, TINY if cmd == "sweep" else tiny_config(["lsq"]))
        line = _fail(capsys, cmd, str(cfg), "--out", str(out), "--scheduler", address, "--no-progress")
        assert "not a dask scheduler address" in line and "tcp://HOST:PORT" in line, line
        assert not out.exists()


def test_dry_run_of_a_grid_too_large_for_memory_refuses_with_the_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from matroots.study import sweep_estimate

    monkeypatch.setattr(sweep_estimate, "_memory_bytes", lambda: 16 * 2**30)  # a 16 GiB machine
    cfg = _config(tmp_path, TINY.replace("n = [6]", "n = [6, 100000]"))
    line = _fail(capsys, "sweep", str(cfg), "--dry-run")
    assert "n = 100000" in line and "74.5 GiB per float64 matrix" in line and "16.0 GiB" in line


# --- validation configs: the whole config is checked before any unit starts ----------------------


def _validate_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes) -> str:
    cfg = tmp_path / "v.toml"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "vrun"
    line = _fail(capsys, "validate", str(cfg), "--out", str(out), "--no-progress")
    assert not out.exists(), "a config mistake must be caught before the run starts"
    return line


BAD_VALIDATION = {
    "binary": (bytes(range(256)) * 4, "not a text file"),
    "lr_text": (tiny_config(["lsq"]).replace("lr = [3e-3, 1e-2]", 'lr = ["abc"]', 1), "lr values"),
    "lr_negative": (tiny_config(["lsq"]).replace("lr = [3e-3, 1e-2]", "lr = [-1e-3]", 1), "lr values"),
    "lr_nan": (tiny_config(["lsq"]).replace("lr = [3e-3, 1e-2]", "lr = [nan]", 1), "lr values"),
    "lr_empty": (tiny_config(["lsq"]).replace("lr = [3e-3, 1e-2]", "lr = []", 1), "no learning rate"),
    "option_unknown": (
        tiny_config(["lsq"]).replace('name = "adamw"', 'name = "adamw"\noptions = { bogus = 1 }'),
        "optimizer adamw",
    ),
    "option_value": (
        tiny_config(["lsq"]).replace(
            'root_solver = ["eigh"]', 'root_solver = ["eigh"]\noptions = { betas = [0.9] }'
        ),
        "optimizer shampoo",
    ),
    "task_size_unknown": (
        tiny_config(["lsq"]).replace("size = { batch_size = 64 }", "size = { widht = 3 }"),
        "tasks.lsq",
    ),
    "task_size_value": (tiny_config(["digits"]).replace("hidden = 16", "hidden = -4"), "tasks.digits"),
    "steps_text": (
        tiny_config(["lsq"]).replace("steps = 2", 'steps = "many"'),
        "steps must be a whole number",
    ),
    "steps_inf": (  # TOML's inf: int(inf) was a raw OverflowError traceback
        tiny_config(["lsq"]).replace("steps = 2", "steps = inf"),
        "steps must be a whole number",
    ),
    "steps_nan": (tiny_config(["lsq"]).replace("steps = 2", "steps = nan"), "steps must be a whole number"),
    "frequency_zero": (
        tiny_config(["lsq"]).replace("precondition_frequency = [1]", "precondition_frequency = [0]"),
        "precondition_frequency",
    ),
    "seeds_text": (tiny_config(["lsq"], seeds='["a"]'), "seeds must be a whole number"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALIDATION))
def test_bad_validation_config(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    text, expect = BAD_VALIDATION[case]
    line = _validate_fails(tmp_path, capsys, text)
    assert expect in line, line


def test_solve_non_npy_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    txt = tmp_path / "a.txt"
    np.savetxt(txt, np.eye(3))
    line = _fail(capsys, "solve", str(txt), "-p", "2")
    assert "not a .npy file" in line and "numpy.save" in line
    fake = tmp_path / "b.npy"
    fake.write_text("1 0\n0 1\n")
    line = _fail(capsys, "solve", str(fake), "-p", "2")
    assert "not a readable .npy array" in line
    line = _fail(capsys, "solve", str(tmp_path / "missing.npy"), "-p", "2")
    assert "no file" in line


def test_solve_unknown_method_and_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "a.npy", np.eye(3))
    line = _fail(capsys, "solve", str(tmp_path / "a.npy"), "-p", "2", "--method", "newton")
    assert "newton" in line and "coupled_newton" in line
    line = _fail(capsys, "solve", str(tmp_path / "a.npy"), "-p", "2", "--dtype", "fp8")
    assert "invalid choice: 'fp8'" in line and "bf16" in line


def test_solve_not_square(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "a.npy", np.ones((2, 3)))
    line = _fail(capsys, "solve", str(tmp_path / "a.npy"), "-p", "2")
    assert "NotSquareError" in line


def test_report_without_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(capsys, "report", str(tmp_path / "nothing"))
    assert "no run folder" in line and "matroots sweep" in line
    (tmp_path / "empty").mkdir()
    line = _fail(capsys, "report", str(tmp_path / "empty"))
    assert "no rows" in line and "--resume" in line


def test_report_without_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    run = tmp_path / "run"
    (run / "parts").mkdir(parents=True)
    rows = pd.DataFrame(
        {"unit": ["u1"], "solver": ["eigh"], "dtype": ["fp64"], "failure": ["WorkerCrashed"], "kappa": [1.0]}
    )
    rows.to_parquet(run / "parts" / "u1.parquet")
    line = _fail(capsys, "report", str(run))
    assert "no forward-error metrics" in line
    line = _fail(capsys, "plot", str(run))
    assert "no forward-error metrics" in line


def test_report_corrupted_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    (run / "parts").mkdir(parents=True)
    (run / "parts" / "u1.parquet").write_bytes(b"PAR1 not really")
    line = _fail(capsys, "report", str(run))
    assert "corrupted" in line and "--resume" in line


def test_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(capsys, "swep")
    assert "invalid choice: 'swep'" in line and "--help" in line


def test_version_and_choice_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("matroots 0.")
    with pytest.raises(SystemExit):
        cli.main(["solve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    from matroots.solvers import registry

    assert f"one of {', '.join(registry.available())}" in text
    assert "one of fp64, fp32, bf16, fp16" in text


def test_console_script_one_line(tmp_path: Path) -> None:
    """The same contract through a fresh interpreter (what the installed `matroots` script runs)."""
    cfg = _config(tmp_path, TINY.replace('name = "eigh"', 'name = "eig"'))
    r = subprocess.run(
        [sys.executable, "-m", "matroots.cli", "sweep", str(cfg), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "unknown solver 'eig'" in r.stderr
