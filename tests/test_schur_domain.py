"""schur_newton's domain test and convergence flag on the classical gallery (issue 22, classes 4 and 2).

The domain test separates "this matrix has an eigenvalue on the closed negative real axis" (refused)
from "a matrix within the eigensolver's backward error has one" (non-normality: the root is computed,
and flagged converged=False with stop reason "ill_conditioned" where cond(f, A) u >= 1, since then no
digit is promised; docs/design.md §3). Errors are judged against the high-precision reference of the
matrix actually solved with the bound of tests/test_conditioning_accuracy.py,
C sqrt(n) (cond(f, fl(A)) + 1) u, C = 5.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import matroots
from matroots import conditioning, matrices, metrics, reference

C = 5.0
U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}
AL_MOHY_HIGHAM = np.array(
    [[3.2346e-1, 3e4, 3e4, 3e4], [0, 3.0089e-1, 3e4, 3e4], [0, 0, 3.2210e-1, 3e4], [0, 0, 0, 3.0744e-1]]
)


def _frank(n: int) -> np.ndarray:
    i = np.arange(1, n + 1)
    return np.where(i[None, :] >= i[:, None] - 1, (n + 1 - np.maximum.outer(i, i)).astype(float), 0.0)


def _chebspec1(n: int) -> np.ndarray:
    """MATLAB gallery('chebspec', n, 1): Chebyshev differentiation matrix of order n + 1 without its
    first row and column."""
    x = np.cos(np.pi * np.arange(n + 1) / n)
    c = np.where((np.arange(n + 1) == 0) | (np.arange(n + 1) == n), 2.0, 1.0) * (-1.0) ** np.arange(n + 1)
    D = np.outer(c, 1 / c) / (x[:, None] - x[None, :] + np.eye(n + 1))
    D -= np.diag(D.sum(axis=1))
    return D[1:, 1:]


def _solve(A, p, dtype, inverse):
    fn = matroots.inverse_root if inverse else matroots.root
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        return fn(torch.from_numpy(A), p, method="schur_newton", dtype=dtype)


def _error_and_bound(A, res, p, dtype, inverse):
    Aw = torch.from_numpy(A).to(dtype).double().numpy()
    ref = (reference.inverse_root if inverse else reference.root)(Aw, p)
    cond = conditioning.cond_root(Aw, p, inverse=inverse)
    return metrics.relative_forward_error(res.root, ref.root), C * math.sqrt(A.shape[0]) * (cond + 1) * U[
        dtype
    ]


@pytest.mark.parametrize("inverse", (True, False))
def test_a_non_normal_triangle_near_a_singular_matrix_is_solved_not_refused(inverse):
    # eigenvalues ~0.3, but within 4e-16 (2-norm) of a singular matrix: before, NegativeRealEigenvalueError
    res = _solve(AL_MOHY_HIGHAM, 2, torch.float64, inverse)
    assert "near_negative_axis" in res.info
    cond = conditioning.cond_root(AL_MOHY_HIGHAM, 2, inverse=inverse)
    assert cond * U[torch.float64] >= 1  # ~1e20: no digit promised, so it cannot be "converged"
    assert not bool(res.converged) and res.info["stop_reason"] == ["ill_conditioned"]
    assert bool(torch.isfinite(res.root).all())


def test_a_matrix_with_an_axis_eigenvalue_is_still_refused():
    A = np.array([[-1.0, 5.0], [0.0, 2.0]])
    with pytest.raises(matroots.NegativeRealEigenvalueError, match="has the eigenvalue"):
        _solve(A, 2, torch.float64, True)


def test_hilbert_8_in_fp32_forward_root_is_computed_and_the_inverse_flagged():
    H, _ = matrices.generate("hilbert", 8, None, None)
    # fl32(hilb(8)) is SPD (its exact eigenvalues), but fp32's eigensolver returns lambda_min = -5.5e-10
    # on some CPUs: before, NotPositiveDefiniteError "no principal root exists"
    fwd = _solve(H, 2, torch.float32, False)
    err, bound = _error_and_bound(H, fwd, 2, torch.float32, False)
    assert bool(fwd.converged) and err <= bound
    inv = _solve(H, 2, torch.float32, True)  # cond(f, A) ~ 7e9: cond u ~ 450 in fp32
    assert not bool(inv.converged) and inv.info["stop_reason"] == ["ill_conditioned"]


@pytest.mark.parametrize(("name", "A"), (("frank(10)", _frank(10)), ("chebspec(10,1)", _chebspec1(10))))
@pytest.mark.parametrize("p", (2, 3, 4))
def test_forward_roots_of_non_normal_gallery_matrices_are_not_false_alarms(name, A, p):
    # before: converged=False, stop "backward_error", though within the bound (their residual is
    # ~u ||X||^p, not u ||A||: the stability factor)
    res = _solve(A, p, torch.float64, False)
    err, bound = _error_and_bound(A, res, p, torch.float64, False)
    assert bool(res.converged), res.info["stop_reason"]
    assert err <= bound


def test_numerically_singular_spd_inverse_root_is_not_converged():
    # issue 22 class 2: exactly one zero eigenvalue, rounded to fp64 (exact smallest eigenvalue -1.5e-17)
    q = np.linalg.qr(np.random.default_rng(8).standard_normal((8, 8)))[0]
    S = (q * np.r_[np.linspace(1, 0.5, 7), 0.0]) @ q.T
    res = _solve((S + S.T) / 2, 2, torch.float64, True)
    assert not bool(res.converged) and res.info["stop_reason"] == ["ill_conditioned"]
