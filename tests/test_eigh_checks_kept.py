"""Every check of a direct eigh solve still fires after its per-call work was cut (issue 29, item 7):
the eigensolver's finiteness test read as two sums (eigenvalues, eigenvectors), the range check's
log2 taken in Python, the exact-symmetry test without a zero defect, and a direct method's
converged / iterations / residual built only where a tensor is returned or a flag is lowered."""

from __future__ import annotations

import math

import pytest
import torch

import matroots
from matroots.core.errors import EigensolverError, FormatRangeError, NotSymmetricError

_eigh = torch.linalg.eigh


def _spd(n: int = 8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    G = torch.randn(n, 2 * n, generator=g, dtype=torch.float64)
    A = (G @ G.T / (2 * n) + 0.1 * torch.eye(n, dtype=torch.float64)).to(dtype)
    return torch.maximum(A, A.mT)


def _poisoned(which: str, dtypes: tuple[torch.dtype, ...]):
    """torch.linalg.eigh with a NaN planted in the eigenvalues or the eigenvectors, in ``dtypes``."""

    def eigh(A, *args, **kw):
        w, Q = _eigh(A, *args, **kw)
        if A.dtype in dtypes:
            if which == "w":
                w = w.clone()
                w[..., 1] = math.nan
            else:
                Q = Q.clone()
                Q[..., 2, 3] = math.nan
        return w, Q

    return eigh


@pytest.mark.parametrize("which", ["w", "Q"])
def test_a_non_finite_fp32_eigenvalue_or_eigenvector_is_solved_again_in_fp64(monkeypatch, which: str) -> None:
    A = _spd()
    expect = matroots.inverse_root(A, 2)
    monkeypatch.setattr(torch.linalg, "eigh", _poisoned(which, (torch.float32,)))
    res = matroots.inverse_root(A, 2)
    assert "eigh_retry_fp64" in res.info and res.converged
    assert torch.allclose(res.root, expect.root, rtol=1e-5, atol=1e-6)


def test_a_non_finite_spectrum_that_no_retry_mends_raises(monkeypatch) -> None:
    monkeypatch.setattr(torch.linalg, "eigh", _poisoned("w", (torch.float32, torch.float64)))
    with pytest.raises(EigensolverError, match="non-finite eigenvalues"):
        matroots.inverse_root(_spd(dtype=torch.float64), 2)


def test_the_root_spectrum_range_checks_still_raise() -> None:
    A = 4.0 * torch.eye(4)
    with pytest.raises(FormatRangeError, match="underflow"):  # 4^-100 is below fp32's smallest normal
        matroots.inverse_root(A, 0.01)
    with pytest.raises(FormatRangeError, match="overflow fp32"):  # (2^-30)^-10 = 2^300
        matroots.inverse_root(torch.diag(torch.tensor([1.0, 2.0**-30])), 0.1)
    # a row whose maximum is 0 after the rank policy dropped everything: the entrywise path, a 0 root
    res = matroots.inverse_root(torch.zeros(3, 3), 2, rank_policy="pseudo_inverse", atol=1e-3)
    assert torch.equal(res.root, torch.zeros(3, 3)) and res.info["dropped"] == 3


def test_the_symmetry_test_still_refuses_and_still_symmetrises() -> None:
    A = _spd()
    B = A.clone()
    B[0, 1] += 0.5
    with pytest.raises(NotSymmetricError):
        matroots.inverse_root(B, 2)
    C = A.clone()
    C[0, 1] = torch.nextafter(C[0, 1], torch.tensor(math.inf))  # within the tolerance, not exactly symmetric
    res = matroots.inverse_root(C, 2)
    assert torch.equal(res.root, matroots.inverse_root((C + C.mT) / 2, 2).root)
    # exactly symmetric input and trusted input: the same bits
    assert torch.equal(matroots.inverse_root(A, 2).root, matroots.inverse_root(A, 2, trusted=True).root)


def test_direct_flags_iterations_and_residuals() -> None:
    single = matroots.inverse_root(_spd(), 2)
    assert single.converged is True and single.iterations == 0 and math.isnan(single.residual)
    batch = matroots.inverse_root(torch.stack([_spd(), _spd()]), 2)
    assert batch.converged.dtype == torch.bool and bool(batch.converged.all())
    assert torch.equal(batch.iterations, torch.zeros(2, dtype=torch.int64))
    assert batch.residual.dtype == torch.float64 and bool(batch.residual.isnan().all())
    # a near-singular single matrix still comes back not converged (flag_singular's tensor)
    S = torch.diag(torch.tensor([1.0, 1.0, 1e-30], dtype=torch.float64))
    with pytest.warns(matroots.ConvergenceWarning):
        res = matroots.inverse_root(S, 2)
    assert res.converged is False and res.info["stop_reason"] == ["not_determined"]
