"""The rank-deficiency policies of matroots.core.psd: one definition, the same matrix for every solver.

Inputs are built the way Shampoo builds them (rank-deficient fp32 factors accumulated by ``baddbmm``,
read with the upper triangle mirrored, :func:`shampoo.state.mirror_upper_`: exactly symmetric on every
CPU, whether or not its GEMM rounds the two triangles alike);
accuracy is judged against high-precision references (matroots.truth.reference) of the matrix actually solved
and against the condition number of that matrix, never against the code under test.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import matroots
from matroots.core import psd
from matroots.core.errors import ConvergenceWarning, InvalidArgumentError, NotPositiveDefiniteError
from matroots.truth import reference
from shampoo.state import mirror_upper_

SOLVERS = [s for s in matroots.solvers.available() if s != "auto"]
U32 = 2.0**-24


def baddbmm_factor(n: int, rank: int, steps: int = 3, seed: int = 0, beta2: float = 0.999) -> torch.Tensor:
    """An fp32 EMA of G G^T with G (n, rank): PSD of rank <= steps * rank, rounded like Shampoo's and
    read as Shampoo reads it (upper triangle mirrored: the lower one is the GEMM's scratch, bitwise
    equal to the upper one on some CPUs only)."""
    g = torch.Generator().manual_seed(seed)
    F = torch.zeros(1, n, n)
    for _ in range(steps):
        G = torch.randn(1, n, rank, generator=g)
        F.baddbmm_(G, G.mT, beta=beta2, alpha=1.0 - beta2)
    return mirror_upper_(F)[0]


def solved_matrix(A: torch.Tensor, res: matroots.RootResult) -> np.ndarray:
    """The matrix the solver actually solved, in float64: A rounded to the working format, plus the
    psd shift added on the diagonal in that format, plus eps_abs (added exactly by the reference)."""
    s = float(torch.as_tensor(res.info["psd_shift"]).reshape(-1)[0])
    W = A.to(res.dtype).clone()
    W.diagonal().add_(torch.tensor(s, dtype=torch.float64).to(W.dtype))
    return W.double().numpy()


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shift_makes_every_solver_solve_the_same_spd_matrix(solver: str, dtype: torch.dtype) -> None:
    A = baddbmm_factor(48, 2)  # rank 6 of 48, fp32 rounding noise on the null space
    assert float(torch.linalg.eigvalsh(A.double())[0]) < 0  # rounding made it indefinite
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        res = matroots.resolve_method(solver).solve(A, 4, eps=1e-12, dtype=dtype, psd="shift")
    assert bool(res.converged)
    info = res.info
    f = float(info["psd_floor"][0])
    # the floor is n u ||A||_F with u of fp32, the factor's own format, even when solved in fp64
    assert f == pytest.approx(48 * U32 * float(torch.linalg.matrix_norm(A.double())), rel=1e-6)
    s = float(info["psd_shift"][0])
    assert f <= s <= 4 * f  # rank deficient: shifted, by f or 2f plus its rounding-negative part
    assert float(info["regularisation_abs"][0]) == pytest.approx(s + float(info["eps_abs"][0]))
    M = solved_matrix(A, res)
    lam = reference.eigvalsh(M)
    assert lam[0] >= 0.5 * f  # certified: lambda_min of the matrix solved is at the floor
    kappa = float(lam[-1] / (lam[0] + 1e-12))
    assert kappa <= 2.0 / (48 * U32)
    ref = reference.inverse_root(M, 4, eps=1e-12)
    err = float(np.linalg.norm(res.root.double().numpy() - ref.root) / np.linalg.norm(ref.root))
    u = matroots.core.precision.unit_roundoff(dtype)
    assert err <= 48 * (kappa / 4) * u, (solver, err, kappa)


def test_shift_leaves_a_well_conditioned_matrix_alone() -> None:
    A = baddbmm_factor(24, 40, steps=1)  # rank 24: full rank, modest kappa
    for solver in SOLVERS:
        cfg = matroots.resolve_method(solver)
        a = cfg.solve(A, 2, eps=1e-6, eps_mode="relative", psd="shift")
        b = cfg.solve(A, 2, eps=1e-6, eps_mode="relative", psd="none")
        assert float(a.info["psd_shift"][0]) == 0.0
        on_eigenvalues = solver == "eigh"  # eigh decides "shift" on its own spectrum; the rest by Cholesky
        assert a.info["psd_cholesky_calls"] == (0 if on_eigenvalues else 1), solver
        assert a.info["psd_certificate"] == ("computed eigenvalues" if on_eigenvalues else "cholesky")
        assert torch.equal(a.root, b.root), solver


def test_meta_policy_reproduces_distributed_shampoo_eigen_root() -> None:
    """Meta's PerturbationConfig: eigenvalues L of A; if min L < eps... the solved spectrum is
    L + max(0, -lambda_min) + eps (matrix_functions.matrix_inverse_root_from_eigendecomposition)."""
    A = baddbmm_factor(32, 2).double()
    eps = 1e-10
    L, Q = torch.linalg.eigh(A)
    lmin = float(L.min())
    assert lmin < 0
    expect = Q * (L - lmin + eps).pow(-0.25).unsqueeze(0) @ Q.T
    res = matroots.EighConfig().solve(A, 4, eps=eps, psd="meta")
    assert float(res.info["psd_shift"][0]) == pytest.approx(-lmin, rel=1e-12)
    assert math.isnan(float(res.info["psd_floor"][0]))
    assert torch.allclose(res.root, expect, rtol=1e-10, atol=0)
    # a positive definite matrix is not shifted (only eps is added)
    B = A + 1e-3 * torch.eye(32, dtype=torch.float64)
    rb = matroots.EighConfig().solve(B, 4, eps=eps, psd="meta")
    assert float(rb.info["psd_shift"][0]) == 0.0


def test_meta_policy_on_newton_methods_uses_eigvalsh_lambda_min() -> None:
    A = baddbmm_factor(32, 2).double()
    lmin = float(torch.linalg.eigvalsh(A)[0])
    res = matroots.CoupledNewtonConfig().solve(A, 2, eps=1e-8, psd="meta")
    assert float(res.info["psd_shift"][0]) == pytest.approx(-lmin, rel=1e-9)
    assert res.info["psd_eigvalsh_calls"] == 1


@pytest.mark.parametrize("solver", ["coupled_newton", "schur_newton", "eigh"])
def test_none_policy_refuses_a_rank_deficient_fp32_factor(solver: str) -> None:
    A = baddbmm_factor(48, 2)
    with pytest.raises(NotPositiveDefiniteError):
        matroots.resolve_method(solver).solve(A, 4, eps=1e-12, psd="none")


def test_policy_is_a_config_field_and_a_solve_override() -> None:
    A = baddbmm_factor(16, 1)
    cfg = matroots.CoupledNewtonConfig(psd="shift")
    assert bool(cfg.solve(A, 2, eps=1e-12).converged)
    with pytest.raises(NotPositiveDefiniteError):
        cfg.solve(A, 2, eps=1e-12, psd="none")
    with pytest.raises(InvalidArgumentError, match="psd policy must be one of"):
        cfg.solve(A, 2, psd="shfit")


def test_fp16_shift_is_reported_in_the_users_units() -> None:
    A = baddbmm_factor(16, 1) * 3e4  # fp16 inputs are pre-scaled by a power of two inside matroots
    res = matroots.EighConfig().solve(A, 2, eps=0.0, dtype=torch.float16, psd="shift")
    f = float(res.info["psd_floor"][0])
    u16 = matroots.core.precision.unit_roundoff(torch.float16)
    assert f == pytest.approx(16 * u16 * float(torch.linalg.matrix_norm(A.double())), rel=1e-3)
    assert f <= float(res.info["psd_shift"][0]) <= 4 * f


def test_zero_matrix_gets_no_shift_and_the_eps_decides() -> None:
    Z = torch.zeros(8, 8)
    res = matroots.EighConfig().solve(Z, 2, eps=1e-4, psd="shift")
    assert float(res.info["psd_shift"][0]) == 0.0
    assert torch.allclose(res.root, torch.eye(8) * 100.0)


def test_certified_shift_terminates_on_an_indefinite_matrix() -> None:
    """A badly indefinite matrix ends at the Gershgorin bound, not in an endless doubling."""
    A = torch.diag(torch.tensor([1.0, -5.0, 2.0], dtype=torch.float64)).unsqueeze(0)
    f = psd.floor_level(A)
    shift, calls = psd.certified_shift(A, f, torch.float64)
    assert 5.0 < float(shift[0]) < 5.0 * 1.01 + 1e-6
    assert calls < 60
    assert bool(torch.linalg.cholesky_ex(A + float(shift[0]) * torch.eye(3))[1][0] == 0)


def test_quiet_solve_warns_nothing_but_reports_non_convergence() -> None:
    A = baddbmm_factor(16, 20, steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = matroots.CoupledNewtonConfig().solve(A, 4, eps=1e-12, max_iter=1, psd="shift", quiet=True)
    assert not bool(res.converged)
    with pytest.warns(ConvergenceWarning):
        matroots.CoupledNewtonConfig().solve(A, 4, eps=1e-12, max_iter=1, psd="shift")


def test_fp32_baddbmm_factor_solved_in_fp64_is_accepted_as_symmetric() -> None:
    """A fp32 factor asymmetric at fp32's rounding level (a baddbmm accumulation read without the
    mirror) solved in fp64: the fp64 fallback (eigh) judges its symmetry against fp32, its own format.
    Whether baddbmm's two triangles differ depends on the CPU's GEMM kernel, so the asymmetry is made
    by construction: the mirrored factor with its lower triangle moved up by one fp32 ulp."""
    g = torch.Generator().manual_seed(1)
    F = torch.zeros(1, 256, 256)
    for _ in range(3):
        G = torch.randn(1, 256, 1024, generator=g)
        F.baddbmm_(G, G.mT, beta=0.999, alpha=0.001)
    F = mirror_upper_(F)
    lower = torch.ones(256, 256, dtype=torch.bool).tril_(-1)
    F = torch.where(lower, torch.nextafter(F, torch.tensor(math.inf)), F)
    defect = float(torch.linalg.matrix_norm(F - F.mT) / torch.linalg.matrix_norm(F))
    # one ulp on the off-diagonal entries: 0 < defect <= 2^-23, far above fp64's tolerance (~n 2^-53)
    assert 0 < defect <= 2.0**-23
    res = matroots.EighConfig().solve(F, 4, eps=1e-12, dtype=torch.float64, psd="shift")
    assert bool(res.converged) and res.root.dtype == torch.float64
    # a truly non-symmetric matrix is still refused
    bad = F.clone()
    bad[0, 0, 1] += 1e-2 * float(F.abs().max())
    with pytest.raises(matroots.NotSymmetricError):
        matroots.EighConfig().solve(bad, 4, eps=1e-12, dtype=torch.float64)


# ------------------------------------------------------------------ "shift" decided on eigenvalues (eigh)


def _with_spectrum(lam: np.ndarray, seed: int = 0) -> torch.Tensor:
    """Q diag(lam) Q^T in float64 for a random orthogonal Q (exactly symmetric)."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((lam.size, lam.size)))
    A = torch.from_numpy((Q * lam) @ Q.T)
    return 0.5 * (A + A.mT)


@pytest.mark.parametrize(("c", "expect"), [(3.0, 0.0), (0.5, 1.0), (-0.5, 2.0), (-2.5, 4.0), (-5.0, 8.0)])
def test_eigenvalue_shift_is_the_smallest_certified_candidate(c: float, expect: float) -> None:
    """lambda_min(A) = c f (f the floor): s is the smallest of {0, f, 2f, ...} with lambda_min + s - f
    > 0, the value the Cholesky search of the other methods finds, and the matrix solved is A + s I."""
    n = 24
    lam = np.linspace(1.0, 2.0, n)
    A0 = _with_spectrum(lam)
    f0 = float(psd.floor_level(A0.unsqueeze(0))[0])
    lam[0] = c * f0  # ||A||_F moves by ~f: recompute the floor of the final matrix
    A = _with_spectrum(lam)
    f = float(psd.floor_level(A.unsqueeze(0))[0])
    lam_min = float(reference.eigvalsh(A.numpy())[0])
    res = matroots.EighConfig().solve(A, 2, eps=0.0, psd="shift")
    s = float(res.info["psd_shift"][0])
    assert s == pytest.approx(expect * f, rel=1e-12), (s / f, lam_min / f)
    assert res.info["psd_cholesky_calls"] == 0
    chol = matroots.CoupledNewtonConfig().solve(A, 2, eps=0.0, psd="shift")  # the Cholesky search
    assert float(chol.info["psd_shift"][0]) == pytest.approx(s, rel=1e-12)
    M = A.numpy() + s * np.eye(n)
    ref = reference.inverse_root(M, 2, eps=0.0).root
    err = np.linalg.norm(res.root.numpy() - ref) / np.linalg.norm(ref)
    kappa = float(lam[-1] / (lam_min + s))
    assert err <= 10 * n * kappa * 2.0**-53, (err, kappa)


def test_eigenvalue_shift_keeps_the_gershgorin_cap() -> None:
    """A diagonal indefinite matrix: the Gershgorin bound s_G = f - min a_ii is below 2f, so the
    search stops there (the same value as the Cholesky search's cap), not at 2f."""
    d = torch.linspace(1.0, 2.0, 16, dtype=torch.float64)
    f = float(psd.floor_level(torch.diag(d).unsqueeze(0))[0])
    d[0] = -0.5 * f
    A = torch.diag(d)
    f = float(psd.floor_level(A.unsqueeze(0))[0])
    res = matroots.EighConfig().solve(A, 2, eps=0.0, psd="shift")
    chol, _ = psd.certified_shift(A.unsqueeze(0), torch.tensor([f], dtype=torch.float64), torch.float64)
    s_g = f - float(d[0])
    assert float(res.info["psd_shift"][0]) == float(chol[0]) == pytest.approx(s_g * 1.001 + 1e-3 * f)


def test_eigenvalue_shift_matches_the_cholesky_search_on_shampoo_factors() -> None:
    """Rank-deficient, full-rank and barely full-rank fp32 factors built by baddbmm: eigh's shift is
    the Cholesky search's, except where lambda_min(A) - f (+ s) is within rounding of 0 (then the
    neighbouring candidate, and the matrix solved still has lambda_min >= f up to rounding)."""
    cases = [(48, r, steps, seed) for r, steps in [(2, 3), (8, 6), (16, 3), (60, 1)] for seed in range(3)]
    differ = 0
    for n, rank, steps, seed in cases:
        A = baddbmm_factor(n, rank, steps=steps, seed=seed)
        e = matroots.EighConfig().solve(A, 4, eps=1e-12, psd="shift")
        c = matroots.CoupledNewtonConfig().solve(A, 4, eps=1e-12, psd="shift")
        se, sc = float(e.info["psd_shift"][0]), float(c.info["psd_shift"][0])
        f = float(e.info["psd_floor"][0])
        lam = reference.eigvalsh(A.double().numpy())
        assert lam[0] + se >= f - 4 * math.sqrt(n) * U32 * lam[-1], (n, rank, se / f)  # certified floor
        if se != sc:
            differ += 1
            margin = (
                min(abs(lam[0] + s - f) for s in (se, sc) if s > 0) if max(se, sc) > 0 else abs(lam[0] - f)
            )
            assert margin <= 4 * math.sqrt(n) * U32 * lam[-1], (se / f, sc / f, lam[0] / f)
    assert differ <= 1


def test_eigenvalue_shift_is_a_constant_for_autograd() -> None:
    """The gradient through eigh under psd='shift' is that of (A + s I)^(-1/p) with s held fixed (the
    "meta" shift -lambda_min moves with A; this one does not)."""
    A = baddbmm_factor(12, 2).double()
    A = (A + A.mT) / 2
    Ag = A.clone().requires_grad_(True)
    res = matroots.EighConfig().solve(Ag, 2, eps=1e-10, psd="shift")
    s = float(res.info["psd_shift"][0])
    assert s > 0
    B = (A + s * torch.eye(12, dtype=torch.float64)).requires_grad_(True)
    ref = matroots.EighConfig().solve(B, 2, eps=1e-10, psd="none")
    W = torch.randn(12, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (ga,) = torch.autograd.grad((res.root * W).sum(), Ag)
    (gb,) = torch.autograd.grad((ref.root * W).sum(), B)
    # the matrix solved has kappa ~ 1/(n u) ~ 1e14 (fp64 floor): the two solves differ at ~kappa u
    kappa = float(res.info["lambda_max"][0]) / s
    tol = 10 * kappa * 2.0**-53
    rel = lambda x, y: float(torch.linalg.norm(x - y) / torch.linalg.norm(y))  # noqa: E731
    assert rel(res.root.detach(), ref.root.detach()) <= tol
    assert rel(ga, gb) <= 10 * tol, (rel(ga, gb), tol)
    # ... and the "meta" policy's derivative differs (its shift moves with A): the test can tell
    meta = matroots.EighConfig().solve(Ag, 2, eps=1e-10, psd="meta")
    (gm,) = torch.autograd.grad((meta.root * W).sum(), Ag)
    assert not torch.allclose(gm, ga, rtol=1e-3)
