"""The robustness harness's own yardstick (matroots.study.robustness_reference.reference_root) on defective input.

A non-symmetric matrix without a usable eigenbasis (a Jordan block, exactly representable in every
format, or a 16-bit rounding that makes two eigenvectors parallel) used to break the eigen-route
V diag(f(lambda)) V^-1: mpmath.eig returns (nearly) parallel eigenvectors, and either
``mpmath.inverse`` raised ZeroDivisionError (a crash of the harness, not of a solver) or the product
was a wrong reference (the square root of [[1, 1], [0, 1]] came out as I, so a correct solver would be
called silent wrong and a wrong one correct). Judged here against closed forms and scipy, never the
code under test.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import scipy.linalg

from matroots.study import robustness_reference


def _jordan(lam: float, n: int) -> np.ndarray:
    return lam * np.eye(n) + np.diag(np.ones(n - 1), 1)


def _jordan_function(lam: float, n: int, e: Fraction) -> np.ndarray:
    """f(J) for f(x) = x^e on the Jordan block J = lam I + N: sum_k f^(k)(lam)/k! N^k (closed form,
    Higham 2008, eq. (1.4)); the binomial coefficients C(e, k) lam^(e - k) exactly in Fractions."""
    out = np.zeros((n, n))
    coef = Fraction(1)
    for k in range(n):
        out += float(coef) * lam ** (float(e) - k) * np.diag(np.ones(n - k), k)
        coef = coef * (e - k) / (k + 1)
    return out


def _mp_to_np(X) -> np.ndarray:
    return np.array([[float(mpmath.re(X[i, j])) for j in range(X.cols)] for i in range(X.rows)])


@pytest.mark.parametrize("n", (2, 3))
@pytest.mark.parametrize("e", (Fraction(1, 2), Fraction(-1, 2), Fraction(-1, 3), Fraction(2)))
def test_reference_of_a_jordan_block_is_the_closed_form(n, e):
    """reference_root on an exactly defective matrix: no exception, f(J) to ~1e-14 of the closed form
    (the fp64 closed form's own rounding: a few u times the sum of |terms|), and the condition number
    within 1e-4 of central differences of scipy's fractional_matrix_power (Schur-Pade, independent of
    mpmath; step 1e-5: truncation ~1e-10, rounding ~1e-16/1e-5)."""
    lam = 0.5
    J = _jordan(lam, n)
    ref = robustness_reference.reference_root(J, 0, 0.0, e, symmetric=False, u=2.0**-11)
    assert ref["exists"]
    want = _jordan_function(lam, n, e)
    err = np.abs(_mp_to_np(ref["X"]) - want).max() / np.abs(want).max()
    assert err <= 1e-14, err

    f = lambda A: np.real(scipy.linalg.fractional_matrix_power(A, float(e)))  # noqa: E731
    h = 1e-5
    K = np.zeros((n * n, n * n))
    for j in range(n):
        for i in range(n):
            E = np.zeros((n, n))
            E[i, j] = 1.0
            K[:, i + j * n] = ((f(J + h * E) - f(J - h * E)) / (2 * h)).flatten(order="F")
    fd = np.linalg.norm(K, 2) * np.linalg.norm(J) / np.linalg.norm(f(J))
    assert math.isclose(ref["cond"], fd, rel_tol=1e-4), (ref["cond"], fd)


def test_defective_reference_is_scaled_exactly():
    """The same Jordan block at 2^-600 (A_s 2^-k with k = 600, as the solvers' prescale reports it):
    f scales by 2^(-600 e) exactly, cond is scale invariant."""
    e = Fraction(-1, 2)
    J = _jordan(0.5, 3)
    one = robustness_reference.reference_root(J, 0, 0.0, e, symmetric=False)
    tiny = robustness_reference.reference_root(J, 600, 0.0, e, symmetric=False)
    with mpmath.workdps(robustness_reference.REF_DPS):
        scale = mpmath.power(2, 300)  # (2^-600)^(-1/2)
        for i in range(3):
            for j in range(3):
                a, b = mpmath.re(tiny["X"][i, j]), mpmath.re(one["X"][i, j]) * scale
                assert abs(a - b) <= mpmath.mpf(10) ** -40 * (abs(b) + scale)
    assert math.isclose(one["cond"], tiny["cond"], rel_tol=1e-10)


def test_diagonalisable_input_keeps_the_eigen_route():
    """A well-conditioned eigenbasis still takes the eigen-route (no 'defective' mark): the answer
    agrees with scipy's sqrtm to fp64 rounding."""
    rng = np.random.default_rng(0)
    V = np.eye(4) + 0.3 * rng.standard_normal((4, 4))
    A = V @ np.diag([1.0, 0.5, 0.25, 0.125]) @ np.linalg.inv(V)
    ref = robustness_reference.reference_root(A, 0, 0.0, Fraction(1, 2), symmetric=False)
    assert "defective" not in ref
    want = np.real(scipy.linalg.sqrtm(A))
    assert np.abs(_mp_to_np(ref["X"]) - want).max() <= 1e-12 * np.abs(want).max()
