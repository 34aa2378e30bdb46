"""fp64 accuracy of the three solvers against an independent mpmath reference (tests/_refs.py).

Bound (stated once, used everywhere): relative forward error in the Frobenius norm

    ||X - X_ref||_F / ||X_ref||_F <= C * cond(V)^2 * (1 + kappa/p) * u * sqrt(n),   C = 10,

with kappa = max|lambda|/min|lambda|, u the unit roundoff of the working format, cond(V) = 1 for
symmetric input and the eigenvector condition number for general input A = V B V^{-1}. kappa/p is the
relative condition number of A^{-1/p} (docs/design.md §4); for the forward root A^{1/p} it is smaller, so
the same bound is a safe one.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from _refs import (
    C_FWD,
    U,
    complex_spectrum_matrix,
    fwd_bound,
    haar_orthogonal,
    ref_inverse_root,
    ref_power,
    rel_err,
    spd_matrix,
    spectral_condition,
)

import matroots
from matroots.core.options import EPS_MODES

N = 16
KAPPAS = (1e1, 1e4, 1e8, 1e12)
PS = (1, 2, 3, 4, 8)
METHODS = ("eigh", "coupled_newton", "schur_newton")


def _spd(kappa: float) -> np.ndarray:
    return spd_matrix(N, kappa, seed=round(math.log10(kappa)))


def test_bound_constant_is_small():
    assert C_FWD <= 10


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kappa", KAPPAS)
def test_spd_geometric_spectrum_fp64(method, kappa):
    A = _spd(kappa)
    for p in PS:
        res = matroots.inverse_root(torch.from_numpy(A), p, method=method)
        assert res.converged, (method, kappa, p, res.info.get("stop_reason"))
        err = rel_err(res.root, ref_inverse_root(A, p))
        bound = fwd_bound(kappa, p, N, U["fp64"])
        assert err <= bound, f"{method} kappa={kappa:g} p={p}: error {err:.2e} > bound {bound:.2e}"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kappa", (1e1, 1e4, 1e8))
def test_spd_forward_root_fp64(method, kappa):
    """matroots.root computes A^{1/p}; its condition number is below that of A^{-1/p}."""
    A = _spd(kappa)
    for p in (1, 2, 3, 4):
        res = matroots.root(torch.from_numpy(A), p, method=method)
        assert res.converged
        err = rel_err(res.root, ref_power(A, Fraction(1, p)))
        assert err <= fwd_bound(kappa, p, N, U["fp64"]), (method, kappa, p, err)


@pytest.mark.parametrize("method", ("schur_newton", "coupled_newton"))
@pytest.mark.parametrize("seed", (0, 1, 2))
@pytest.mark.parametrize("n", (8, 11))
def test_nonsymmetric_complex_eigenvalues_fp64(method, seed, n):
    """V blockdiag(r R(theta)) V^{-1}, |theta| <= 1.2 (and a real eigenvalue when n is odd)."""
    A, cond_v = complex_spectrum_matrix(n, seed, max_arg=1.2)
    assert np.abs(np.linalg.eigvals(A).imag).max() > 0.1  # really complex
    kappa = spectral_condition(A)
    opts = {"scaling": "frobenius"} if method == "coupled_newton" else {}
    for p in (1, 2, 3, 4, 8):
        res = matroots.inverse_root(torch.from_numpy(A), p, method=method, **opts)
        assert res.converged, (method, p, res.info.get("stop_reason"))
        err = rel_err(res.root, ref_inverse_root(A, p))
        bound = fwd_bound(kappa, p, n, U["fp64"], cond_v)
        assert err <= bound, f"{method} n={n} seed={seed} p={p}: {err:.2e} > {bound:.2e}"


@pytest.mark.parametrize("seed", (0, 1, 2, 3))
def test_nonsymmetric_near_negative_axis_is_right_or_reported(seed):
    """Eigenvalue arguments up to 2.5 rad: schur_newton is accurate; coupled_newton (no square roots
    first) may be drawn to a non-principal root, which must be reported, never returned silently."""
    n = 8
    A, cond_v = complex_spectrum_matrix(n, seed, max_arg=2.5)
    kappa = spectral_condition(A)
    for p in (1, 2, 3, 4, 8):
        ref = ref_inverse_root(A, p)
        bound = fwd_bound(kappa, p, n, U["fp64"], cond_v)
        res = matroots.inverse_root(torch.from_numpy(A), p, method="schur_newton")
        assert res.converged and rel_err(res.root, ref) <= bound
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", matroots.ConvergenceWarning)
            res = matroots.inverse_root(torch.from_numpy(A), p, method="coupled_newton", scaling="frobenius")
        if res.converged:
            assert rel_err(res.root, ref) <= bound, (seed, p, res.info.get("stop_reason"))
        else:
            assert res.info["stop_reason"][0] in (
                "non_principal_root",
                "divergence",
                "max_iter",
                "stagnation",
            )


@pytest.mark.parametrize("p", (Fraction(3, 2), 2.5, 1 / 3, Fraction(2, 3), 0.5))
def test_eigh_rational_p(p):
    A = _spd(1e4)
    res = matroots.inverse_root(torch.from_numpy(A), p, method="eigh")
    err = rel_err(res.root, ref_inverse_root(A, p))
    assert err <= fwd_bound(1e4, float(Fraction(p).limit_denominator(10**6)), N, U["fp64"])


def _diag_ref(lam: np.ndarray, p: float) -> np.ndarray:
    return np.diag(lam ** (-1.0 / p))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("eps_mode", EPS_MODES)
def test_eps_closed_form_on_diagonal(method, eps_mode):
    """(A + eps_abs I)^{-1/p} on a diagonal A, with eps_abs = eps or eps * lambda_max (closed form)."""
    lam = np.array([1e-6, 1e-3, 0.1, 0.5, 2.0, 8.0])  # clear top gap: power iteration is exact here
    A = np.diag(lam)
    eps = 1e-4
    eps_abs = eps if eps_mode == "absolute" else eps * lam.max()
    for p in (1, 2, 4):
        res = matroots.inverse_root(torch.from_numpy(A), p, method=method, eps=eps, eps_mode=eps_mode)
        ref = _diag_ref(lam + eps_abs, p)
        kappa = (lam.max() + eps_abs) / (lam.min() + eps_abs)
        assert rel_err(res.root, ref) <= fwd_bound(kappa, p, len(lam), U["fp64"])
        got = res.info["eps_abs"]
        got = float(got[0]) if not isinstance(got, float) else got
        assert math.isclose(got, eps_abs, rel_tol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_eps_absolute_fp16_is_in_user_units(method):
    """fp16 inputs are pre-scaled by a power of two; an absolute eps must be scaled with them."""
    A = np.diag([1000.0, 3000.0])
    res = matroots.inverse_root(torch.from_numpy(A), 1, method=method, eps=1000.0, dtype=torch.float16)
    np.testing.assert_allclose(res.root.double().diagonal().numpy(), [1 / 2000, 1 / 4000], rtol=4e-3)


def _psd_with_null(n: int = 10, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Q = haar_orthogonal(n, rng)
    lam = np.array([0.0, 0.0, -1e-3, 1e-2, 0.1, 0.3, 1.0, 2.0, 4.0, 8.0])
    A = (Q * lam) @ Q.T
    return 0.5 * (A + A.T), Q, lam


@pytest.mark.parametrize("p", (1, 2, 4))
def test_eigh_clamp_closed_form(p):
    A, Q, lam = _psd_with_null()
    atol = 1e-3 * 8.0
    res = matroots.inverse_root(torch.from_numpy(A), p, method="eigh", rank_policy="clamp", atol=atol)
    ref = (Q * np.maximum(lam, atol) ** (-1.0 / p)) @ Q.T
    assert rel_err(res.root, ref) <= fwd_bound(8.0 / atol, p, len(lam), U["fp64"])
    assert int(res.info["clamped"][0]) == 3


@pytest.mark.parametrize("p", (1, 2, 4))
def test_eigh_pseudo_inverse_closed_form(p):
    A, Q, lam = _psd_with_null()
    res = matroots.inverse_root(
        torch.from_numpy(A), p, method="eigh", rank_policy="pseudo_inverse", atol=1e-3
    )
    keep = lam > 1e-3
    f = np.where(keep, np.maximum(np.abs(lam), 1e-300) ** (-1.0 / p), 0.0)
    ref = (Q * f) @ Q.T
    assert rel_err(res.root, ref) <= fwd_bound(8.0 / 1e-2, p, len(lam), U["fp64"])
    assert int(res.info["dropped"][0]) == 3
    # forward root: the eigenvalues below the threshold are dropped as well
    res = matroots.root(torch.from_numpy(A), p, method="eigh", rank_policy="pseudo_inverse", atol=1e-3)
    ref = (Q * np.where(keep, np.abs(lam) ** (1.0 / p), 0.0)) @ Q.T
    assert rel_err(res.root, ref) <= fwd_bound(8.0 / 1e-2, p, len(lam), U["fp64"])


def test_eigh_pseudo_inverse_of_zero_is_zero():
    res = matroots.inverse_root(
        torch.zeros(4, 4, dtype=torch.float64), 2, method="eigh", rank_policy="pseudo_inverse"
    )
    assert torch.equal(res.root, torch.zeros(4, 4, dtype=torch.float64))
