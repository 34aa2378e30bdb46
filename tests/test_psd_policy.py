"""The rank-deficiency policies of matroots.psd: one definition, the same matrix for every solver.

Inputs are built the way Shampoo builds them (rank-deficient fp32 factors accumulated by ``baddbmm``);
accuracy is judged against high-precision references (matroots.reference) of the matrix actually solved
and against the condition number of that matrix, never against the code under test.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import matroots
from matroots import psd, reference
from matroots.errors import ConvergenceWarning, InvalidArgumentError, NotPositiveDefiniteError

SOLVERS = [s for s in matroots.solvers.available() if s != "auto"]
U32 = 2.0**-24


def baddbmm_factor(n: int, rank: int, steps: int = 3, seed: int = 0, beta2: float = 0.999) -> torch.Tensor:
    """An fp32 EMA of G G^T with G (n, rank): PSD of rank <= steps * rank, rounded like Shampoo's."""
    g = torch.Generator().manual_seed(seed)
    F = torch.zeros(1, n, n)
    for _ in range(steps):
        G = torch.randn(1, n, rank, generator=g)
        F.baddbmm_(G, G.mT, beta=beta2, alpha=1.0 - beta2)
    return F[0]


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
    u = matroots.precision.unit_roundoff(dtype)
    assert err <= 48 * (kappa / 4) * u, (solver, err, kappa)


def test_shift_leaves_a_well_conditioned_matrix_alone() -> None:
    A = baddbmm_factor(24, 40, steps=1)  # rank 24: full rank, modest kappa
    for solver in SOLVERS:
        cfg = matroots.resolve_method(solver)
        a = cfg.solve(A, 2, eps=1e-6, eps_mode="relative", psd="shift")
        b = cfg.solve(A, 2, eps=1e-6, eps_mode="relative", psd="none")
        assert float(a.info["psd_shift"][0]) == 0.0 and a.info["psd_cholesky_calls"] == 1
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
    u16 = matroots.precision.unit_roundoff(torch.float16)
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
    """Item 2 of the issue on a real accumulation: a baddbmm fp32 factor is asymmetric at ~1e-8 and the
    fp64 fallback (eigh) judges its symmetry against fp32, its own format."""
    g = torch.Generator().manual_seed(1)
    F = torch.zeros(1, 256, 256)
    for _ in range(3):
        G = torch.randn(1, 256, 1024, generator=g)
        F.baddbmm_(G, G.mT, beta=0.999, alpha=0.001)
    defect = float(torch.linalg.matrix_norm(F - F.mT) / torch.linalg.matrix_norm(F))
    assert 0 < defect < 1e-6  # asymmetric at the rounding level of fp32, far above fp64's tolerance
    res = matroots.EighConfig().solve(F, 4, eps=1e-12, dtype=torch.float64, psd="shift")
    assert bool(res.converged) and res.root.dtype == torch.float64
    # a truly non-symmetric matrix is still refused
    bad = F.clone()
    bad[0, 0, 1] += 1e-2 * float(F.abs().max())
    with pytest.raises(matroots.NotSymmetricError):
        matroots.EighConfig().solve(bad, 4, eps=1e-12, dtype=torch.float64)
