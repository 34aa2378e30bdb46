"""The README states what the code does: its solver table and ``available()`` example list the
registered solvers, and its manual install line installs the extras the Makefile installs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
