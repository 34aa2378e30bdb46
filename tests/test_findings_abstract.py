"""paper_figs/findings_abstract.py: the three headline findings give the numbers worked out by hand on
tiny synthetic frames (the shipped page itself is checked by tests/test_findings.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
from _findings_frames import load_script, row

F = load_script("paper_findings", "findings.py")
A = load_script("paper_findings_abstract", "findings_abstract.py")
H = SimpleNamespace(**vars(F))


def _row(**kw):
    return row(**{"solver": "eigh", **kw})


def test_precision_finding_by_hand():
    rows = []
    # fp32: cond u passes 1e-2 at kappa 1e6. eigh holds (error 1e-3 at 1e4, 5e-2 at 1e6); "early"
    # exceeds 1e-2 already at 1e4. Errors relative to cond u: eigh 1e-3/1e-3 = 1 and 5e-2/2e-2 = 2.5
    # (both within 10x), early 5e-2/1e-3 = 50 at 1e4 (outside) and a NotPositiveDefiniteError at 1e6.
    for k, cu, e_eigh, e_early in ((1e4, 1e-3, 1e-3, 5e-2), (1e6, 2e-2, 5e-2, None)):
        rows.append(_row(kappa=k, kappa_actual=k, cond_u_line=cu, relative_forward_error=e_eigh))
        rows.append(
            _row(
                solver="early",
                kappa=k,
                kappa_actual=k,
                cond_u_line=cu,
                relative_forward_error=np.nan if e_early is None else e_early,
                failure="NotPositiveDefiniteError" if e_early is None else "",
            )
        )
    # fp64: one success at 20x cond u (outside), one at 1x (inside): 50%
    rows.append(
        _row(dtype="fp64", kappa=1e4, kappa_actual=1e4, cond_u_line=1e-12, relative_forward_error=2e-11)
    )
    rows.append(
        _row(dtype="fp64", kappa=1e4, kappa_actual=1e4, cond_u_line=1e-12, relative_forward_error=1e-12)
    )
    # a refusal is no failure and no solve
    rows.append(_row(solver="early", kappa=1e4, kappa_actual=1e4, failure="UnsupportedExponentError"))
    text = A._precision(H, pd.DataFrame(rows))
    assert "50% in fp64 and 67% in fp32 are within 10 cond(f,A)·u" in text
    assert "passes 0.01 at κ = 1e6" in text
    assert "1 of 2 methods keep the median error below 0.01 until that κ (earlier: early at κ = 1e4)" in text
    assert "NotPositiveDefiniteError (100% of them)" in text
    assert "error_vs_kappa.png" in text


def test_eps_finding_by_hand():
    rows = []
    # fp64 rounding at eps = 0: 1e-14 at kappa 1e4, 1e-10 at 1e8; fp32 rounding 1e-5 at 1e4
    for k, r64, r32 in ((1e4, 1e-14, 1e-5), (1e8, 1e-10, 1e-1)):
        rows.append(_row(dtype="fp64", kappa=k, relative_forward_error=r64))
        rows.append(_row(dtype="fp32", kappa=k, relative_forward_error=r32))
    # biases: 1e-12 rel adds 1e-9 at 1e4 (1e5x fp64's rounding) and 1e-6 at 1e8 (1e4x: the least);
    # Google's 1e-6 rel adds 2e-3 at kappa 1e4
    for k, eps, bias in ((1e4, 1e-12, 1e-9), (1e8, 1e-12, 1e-6), (1e4, 1e-6, 2e-3), (1e8, 1e-6, 0.7)):
        rows.append(_row(kappa=k, eps=eps, eps_mode="relative", eps_bias=bias, relative_forward_error=1e-7))
    # an absolute eps, another family and eigh's pseudo-inverse policy are not read
    rows.append(_row(kappa=1e4, eps=1e-12, eps_mode="absolute", eps_bias=1.0))
    rows.append(_row(family="lowrank", kappa=1e4, eps=1e-12, eps_mode="relative", eps_bias=1.0))
    rows.append(_row(solver="eigh[pseudo_inverse]", kappa=1e4, eps=1e-12, eps_mode="relative", eps_bias=1.0))
    text = A._eps(H, pd.DataFrame(rows))
    assert "(1e-12 relative) already moves the root by at least 1e+04× the fp64 rounding error" in text
    assert "(1e-06 relative) moves it by 2.0e-03 at κ = 1e4, where fp32 rounds it to 1.0e-05" in text


def test_cost_finding_by_hand():
    rows = []
    # fp32 kappa 1e0-1e4: eigh 100 and 300 (median 200); x 500; y 400 but never solves (median error
    # infinite: not an accurate root, so not the cheapest "other"); the nonsymmetric family is not read
    for s, cost, err in (("eigh", 100, 1e-6), ("eigh", 300, 1e-6), ("x", 500, 1e-6), ("y", 400, None)):
        rows.append(
            _row(
                solver=s,
                kappa=10.0,
                kappa_actual=10.0,
                gemm_equivalents=cost,
                relative_forward_error=np.nan if err is None else err,
                failure="NotConverged" if err is None else "",
            )
        )
    rows.append(_row(solver="x", family="nonsymmetric", kappa=10.0, kappa_actual=10.0, gemm_equivalents=1.0))
    text = A._cost(H, pd.DataFrame(rows))
    assert "fp32 κ 1e0–1e4: eigh 200, x 500" in text
    assert "fp64 κ" not in text  # no fp64 band without rows
    assert "cost_accuracy.png" in text
