"""eigh-specific behaviour: diagnostics, the fp32 -> fp64 retry, symmetry tolerance, honest NaN residual."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _refs import U, fwd_bound, ref_inverse_root, rel_err, spd_matrix

import matroots


def test_info_reports_spectrum_and_shift_in_user_units():
    A = np.diag([2.0, 1000.0, 5000.0])
    for dt in (torch.float64, torch.float16):  # fp16 inputs are pre-scaled internally
        res = matroots.inverse_root(torch.from_numpy(A), 2, method="eigh", dtype=dt, eps=1e-2)
        assert float(res.info["lambda_max"][0]) == pytest.approx(5000.0, rel=1e-3)
        assert float(res.info["lambda_min"][0]) == pytest.approx(2.0, rel=1e-3)
        assert float(res.info["eps_abs"][0]) == pytest.approx(1e-2, rel=1e-12)
        assert res.info["eigh_calls"] == 1 and res.matmuls == 1.0 and res.iterations == 0


def test_residual_is_nan_and_says_so():
    res = matroots.inverse_root(torch.from_numpy(spd_matrix(6, 10.0, seed=0)), 2, method="eigh")
    assert math.isnan(res.residual)
    assert "NaN" in res.info["residual_note"]
    assert res.converged is True


def test_fp32_eigensolver_failure_is_retried_in_fp64(monkeypatch):
    real_eigh = torch.linalg.eigh

    def flaky(A, *args, **kwargs):
        if A.dtype == torch.float32:
            raise torch.linalg.LinAlgError("simulated: the algorithm failed to converge")
        return real_eigh(A, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "eigh", flaky)
    A = spd_matrix(8, 1e3, seed=2)
    res = matroots.inverse_root(torch.from_numpy(A), 2, method="eigh", dtype=torch.float32)
    assert "fp64" in res.info["eigh_retry_fp64"]
    assert res.root.dtype == torch.float32
    assert rel_err(res.root, ref_inverse_root(A, 2)) <= fwd_bound(1e3, 2, 8, U["fp32"])


def _embedding_factor() -> torch.Tensor:
    """A real fp32 Shampoo factor: the left factor of bytes_lm's byte embedding at step 70 (156 of
    its 256 bytes never seen: exactly zero rows and columns), in the user's units."""
    d = np.load(Path(__file__).parent / "data" / "eigh_nan_embedding_factor.npz")
    n, rows = int(d["n"]), torch.from_numpy(d["rows"].astype(np.int64))
    A = torch.zeros(n, n)
    A[rows.unsqueeze(1), rows] = torch.from_numpy(d["block"])
    return A


def test_unreported_nan_eigenvalues_are_solved_again_in_fp64():
    """MKL's threaded ssyevd (torch 2.13 CPU, 2 threads) returns NaN eigenvalues for this factor
    without raising; eigh must notice, solve it in fp64 and return the true root (here at whatever
    thread count the machine gives: with one thread the fp32 solve is fine and nothing is retried)."""
    A = _embedding_factor()
    # solved in the batch it came from: a larger factor sets the batch's pre-scaling to 8, so eigh
    # sees 8 A (the stand-in here: 0.2 I)
    batch = torch.stack([A, 0.2 * torch.eye(A.shape[0])])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        res = matroots.EighConfig().solve(batch, 4, eps=1e-12, psd="shift")
        assert res.info.get("prescale") == 8.0
        reproduces = bool(torch.isnan(torch.linalg.eigh(8.0 * batch)[0]).any())
    finally:
        torch.set_num_threads(threads)
    # where this machine's LAPACK has the bug, the retry must have run (else the fp32 solve is fine)
    assert ("eigh_retry_fp64" in res.info) == reproduces, (reproduces, res.info.get("eigh_retry_fp64"))
    assert bool(res.converged.all()) and bool(torch.isfinite(res.root).all())
    s = float(res.info["regularisation_abs"][0])
    w, Q = np.linalg.eigh(A.double().numpy())
    ref = (Q * (w + s) ** -0.25) @ Q.T
    kappa = (w[-1] + s) / (w[0] + s)
    err = np.linalg.norm(res.root[0].double().numpy() - ref) / np.linalg.norm(ref)
    assert err <= 10 * 256 * (kappa / 4) * U["fp32"], (err, kappa)


def test_non_finite_fp32_eigenvalues_are_retried_for_those_matrices_only(monkeypatch):
    real_eigh = torch.linalg.eigh

    def nan_for_second(A, *args, **kwargs):
        w, Q = real_eigh(A, *args, **kwargs)
        if A.dtype == torch.float32 and A.shape[0] == 3:
            w, Q = w.clone(), Q.clone()
            w[1, 4] = math.nan  # unreported, as LAPACK's threaded ssyevd does
        return w, Q

    A = torch.stack([torch.from_numpy(spd_matrix(8, 10.0**k, seed=k)).float() for k in (1, 2, 3)])
    plain = [matroots.EighConfig().solve(A[i : i + 1], 2) for i in range(3)]
    monkeypatch.setattr(torch.linalg, "eigh", nan_for_second)
    res = matroots.EighConfig().solve(A, 2)
    assert "1 of 3" in res.info["eigh_retry_fp64"]
    assert bool(res.converged.all())
    for i in (0, 2):  # untouched elements: their fp32 solve
        assert torch.equal(res.root[i], plain[i].root[0])
    ref = ref_inverse_root(A[1].double().numpy(), 2)
    assert rel_err(res.root[1], ref) <= fwd_bound(1e2, 2, 8, U["fp32"])


def test_non_finite_eigenvalues_that_persist_are_a_linalg_error(monkeypatch):
    real_eigh = torch.linalg.eigh

    def always_nan(A, *args, **kwargs):
        w, Q = real_eigh(A, *args, **kwargs)
        return torch.full_like(w, math.nan), Q

    monkeypatch.setattr(torch.linalg, "eigh", always_nan)
    with pytest.raises(matroots.EigensolverError, match="non-finite eigenvalues for 1 of 1"):
        matroots.EighConfig().solve(torch.from_numpy(spd_matrix(6, 10.0, seed=0)), 2)


def test_rounding_noise_asymmetry_is_accepted():
    A = spd_matrix(10, 1e2, seed=3)
    # asymmetric at the level of rounding: the upper triangle moved 4 ulps up (defect ~3u; building
    # Q diag Q^T in fp64/fp32 measured <= 0.2 sqrt(n) u), inside the default 10 sqrt(n) u
    B = A.copy()
    iu = np.triu_indices(10, 1)
    for _ in range(4):
        B[iu] = np.nextafter(B[iu], np.inf)
    for method in ("eigh", "coupled_newton"):
        res = matroots.inverse_root(torch.from_numpy(B), 2, method=method)
        if method == "coupled_newton":  # symmetrised at the end (cheap next to the iteration)
            assert torch.equal(res.root, res.root.mT)
        else:  # eigh: Q f(Lambda) Q^T is symmetric up to the final GEMM's rounding
            asym = torch.linalg.matrix_norm(res.root - res.root.mT) / torch.linalg.matrix_norm(res.root)
            assert float(asym) <= 10 * math.sqrt(10) * U["fp64"]
        assert rel_err(res.root, ref_inverse_root(A, 2)) <= fwd_bound(1e2, 2, 10, U["fp64"])


def test_symmetry_tolerance_is_configurable():
    A = spd_matrix(6, 10.0, seed=4)
    A[0, 1] += 1e-6
    with pytest.raises(matroots.NotSymmetricError):
        matroots.inverse_root(torch.from_numpy(A), 2, method="eigh")
    res = matroots.inverse_root(torch.from_numpy(A), 2, method="eigh", symmetry_tol=1e-5)
    assert res.converged


def test_clamp_refuses_when_nothing_is_positive():
    with pytest.raises(matroots.NotPositiveDefiniteError, match="atol"):
        matroots.inverse_root(-torch.eye(3, dtype=torch.float64), 2, method="eigh", rank_policy="clamp")
    res = matroots.inverse_root(
        -torch.eye(3, dtype=torch.float64), 2, method="eigh", rank_policy="clamp", atol=0.25
    )
    assert torch.allclose(res.root, 2.0 * torch.eye(3, dtype=torch.float64))


def test_default_pseudo_inverse_threshold_is_n_u_lambda_max():
    n = 6
    lam = np.array([1e-17, 1e-15, 1e-3, 0.1, 1.0, 2.0])  # n u lambda_max = 1.3e-15
    res = matroots.inverse_root(
        torch.from_numpy(np.diag(lam)), 1, method="eigh", rank_policy="pseudo_inverse"
    )
    assert int(res.info["dropped"][0]) == 2
    want = np.diag(np.where(lam > n * U["fp64"] * 2.0, 1.0 / lam, 0.0))
    np.testing.assert_allclose(res.root.numpy(), want, rtol=1e-12)


def test_config_object_and_options_are_equivalent():
    A = torch.from_numpy(spd_matrix(6, 10.0, seed=5))
    a = matroots.inverse_root(A, 3, method=matroots.EighConfig(rank_policy="clamp", atol=1e-3))
    b = matroots.inverse_root(A, 3, method="eigh", rank_policy="clamp", atol=1e-3)
    assert torch.equal(a.root, b.root)
    assert a.method == b.method == "eigh"
