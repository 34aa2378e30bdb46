"""A batch is solved as a batch, and its results equal the per-matrix results."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _refs import U, fwd_bound, spd_matrix

import matroots

N = 12


def _batch(shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    kappas = np.logspace(1, 5, count)  # different conditioning: elements stop at different iterations
    mats = [spd_matrix(N, k, seed=i, lmax=10.0 ** (i % 3 - 1)) for i, k in enumerate(kappas)]
    return np.stack(mats).reshape(*shape, N, N)


@pytest.mark.parametrize("shape", [(3,), (2, 2)])
@pytest.mark.parametrize(
    "method,opts",
    [
        ("eigh", {}),
        ("coupled_newton", {}),
        ("coupled_newton", {"scaling": "frobenius"}),
        ("coupled_newton", {"scaling": "dynamic"}),
        ("schur_newton", {}),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_equals_per_matrix(shape, method, opts, dtype):
    A = _batch(shape)
    p = 4
    res = matroots.inverse_root(torch.from_numpy(A), p, method=method, dtype=dtype, **opts)
    assert res.root.shape == (*shape, N, N) and res.root.dtype == dtype
    assert isinstance(res.converged, torch.Tensor) and res.converged.shape == shape
    assert isinstance(res.iterations, torch.Tensor) and res.iterations.shape == shape
    flat = A.reshape(-1, N, N)
    roots = res.root.reshape(-1, N, N)
    for i in range(flat.shape[0]):
        one = matroots.inverse_root(torch.from_numpy(flat[i]), p, method=method, dtype=dtype, **opts)
        assert bool(res.converged.reshape(-1)[i]) == one.converged
        assert int(res.iterations.reshape(-1)[i]) == one.iterations
        # same arithmetic, up to the batched GEMM kernel's summation order
        diff = float(
            torch.linalg.matrix_norm((roots[i] - one.root).double())
            / torch.linalg.matrix_norm(one.root.double())
        )
        kappa = np.linalg.cond(flat[i])
        assert diff <= 0.1 * fwd_bound(kappa, p, N, U["fp64" if dtype == torch.float64 else "fp32"])


def test_batched_eps_is_per_element():
    """Relative eps uses each element's own lambda_max."""
    A = np.stack([np.diag([1.0, 4.0]), np.diag([100.0, 400.0])])
    for method in ("eigh", "coupled_newton", "schur_newton"):
        res = matroots.inverse_root(torch.from_numpy(A), 1, method=method, eps=0.25, eps_mode="relative")
        want = np.stack(
            [np.diag(1 / (np.array([1.0, 4.0]) + 1.0)), np.diag(1 / (np.array([100.0, 400.0]) + 100.0))]
        )
        np.testing.assert_allclose(res.root.numpy(), want, rtol=1e-10, atol=0)


def test_batch_with_one_bad_element_reports_only_that_element():
    A = _batch((3,))
    with pytest.warns(matroots.ConvergenceWarning, match="1 of 3"):
        res = matroots.inverse_root(torch.from_numpy(A), 2, method="coupled_newton", max_iter=14)
    assert res.converged.tolist() == [True, True, False]


def test_frobenius_retry_reruns_only_the_diverged_elements():
    """fp32, kappa up to 1e8: dynamic scaling diverges on the worst element only; the safe rerun must
    not redo (and change) the others."""
    kappas = np.logspace(1, 8, 4)
    A = np.stack([spd_matrix(N, k, seed=i, lmax=10.0 ** (i % 3 - 1)) for i, k in enumerate(kappas)])
    kw = {"method": "coupled_newton", "scaling": "dynamic", "dtype": torch.float32}
    res = matroots.inverse_root(torch.from_numpy(A), 4, **kw)
    retried = res.info.get("retried_frobenius", [])
    assert 1 <= len(retried) < 4  # (if dynamic scaling stops diverging here, pick another case)
    for i in range(4):
        one = matroots.inverse_root(torch.from_numpy(A[i]), 4, **kw)
        assert int(res.iterations[i]) == one.iterations
        assert torch.allclose(res.root[i], one.root, rtol=1e-4, atol=0)
