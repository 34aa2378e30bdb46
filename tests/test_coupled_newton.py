"""coupled_newton: iteration counts against the scalar model, scalings, warm starts, honest failure.

Scalar model (docs/design.md §4): on a diagonal A each eigenvalue follows m -> ((p+1-m)/p)^p m from
m_0 = lambda/c^p, so the matrix iteration's count is that of the scalar iterations run together under the
same stopping rule (||M_k - I||_F <= tol, or stagnation: the residual, once below 1/2, fails to halve).
The test re-implements that model here in numpy; it takes c from ``res.info["c_power"]`` but checks
separately that c is what the scaling's formula gives from the exact eigenvalues, within the documented
estimation slack: frobenius c^p = 2||A||_F/(p+1); power c^p = 2 lambda_max/(p+1); optimal c^p = Guo &
Higham's eq. (3.11), or Frobenius's c^p where the scalar model shows it takes strictly fewer steps.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from _refs import (
    U,
    complex_spectrum_matrix,
    fwd_bound,
    geometric_spectrum,
    haar_orthogonal,
    ref_inverse_root,
    ref_power,
    rel_err,
    spd_matrix,
    spectral_condition,
)

import matroots
from matroots.core.conditioning import cond_root

# Estimation slack on c^p: power iteration's Rayleigh quotient underestimates lambda_max by at most
# (lambda_2/lambda_1)^(2*20) relatively (<= 1e-7 for the spectra below, whose top ratio is <= 0.66);
# Lanczos (exact in n <= 24 steps) is inflated by its residual bound and a 1e-6 safety factor.
POWER_SLACK = 1e-6
OPTIMAL_SLACK = 1e-5
DATA = Path(__file__).parent / "data"


def scalar_iterations(lam: np.ndarray, p: int, cp: float, tol: float, max_iter: int = 100) -> int:
    m = lam / cp
    r = float(np.linalg.norm(m - 1))
    if r <= tol:
        return 0
    for k in range(1, max_iter + 1):
        m_new = ((p + 1 - m) / p) ** p * m
        r_new = float(np.linalg.norm(m_new - 1))
        if r_new <= tol or (r < 0.5 and r_new > 0.5 * r):
            return k
        m, r = m_new, r_new
    return max_iter


def expected_c_power(lam: np.ndarray, p: int, scaling: str) -> float:
    lmin, lmax = float(lam.min()), float(lam.max())
    if scaling == "frobenius":
        return 2.0 * float(np.linalg.norm(lam)) / (p + 1)
    if scaling == "power":
        return 2.0 * lmax / (p + 1)
    a = 1.0 / p  # Guo & Higham (2006), eq. (3.11)
    return (lmax ** (1 + a) - lmin ** (1 + a)) / ((p + 1) * (lmax**a - lmin**a))


def _solve(A, p, **kw):
    return matroots.inverse_root(torch.from_numpy(A), p, method="coupled_newton", **kw)


@pytest.mark.parametrize("kappa", (1e2, 1e4, 1e6, 1e10))
@pytest.mark.parametrize("p", (1, 2, 3, 4, 8))
def test_iterations_match_scalar_model(kappa, p):
    lam = geometric_spectrum(12, kappa, lmax=5.0)
    A = np.diag(lam[::-1].copy())
    counts = {}
    for scaling in ("frobenius", "power", "optimal"):
        res = _solve(A, p, scaling=scaling)
        assert res.converged
        cp = float(res.info["c_power"][0])
        want = expected_c_power(lam, p, scaling)
        tol = res.info["tol"]
        if scaling == "optimal" and res.info["c_choice"][0] != "guo_higham":
            # "optimal" takes Frobenius's c only where the scalar model says it is strictly faster
            want = expected_c_power(lam, p, "frobenius")
            gh = expected_c_power(lam, p, "optimal")
            assert scalar_iterations(lam, p, want, tol) < scalar_iterations(lam, p, gh, tol)
        slack = {"frobenius": 1e-12, "power": POWER_SLACK, "optimal": OPTIMAL_SLACK}[scaling]
        assert abs(cp - want) <= slack * want, (scaling, cp, want)
        if scaling == "power":
            assert cp <= want * (1 + 1e-12)  # the Rayleigh quotient never overestimates
        model = scalar_iterations(lam, p, cp, tol)
        assert abs(res.iterations - model) <= 1, (scaling, res.iterations, model)
        counts[scaling] = res.iterations
    assert counts["optimal"] <= counts["frobenius"]


@pytest.mark.parametrize("kappa", (1e1, 1e4, 1e8, 1e12))
@pytest.mark.parametrize("p", (1, 2, 4, 8))
def test_optimal_never_slower_than_frobenius_on_dense_spd(kappa, p):
    A = spd_matrix(16, kappa, seed=3)
    opt = _solve(A, p, scaling="optimal")
    fro = _solve(A, p, scaling="frobenius")
    assert opt.converged and fro.converged
    assert opt.iterations <= fro.iterations


@pytest.mark.parametrize("scaling", ("frobenius", "power", "optimal", "dynamic"))
@pytest.mark.parametrize("kappa", (1e4, 1e8))
def test_every_scaling_is_accurate(scaling, kappa):
    n = 16
    A = spd_matrix(n, kappa, seed=4)
    for p in (1, 2, 4):
        res = _solve(A, p, scaling=scaling)
        assert res.converged
        assert rel_err(res.root, ref_inverse_root(A, p)) <= fwd_bound(kappa, p, n, U["fp64"])


def test_history_and_matmul_accounting():
    A = spd_matrix(12, 1e3, seed=1)
    p = 4
    res = _solve(A, p, scaling="frobenius", record_history=True)
    assert len(res.history) == res.iterations + 1
    assert res.history[-1] == pytest.approx(res.residual)
    assert res.residual <= res.info["tol"]
    # p = 4: X T, T^2, T^4, T^4 M: four products per iteration (docs/design.md §4), plus the domain
    # test's Cholesky factorisation (1/6 of a product, solvers.spd_start.domain_test)
    assert res.matmuls == 4 * res.iterations + res.info["domain_matmuls"]
    assert res.info["domain_matmuls"] == 1 / 6


# --------------------------------------------------------------------------------------------------
# Warm starts


def _perturbed(A: np.ndarray, rel: float, seed: int, multiplicative: bool) -> np.ndarray:
    n = A.shape[0]
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((n, n))
    E = 0.5 * (E + E.T)
    E /= np.linalg.norm(E, 2)
    if multiplicative:  # (I + rel E) A (I + rel E): every eigenvalue moves by a relative O(rel)
        S = np.eye(n) + rel * E
        B = S @ A @ S
    else:  # A + rel ||A|| E
        B = A + rel * np.linalg.norm(A, 2) * E
    return 0.5 * (B + B.T)


def _warm_case(kappa: float, p: int, multiplicative: bool):
    n = 16
    A0 = spd_matrix(n, kappa, seed=11)
    A1 = _perturbed(A0, 1e-3, seed=12, multiplicative=multiplicative)
    assert np.linalg.eigvalsh(A1).min() > 0
    prev = _solve(A0, p)
    cold = _solve(A1, p)
    warm = _solve(A1, p, warm_start=prev)
    assert prev.converged and cold.converged and warm.converged
    bound = fwd_bound(spectral_condition(A1), p, n, U["fp64"])
    ref = ref_inverse_root(A1, p)
    assert rel_err(cold.root, ref) <= bound
    assert rel_err(warm.root, ref) <= bound, "warm start must keep the cold bound"
    return cold, warm


@pytest.mark.parametrize("kappa", (1e1, 1e2))
def test_warm_start_p1_needs_at_most_half_the_iterations(kappa):
    """p = 1: Newton-Schulz from the previous inverse (its true residual squares each step)."""
    cold, warm = _warm_case(kappa, 1, multiplicative=False)
    assert warm.iterations <= cold.iterations // 2, (warm.iterations, cold.iterations)
    assert "newton_schulz" in warm.info["warm_start"]


@pytest.mark.parametrize("p", (2, 4, 8))
@pytest.mark.parametrize("kappa", (1e2, 1e4, 1e6))
def test_warm_start_p_ge_2_is_correct_and_faster(kappa, p):
    """p >= 2: spectral interval from the previous root + dynamic scaling. It removes about half of the
    linear phase; the quadratic phase (~5 steps) remains, so the saving grows with kappa."""
    cold, warm = _warm_case(kappa, p, multiplicative=True)
    assert warm.iterations < cold.iterations
    if kappa >= 1e4:
        assert warm.iterations <= 0.7 * cold.iterations, (warm.iterations, cold.iterations)


@pytest.mark.xfail(
    strict=True,
    reason="Issue 2 asks for <= half the cold iterations. For p >= 2 no warm start that keeps the answer "
    "within the cold bound reaches it with products only: X_0 must be a function of A for the coupled "
    "iteration to converge to A^{-1/p}, so the previous root contributes only spectral bounds, and the "
    "true-residual Newton correction is unstable for kappa > ~10 (see coupled_newton's module docstring).",
)
@pytest.mark.parametrize("p", (2, 4))
def test_warm_start_p_ge_2_half_the_iterations(p):
    cold, warm = _warm_case(1e4, p, multiplicative=True)
    assert warm.iterations <= cold.iterations // 2


def test_warm_start_accepts_a_root_tensor_batch_and_fp16():
    A0 = np.stack([spd_matrix(8, 1e2, seed=s, lmax=300.0) for s in range(3)])
    A1 = np.stack([_perturbed(a, 1e-3, seed=s, multiplicative=True) for s, a in enumerate(A0)])
    prev = _solve(A0, 2, dtype=torch.float16)
    warm = _solve(A1, 2, dtype=torch.float16, warm_start=prev.root)
    assert bool(warm.converged.all())
    for b in range(3):
        bound = fwd_bound(spectral_condition(A1[b]), 2, 8, U["fp16"])
        assert rel_err(warm.root[b], ref_inverse_root(A1[b], 2)) <= bound


def test_warm_start_with_wrong_shape_is_refused():
    A = spd_matrix(8, 10.0, seed=1)
    with pytest.raises(matroots.InvalidArgumentError, match="warm_start"):
        _solve(A, 2, warm_start=torch.eye(5, dtype=torch.float64))
    with pytest.raises(matroots.InvalidArgumentError, match="warm_start"):  # the right size, too many
        _solve(A, 2, warm_start=torch.eye(8, dtype=torch.float64).expand(2, 8, 8))


@pytest.mark.parametrize("p", (1, 2, 4))
def test_naive_warm_start_would_be_wrong(p):
    """X_0 = previous root, M_0 = X_0^p A: M_k -> I, yet X_k does not converge to A^{-1/p} (X_0 does not
    commute with A). This is why coupled_newton does not warm-start that way."""
    n = 16
    A0 = spd_matrix(n, 1e2, seed=11)
    A1 = _perturbed(A0, 1e-3, seed=12, multiplicative=False)
    Z = _solve(A0, p).root.numpy()
    X, M = Z.copy(), np.linalg.matrix_power(Z, p) @ A1
    for _ in range(50):
        T = ((p + 1) * np.eye(n) - M) / p
        X, M = X @ T, np.linalg.matrix_power(T, p) @ M
        if np.linalg.norm(M - np.eye(n)) < 1e-13:
            break
    assert np.linalg.norm(M - np.eye(n)) < 1e-12  # the iteration "converged" ...
    err = rel_err(X, ref_inverse_root(A1, p))
    bound = fwd_bound(spectral_condition(A1), p, n, U["fp64"])
    if p == 1:
        assert err > 1e3 * bound  # X = Z (Z A1)^{-1} = Z A1^{-1} Z^{-1}: off by the commutator
    else:
        assert err > 1e3 * bound  # ... to the wrong matrix


# --------------------------------------------------------------------------------------------------
# General (nonsymmetric) input: never silently the wrong root


def test_non_principal_limit_is_reported():
    """Eigenvalues near the negative real axis can be drawn to a non-principal p-th root. The result
    must say so (converged=False, stop reason, warning) rather than pass for A^{-1/p}."""
    A, _ = complex_spectrum_matrix(8, 2, max_arg=2.5)
    p = 3
    with pytest.warns(matroots.ConvergenceWarning):
        res = _solve(A, p, scaling="frobenius")
    assert res.converged is False
    assert res.info["stop_reason"] == ["non_principal_root"]
    X = res.root.numpy()
    # independently: X is a p-th root of A^{-1} (so M_k -> I), just not the principal one
    assert np.linalg.norm(np.linalg.matrix_power(X, p) @ A - np.eye(8)) < 1e-8
    assert rel_err(X, ref_inverse_root(A, p)) > 0.1
    with pytest.raises(matroots.ConvergenceError):
        _solve(A, p, scaling="frobenius", strict=True)


@pytest.mark.parametrize("p", (1, 2, 3))
def test_general_real_matrix_with_positive_spectrum(p):
    rng = np.random.default_rng(3)
    n = 10
    V = np.eye(n) + 0.2 * rng.standard_normal((n, n))
    A = V @ np.diag(np.linspace(0.5, 4.0, n)) @ np.linalg.inv(V)
    res = _solve(A, p, scaling="frobenius")
    assert res.converged and res.info["symmetric"] is False
    bound = fwd_bound(spectral_condition(A), p, n, U["fp64"], np.linalg.cond(V))
    assert rel_err(res.root, ref_inverse_root(A, p)) <= bound


def test_orthogonal_basis_dense_diag_matches_diag_iterations():
    """Q diag(lambda) Q^T and diag(lambda) take the same iteration count (up to rounding: +-1)."""
    lam = geometric_spectrum(12, 1e6)
    Q = haar_orthogonal(12, np.random.default_rng(0))
    dense = _solve(0.5 * ((Q * lam) @ Q.T + ((Q * lam) @ Q.T).T), 2, scaling="frobenius")
    diag = _solve(np.diag(lam), 2, scaling="frobenius")
    assert abs(dense.iterations - diag.iterations) <= 1
    assert math.isclose(float(dense.info["c_power"][0]), float(diag.info["c_power"][0]), rel_tol=1e-12)


def test_quiet_when_converged():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _solve(spd_matrix(8, 10.0, seed=0), 2)


def test_warm_started_forward_root_is_correct():
    """matroots.root with a warm start (the previous A^{1/p}) keeps the cold bound."""
    n, p = 16, 2
    A0 = spd_matrix(n, 1e4, seed=11)
    A1 = _perturbed(A0, 1e-3, seed=12, multiplicative=True)
    prev = matroots.root(torch.from_numpy(A0), p, method="coupled_newton")
    cold = matroots.root(torch.from_numpy(A1), p, method="coupled_newton")
    warm = matroots.root(torch.from_numpy(A1), p, method="coupled_newton", warm_start=prev)
    assert warm.converged and warm.iterations < cold.iterations
    ref = ref_power(A1, Fraction(1, p))
    assert rel_err(warm.root, ref) <= fwd_bound(spectral_condition(A1), p, n, U["fp64"])


def test_true_residual_catches_a_drift_hidden_by_the_product_of_norms():
    """A non-normal matrix (kappa(V) = 8.7, eigenvalue arguments up to 0.62 pi, |lambda| 0.1-1) where
    the coupled iteration met tol at p = 8 with an error of 1.3e-12, 21 times the cond(f, A) bound
    (cond 39), and r = ||R||_2 / (||X||^p ||A||) = 0.3 of its floor: ||X||_2^8 = 1900 hides it. The
    first-order floor (||R||_F <= 4 (n + 1) u phi, coupled_newton_checks) sees ||R||_F = 249 u phi.
    Reference: mpmath.powm at 50 digits (scipy's fractional_matrix_power agrees to 1e-14)."""
    A = np.load(DATA / "coupled_newton_residual_drift.npz")["A"]
    res = matroots.inverse_root(torch.from_numpy(A), 8, method="coupled_newton")
    u = U["fp64"]
    bound = 5 * math.sqrt(8) * (cond_root(A, 8, inverse=True) + 1) * u
    if res.converged:  # a converged claim must be within the bound
        assert rel_err(res.root, ref_inverse_root(A, 8)) <= bound
    else:
        assert res.info["stop_reason"] == ["true_residual"]
        assert float(res.info["true_residual_floor_ratio"][0]) > 4 * (8 + 1)
