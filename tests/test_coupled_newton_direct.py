"""coupled_newton where no iteration is wanted: the forward root with p = 1 is the matrix itself (issue 28,
item 5), and a matrix singular within rounding gets no "converged" inverse root (issue 22, class 2)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import matroots


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


def _singular_spd() -> torch.Tensor:
    """The issue's 8x8 SPD matrix with one exactly zero eigenvalue (rounded to fp64: exact smallest
    eigenvalue -1.5e-17, so no principal inverse root exists)."""
    q = np.linalg.qr(np.random.default_rng(8).standard_normal((8, 8)))[0]
    S = (q * np.r_[np.linspace(1, 0.5, 7), 0.0]) @ q.T
    return torch.tensor((S + S.T) / 2)


@pytest.mark.parametrize("scaling", ["auto", "frobenius", "power"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_numerically_singular_spd_is_refused_with_the_reason(p, scaling):
    """A typed NotPositiveDefiniteError that says what is wrong and what to do; never converged=True
    (before: p = 1 and 3 under "auto", 2..4 under "frobenius", 2 under "power" returned converged)."""
    S = _singular_spd()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        try:
            res = matroots.inverse_root(S, p, method="coupled_newton", scaling=scaling)
        except matroots.NotPositiveDefiniteError as e:
            assert "not positive definite" in str(e) or "singular or indefinite" in str(e)
            assert "Cholesky fails" in str(e) and "increase eps" in str(e)
            return
    assert not res.converged, res.info["stop_reason"]


def test_singular_refusal_names_the_batch_element():
    S = _singular_spd()
    good = torch.eye(8, dtype=torch.float64) * 2.0
    with pytest.raises(matroots.NotPositiveDefiniteError, match=r"\[1\]"):
        matroots.inverse_root(torch.stack([good, S]), 1, method="coupled_newton")


def test_nearly_singular_but_positive_definite_is_still_solved():
    """The refusal tests Cholesky only where Lanczos cannot exclude singularity, and only fails it
    where float64 cannot tell the matrix from a singular one: kappa 1e10 is solved as before."""
    q = np.linalg.qr(np.random.default_rng(8).standard_normal((8, 8)))[0]
    S = (q * np.logspace(0, -10, 8)) @ q.T
    res = matroots.inverse_root(torch.tensor((S + S.T) / 2), 1, method="coupled_newton")
    assert res.converged
