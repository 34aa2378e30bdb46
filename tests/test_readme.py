"""The README states what the code does: its solver table and ``available()`` example list the
registered solvers, and its manual install line installs the extras the Makefile installs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from _scripts import load_script

import matroots

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_solver_table_lists_every_registered_solver() -> None:
    section = README.split("## Solvers", 1)[1].split("\n\n", 2)[1]
    names = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
    assert sorted(names) == matroots.solvers.available()


def test_the_available_example_prints_what_available_returns() -> None:
    # the printed list is the comment line just above the call (ruff format keeps the line short)
    (shown,) = re.findall(r"# (\[.*\])\nprint\(matroots\.solvers\.available\(\)\)", README)
    assert ast.literal_eval(shown) == matroots.solvers.available()


def test_the_manual_install_line_has_the_makefile_extras() -> None:
    (makefile_extras,) = re.findall(r"^EXTRAS := (\S+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    installs = re.findall(r'pip install -e "\.\[([\w,]+)\]"', README)
    assert installs, "the README has a manual `pip install -e` line"
    for extras in installs:
        assert set(extras.split(",")) == set(makefile_extras.split(","))


#: How the README names each target of experiments/time_claims.py.
TIME_CLAIM_LABELS = {
    "demo": "`make demo`",
    "figures": "`make figures`",
    "test": "`make test`",
    "validate_demo": "`matroots validate experiments/configs/validate_demo.toml`",
    "validate_dry_run": "`matroots validate experiments/configs/validate_demo.toml --dry-run`",
}


def test_the_readme_durations_are_the_latest_measured_ones() -> None:
    """Every target in experiments/time_claims.json (the script's latest results) is stated in the
    README with that wall and CPU time (minutes, one decimal) and its load average."""
    import json

    record = json.loads((ROOT / "experiments" / "time_claims.json").read_text())
    assert set(record) <= set(TIME_CLAIM_LABELS)
    for target, r in record.items():
        label = re.escape(TIME_CLAIM_LABELS[target])
        found = re.findall(rf"{label} (\d+\.\d) min wall, (\d+\.\d) min CPU \(load average (\d+)", README)
        assert found, f"the README states no measured duration for {target}"
        wall, cpu, load = found[0]
        assert (wall, cpu) == (f"{r['wall_s'] / 60:.1f}", f"{r['cpu_s'] / 60:.1f}"), (target, found[0])
        assert int(load) == round(r["load_mean"]), (target, load, r["load_mean"])


def _time_claims():
    return load_script("experiments/time_claims.py")


def test_every_time_claims_target_has_a_readme_label_and_the_dry_run_runs_nothing(tmp_path) -> None:
    """The README can state each target experiments/time_claims.py measures (the check above finds it
    by this label), and the dry-run target times the estimate alone: `--dry-run`, no run folder."""
    tc = _time_claims()
    assert set(tc.TARGETS) == set(TIME_CLAIM_LABELS)
    (cmd,) = tc.commands("validate_dry_run", tmp_path, make=False)
    assert cmd[-1] == "--dry-run" and "--out" not in cmd
    assert cmd[cmd.index("validate") + 1] == "experiments/configs/validate_demo.toml"
    (run,) = tc.commands("validate_demo", tmp_path, make=False)
    assert "--dry-run" not in run
