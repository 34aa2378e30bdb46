"""The second-order term of eigh_warm's error estimate, bounded by divided differences over eigenvalue bins.

:mod:`matroots.solvers.eigh_warm` estimates the error of the root f(D) taken from a warm basis in
which the matrix solved reads D + O (O off-diagonal) by the Daleckii-Krein expansion
f(D + O) = f(D) + F1 o O + T2 + ..., T2_ij = sum_k f[d_i, d_k, d_j] O_ik O_kj (Higham, *Functions of
Matrices*, 2008, Thm. 3.11; Bhatia, *Matrix Analysis*, 1997, §V.3). This module bounds ||T2||_F.
"""

from __future__ import annotations

import math

import torch

_BIN_MAX = 40  # at most this many log-spaced bins (factor 2 wide unless the spread exceeds 2^39)


def binned_second_order(O2: torch.Tensor, z: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Bound on ||T2||_F, T2_ij = sum_k f[z_i, z_k, z_j] O_ik O_kj, from block norms of O over factor-2
    bins of the (positive) Ritz values z (float64, per element; O2 = O o O, diagonal included).

    For f(x) = x^e, 0 < |e| <= 1: |f[x, y, z]| <= max(f(x), f(y), f(z)) / (M1 M2), M1 >= M2 the two
    largest arguments. (Inverse roots, 0 < -e < 1: f(x) = sin(pi a)/pi int_0^inf t^-a / (x + t) dt, so
    f[x, y, z] = sin(pi a)/pi int t^-a / ((x+t)(y+t)(z+t)) dt <= f(min) / (M1 M2); -e = 1: 1/(xyz).
    Forward roots: f[x, y, z] = -sin(pi e)/pi int t^e / ((x+t)(y+t)(z+t)) dt, |.| <= f[m, M2] / M1
    <= f(M2) / (M1 M2).) Unlike the relative scaling O_ij / sqrt(z_i z_j), this stays bounded when a
    large direction couples two small ones (|f[s, L, s]| ~ f(s) / (s L), not f(s) / s^2). Over bins
    I, K, J with smallest values lo and largest f values fm: ||T2_IJ||_F <= sum_K g_IKJ N_IK N_KJ,
    N_IK = ||O_IK||_F without the diagonal, g_IKJ = max(fm_I, fm_K, fm_J) / (product of the two largest
    of lo_I, lo_K, lo_J). Cost: one n x n x nb product and nb^3 scalars per element.
    """
    m, n = z.shape
    zd = z.double()
    lz = torch.log2(zd / zd.amin(-1, keepdim=True))
    spread = float(lz.max())
    if not math.isfinite(spread):  # a non-positive or non-finite z: no bound (the estimate rejects)
        return torch.full((m,), math.inf, dtype=torch.float64, device=O2.device)
    nb = int(min(_BIN_MAX, math.ceil(spread) + 1))
    b = (
        torch.clamp((lz * (nb / max(spread, 1e-300))).floor().long(), max=nb - 1)
        if nb > 1
        else (torch.zeros_like(lz, dtype=torch.long))
    )
    B = torch.zeros(m, n, nb, dtype=O2.dtype, device=O2.device).scatter_(-1, b.unsqueeze(-1), 1.0)
    N2 = (B.mT @ (O2 @ B)).double()
    N2 -= torch.diag_embed((B * O2.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)).sum(-2).double())
    N = N2.clamp_min(0).sqrt()
    inf = torch.full((m, nb), math.inf, dtype=torch.float64, device=z.device)
    lo = inf.scatter_reduce(-1, b, zd, "amin")
    fm = torch.zeros_like(inf).scatter_reduce(-1, b, f.double(), "amax")
    li, lk, lj = lo.view(m, nb, 1, 1), lo.view(m, 1, nb, 1), lo.view(m, 1, 1, nb)
    top = torch.maximum(torch.maximum(li, lk), lj)
    mid = torch.maximum(torch.minimum(li, lk), torch.minimum(torch.maximum(li, lk), lj))
    g = torch.maximum(torch.maximum(fm.view(m, nb, 1, 1), fm.view(m, 1, nb, 1)), fm.view(m, 1, 1, nb))
    g = torch.where(torch.isfinite(top), g / (top * mid), torch.zeros_like(g))  # empty bins: N = 0
    T = torch.einsum("mik,mikj,mkj->mij", N, g, N)
    return torch.linalg.vector_norm(T, dim=(-2, -1)).to(device=O2.device)


__all__ = ["binned_second_order"]
