"""fp32, bf16 and fp16: within the documented bound for the format, or the failure is reported.

The bound is that of tests/test_solvers_accuracy.py with u of the working format,
C * (1 + kappa/p) * u * sqrt(n), C = 10, measured against the mpmath reference of the float64 input
(so it includes the error of rounding A to the format, which is why kappa/p appears). A reported failure
is a typed MatrootsError (e.g. NotPositiveDefiniteError when rounding made the matrix indefinite) or
``converged=False`` with a ConvergenceWarning. A silently wrong answer (converged, error above the bound)
fails. Once the bound exceeds 1 the first-order theory promises nothing; those cases still must not
return non-finite values without saying so.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from _refs import U, fwd_bound, ref_inverse_root, rel_err, spd_matrix

import matroots

N = 16
METHODS = ("eigh", "coupled_newton", "schur_newton")
FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KAPPAS = {"fp32": (1e1, 1e2, 1e4, 1e8), "bf16": (1e1, 1e2, 1e4), "fp16": (1e1, 1e2, 1e4, 1e8)}


def _check(A, p, method, dtype, u, kappa, compute_dtype=None, lmax_scale=1.0):
    ref = ref_inverse_root(A, p)
    bound = fwd_bound(kappa, p, A.shape[0], u)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = matroots.inverse_root(
                torch.from_numpy(A), p, method=method, dtype=dtype, compute_dtype=compute_dtype
            )
    except matroots.MatrootsError:
        return "raised"
    assert res.root.dtype == dtype
    if not res.converged:
        assert any(issubclass(w.category, matroots.ConvergenceWarning) for w in caught)
        return "reported"
    assert bool(torch.isfinite(res.root).all())
    err = rel_err(res.root, ref)
    assert err <= bound, (
        f"silently wrong: {method} {dtype} kappa={kappa:g} p={p}: error {err:.2e} > bound {bound:.2e} "
        f"(stop: {res.info.get('stop_reason')})"
    )
    return "ok"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_low_precision_within_bound_or_reported(method, fmt):
    dtype, u = FORMATS[fmt], U[fmt]
    outcomes = {}
    for kappa in KAPPAS[fmt]:
        A = spd_matrix(N, kappa, seed=round(math.log10(kappa)), lmax=3.0)
        for p in (1, 2, 4, 8):
            outcomes[(kappa, p)] = _check(A, p, method, dtype, u, kappa)
    # Where the bound is meaningful (< 1/2), every solver must actually deliver, not just report.
    for (kappa, p), outcome in outcomes.items():
        if fwd_bound(kappa, p, N, u) < 0.5:
            assert outcome == "ok", (method, fmt, kappa, p, outcome)


@pytest.mark.parametrize("method", METHODS)
def test_fp16_large_magnitude_is_prescaled(method):
    """Entries far beyond fp16's range (65504) are handled by an exact power-of-two prescale."""
    A = spd_matrix(N, 1e2, seed=5, lmax=1e7)
    assert _check(A, 2, method, torch.float16, U["fp16"], 1e2) == "ok"


@pytest.mark.parametrize("method", METHODS)
def test_mixed_precision_bf16_storage_fp32_compute(method):
    """dtype=bf16 with compute_dtype=fp32: the input is rounded to bf16, the arithmetic runs in fp32."""
    A = spd_matrix(N, 1e2, seed=2)
    assert _check(A, 2, method, torch.bfloat16, U["bf16"], 1e2, compute_dtype=torch.float32) == "ok"


def test_eigh_says_it_computed_in_fp32_for_16bit_formats():
    A = torch.from_numpy(spd_matrix(8, 10.0, seed=1))
    for dt in (torch.bfloat16, torch.float16):
        res = matroots.inverse_root(A, 2, method="eigh", dtype=dt)
        assert "fp32" in res.info["compute_dtype_fallback"]
        assert res.dtype == dt and res.root.dtype == dt


@pytest.mark.parametrize("method", METHODS)
def test_rounding_to_indefinite_is_reported(method):
    """kappa 1e8 rounded to bf16 (u = 3.9e-3) is indefinite: a typed error or converged=False."""
    A = spd_matrix(N, 1e8, seed=8)
    outcome = _check(A, 2, method, torch.bfloat16, U["bf16"], 1e8)
    assert outcome in ("raised", "reported", "ok")
    if outcome == "ok":  # only acceptable because the bound is vacuous here
        assert fwd_bound(1e8, 2, N, U["bf16"]) > 1


def test_default_tolerance_scales_with_format():
    n = 64
    tols = [
        matroots.core.precision.default_tol(dt, n) for dt in (torch.float64, torch.float32, torch.bfloat16)
    ]
    assert tols[0] < tols[1] < tols[2]
    assert tols[1] == pytest.approx(4 * math.sqrt(n) * 2.0**-24)
    assert np.isfinite(tols).all()
