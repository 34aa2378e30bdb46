"""eigh (and auto, which picks it) on numerically singular SPD input: never a converged inverse root
whose accuracy cannot be promised (issue 22, class 2).

The inverse root of A + shift I has relative condition number cond(A^{-1/p}) = max |f[l_i, l_j]| ||A||_F
/ ||f(A)||_F (Higham 2008, Cor. 3.16), evaluated here by mpmath at 50 digits on the exact spectrum
(independent of the code under test). Where cond u >= 1 no digit is promised and the answer must be
flagged (converged=False, stop reason "not_determined") or refused (NotPositiveDefiniteError); where
cond u << 1 it must be converged and within C sqrt(n) (1 + cond) u of the mpmath root.

Fixtures get their singularity from construction: A = B B^T with B an 8 x 7 matrix of small integers,
exact in fp32 and fp64 (every entry of A is an integer < 2^24), rank 7, lambda_min = 0 exactly.
"""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest
import torch

import matroots
from matroots.core.errors import NotPositiveDefiniteError
from matroots.solvers import spd_start

U = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
C_FWD = 10.0
U_BF16 = 2.0**-8


def singular_factor() -> np.ndarray:
    B = np.random.default_rng(5).integers(-4, 5, size=(8, 7)).astype(np.float64)
    A = B @ B.T  # integers: exact, symmetric by construction
    assert np.linalg.matrix_rank(B) == 7
    return A


def mp_reference(A: np.ndarray, shift: float, p: int) -> tuple[np.ndarray, float]:
    """(A + shift I)^(-1/p) and cond(A^{-1/p}) at 50 digits from mpmath's symmetric eigensolver."""
    n = A.shape[0]
    with mpmath.workdps(50):
        E, Q = mpmath.eigsy(mpmath.matrix(A.tolist()))
        lam = [E[i] + mpmath.mpf(shift) for i in range(n)]
        f = [x ** (-mpmath.mpf(1) / p) for x in lam]
        X = Q * mpmath.diag(f) * Q.T
        dd = max(
            abs((f[i] - f[j]) / (lam[i] - lam[j]))
            if abs(lam[i] - lam[j]) > mpmath.mpf(10) ** -40 * abs(lam[i])
            else abs(-f[i] / (p * lam[i]))
            for i in range(n)
            for j in range(n)
        )
        cond = dd * mpmath.sqrt(sum(x**2 for x in lam)) / mpmath.sqrt(sum(x**2 for x in f))
        Xn = np.array([[float(X[i, j]) for j in range(n)] for i in range(n)])
    return Xn, float(cond)


def lmax_exact(A: np.ndarray) -> float:
    with mpmath.workdps(50):
        return float(max(mpmath.eigsy(mpmath.matrix(A.tolist()))[0]))


@pytest.mark.parametrize("method", ["eigh", "eigh_warm", "auto"])
def test_singular_bf16_factor_is_flagged_not_converged(method):
    """bf16 (every entry of B B^T is an integer <= 112: exact), eps relative 1e-3: the matrix solved has
    lambda_min = 1e-3 lambda_max < u_bf16 lambda_max, so cond(A^{-1/2}) u_bf16 ~ 2 (mpmath below): no
    digit promised. LAPACK runs in fp32, whose eigenvalue error (~n u_32 lambda_max = 5e-7 lambda_max)
    is far below the shift on every CPU, so the computed spectrum is positive and the float64 Cholesky
    test flags it (not a refusal)."""
    A = singular_factor()
    _, cond = mp_reference(A, 1e-3 * lmax_exact(A), 2)
    assert cond * U_BF16 > 1.0
    At = torch.from_numpy(A).to(torch.bfloat16)
    with pytest.warns(matroots.ConvergenceWarning):
        res = matroots.inverse_root(At, 2, method=method, eps=1e-3, eps_mode="relative", dtype="bf16")
    assert not res.all_converged
    if method != "auto":
        assert res.info["stop_reason"] == ["not_determined"]
        assert float(res.info["domain_margin"][0]) == pytest.approx(U_BF16 * lmax_exact(A), rel=1e-2)


@pytest.mark.parametrize("method", ["eigh", "eigh_warm", "auto"])
def test_singular_fp32_factor_is_flagged_or_refused(method):
    """fp32, eps relative 1e-9: lambda_min = 1e-9 lambda_max, cond u_32 ~ 30. Here the margin
    u_32 lambda_max lies inside fp32 eigh's own eigenvalue error (n u_32 lambda_max), so whether the
    computed lambda_min is positive depends on the CPU's kernels: flagged (not_determined) on one,
    NotPositiveDefiniteError on another (ATEN_CPU_CAPABILITY=default); never converged."""
    A = singular_factor()
    _, cond = mp_reference(A, 1e-9 * lmax_exact(A), 2)
    assert cond * U[torch.float32] > 1.0
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        try:
            res = matroots.inverse_root(
                torch.from_numpy(A).float(), 2, method=method, eps=1e-9, eps_mode="relative"
            )
        except NotPositiveDefiniteError:
            return
    assert not res.all_converged


@pytest.mark.parametrize("method", ["eigh", "eigh_warm", "auto"])
def test_well_determined_shift_converges_within_the_bound(method):
    """eps relative 1e-4: cond(A^{-1/2}) u_32 ~ 3e-4: converged, within C sqrt(n) (1 + cond) u_32 of
    the mpmath root (the accuracy contract; C = 10)."""
    A = singular_factor()
    shift = 1e-4 * lmax_exact(A)
    X, cond = mp_reference(A, shift, 2)
    assert cond * U[torch.float32] < 1e-3
    res = matroots.inverse_root(torch.from_numpy(A).float(), 2, method=method, eps=1e-4, eps_mode="relative")
    assert res.all_converged
    err = np.linalg.norm(res.root.double().numpy() - X) / np.linalg.norm(X)
    assert err <= C_FWD * math.sqrt(8) * (1 + cond) * U[torch.float32], (err, cond)


@pytest.mark.parametrize("method", ["eigh", "eigh_warm", "auto"])
def test_issue_rounding_singular_fp64_matrix_is_flagged_or_refused(method):
    """The issue's 8 x 8: one exactly zero eigenvalue before rounding to fp64; the rounded matrix's exact
    lambda_min (mpmath) is within u_64 lambda_max of 0, so its inverse root is not determined:
    NotPositiveDefiniteError (the float64 Cholesky test cannot factor it) or converged=False."""
    q = np.linalg.qr(np.random.default_rng(8).standard_normal((8, 8)))[0]
    S = (q * np.r_[np.linspace(1, 0.5, 7), 0.0]) @ q.T
    S = (S + S.T) / 2
    with mpmath.workdps(50):
        lam = mpmath.eigsy(mpmath.matrix(S.tolist()))[0]
        assert abs(float(min(lam))) < U[torch.float64] * float(max(lam))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            res = matroots.inverse_root(torch.from_numpy(S), 2, method=method)
        except NotPositiveDefiniteError:
            return
    assert not res.all_converged
    assert any(issubclass(w.category, matroots.ConvergenceWarning) for w in seen)


def test_only_the_singular_element_of_a_batch_is_flagged():
    """bf16: a batch of the singular factor (eps 1e-3: cond u ~ 2) and a regular SPD one (lambda in
    [1, 2], rounded to bf16): the first flagged, the second converged and within the bound of the
    mpmath root of its rounded matrix."""
    A = singular_factor()
    q = np.linalg.qr(np.random.default_rng(2).standard_normal((8, 8)))[0]
    R = (q * np.linspace(1, 2, 8)) @ q.T
    R = np.triu(R) + np.triu(R, 1).T  # exactly symmetric: the upper triangle mirrored
    lmax_R = lmax_exact(R)
    scale = lmax_exact(A) / lmax_R  # same lambda_max, so the relative eps is the same absolute shift
    R = np.triu(R * scale) + np.triu(R * scale, 1).T
    At = torch.from_numpy(np.stack([A, R])).to(torch.bfloat16)
    with pytest.warns(matroots.ConvergenceWarning):
        res = matroots.inverse_root(At, 2, method="eigh", eps=1e-3, eps_mode="relative", dtype="bf16")
    assert res.converged.tolist() == [False, True]
    R16 = At[1].double().numpy()
    X, cond = mp_reference(R16, float(res.info["eps_abs"][1]), 2)
    err = np.linalg.norm(res.root[1].double().numpy() - X) / np.linalg.norm(X)
    assert err <= C_FWD * math.sqrt(8) * (1 + cond) * U_BF16, (err, cond)


def test_a_clearly_definite_matrix_runs_no_cholesky(monkeypatch):
    """The hot path: lambda_min well above (n + 1) u lambda_max decides from the computed eigenvalues
    alone (Weyl), with no Cholesky."""
    calls = []
    real = spd_start.cholesky_fails
    monkeypatch.setattr(spd_start, "cholesky_fails", lambda *a: calls.append(1) or real(*a))
    q = np.linalg.qr(np.random.default_rng(3).standard_normal((16, 16)))[0]
    A = (q * np.logspace(0, -4, 16)) @ q.T
    A = np.triu(A) + np.triu(A, 1).T
    res = matroots.inverse_root(torch.from_numpy(A).float(), 4, method="eigh")
    assert res.all_converged and calls == []


def test_eigh_warm_started_on_a_singular_factor_is_flagged():
    """eigh_warm warm-started from the root of a regular matrix (the accepted or refined warm path,
    not the cold eigh) still applies the domain test: flagged not_determined."""
    q = np.linalg.qr(np.random.default_rng(3).standard_normal((8, 8)))[0]
    R = (q * np.logspace(0, -3, 8)) @ q.T
    R = torch.from_numpy(np.triu(R) + np.triu(R, 1).T).to(torch.bfloat16)
    kw = {"method": "eigh_warm", "eps_mode": "relative", "dtype": "bf16"}
    prev = matroots.inverse_root(R, 2, **kw)
    A = torch.from_numpy(singular_factor()).to(torch.bfloat16)
    for start in (prev, matroots.inverse_root(A, 2, eps=0.1, **kw)):
        with pytest.warns(matroots.ConvergenceWarning):
            res = matroots.inverse_root(A, 2, eps=1e-3, warm_start=start, **kw)
        assert not res.all_converged and res.info["stop_reason"] == ["not_determined"]
