"""halley: the coupled Halley ([1/1] Padé) iteration for A^{-1/p} of SPD matrices, cubic convergence.

Accuracy bound and reference: tests/_matmul_roots.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from _matmul_roots import check_accurate_or_reported
from _refs import spd_matrix

import matroots
from matroots.solvers.halley import cubic_constant

METHOD = "halley"
N = 16


@pytest.mark.parametrize("scaling", ("centred", "lambda_max"))
@pytest.mark.parametrize("kappa", (1e1, 1e4, 1e8))
@pytest.mark.parametrize("p", (1, 2, 3, 4, 8))
def test_geometric_spectrum_fp64_converges_within_the_bound(kappa: float, p: int, scaling: str) -> None:
    A = spd_matrix(N, kappa, seed=p)
    assert check_accurate_or_reported(METHOD, A, p, torch.float64, scaling=scaling) == "converged"


def test_refusals() -> None:
    G = torch.triu(torch.ones(4, 4, dtype=torch.float64)) + 3 * torch.eye(4, dtype=torch.float64)
    with pytest.raises(matroots.NotSymmetricError):
        matroots.inverse_root(G, 2, method=METHOD)
    with pytest.raises(matroots.InvalidArgumentError, match="inverse roots only"):
        matroots.root(torch.eye(4, dtype=torch.float64), 2, method=METHOD)
    with pytest.raises(matroots.UnsupportedExponentError):
        matroots.inverse_root(torch.eye(4, dtype=torch.float64), 1.5, method=METHOD)
    with pytest.raises(matroots.InvalidArgumentError, match="scaling"):
        matroots.solvers.get(METHOD, scaling="optimal")


@pytest.mark.parametrize("method", ("halley", "polar_express"))
@pytest.mark.parametrize("p", (1, 3))
def test_odd_p_on_an_indefinite_matrix_is_refused_not_a_real_root(method: str, p: int) -> None:
    """For odd p, -|lambda|^{1/p} is a real p-th root of a negative eigenvalue, which the iteration
    can reach with a small residual. Whether Lanczos proves the negative eigenvalue first or the root's
    Cholesky finds it afterwards, the answer is a typed NotPositiveDefiniteError, never a converged root."""
    # 2 Lanczos steps do not prove the eigenvalue -1e-3 (the Ritz values stay inside [1e-2, 1]), so
    # the iteration runs; halley then converges to the real non-principal root, which Cholesky refuses
    lam = np.concatenate([np.geomspace(1e-2, 1.0, 31), [-1e-3]])
    Q = np.linalg.qr(np.random.default_rng(1).standard_normal((32, 32)))[0]
    A = 0.5 * ((Q * lam) @ Q.T + ((Q * lam) @ Q.T).T)
    with pytest.raises(matroots.NotPositiveDefiniteError, match="not positive definite"):
        matroots.inverse_root(torch.from_numpy(A), p, method=method, lanczos_steps=2)


def test_a_matrix_singular_in_the_compute_format_is_a_typed_refusal() -> None:
    """[[1, 1], [1, 1]] + 1e-12 I is positive definite (its float64 Cholesky succeeds), but 1 + 1e-12
    rounds to 1 in fp32, so M_0 has four equal entries and the p = 1 denominator 2 M_0 has an exactly zero
    LU pivot on every kernel (a - (a/a) a = 0): a NotPositiveDefiniteError, never torch's LinAlgError."""
    A = torch.ones(2, 2, 2, dtype=torch.float64)
    A[1] = torch.eye(2, dtype=torch.float64) + 0.5  # a healthy element beside it: the batch is refused
    with pytest.raises(matroots.NotPositiveDefiniteError, match="singular in fp32"):
        matroots.inverse_root(A, 1, method=METHOD, dtype="fp32", eps=1e-12, eps_mode="absolute")


def test_cubic_convergence_and_iteration_count() -> None:
    """kappa 10, p = 4, fp64: the count is the scalar model's (m -> m h(m)^4 on the eigenvalues of
    A/c^p, c^p as reported), and the residual is cubic: per eigenvalue f(1 + e) - 1 = C_p e^3 + O(e^4)
    with C_p = (p^2 - 1)/(12 p^2), so ||M_{k+1} - I||_F <= C_p ||M_k - I||_F^3 (1 + O(r)); checked as
    <= 2 C_p r^3 for r <= 0.05 (the O(e^4) term is below e/|C_p| < 1 there) above the rounding floor."""
    p = 4
    lam = np.geomspace(0.1, 1.0, N)
    Q = np.linalg.qr(np.random.default_rng(0).standard_normal((N, N)))[0]
    A = 0.5 * ((Q * lam) @ Q.T + ((Q * lam) @ Q.T).T)
    tol = 1e-9
    res = matroots.inverse_root(torch.from_numpy(A), p, method=METHOD, tol=tol, record_history=True)
    assert res.converged
    m = lam / float(res.info["c_power"][0])
    k = 0
    while math.sqrt(float(((m - 1) ** 2).sum())) > tol:
        h = ((p + 1) + (p - 1) * m) / ((p - 1) + (p + 1) * m)
        m, k = m * h**p, k + 1
    assert res.iterations == k
    r = [float(h) for h in res.history]
    for a, b in itertools.pairwise(r):
        if 1e-4 < a <= 0.05:
            assert b <= 2 * cubic_constant(p) * a**3, r
    assert res.matmuls == pytest.approx(
        (4 / 3 + 1 + 2 + 1) * res.iterations + min(24, N) / N + 1 / 6
    )  # Lanczos <= n matvecs; Cholesky


def test_fewer_iterations_than_coupled_newton() -> None:
    """Cubic against quadratic, and the centred start halves the log-range: fewer iterations."""
    A = torch.from_numpy(spd_matrix(32, 1e6, seed=7))
    ha = matroots.inverse_root(A, 4, method=METHOD)
    cn = matroots.inverse_root(A, 4, method="coupled_newton")
    assert ha.converged and cn.converged
    assert ha.iterations < cn.iterations and ha.matmuls < cn.matmuls


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_iterate_is_a_typed_failure_not_a_lapack_crash(bad: float) -> None:
    """An iterate that overflowed (seen in a Shampoo fp32 run under a different kernel path): LU of a
    NaN matrix gives invalid pivots and MKL's getrs raised RuntimeError ('Pivots given to lu_solve must
    all be greater or equal to 1'), which no failure policy catches. It is masked as failed instead."""
    from matroots.solvers.halley import halley_factor

    M = torch.eye(4, dtype=torch.float32).repeat(3, 1, 1)
    M[1, 2, 1] = bad
    P, failed = halley_factor(M, 2)
    assert failed.tolist() == [False, True, False]
    torch.testing.assert_close(P[0], torch.eye(4), rtol=0, atol=1e-6)  # M = I: P = I, the fixed point
    assert bool(torch.isfinite(P).all())
