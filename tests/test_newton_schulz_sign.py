"""newton_schulz: the coupled Newton-Schulz sign-function iteration for A^{+-1/2^k} (SPD).

Accuracy bound and reference: tests/_matmul_roots.py (C (cond(f, A) + 1) u sqrt(n) against
matroots.truth.reference of the matrix actually solved).
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from _matmul_roots import check_accurate_or_reported
from _refs import spd_matrix

import matroots

METHOD = "newton_schulz"
N = 16


@pytest.mark.parametrize("kappa", (1e1, 1e4, 1e8))
@pytest.mark.parametrize("p", (1, 2, 4, 8))
def test_geometric_spectrum_fp64_converges_within_the_bound(kappa: float, p: int) -> None:
    A = spd_matrix(N, kappa, seed=p)
    assert check_accurate_or_reported(METHOD, A, p, torch.float64) == "converged"


@pytest.mark.parametrize("p", (1, 2, 4))
def test_forward_root_fp64(p: int) -> None:
    A = spd_matrix(N, 1e4, seed=3)
    assert check_accurate_or_reported(METHOD, A, p, torch.float64, inverse=False) == "converged"


def test_nonsymmetric_input_is_refused() -> None:
    G = torch.triu(torch.ones(4, 4, dtype=torch.float64)) + 3 * torch.eye(4, dtype=torch.float64)
    with pytest.raises(matroots.NotSymmetricError, match="symmetric"):
        matroots.inverse_root(G, 2, method=METHOD)


@pytest.mark.parametrize("p", (3, 6, 2.5))
def test_other_exponents_are_refused(p) -> None:
    with pytest.raises(matroots.UnsupportedExponentError, match=r"power of two|integer"):
        matroots.inverse_root(torch.eye(4, dtype=torch.float64), p, method=METHOD)


def test_indefinite_input_is_refused() -> None:
    A = torch.diag(torch.tensor([1.0, 0.5, -0.25], dtype=torch.float64))
    with pytest.raises(matroots.NotPositiveDefiniteError):
        matroots.inverse_root(A, 2, method=METHOD)


def _scalar_steps(lam: np.ndarray, c: float, tol: float) -> int:
    """Steps of the scalar map m -> m (3 - m)^2 / 4 until sqrt(sum (m - 1)^2) <= tol."""
    m = lam / c
    for k in range(1, 200):
        m = m * (3 - m) ** 2 / 4
        if math.sqrt(float(((m - 1) ** 2).sum())) <= tol:
            return k
    raise AssertionError("scalar model did not converge")


def test_quadratic_convergence_and_iteration_count() -> None:
    """Well conditioned (kappa 10, fp64): the iteration count is the scalar model's (m -> m(3-m)^2/4 on
    the eigenvalues of A/c, c = the reported lambda_max bound) and the residual squares: with
    e = m - 1, f(m) - 1 = -3e^2/4 + e^3/4, so ||M_{k+1} - I||_F <= ||M_k - I||_F^2 once it is < 1/2."""
    lam = np.geomspace(0.1, 1.0, N)
    Q = np.linalg.qr(np.random.default_rng(0).standard_normal((N, N)))[0]
    A = (Q * lam) @ Q.T
    A = 0.5 * (A + A.T)
    tol = 1e-9  # well above the rounding floor, so the test sees the exact-arithmetic count
    res = matroots.inverse_root(torch.from_numpy(A), 2, method=METHOD, tol=tol, record_history=True)
    assert res.converged
    c = float(res.info["c"][0])
    assert res.iterations == _scalar_steps(lam, c, tol)
    r = [float(h) for h in res.history]
    for a, b in itertools.pairwise(r):
        if 1e-7 < a < 0.5:
            assert b <= a * a, r
    assert res.matmuls == pytest.approx(
        3 * res.iterations + min(24, N) / N + 1 / 6
    )  # Lanczos <= n matvecs; Cholesky


def test_batch_matches_single_solves() -> None:
    A = np.stack([spd_matrix(N, k, seed=1) for k in (1e2, 1e6)])
    res = matroots.inverse_root(torch.from_numpy(A), 4, method=METHOD)
    for i in range(2):
        one = matroots.inverse_root(torch.from_numpy(A[i]), 4, method=METHOD)
        assert int(res.iterations[i]) == one.iterations
        # same arithmetic up to the batched kernels' rounding: the bound of the single solve
        err = float(torch.linalg.matrix_norm(res.root[i] - one.root) / torch.linalg.matrix_norm(one.root))
        assert err <= 10 * (1 + float(one.info["c"][0]) / float(one.info["lambda_min_est"][0])) * 2**-53 * N


def test_bf16_where_coupled_newton_cannot_run() -> None:
    """bf16, n = 256, p = 4: coupled_newton refuses (4 p sqrt(n) u >= 1); newton_schulz converges."""
    A = spd_matrix(256, 1e2, seed=2)
    with pytest.raises(matroots.UnsupportedExponentError):
        matroots.inverse_root(torch.from_numpy(A), 4, method="coupled_newton", dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", matroots.ConvergenceWarning)
        assert check_accurate_or_reported(METHOD, A, 4, torch.bfloat16) == "converged"
