"""The Newton solvers' domain test on the classical gallery (issue 22, classes 4 and 2; matroots.solvers.
schur_domain, newton_checks.negative_axis_status).

"This matrix has an eigenvalue on the closed negative real axis" is refused; "a matrix within the
eigensolver's backward error has one" (non-normality, or a symmetric matrix singular to working precision)
is computed by schur_newton and flagged converged=False, stop reason "not_determined" (docs/design.md §3).
A working format coarser than float64 whose Schur form is not clear of the axis is decided by the
float64 Schur form of the same rounded matrix.

Errors are judged against the high-precision root of the matrix actually solved (matroots.truth.reference:
mpmath / flint) with the bound C sqrt(n) (1 + cond(f, fl(A))) u, C = 5, of experiments/gallery_domain.py,
cond from matroots.truth.metrics.cond_root. Every matrix gets its domain from construction: integer
(frank), exactly triangular (Al-Mohy-Higham) or power-of-two diagonal matrices, hilb(8) (its fp32
rounding checked SPD here by the exact spectrum), chebspec(10, 1) (eigenvalues with Re < 0, far from the
negative real axis relative to the rounding of either format).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import matroots
from matroots.core.errors import NegativeRealEigenvalueError, NotPositiveDefiniteError
from matroots.study import matrices
from matroots.truth import metrics, reference
from matroots.truth.metrics import cond_root

pytestmark = pytest.mark.numerics

C = 5.0
U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}
AL_MOHY_HIGHAM = np.array(
    [[3.2346e-1, 3e4, 3e4, 3e4], [0, 3.0089e-1, 3e4, 3e4], [0, 0, 3.2210e-1, 3e4], [0, 0, 0, 3.0744e-1]]
)


def _frank(n: int) -> np.ndarray:
    """Frank matrix (integers: exact in fp32): F_ij = n + 1 - max(i, j) for j >= i - 1 (1-based)."""
    i = np.arange(1, n + 1)
    return np.where(i[None, :] >= i[:, None] - 1, (n + 1 - np.maximum.outer(i, i)).astype(float), 0.0)


def _chebspec1(n: int) -> np.ndarray:
    """MATLAB gallery('chebspec', n, 1): the Chebyshev differentiation matrix of order n + 1 without its
    first row and column."""
    x = np.cos(np.pi * np.arange(n + 1) / n)
    c = np.where((np.arange(n + 1) == 0) | (np.arange(n + 1) == n), 2.0, 1.0) * (-1.0) ** np.arange(n + 1)
    D = np.outer(c, 1 / c) / (x[:, None] - x[None, :] + np.eye(n + 1))
    D -= np.diag(D.sum(axis=1))
    return D[1:, 1:]


def _solve(A, p, dtype, inverse, method="schur_newton", **kw):
    fn = matroots.inverse_root if inverse else matroots.root
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        return fn(torch.as_tensor(A), p, method=method, dtype=dtype, **kw)


def _error_and_bound(A, res, p, dtype, inverse):
    Aw = torch.as_tensor(A).to(dtype).double().numpy()  # the matrix solved
    ref = (reference.inverse_root if inverse else reference.root)(Aw, p)
    cond = cond_root(Aw, p, inverse=inverse)
    err = metrics.relative_forward_error(res.root, ref.root)
    return err, C * math.sqrt(Aw.shape[0]) * (cond + 1) * U[dtype]


# ------------------------------------------------------------------ near the axis, not on it: computed
@pytest.mark.parametrize("inverse", (True, False))
def test_the_al_mohy_higham_triangle_is_solved_and_flagged_not_refused(inverse):
    # eigenvalues ~0.3, within 4e-16 (2-norm) of a singular matrix: before, NegativeRealEigenvalueError
    # "no principal root can be computed" (scipy's sqrtm computes it)
    res = _solve(AL_MOHY_HIGHAM, 2, torch.float64, inverse)
    assert bool(torch.isfinite(res.root).all())
    # cond(f, A) ~ 1e20: no digit promised, so never "converged" (not_determined, or the forward root's
    # backward-error test)
    assert cond_root(AL_MOHY_HIGHAM, 2, inverse=inverse) * U[torch.float64] >= 1
    assert not bool(res.converged)
    if inverse:
        assert res.info["stop_reason"] == ["not_determined"]
        assert "closed negative real axis" in res.info["not_determined"][0]


def test_coupled_newton_refuses_the_triangle_without_denying_its_root():
    with pytest.raises(NegativeRealEigenvalueError, match="principal root may exist"):
        _solve(AL_MOHY_HIGHAM, 2, torch.float64, True, method="coupled_newton")


@pytest.mark.parametrize("method", ("schur_newton", "coupled_newton"))
def test_a_matrix_with_an_axis_eigenvalue_is_still_refused(method):
    A = np.array([[-1.0, 5.0], [0.0, 2.0]])  # eigenvalue -1, exactly
    with pytest.raises(NegativeRealEigenvalueError, match=r"has the eigenvalue -1\.000e"):
        _solve(
            A,
            2,
            torch.float64,
            True,
            method=method,
            **({"scaling": "frobenius"} if method != "schur_newton" else {}),
        )


# ------------------------------------------------------- fp32 decided by the float64 Schur form
@pytest.mark.parametrize("method", ("schur_newton", "coupled_newton"))
@pytest.mark.parametrize("inverse", (True, False))
def test_frank_10_in_fp32_is_not_refused(method, inverse):
    # frank(10) is exact in fp32; its small eigenvalues (condition numbers ~1e6) are within fp32's
    # eigensolver error of the axis, not within float64's. Before: NegativeRealEigenvalueError from both.
    A = _frank(10)
    res = _solve(A, 2, torch.float32, inverse, method=method)
    err, bound = _error_and_bound(A, res, 2, torch.float32, inverse)
    if method == "schur_newton":
        assert bool(res.converged), res.info["stop_reason"]
    # cond u ~ 0.5-1.3 here, so the bound itself is loose; what is tested is that no root outside it is
    # flagged converged (coupled Newton diverges on this non-normal matrix and says so)
    assert not bool(res.converged) or err <= bound


def test_hilbert_8_in_fp32_forward_root_is_computed_and_the_inverse_flagged():
    H, _ = matrices.generate("hilbert", 8, None, None)
    H32 = torch.from_numpy(H).float()
    lam = reference.eigvalsh(H32.double().numpy())  # the exact spectrum of the fp32 matrix
    # fl32(hilb(8)) is SPD (lambda_min ~1e-10), but fp32's eigensolver error ~n u ||A|| = 8e-7 hides the
    # sign (-5.5e-10 on this CPU): before, NotPositiveDefiniteError "no principal root exists"
    assert 0 < lam.min() < U[torch.float32] * lam.max()
    fwd = _solve(H, 2, torch.float32, False)
    err, bound = _error_and_bound(H, fwd, 2, torch.float32, False)
    assert bool(fwd.converged) and err <= bound  # cond u ~ 1e-3: well-conditioned
    inv = _solve(H, 2, torch.float32, True)  # lambda_min < u lambda_max: singular to fp32
    assert not bool(inv.converged) and inv.info["stop_reason"] == ["not_determined"]


# ----------------------------------------------------- forward roots: the stability factor
@pytest.mark.parametrize(
    ("A", "dtype"),
    (
        (_frank(10), torch.float64),
        (_chebspec1(10), torch.float64),
        (_chebspec1(10), torch.float32),
    ),
    ids=("frank10-fp64", "chebspec10-fp64", "chebspec10-fp32"),
)
@pytest.mark.parametrize("p", (2, 3, 4))
def test_forward_roots_of_non_normal_gallery_matrices_are_not_false_alarms(A, dtype, p):
    # before: converged=False, stop "backward_error", though within the bound: their residual is
    # ~u ||X||^p, not u ||A|| (the stability factor alpha = ||X||^p / ||A||: 1e6 for frank(10), 6e4 for
    # chebspec(10, 1))
    res = _solve(A, p, dtype, False)
    err, bound = _error_and_bound(A, res, p, dtype, False)
    assert bool(res.converged), res.info["stop_reason"]
    assert err <= bound


# -------------------------------------- symmetric input singular to working precision (class 2)
def _diag(lmin_exp: int, n: int = 8) -> torch.Tensor:
    """diag(1, 2^-1, ..., 2^-(n-2), 2^lmin_exp): exact in fp32 and fp64, eigenvalues computed exactly."""
    d = [2.0**-k for k in range(n - 1)] + [2.0**lmin_exp]
    return torch.diag(torch.tensor(d, dtype=torch.float64))


@pytest.mark.parametrize(("dtype", "lmin_exp"), ((torch.float32, -26), (torch.float64, -55)))
def test_inverse_root_singular_to_working_precision_is_flagged(dtype, lmin_exp):
    A = _diag(lmin_exp)  # lambda_min = u / 4 < u lambda_max: kappa = 4 / u
    assert cond_root(A.numpy(), 2) * U[dtype] >= 1.0 / 2  # no digit promised
    res = _solve(A, 2, dtype, True)  # before: converged (the exact eigenvalues are positive)
    assert not bool(res.converged) and res.info["stop_reason"] == ["not_determined"]
    # the forward root of the same matrix is well-conditioned (cond u ~ u^{1/2}) and stays converged
    fwd = _solve(A, 2, dtype, False)
    exact = torch.diag(torch.diagonal(A) ** 0.5)
    err = float(torch.linalg.matrix_norm(fwd.root.double() - exact) / torch.linalg.matrix_norm(exact))
    assert (
        bool(fwd.converged)
        and err <= C * math.sqrt(8) * (1 + cond_root(A.numpy(), 2, inverse=False)) * U[dtype]
    )


def test_inverse_root_just_inside_the_domain_is_converged_and_accurate():
    A = _diag(-20)  # lambda_min = 16 u_32 lambda_max in fp32
    res = _solve(A, 2, torch.float32, True)
    exact = torch.diag(torch.diagonal(A) ** -0.5)
    err = float(torch.linalg.matrix_norm(res.root.double() - exact) / torch.linalg.matrix_norm(exact))
    assert bool(res.converged) and err <= C * math.sqrt(8) * (1 + cond_root(A.numpy(), 2)) * U[torch.float32]


def test_the_issue_singular_8x8_gets_no_converged_inverse_root():
    # issue 22 class 2: one zero eigenvalue, rounded to fp64 (the exact smallest eigenvalue of the
    # rounded matrix, checked here, is within 2e-17 of 0: singular to fp64 whatever its sign)
    q = np.linalg.qr(np.random.default_rng(8).standard_normal((8, 8)))[0]
    S = (q * np.r_[np.linspace(1, 0.5, 7), 0.0]) @ q.T
    S = (S + S.T) / 2
    lam = reference.eigvalsh(S)
    assert abs(lam.min()) < U[torch.float64] * lam.max()
    for A in (S, S + 1e-16 * np.eye(8)):
        try:
            res = _solve(A, 2, torch.float64, True)
        except NotPositiveDefiniteError:
            continue  # a typed refusal is allowed, a converged root is not
        assert not bool(res.converged)
