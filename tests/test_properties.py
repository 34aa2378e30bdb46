"""Hypothesis property tests on random small SPD matrices, for every solver.

For X = inverse_root(A, p), with kappa = cond_2(A), u = 2^-53, evaluated exactly in mpmath:

* X^{-p} ~ A:  ||X^{-p} - A||_F / ||A||_F <= C (1 + kappa/p + p kappa^{1/p}) u sqrt(n)
  (a backward error: the (1 + kappa/p) part is the forward bound of test_solvers_accuracy.py; the
  p kappa^{1/p} part is what rounding X's own entries to float64 costs, since cond(X) = kappa^{1/p}
  and X^{-p} has p factors);
* X commutes with A:  ||X A - A X||_F / (||X||_F ||A||_F) <= C (1 + kappa/p) u sqrt(n),

with the same C = 10.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import torch
from _refs import C_FWD, U, haar_orthogonal
from hypothesis import given, settings
from hypothesis import strategies as st

import matroots

METHODS = ("eigh", "coupled_newton", "schur_newton")


@st.composite
def spd_problems(draw):
    n = draw(st.integers(2, 8))
    log_kappa = draw(st.floats(0.0, 8.0))
    scale = 10.0 ** draw(st.floats(-3.0, 3.0))
    seed = draw(st.integers(0, 2**16))
    p = draw(st.sampled_from([1, 2, 3, 4]))
    rng = np.random.default_rng(seed)
    logs = np.concatenate([[-log_kappa, 0.0], rng.uniform(-log_kappa, 0.0, n - 2)])
    Q = haar_orthogonal(n, rng)
    A = (Q * (scale * 10.0**logs)) @ Q.T
    return 0.5 * (A + A.T), p


def _mp(M: np.ndarray) -> mpmath.matrix:
    return mpmath.matrix(M.tolist())


def _np(M: mpmath.matrix) -> np.ndarray:
    return np.array([[float(M[i, j]) for j in range(M.cols)] for i in range(M.rows)])


def _check(A: np.ndarray, p: int, method: str) -> None:
    n = A.shape[0]
    res = matroots.inverse_root(torch.from_numpy(A), p, method=method)
    assert res.converged
    X = res.root.numpy()
    kappa = float(np.linalg.cond(A))
    u = U["fp64"]
    with mpmath.workdps(60):
        Xm, Am = _mp(X), _mp(A)
        back = _np(mpmath.inverse(Xm) ** p - Am)
        comm = _np(Xm * Am - Am * Xm)
    back_err = np.linalg.norm(back) / np.linalg.norm(A)
    back_bound = C_FWD * (1 + kappa / p + p * kappa ** (1 / p)) * u * math.sqrt(n)
    assert back_err <= back_bound, (method, n, kappa, p, back_err, back_bound)
    comm_err = np.linalg.norm(comm) / (np.linalg.norm(X) * np.linalg.norm(A))
    assert comm_err <= C_FWD * (1 + kappa / p) * u * math.sqrt(n), (method, n, kappa, p, comm_err)


@settings(max_examples=60, deadline=None)
@given(spd_problems())
def test_eigh_properties(problem):
    _check(*problem, "eigh")


@settings(max_examples=60, deadline=None)
@given(spd_problems())
def test_coupled_newton_properties(problem):
    _check(*problem, "coupled_newton")


@settings(max_examples=60, deadline=None)
@given(spd_problems())
def test_schur_newton_properties(problem):
    _check(*problem, "schur_newton")
