"""Autograd for the eigendecomposition root: the Daleckii-Krein formula with stable divided differences.

For symmetric S = Q diag(x) Q^T and a scalar function phi applied to its eigenvalues, the Frechet
derivative of X = phi(S) is (Daleckii & Krein 1965; Higham, *Functions of Matrices*, 2008, Thm. 3.11)

    L(S, E) = Q (F o (Q^T E Q)) Q^T,   F_ij = phi[x_i, x_j] = (phi(x_i) - phi(x_j)) / (x_i - x_j),

with F_ii = phi'(x_i); L is self-adjoint in the Frobenius inner product, so the gradient of a loss with
dL/dX = G is L(S, sym(G)). Unlike differentiating through ``torch.linalg.eigh`` (whose backward divides
by x_i - x_j and returns NaN or inf for repeated eigenvalues, e.g. any multiple of the identity), this
is finite and accurate for clustered and repeated eigenvalues: for phi(x) = x^e the divided difference
is evaluated as x_i^{e-1} expm1(e t) / expm1(t), t = log(x_j / x_i), which tends to e x_i^{e-1}.

eigh solves phi(w) = (w + c)^e with w the eigenvalues of the working matrix s sym(A) (s the power-of-two
prescale) and c the total shift; c depends on A when eps is relative (c = eps lambda_max) and under the
psd "meta" policy (c = -lambda_min); the derivative of a simple eigenvalue, q^T dS q, adds the rank-one
terms below. Rounding A to the working format is treated as the identity (straight-through).
"""

from __future__ import annotations

import torch


def power_divided_differences(x: torch.Tensor, e: float) -> torch.Tensor:
    """F_ij = (x_i^e - x_j^e) / (x_i - x_j) (F_ii = e x_i^{e-1}) for x > 0, shape (b, n) -> (b, n, n).

    Float64; stable for x_i close to x_j (no cancellation): x_i^{e-1} expm1(e t)/expm1(t) with
    t = log(x_j/x_i), and its limit e (1 + (e-1) t / 2) for |t| < 1e-6.
    """
    x = x.double()
    xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)
    t = torch.log(xj) - torch.log(xi)
    small = t.abs() < 1e-6
    t_safe = torch.where(small, torch.ones_like(t), t)
    ratio = torch.where(small, e * (1 + (e - 1) * t / 2), torch.expm1(e * t_safe) / torch.expm1(t_safe))
    F = xi.pow(e - 1) * ratio
    return 0.5 * (F + F.mT)  # exact symmetry (the two evaluation orders agree to rounding)


class SpectralRoot(torch.autograd.Function):
    """X = W W^T with W = Q diag(phi(w))^{1/2} in the forward pass; Daleckii-Krein in the backward.

    ``forward(A_src, W, Q, x, e, scale, eps_rel, meta_active)``: ``A_src`` is the caller's (b, n, n)
    tensor that requires grad, ``W`` the scaled eigenvectors (the forward GEMM happens here), ``Q``
    the eigenvectors, ``x`` the shifted eigenvalues w + c (working units), ``e`` the exponent,
    ``scale`` the prescale s, ``eps_rel`` the relative eps (0 when absolute) and ``meta_active`` a (b,)
    bool tensor: the psd "meta" shift c = -lambda_min is active.
    """

    @staticmethod
    def forward(ctx, A_src, W, Q, x, e, scale, eps_rel, meta_active):
        ctx.save_for_backward(Q, x, meta_active)
        ctx.e, ctx.scale, ctx.eps_rel = e, scale, eps_rel
        ctx.src_dtype = A_src.dtype
        return W @ W.mT

    @staticmethod
    def backward(ctx, G):
        Q, x, meta_active = ctx.saved_tensors
        e, s = ctx.e, ctx.scale
        Qd, Gd = Q.double(), G.double()
        Gd = 0.5 * (Gd + Gd.mT)
        B = Qd.mT @ Gd @ Qd
        F = power_divided_differences(x, e)
        H = Qd @ (F * B) @ Qd.mT
        # shift c(A): dc = eps_rel * q_n^T dS q_n - [meta] q_1^T dS q_1; dX = ... + dc Q diag(phi') Q^T
        dphi = e * x.double().pow(e - 1)
        weight = (dphi * torch.diagonal(B, dim1=-2, dim2=-1)).sum(-1)  # <Q diag(phi') Q^T, G>
        if ctx.eps_rel:
            qn = Qd[..., :, -1]
            H = H + (ctx.eps_rel * weight)[:, None, None] * (qn.unsqueeze(-1) * qn.unsqueeze(-2))
        if bool(meta_active.any()):
            q1 = Qd[..., :, 0]
            coef = torch.where(meta_active.to(weight.device), -weight, torch.zeros_like(weight))
            H = H + coef[:, None, None] * (q1.unsqueeze(-1) * q1.unsqueeze(-2))
        grad = (s * 0.5 * (H + H.mT)).to(ctx.src_dtype)
        return grad, None, None, None, None, None, None, None


__all__ = ["SpectralRoot", "power_divided_differences"]
