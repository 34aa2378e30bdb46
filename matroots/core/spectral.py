"""Cheap estimates of the extreme eigenvalues of (batches of) symmetric matrices.

The Newton solvers need lambda_max (and, for the optimal scaling, lambda_min) without paying for an
eigendecomposition. Costs are returned in matrix-vector products; ``n`` of them equal one GEMM.

* Power iteration (von Mises): the Rayleigh quotient after k steps underestimates lambda_max.
* Lanczos with full reorthogonalisation (Golub & Van Loan, *Matrix Computations*, 4th ed., §10.1):
  the extreme Ritz values converge fast to the extreme eigenvalues; the top Ritz pair's residual
  |beta_k s_k| bounds its distance to an eigenvalue, which we add to obtain a safe upper estimate.
* Gershgorin discs: a guaranteed (often loose) enclosure of the spectrum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SpectrumEstimate:
    """Extreme-eigenvalue estimates for a batch (tensors of the batch shape, float64).

    ``ritz`` (b, k) are all Ritz values and ``weights`` (b, k) the Gauss-quadrature weights of the
    start vector's spectral measure (squared first components of T's eigenvectors, summing to 1): a
    coarse picture of the whole spectrum, exact (all eigenvalues) when k = n.
    """

    lmin: torch.Tensor
    lmax: torch.Tensor
    lmax_upper: torch.Tensor
    matvecs: int
    ritz: torch.Tensor | None = None
    weights: torch.Tensor | None = None


def _start_vectors(batch: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # A fixed, dense, sign-varying start vector keeps the estimates reproducible without touching
    # the global RNG (solvers are pure).
    g = torch.Generator(device="cpu").manual_seed(0x5EED)
    v = torch.randn(n, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    v = v.expand(batch, n).clone()
    return v / v.norm(dim=-1, keepdim=True)


def _matvec(A: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A v for symmetric A (b, n, n), v (b, n), computed as the row product v^T A.

    The row form is batch-invariant where the BLAS rounds a stack element as it rounds the matrix
    alone (each element's result is then bitwise its solo one, so a batched solve equals per-element
    solves): MKL does for elements at the alignment of a fresh matrix (n = 16 in fp32/fp64), and for
    any layout under ``MKL_CBWR``; on AVX-512 EPYC without it an element of odd n (33) rounds by its
    offset in the stack, and batch and solo results agree to rounding only. It is also faster on CPU
    (MKL); ``bmm(A, v[..., None])`` rounds with the batch size even where the row form does not.
    """
    return torch.bmm(v.unsqueeze(-2), A).squeeze(-2)


def _project(V: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """V V^T w (b, n) for V (b, n, k), in the row form (batch-invariant where the BLAS is, see
    :func:`_matvec`)."""
    return torch.bmm(torch.bmm(w.unsqueeze(-2), V), V.mT).squeeze(-2)


def power_lambda_max(A: torch.Tensor, iters: int = 20) -> tuple[torch.Tensor, int]:
    """Rayleigh-quotient estimate of lambda_max of symmetric ``A`` (b, n, n) by power iteration.

    Returns (estimate of shape (b,), matvecs used). The estimate is a lower bound of lambda_max for
    SPD input; callers add a safety margin.
    """
    work = A if A.dtype in (torch.float32, torch.float64) else A.float()
    b, n, _ = work.shape
    v = _start_vectors(b, n, work.dtype, work.device)
    if iters < 1:
        return torch.zeros(b, dtype=torch.float64, device=work.device), 0
    # the Rayleigh quotient of the last step only (each step's overwrote the one before), and no
    # normalisation after it: the same numbers in fewer small operations (their dispatch is the cost)
    one = torch.ones((), dtype=work.dtype, device=work.device)
    for i in range(iters):
        w = _matvec(work, v)
        if i == iters - 1:
            break
        nrm = w.norm(dim=-1, keepdim=True)
        v = w / torch.where(nrm > 0, nrm, one)
    return (v * w).sum(-1).double(), iters


def lanczos_extremes(A: torch.Tensor, steps: int | None = None) -> SpectrumEstimate:
    """Extreme Ritz values of symmetric ``A`` (b, n, n) after ``steps`` Lanczos steps.

    Full reorthogonalisation keeps the basis orthogonal in finite precision. ``lmax_upper`` is the
    top Ritz value plus its residual bound, a safe estimate of lambda_max for the Newton scalings.
    """
    work = A.double() if A.dtype != torch.float64 else A
    b, n, _ = work.shape
    k = min(n, steps if steps is not None else 24)
    V = torch.zeros(b, n, k, dtype=work.dtype, device=work.device)
    alpha = torch.zeros(b, k, dtype=work.dtype, device=work.device)
    beta = torch.zeros(b, k, dtype=work.dtype, device=work.device)
    v = _start_vectors(b, n, work.dtype, work.device)
    used = 0
    scale = work.abs().sum(-1).amax(-1)  # ||A||_inf, for the breakdown test
    g = torch.Generator(device="cpu").manual_seed(0x1A2C)
    for j in range(k):
        V[:, :, j] = v
        w = _matvec(work, v)
        used += 1
        alpha[:, j] = (v * w).sum(-1)
        Vj = V[:, :, : j + 1]
        for _ in range(2):  # classical Gram-Schmidt twice ("twice is enough")
            w = w - _project(Vj, w)
        bj = w.norm(dim=-1)
        broke = bj <= 1e-13 * scale
        beta[:, j] = torch.where(broke, torch.zeros_like(bj), bj)
        if j + 1 < k:
            if bool(broke.any()):
                # Invariant subspace found: restart with a fresh direction orthogonal to the basis
                # (beta_j = 0 splits T into blocks whose Ritz values all lie in the spectrum).
                r = torch.randn(n, generator=g, dtype=torch.float64).to(work).expand(b, n)
                for _ in range(2):
                    r = r - _project(Vj, r)
                w = torch.where(broke.unsqueeze(-1), r, w)
                bj = torch.where(broke, w.norm(dim=-1), bj)
            safe = torch.where(bj > 0, bj, torch.ones_like(bj))
            v = w / safe.unsqueeze(-1)
    T = torch.diag_embed(alpha) + torch.diag_embed(beta[:, :-1], 1) + torch.diag_embed(beta[:, :-1], -1)
    theta, S = torch.linalg.eigh(T)
    resid = (beta[:, -1] * S[:, -1, -1]).abs()
    lmax = theta[:, -1]
    return SpectrumEstimate(
        lmin=theta[:, 0],
        lmax=lmax,
        lmax_upper=lmax + resid,
        matvecs=used,
        ritz=theta,
        weights=S[:, 0, :] ** 2,
    )


def gershgorin_bounds(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Guaranteed enclosure [lo, hi] of the real spectrum of symmetric ``A`` (b, n, n), float64."""
    Ad = A.double()
    d = torch.diagonal(Ad, dim1=-2, dim2=-1)
    r = Ad.abs().sum(-1) - d.abs()
    return (d - r).min(-1).values, (d + r).max(-1).values


__all__ = ["SpectrumEstimate", "gershgorin_bounds", "lanczos_extremes", "power_lambda_max"]
