"""coupled_newton where no iteration is wanted: the forward root with p = 1 is the matrix itself (issue 28,
item 5), and a matrix singular within rounding gets no "converged" inverse root (issue 22, class 2)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import matroots
from matroots.solvers import spd_start


def _non_normal_batch(n: int = 10, b: int = 4) -> torch.Tensor:
    """V diag(0.5 .. 4) V^{-1} with cond(V) ~ 10..90 (the issue's eigenvector condition ~86)."""
    rng = np.random.default_rng(3)
    out = []
    for _ in range(b):
        V = np.eye(n) + 0.5 * rng.standard_normal((n, n))
        out.append(V @ np.diag(np.linspace(0.5, 4.0, n)) @ np.linalg.inv(V))
    return torch.tensor(np.stack(out))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_root_p1_is_the_shifted_matrix_without_iterations(dtype):
    """Bitwise: the root is A + eps I with each entry rounded once (the prescale is a power of two and
    the sum is formed in float64, then rounded to the working format; elementwise, the same on every
    CPU). Before: 20+ Newton steps and 66 u on this batch."""
    A = _non_normal_batch().to(dtype)
    eps = 1e-3
    res = matroots.root(A, 1, method="coupled_newton", eps=eps, eps_mode="absolute")
    expected = (A.double() + eps * torch.eye(A.shape[-1], dtype=torch.float64)).to(dtype)
    assert torch.equal(res.root, expected)
    assert bool(res.converged.all()) and int(res.iterations.max()) == 0
    assert res.info["stop_reason"] == ["identity_root"] * A.shape[0]


def test_forward_root_p1_of_a_symmetric_matrix_is_its_symmetrised_self():
    rng = np.random.default_rng(0)
    G = rng.standard_normal((12, 12))
    A = torch.tensor(G @ G.T / 12)
    res = matroots.root(A, 1, method="coupled_newton")
    assert res.converged and res.iterations == 0
    assert torch.equal(res.root, 0.5 * (A + A.mT))


def _singular_psd() -> np.ndarray:
    """B B^T with B an 8 x 7 matrix of small integers: every entry is an integer (exact in fp32 and fp64,
    so the matrix solved is the one built) and the rank is 7 by construction: lambda_min = 0 exactly."""
    B = np.random.default_rng(8).integers(-2, 3, size=(8, 7)).astype(float)
    assert np.linalg.matrix_rank(B) == 7
    return B @ B.T


# fp32: the singular matrix itself; the shared domain test (solvers.spd_start.domain_test: the float64
# Cholesky test of A - delta I, delta = u_32 lambda_max) decides it exactly, since lambda_min - delta =
# -delta is ~1e8 times float64 Cholesky's rounding. fp64: there delta = u_64 lambda_max is of the order
# of that rounding, so the fp64 case is made indefinite by a margin instead: lambda_min = -2^-40 (exact:
# the diagonal integers minus 2^-40 fit in 53 bits), 25 times float64 Cholesky's worst-case backward
# error n u_64 ||A||_2 = 3.7e-14 and below Lanczos's proof threshold 100 n u_64 lambda_max = 3.7e-12.
SINGULAR = {torch.float32: 0.0, torch.float64: -(2.0**-40)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("scaling", ["auto", "frobenius", "power"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_numerically_singular_spd_is_refused_with_the_reason(p, scaling, dtype):
    """A typed NotPositiveDefiniteError that says what is wrong and what to do, or a flagged root (stop
    reason "not_determined": the shared domain test); never converged=True (before, on the issue's
    rotated matrix: p = 1 and 3 under "auto", 2..4 under "frobenius", 2 under "power" converged)."""
    S = _singular_psd() + SINGULAR[dtype] * np.eye(8)
    A = torch.tensor(S).to(dtype)
    u = 2.0**-24 if dtype == torch.float32 else 2.0**-53
    delta = spd_start.domain_margin(8, dtype, dtype, torch.tensor([np.linalg.eigvalsh(S).max()]))
    assert bool(spd_start.cholesky_fails(A.double()[None], -delta)[0])  # below the margin u lambda_max
    assert float(delta[0]) == pytest.approx(u * np.linalg.eigvalsh(S).max())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        try:
            res = matroots.inverse_root(A, p, method="coupled_newton", scaling=scaling)
        except matroots.NotPositiveDefiniteError as e:
            assert "not positive definite" in str(e) or "singular or indefinite" in str(e)
            assert ("Cholesky fails" in str(e) or "Lanczos proves" in str(e)) and "increase eps" in str(e)
            return
    assert not res.converged, res.info["stop_reason"]


def test_the_singular_batch_element_is_named():
    """fp32, p = 1: the singular element is refused by name (Cholesky of A itself fails) or flagged
    (it factors: lambda_min = 0 is within float64 Cholesky's rounding), its neighbour converged."""
    S = torch.tensor(_singular_psd(), dtype=torch.float32)
    good = torch.eye(8, dtype=torch.float32) * 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        try:
            res = matroots.inverse_root(torch.stack([good, S]), 1, method="coupled_newton")
        except matroots.NotPositiveDefiniteError as e:
            assert "batch elements [1]" in str(e)
            return
    assert res.converged.tolist() == [True, False]
    assert res.info["stop_reason"][1] == "not_determined"


def test_nearly_singular_but_positive_definite_is_still_solved():
    """The refusal tests Cholesky only where Lanczos cannot exclude singularity, and only fails it
    where float64 cannot tell the matrix from a singular one: kappa 1e10 is solved as before."""
    q = np.linalg.qr(np.random.default_rng(8).standard_normal((8, 8)))[0]
    S = (q * np.logspace(0, -10, 8)) @ q.T
    res = matroots.inverse_root(torch.tensor((S + S.T) / 2), 1, method="coupled_newton")
    assert res.converged
