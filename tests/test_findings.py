"""paper_figs/findings.py: docs/findings.md matches the shipped results, and each computation gives the
number worked out by hand on a tiny synthetic frame."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _findings_frames import load_script, row

ROOT = Path(__file__).resolve().parents[1]


F = load_script("paper_findings", "findings.py")
INF = math.inf
_row = row


# --- the document against the data ---------------------------------------------------------------------


def test_findings_doc_matches_the_shipped_results():
    assert F.main(["--check"]) == 0


def test_check_fails_when_a_block_was_edited_by_hand(tmp_path):
    doc = (ROOT / "docs" / "findings.md").read_text()
    begin = F._marker("eps_bias")
    assert begin in doc
    edited = doc.replace(begin + "\n", begin + "\nhand-typed 1e-3\n", 1)
    path = tmp_path / "findings.md"
    path.write_text(edited)
    assert F.main(["--check", "--doc", str(path)]) == 1
    assert F.main(["--write", "--doc", str(path)]) == 0
    assert path.read_text() == doc


def test_render_refuses_a_document_without_the_block():
    with pytest.raises(SystemExit, match="no block"):
        F.render("no markers here", {"eps_bias": "x"})


# --- the computations on frames worked by hand ---------------------------------------------------------


def test_precision_limits_by_hand():
    rows = []
    # solver a: kappa 1e2 accurate; 1e4 one failure in four (rate 0.25 > 0.1) but median 1e-3 < 1e-2;
    # 1e6 every error 5e-2 > 1e-2 and cond u = 2e-2 > 1e-2; 1e8 all fail
    for k, errs, cu in (
        (1e2, [1e-5] * 4, 1e-5),
        (1e4, [1e-3, 1e-3, 1e-3, None], 1e-3),
        (1e6, [5e-2] * 4, 2e-2),
        (1e8, [None] * 4, 2.0),
    ):
        for e in errs:
            fail = "NotPositiveDefiniteError" if e is None else ""
            rows.append(
                _row(
                    kappa=k,
                    kappa_actual=k,
                    relative_forward_error=np.nan if e is None else e,
                    failure=fail,
                    cond_u_line=cu,
                )
            )
    # solver b at kappa 1e4: two of four fail, the others exact: the median counts failures as
    # infinite, so the median error (inf) exceeds the target already there
    for e in (1e-9, 1e-9, None, None):
        rows.append(
            _row(
                solver="b",
                kappa=1e4,
                kappa_actual=1e4,
                relative_forward_error=np.nan if e is None else e,
                failure="NotConverged" if e is None else "",
                cond_u_line=1e-3,
            )
        )
    # an eps > 0 row with a huge error at kappa 1e2 must not count (the limits are at eps = 0)
    rows.append(_row(kappa=1e2, kappa_actual=1e2, eps=1e-2, eps_mode="relative", relative_forward_error=1.0))
    # a refusal of an input outside the method's domain (a MatrootsInputError) is no failure: with it
    # counted, kappa 1e2 would have a failure rate 1/5 > 0.1
    rows.append(_row(kappa=1e2, kappa_actual=1e2, failure="UnsupportedExponentError"))
    lim = F.precision_limits(pd.DataFrame(rows), threshold=1e-2, fail_rate=0.1).set_index("solver")
    a = lim.loc["a"]
    assert (a["kappa_err"], a["kappa_fail"], a["kappa_theory"], a["kappa_max"]) == (1e6, 1e4, 1e6, 1e8)
    b = lim.loc["b"]
    assert b["kappa_err"] == 1e4 and b["kappa_fail"] == 1e4 and math.isnan(b["kappa_theory"])


def test_least_error_eps_by_hand():
    rows = []

    def add(g, eps, mode, errs):
        for e in errs:
            fail = "NotPositiveDefiniteError" if e is None else ""
            err = np.nan if e is None else e
            rows.append(
                _row(
                    solver=g,
                    eps=eps,
                    eps_mode=mode,
                    eps_abs=eps,
                    failure=fail,
                    # at eps = 0 the total error is the error against the matrix solved
                    relative_forward_error=err if eps == 0 else 1e-7,
                    forward_error_total=np.nan if eps == 0 else err,
                )
            )

    # g1: eps = 0 gives 1e-3; 1e-8 rel 5e-4 (the least); 1e-6 rel half failed: median inf; 1e-4 rel 1e-1
    add("g1", 0.0, "absolute", [1e-3, 1e-3])
    add("g1", 1e-8, "relative", [5e-4, 5e-4])
    add("g1", 1e-6, "relative", [1e-5, None])
    add("g1", 1e-4, "relative", [1e-1, 1e-1])
    # g2: eps = 0 always fails; 1e-8 rel 2e-1, 1e-4 rel 1e-1: the least is 1e-4, eps = 0 is infinite
    add("g2", 0.0, "absolute", [None, None])
    add("g2", 1e-8, "relative", [2e-1, 2e-1])
    add("g2", 1e-4, "relative", [1e-1, 1e-1])
    # g3: a tie between eps = 0 and 1e-8 abs goes to the smaller eps
    add("g3", 0.0, "absolute", [1e-3, 1e-3])
    add("g3", 1e-8, "absolute", [1e-3, 1e-3])
    best = F.least_error_eps(pd.DataFrame(rows), ["solver"]).set_index("solver")
    assert (best.loc["g1", "eps"], best.loc["g1", "eps_mode"]) == (1e-8, "relative")
    assert best.loc["g1", "error"] == 5e-4 and best.loc["g1", "error_eps0"] == 1e-3
    assert best.loc["g2", "eps"] == 1e-4 and best.loc["g2", "error"] == 1e-1
    assert best.loc["g2", "error_eps0"] == INF and best.loc["g2", "fail"] == 0
    assert best.loc["g3", "eps"] == 0 and best.loc["g3", "error"] == 1e-3


def test_total_error_at_eps0_is_the_error_against_the_matrix_solved():
    d = pd.DataFrame(
        [
            _row(relative_forward_error=1e-4),
            _row(
                eps=1e-6,
                eps_mode="relative",
                eps_abs=1e-6,
                relative_forward_error=1e-7,
                forward_error_total=1e-3,
            ),
            _row(
                eps=1e-6,
                eps_mode="relative",
                eps_abs=1e-6,
                failure="NotConverged",
                forward_error_total=np.nan,
            ),
        ]
    )
    assert F.total_error(d).iloc[:2].tolist() == [1e-4, 1e-3]
    assert F.total_or_inf(d).iloc[2] == INF


def test_pareto_by_hand():
    pts = pd.DataFrame(
        {"cost": [10.0, 20.0, 30.0, 15.0], "error": [1e-3, 1e-5, 1e-4, 1e-2]}, index=list("abcd")
    )
    # a (cheapest), b (more accurate than a); c is beaten by b in both; d by a in both
    assert F.pareto(pts).to_dict() == {"a": True, "b": True, "c": False, "d": False}


def test_coverage_says_partial():
    prov = {
        "name": "precision_full",
        "config": "experiments/configs/precision_full.toml",
        "config_hash": "h",
        "units_done": 3,
        "units_total": 10,
        "complete": False,
        "rows": 12,
        "commits": ["abcdef0123456"],
        "shipped": "2026-12-02T00:00:00",
    }
    line = F.coverage(prov)
    assert "3/10 units" in line and "PARTIAL" in line
    assert "PARTIAL" not in F.coverage({**prov, "units_done": 10, "complete": True})


def test_every_figure_the_findings_cite_is_one_make_figures_writes():
    figs = load_script("paper_figures", "figures.py")
    doc = (ROOT / "docs" / "findings.md").read_text()
    cited = set(re.findall(r"paper_figs/out/full/(\w+)\.png", doc))
    assert cited and cited <= set(figs.FIGURES), cited - set(figs.FIGURES)
