"""eigh returns the root of a prescaled fp32 problem in the caller's units by scaling its n root
eigenvalues (matroots.solvers.eigh.root_eigenvalue_sqrt) instead of the n^2 entries of the root
(matroots.core.inputs.rescale_root), and proves its fp32 roots finite instead of testing them.

Checked against float64 numpy references on rank-deficient fp32 factors built by baddbmm and read with
the upper triangle mirrored, as Shampoo builds them (magnitude 1e-5: every such batch is prescaled), against the rescaling path it replaces,
per element in a batch as alone, on an element at fp32's range edge that must keep the rescaling,
and through Shampoo's root round (a non-finite root from a matroots solver still fails there).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import matroots
from matroots.solvers import base as solver_base
from matroots.solvers import eigh as eigh_mod
from matroots.solvers import eigh_warm as eigh_warm_mod
from shampoo.state import mirror_upper_

U32 = 2.0**-24


def factors(b: int = 6, n: int = 48, rank: int = 20, scale: float = 1e-5) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    G = torch.randn(b, n, rank, generator=g)
    # rank-deficient fp32 PSD, exactly symmetric on every CPU (the GEMM's lower triangle is scratch)
    return mirror_upper_(torch.baddbmm(torch.zeros(b, n, n), G, G.mT, alpha=scale))


def reference(A: torch.Tensor, p: int, shift: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(A + shift I)^(-1/p) in float64 and its condition number, per element."""
    out, cond = [], []
    for a, s in zip(A.double().numpy(), shift.double().numpy(), strict=True):
        w, Q = np.linalg.eigh(a)
        w = w + s
        out.append((Q * w ** (-1.0 / p)) @ Q.T)
        cond.append(w.max() / w.min())
    return np.stack(out), np.array(cond)


def spy_folds(monkeypatch) -> list[torch.Tensor | None]:
    seen: list[torch.Tensor | None] = []
    real = eigh_mod.root_eigenvalue_sqrt

    def spy(*a, **k):
        sq, folded = real(*a, **k)
        seen.append(folded)
        return sq, folded

    monkeypatch.setattr(eigh_mod, "root_eigenvalue_sqrt", spy)
    monkeypatch.setattr(eigh_warm_mod, "root_eigenvalue_sqrt", spy)
    return seen


@pytest.mark.parametrize("p", [2, 4])
def test_prescaled_fp32_roots_are_in_the_callers_units_and_accurate(monkeypatch, p):
    seen = spy_folds(monkeypatch)
    A = factors()
    res = matroots.EighConfig().solve(A, p, eps=1e-12, psd="shift")
    assert res.info["prescale"] != 1.0 and seen and bool(seen[-1].all())
    ref, cond = reference(A, p, res.info["regularisation_abs"])
    for i in range(A.shape[0]):
        err = np.linalg.norm(res.root[i].double().numpy() - ref[i]) / np.linalg.norm(ref[i])
        # forward error of the root asked for: (1/p) kappa u sqrt(n) and the GEMM's n u, with margin
        assert err <= 10 * (1 + cond[i] / p) * U32 * np.sqrt(48), (i, err, cond[i])


def test_folded_roots_equal_the_rescaled_roots_to_a_few_ulps(monkeypatch):
    A = factors()
    folded = matroots.EighConfig().solve(A, 4, eps=1e-12, psd="shift").root
    real = eigh_mod.root_eigenvalue_sqrt
    monkeypatch.setattr(eigh_mod, "root_eigenvalue_sqrt", lambda pr, wr, f, e, inv: (f.sqrt(), None))
    rescaled = matroots.EighConfig().solve(A, 4, eps=1e-12, psd="shift").root
    monkeypatch.setattr(eigh_mod, "root_eigenvalue_sqrt", real)
    scale = rescaled.abs().amax(dim=(-2, -1), keepdim=True)
    assert float(((folded - rescaled).abs() / scale).max()) <= 8 * 48 * U32


def test_mixed_batch_rescales_only_the_elements_left_prescaled(monkeypatch):
    A = factors()
    all_folded = matroots.EighConfig().solve(A, 4, eps=1e-12, psd="shift").root
    real = eigh_mod.root_eigenvalue_sqrt

    def fold_none(pr, wr, f, e, inv):
        return f.sqrt(), None

    monkeypatch.setattr(eigh_mod, "root_eigenvalue_sqrt", fold_none)
    none_folded = matroots.EighConfig().solve(A, 4, eps=1e-12, psd="shift").root

    def fold_even(pr, wr, f, e, inv):
        sq, folded = real(pr, wr, f, e, inv)
        keep = torch.arange(f.shape[0]) % 2 == 0
        return torch.where(keep.unsqueeze(-1), sq, f.sqrt()), folded & keep

    monkeypatch.setattr(eigh_mod, "root_eigenvalue_sqrt", fold_even)
    mixed = matroots.EighConfig().solve(A, 4, eps=1e-12, psd="shift").root
    assert torch.equal(mixed[0::2], all_folded[0::2])
    assert torch.equal(mixed[1::2], none_folded[1::2])


def test_an_element_gets_the_same_bits_in_a_batch_as_alone():
    A = factors(b=4)
    A = A / A.abs().amax(dim=(-2, -1), keepdim=True) * 3e-5  # one prescale for each alone and the batch
    batch = matroots.EighConfig().solve(A, 4, eps=1e-12, psd="shift")
    for i in range(4):
        alone = matroots.EighConfig().solve(A[i], 4, eps=1e-12, psd="shift")
        assert alone.info["prescale"] == batch.info["prescale"]
        assert torch.equal(alone.root, batch.root[i]), i


def test_a_root_at_the_fp32_range_edge_keeps_the_exact_rescaling(monkeypatch):
    """The forward root (p = 1) of diag(2^-125, 1.5 2^-125): prescaled by 2^125, its root would be
    within n of fp32's smallest normal number in the caller's units, so the eigenvalues are not
    scaled and the exact rescaling returns A (to the eigensolver's rounding)."""
    seen = spy_folds(monkeypatch)
    A = torch.diag(torch.tensor([2.0**-125, 1.5 * 2.0**-125], dtype=torch.float32))
    res = matroots.EighConfig().solve(A, 1, inverse=False)
    assert res.info["prescale"] == 2.0**125
    assert seen and not bool(seen[-1].any())
    torch.testing.assert_close(res.root, A, rtol=4 * U32, atol=0)
    # eight binades higher it is folded, with the same accuracy
    B = A * 2.0**8
    res = matroots.EighConfig().solve(B, 1, inverse=False)
    assert bool(seen[-1].all())
    torch.testing.assert_close(res.root, B, rtol=4 * U32, atol=0)


def test_fp32_roots_are_proved_finite_and_others_tested(monkeypatch):
    calls = []
    real = solver_base.all_finite
    monkeypatch.setattr(solver_base, "all_finite", lambda t: calls.append(t.dtype) or real(t))
    A = factors(b=2)
    matroots.EighConfig().solve(A, 4, eps=1e-12, psd="shift")
    assert calls == []  # eigh_checked tested Q and the spectrum; the root's range was checked
    matroots.EighConfig().solve(A.double(), 4, eps=1e-12, psd="shift")
    assert calls == [torch.float64]
    matroots.solvers.EighWarmConfig().solve(A, 4, eps=1e-12, psd="shift")
    assert calls == [torch.float64, torch.float32]  # eigh_warm's roots are tested


@pytest.mark.parametrize(
    "diag,p",
    [([1e-33, 0.0], 1), ([1.0, 0.0], 0.1)],  # clamped to thresh = n u lambda_max: thresh^(-1/p) > 3.4e38
    ids=["prescaled", "unscaled"],
)
def test_clamped_roots_beyond_fp32_are_range_errors_not_converged(diag, p):
    """rank_policy="clamp" powers max(wr, thresh): with wr = 0 the largest root eigenvalue is
    thresh^(-1/p), here beyond fp32 (its log2 is judged from the values powered, not from wr)."""
    A = torch.diag(torch.tensor(diag))
    lam_max = max(diag)
    assert (2 * U32 * lam_max) ** (-1.0 / p) > torch.finfo(torch.float32).max  # the true root overflows
    with pytest.raises(matroots.FormatRangeError, match=r"beyond fp32|overflow fp32"):
        matroots.inverse_root(A, p, method=matroots.EighConfig(rank_policy="clamp"))


def test_clamped_root_inside_fp32_is_the_documented_one(monkeypatch):
    """diag(1, 0), p = 4, clamp: eigenvalues floored at rtol lambda_max (rtol = n u), so the root is
    diag(1, (2 u)^(-1/4)): finite, converged, proved finite without a pass."""
    calls = []
    real = solver_base.all_finite
    monkeypatch.setattr(solver_base, "all_finite", lambda t: calls.append(t.dtype) or real(t))
    res = matroots.inverse_root(
        torch.diag(torch.tensor([1.0, 0.0])), 4, method=matroots.EighConfig(rank_policy="clamp")
    )
    assert res.converged and bool(torch.isfinite(res.root).all())
    assert float(res.root[0, 0]) == pytest.approx(1.0, rel=1e-6)
    assert float(res.root[1, 1]) == pytest.approx((2 * U32) ** -0.25, rel=1e-5)
    assert calls == []


def test_a_root_near_the_top_of_fp32_is_tested_not_proved(monkeypatch):
    """diag(1, 6e-20)^(-2) has the root eigenvalue 2.8e38 in (max/2, max): the GEMM could round
    past max, so the root is tested (and is right). kappa = 1.7e19 > 1/u: the matrix is singular to
    fp32 (lambda_min < u lambda_max), cond(A^-2) u = 2 kappa u ~ 2e12, so no digit of the root is
    promised normwise and it is flagged not converged ("not_determined", the shared SPD domain test),
    although this diagonal one is computed exactly."""
    calls = []
    real = solver_base.all_finite
    monkeypatch.setattr(solver_base, "all_finite", lambda t: calls.append(t.dtype) or real(t))
    with pytest.warns(matroots.ConvergenceWarning):
        res = matroots.EighConfig().solve(torch.diag(torch.tensor([1.0, 6e-20])), 0.5, psd="none")
    assert calls == [torch.float32] and not res.converged
    assert res.info["stop_reason"] == ["not_determined"]
    assert float(res.root[1, 1]) == pytest.approx(float(np.float32(6e-20)) ** -2.0, rel=1e-5)


@pytest.mark.parametrize("policy", ["perturb", "clamp", "pseudo_inverse"])
def test_a_root_whose_eigenvalues_all_underflow_is_a_range_error(policy):
    """(4 I)^(-1/0.01) = 2^-200 I underflows fp32 to 0 in every entry: before, a zero root came back
    converged. No prescale (max|A| = 4 is in fp32's band), so eigh's own test must catch it."""
    with pytest.raises(matroots.FormatRangeError, match="underflow"):
        matroots.inverse_root(
            torch.diag(torch.tensor([4.0, 4.0])), 0.01, method=matroots.EighConfig(rank_policy=policy)
        )
    # in fp64 the same root is representable and right
    res = matroots.inverse_root(torch.diag(torch.tensor([4.0, 4.0], dtype=torch.float64)), 0.01)
    assert float(res.root[0, 0]) == pytest.approx(2.0**-200, rel=1e-12)


def test_pseudo_inverse_zeros_are_not_underflow():
    """pseudo_inverse sets the root eigenvalue of a dropped (zero) eigenvalue to 0: not an underflow."""
    res = matroots.inverse_root(
        torch.diag(torch.tensor([4.0, 0.0])), 2, method=matroots.EighConfig(rank_policy="pseudo_inverse")
    )
    assert res.converged
    torch.testing.assert_close(res.root, torch.diag(torch.tensor([0.5, 0.0])), rtol=2 * U32, atol=0)


def test_eigh_warm_warm_roots_are_folded_and_accurate(monkeypatch):
    """eigh_warm's warm path (a Rayleigh-Ritz step from the previous basis) folds like eigh."""
    seen = spy_folds(monkeypatch)
    cfg = matroots.solvers.EighWarmConfig()
    A0 = factors(rank=96)  # full rank: the warm path's clusters are well separated
    g = torch.Generator().manual_seed(11)
    G = torch.randn(6, 48, 2, generator=g)
    A1 = mirror_upper_(torch.baddbmm(A0, G, G.mT, alpha=1e-8))  # the next round's factors: a small update
    r0 = cfg.solve(A0, 4, eps=1e-12, psd="shift")
    r1 = cfg.solve(A1, 4, eps=1e-12, psd="shift", warm_start=r0)
    assert r1.info["prescale"] != 1.0
    assert all(w.startswith(("accepted", "refined")) for w in r1.info["warm"]), r1.info["warm"]
    assert seen and all(bool(s.all()) for s in seen if s is not None)
    ref, cond = reference(A1, 4, r1.info["regularisation_abs"])
    for i in range(6):
        err = np.linalg.norm(r1.root[i].double().numpy() - ref[i]) / np.linalg.norm(ref[i])
        assert err <= 10 * (1 + cond[i] / 4) * U32 * np.sqrt(48), (i, err, cond[i], r1.info["warm"][i])


def test_an_unconverged_warm_root_is_left_to_the_exact_rescaling(monkeypatch):
    """eigh_warm with fallback=False and bases from the wrong factors: not converged, its basis far
    from orthonormal, so its root is not folded (the margin assumes unit rows); it still comes back
    in the caller's units (a missing or doubled rescaling, 2^(10/4) here, would show)."""
    seen = spy_folds(monkeypatch)
    cfg = matroots.solvers.EighWarmConfig(fallback=False)
    A = factors(b=2, rank=96)
    r0 = cfg.solve(A, 4, eps=1e-12, psd="shift")
    swapped = A[torch.tensor([1, 0])]
    with pytest.warns(matroots.ConvergenceWarning):
        res = cfg.solve(swapped, 4, eps=1e-12, psd="shift", warm_start=r0, max_iter=1)
    assert res.info["prescale"] >= 2.0**8 and not bool(res.converged.any()), res.info["warm"]
    assert len(seen) == 1  # r0's cold solve only
    ref, _ = reference(swapped, 4, res.info["regularisation_abs"])
    for i in range(2):
        ratio = float(res.root[i].norm()) / float(np.linalg.norm(ref[i]))
        assert 0.5 < ratio < 2.0, (i, ratio)


def test_a_retried_fp32_solve_is_tested_again(monkeypatch):
    calls = []
    real_finite, real_eigh = solver_base.all_finite, torch.linalg.eigh
    monkeypatch.setattr(solver_base, "all_finite", lambda t: calls.append(t.dtype) or real_finite(t))

    def nan_once(A, *a, **k):
        w, Q = real_eigh(A, *a, **k)
        if A.dtype == torch.float32:
            w = w.clone()
            w[0, 0] = float("nan")
        return w, Q

    monkeypatch.setattr(torch.linalg, "eigh", nan_once)
    res = matroots.EighConfig().solve(factors(b=2), 4, eps=1e-12, psd="shift")
    assert "eigh_retry_fp64" in res.info and calls == [torch.float32]


def test_shampoo_still_fails_a_non_finite_root_of_a_matroots_solver(monkeypatch):
    """Shampoo no longer re-tests roots of matroots' own solve(): _finalise must flag a NaN root."""
    import shampoo
    from shampoo.config import GroupOptions
    from shampoo.roots import solve_batch

    real_run = matroots.EighConfig._run

    def nan_root(self, prob, **kw):
        raw = real_run(self, prob, **kw)
        raw.root[1, 0, 0] = float("nan")
        raw.finite = None  # the proof no longer holds
        return raw

    monkeypatch.setattr(matroots.EighConfig, "_run", nan_root)
    opts = GroupOptions.from_group(shampoo.Shampoo([torch.nn.Parameter(torch.zeros(2, 2))]).param_groups[0])
    out = solve_batch(matroots.EighConfig(), factors(b=3), 4, opts, torch.float32, None, 0)
    assert out.ok.tolist() == [True, False, True]
    assert "non-finite root for 1 of 3" in out.error
