"""Cheap condition-number estimates for ``method="auto"`` (symmetric input, batched).

* lambda_max: power iteration (:func:`matroots.core.spectral.power_lambda_max`; the Rayleigh quotient, a
  lower bound that converges as (lambda_2/lambda_1)^(2k); Golub & Van Loan, *Matrix Computations*,
  4th ed., §7.3.1). The table's kappa bands span a factor 100, so a few steps suffice; the
  caller's safety factor covers the remaining underestimate. (Lanczos with reorthogonalisation is more
  accurate but its Python-level loop costs more than an n = 16 eigendecomposition.)
* lambda_min: inverse iteration with a Cholesky factor (Golub & Van Loan §8.2.2): L L^T = A + eps I
  (n^3/3 flops = 1/6 GEMM), then ``inverse_iters`` solves v <- (L L^T)^{-1} v (2 n^2 flops each); the
  Rayleigh quotient mu = v^T A^{-1} v / v^T v <= 1/lambda_min, so 1/mu >= lambda_min, converging as
  (lambda_1/lambda_2)^(2k). A failed Cholesky
  factorisation proves that A + eps I is not (numerically) positive definite: kappa = inf.
* from a previous root Z ~ (A + eps I)^{-1/p} (warm start): 1/lambda_min ~ lambda_max(Z)^p, from power
  iteration on Z: the previous round's conditioning, without a factorisation.

* exact, for small problems (b n^3 <= :data:`EXACT_MAX_WORK`): the eigenvalues of A + eps I by one
  LAPACK call (``eigvalsh``, ~ 4n^3/3 flops for tridiagonalisation). Up to n ~ 192 one such call costs
  less than the ~100 small tensor operations of the iterative estimate, whose time there is mostly
  dispatch, not flops (one float64 n = 128 matrix, 1 torch thread on the shared 2-core CPU box:
  eigvalsh 0.46x the iterative estimate's CPU time, n = 192: 0.89x, n = 256: 1.29x, medians of 11
  interleaved rounds, 2026-12-02); a non-positive lambda_min is kappa = inf, as a failed Cholesky is.

Costs are returned in GEMM-equivalents (flops / 2n^3) and are added to the solve's ``matmuls``.
The estimates are taken on the float64 input (the selection table is keyed on the kappa of the
input matrix with its eps, before rounding to the working format).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core.options import EPS_MODES
from ..core.regularize import absolute_shift
from ..core.spectral import power_lambda_max

# Largest b n^3 estimated exactly (eigvalsh): one n = 192 matrix, or 27 n = 64 ones (the crossover
# with the iterative estimate's cost, module docstring).
EXACT_MAX_WORK = 192**3


@dataclass(frozen=True)
class KappaEstimate:
    """Per-element estimates (lists of floats) and their cost; ``exact``: computed eigenvalues, not
    an iterative estimate that errs low."""

    kappa: list[float]
    lmax: list[float]
    lmin: list[float]
    eps_abs: list[float]
    matmuls: float
    source: str
    exact: bool = False


def estimate_kappa(
    A: torch.Tensor,
    *,
    eps: float = 0.0,
    eps_mode: str = "absolute",
    power_iters: int = 8,
    inverse_iters: int = 4,
    previous_root: torch.Tensor | None = None,
    p: float | None = None,
    floor: torch.Tensor | None = None,
) -> KappaEstimate:
    """Estimate kappa_2(A + eps_abs I) for a symmetric batch ``A`` (b, n, n).

    ``floor`` (b,): the eigenvalue floor of the ``"shift"`` rank-deficiency policy
    (:func:`matroots.core.psd.floor_level`) when the solver will apply it: the matrix solved then has
    lambda_min >= floor, so the estimate of lambda_min is raised to it (also where A + eps I is
    not positive definite, which the policy repairs).
    """
    work = A.detach().to(torch.float64)
    b, n, _ = work.shape
    if b * n**3 <= EXACT_MAX_WORK:
        return _exact(work, eps, eps_mode, floor)
    lmax, mv = power_lambda_max(work, power_iters)
    cost = mv / n
    shift = absolute_shift(eps, eps_mode, lmax).to(lmax.dtype)
    hi = lmax + shift
    if previous_root is not None and p is not None:
        Z = previous_root.detach().to(torch.float64).reshape(b, n, n)
        zmax, mvz = power_lambda_max(0.5 * (Z + Z.mT), power_iters)
        cost += mvz / n
        inv_lmin = zmax.clamp_min(0) ** float(p)
        lo = torch.where(inv_lmin > 0, 1.0 / inv_lmin, torch.zeros_like(inv_lmin))
        kappa = torch.where(lo > 0, hi / lo, torch.full_like(hi, math.inf))
        return KappaEstimate(
            kappa.tolist(),
            hi.tolist(),
            lo.tolist(),
            shift.tolist(),
            cost,
            "previous root (power iteration on A and Z)",
        )
    Ae = work + shift.view(b, 1, 1) * torch.eye(n, dtype=torch.float64, device=work.device)
    L, info = torch.linalg.cholesky_ex(Ae)
    cost += 1.0 / 6.0
    pd = info == 0
    g = torch.Generator(device="cpu").manual_seed(0xC0DE)
    v = torch.randn(b, n, 1, generator=g, dtype=torch.float64).to(work.device)
    v = v / v.norm(dim=-2, keepdim=True)
    mu = torch.zeros(b, dtype=torch.float64, device=work.device)
    if bool(pd.any()):
        Ls = torch.where(pd.view(b, 1, 1), L, torch.eye(n, dtype=torch.float64, device=work.device))
        for i in range(inverse_iters):  # mu of the last step only (the earlier ones were overwritten)
            w = torch.cholesky_solve(v, Ls)
            if i == inverse_iters - 1:
                mu = (v * w).sum((-2, -1)) / (v * v).sum((-2, -1))
                break
            v = w / w.norm(dim=-2, keepdim=True).clamp_min(1e-300)
        cost += inverse_iters / n
    lo_inv = torch.where(mu > 0, 1.0 / mu.clamp_min(1e-300), torch.full_like(mu, math.inf))
    lo = lo_inv
    src = "power iteration + Cholesky inverse iteration"
    if floor is not None:
        f = floor.to(lo) + shift
        lo = torch.where(pd, torch.maximum(lo, f), f)
        pd = torch.ones_like(pd)
        src += " (lambda_min raised to the psd='shift' floor)"
    kappa = torch.where(pd & (lo > 0), hi / lo.clamp_min(1e-300), torch.full_like(hi, math.inf))
    return KappaEstimate(kappa.tolist(), hi.tolist(), lo.tolist(), shift.tolist(), cost, src)


def _exact(work: torch.Tensor, eps: float, eps_mode: str, floor: torch.Tensor | None) -> KappaEstimate:
    """kappa of A + eps_abs I from the eigenvalues of A (float64 LAPACK), with the psd floor applied
    as in the iterative estimate."""
    w = torch.linalg.eigvalsh(work)
    if floor is None and eps_mode in EPS_MODES:
        # the float64 arithmetic of the tensor path below on Python floats (IEEE double, the same
        # roundings), in two operations instead of a dozen small ones
        ends = (w[:, :: w.shape[1] - 1] if w.shape[1] > 1 else w[:, [0, 0]]).tolist()  # a view: no index op
        shifts = [float(eps) * abs(top) if eps_mode == "relative" else float(eps) for _, top in ends]
        his = [top + s for (_, top), s in zip(ends, shifts, strict=True)]
        los = [bot + s for (bot, _), s in zip(ends, shifts, strict=True)]
        kap = [h / max(lo, 1e-300) if lo > 0 else math.inf for h, lo in zip(his, los, strict=True)]
        return KappaEstimate(kap, his, los, shifts, 2.0 / 3.0, "eigenvalues (float64 eigvalsh)", exact=True)
    shift = absolute_shift(eps, eps_mode, w[:, -1]).to(w.dtype)
    hi, lo = w[:, -1] + shift, w[:, 0] + shift
    src = "eigenvalues (float64 eigvalsh)"
    if floor is not None:
        lo = torch.maximum(lo, floor.to(lo) + shift)
        src += " (lambda_min raised to the psd='shift' floor)"
    kappa = torch.where(lo > 0, hi / lo.clamp_min(1e-300), torch.full_like(hi, math.inf))
    return KappaEstimate(kappa.tolist(), hi.tolist(), lo.tolist(), shift.tolist(), 2.0 / 3.0, src, exact=True)


__all__ = ["EXACT_MAX_WORK", "KappaEstimate", "estimate_kappa"]
