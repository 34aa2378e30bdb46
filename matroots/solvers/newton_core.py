"""The coupled Newton iteration for A^{-1/p} (and A^{1/p}), shared by coupled_newton and schur_newton.

Guo & Higham, "A Schur-Newton method for the matrix p-th root and its inverse", SIMAX 28(3), 2006,
eq. (3.9); Higham, *Functions of Matrices*, 2008, eq. (7.18):

    X_0 = I/c,  M_0 = A/c^p,  T_k = ((p+1) I - M_k)/p,  X_{k+1} = X_k T_k,  M_{k+1} = T_k^p M_k,

with M_k -> I and X_k -> A^{-1/p}. The forward root uses Y_k = X_k^{-1}: Y_0 = c I, Y_{k+1} = T_k^{-1} Y_k
(T_k is close to I, so the solve is well conditioned). Each eigenvalue m of M follows the scalar map
f(m) = ((p+1-m)/p)^p m, which converges to 1 for 0 < m < p+1.

Optional dynamic scaling: when a spectral interval [a, b] of M_k is known, rescale M_k <- s M_k
(X_k <- s^{1/p} X_k, exactly as a new c) with s maximising min(f(sa), f(sb)); the interval is tracked
through f. This keeps X_0 a function of A, so the iteration still converges to A^{-1/p}.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .base import eye_like, matmul_count_power, matrix_power


def scalar_map(m: np.ndarray, p: int) -> np.ndarray:
    """f(m) = ((p+1-m)/p)^p m, the eigenvalue map of one coupled Newton step."""
    return ((p + 1 - m) / p) ** p * m


def optimal_c_power(lmin: np.ndarray, lmax: np.ndarray, p: int) -> np.ndarray:
    """c^p minimising the worst start on [lmin, lmax] (Guo & Higham 2006, eq. (3.11)):

    c^p = (lmax^{1+1/p} - lmin^{1+1/p}) / ((p+1)(lmax^{1/p} - lmin^{1/p})), with limit lmax at lmin = lmax.
    """
    lmin = np.minimum(np.maximum(lmin, 0.0), lmax)
    a = 1.0 / p
    num = lmax ** (1 + a) - lmin ** (1 + a)
    den = (p + 1) * (lmax**a - lmin**a)
    with np.errstate(divide="ignore", invalid="ignore"):
        cp = np.where(den > 1e-14 * np.maximum(lmax**a, 1e-300), num / den, lmax)
    return cp


def best_step_scale(a: np.ndarray, b: np.ndarray, p: int) -> np.ndarray:
    """s maximising min(f(s a), f(s b)) over 0 < s <= (p+1)/b, for intervals 0 < a <= b (vectorised)."""
    lo = 1.0 / b
    hi = np.minimum(1.0 / a, (p + 1) / b * (1 - 1e-3))
    hi = np.maximum(hi, lo)

    def h(s: np.ndarray) -> np.ndarray:
        return scalar_map(s * a, p) - scalar_map(s * b, p)

    take_hi = h(hi) <= 0
    L, H = lo.copy(), hi.copy()
    for _ in range(60):
        mid = 0.5 * (L + H)
        neg = h(mid) <= 0
        L = np.where(neg, mid, L)
        H = np.where(neg, H, mid)
    return np.where(take_hi, hi, L)


def predicted_iterations(
    eigs: np.ndarray,
    mult: np.ndarray,
    p: int,
    cp: float,
    tol: float,
    *,
    max_iter: int = 100,
    quadratic_start: float = 0.5,
) -> int:
    """Iterations the coupled iteration needs on a spectrum ``eigs`` with multiplicities ``mult``.

    The scalar model (each eigenvalue m -> f(m)) under the stopping rule of
    :func:`coupled_newton_iterate`: ||M_k - I||_F = sqrt(sum mult (m - 1)^2) <= tol, or stagnation.
    Exact (up to rounding) when ``eigs`` are all the eigenvalues; with Lanczos Ritz values and
    n times their quadrature weights as ``mult`` it is an estimate.
    """
    m = np.asarray(eigs, dtype=float) / cp
    w = np.asarray(mult, dtype=float)
    with np.errstate(all="ignore"):
        r = float(np.sqrt((w * (m - 1) ** 2).sum()))
        if r <= tol:
            return 0
        for k in range(1, max_iter + 1):
            m = scalar_map(m, p)
            r_new = float(np.sqrt((w * (m - 1) ** 2).sum()))
            if not np.isfinite(r_new) or r_new <= tol or (r < quadratic_start and r_new > 0.5 * r):
                return k
            r = r_new
    return max_iter


def scalar_limits(
    eigs: np.ndarray, p: int, cp: np.ndarray | float, iterations: int | np.ndarray
) -> np.ndarray:
    """Eigenvalues x_k(lambda) of X_k after ``iterations`` coupled steps from X_0 = I/c (no rescaling).

    X_k is a polynomial in A, so its eigenvalues are the scalar iteration x <- x t, m <- t^p m,
    t = (p+1-m)/p, applied to each eigenvalue lambda of A with x_0 = 1/c, m_0 = lambda/c^p. Used to tell
    which p-th root of 1/lambda the matrix iteration converged to (complex eigenvalues may be drawn to a
    non-principal one).
    """
    lam = np.asarray(eigs, dtype=complex)
    cpv = np.broadcast_to(np.asarray(cp, dtype=float), lam.shape)
    its = np.broadcast_to(np.asarray(iterations), lam.shape)
    x = cpv ** (-1.0 / p) + 0j
    m = lam / cpv
    with np.errstate(all="ignore"):
        for k in range(int(its.max(initial=0))):
            go = k < its
            t = (p + 1 - m) / p
            x = np.where(go, x * t, x)
            m = np.where(go, t**p * m, m)
    return x


def principal_branch_ok(eigs: np.ndarray, x: np.ndarray, p: int) -> np.ndarray:
    """True where x is (close to) the principal root lambda^{-1/p} rather than another p-th root.

    Distinct p-th roots differ by a factor e^{2 pi i j/p}, at relative distance >= 2 sin(pi/p); we accept
    a relative distance below sin(pi/p)/2 (and below 1/2).
    """
    lam = np.asarray(eigs, dtype=complex)
    with np.errstate(all="ignore"):
        target = lam ** (-1.0 / p)
        rel = np.abs(x - target) / np.abs(target)
    return np.isfinite(rel) & (rel <= min(0.5, 0.5 * np.sin(np.pi / p) if p > 1 else 0.5))


@dataclass
class NewtonOutcome:
    X: torch.Tensor
    converged: torch.Tensor
    iterations: torch.Tensor
    residual: torch.Tensor
    reason: list[str]
    matmuls: float
    history: list[torch.Tensor] = field(default_factory=list)


def _residual_norm(M: torch.Tensor, I: torch.Tensor) -> torch.Tensor:
    """||M - I||_F per batch element as float64, computed in M's dtype (float32 for 16-bit formats)."""
    if M.dtype in (torch.float32, torch.float64):
        return torch.linalg.matrix_norm(M - I).double()
    return torch.linalg.matrix_norm(M.float() - I.float()).double()


def _select(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Per-batch-element choice between two (b, n, n) tensors, without a copy when all take ``new``."""
    if bool(mask.all()):
        return new
    if not bool(mask.any()):
        return old
    return torch.where(mask[:, None, None], new, old)


def coupled_newton_iterate(
    A: torch.Tensor,
    p: int,
    cp: torch.Tensor,
    *,
    tol: float,
    max_iter: int,
    stagnation_accept: float,
    inverse: bool = True,
    interval: tuple[np.ndarray, np.ndarray] | None = None,
    record_history: bool = False,
    quadratic_start: float = 0.5,
    divergence_factor: float = 1e3,
    dynamic_until: float = 0.99,
) -> NewtonOutcome:
    """Run the coupled iteration on a batch A (b, n, n) in A's dtype, with per-element c^p ``cp`` (b,).

    Stops per element on ``||M_k - I||_F <= tol``, on stagnation (once the residual is below
    ``quadratic_start`` it must at least halve each step; the better iterate is kept and counts as
    converged when its residual is <= min(``stagnation_accept``, ``quadratic_start``)), on divergence
    (non-finite values or the residual growing ``divergence_factor`` times past max(res_0, 1)) and at
    ``max_iter``. ``interval`` = (a, b) bounds of the spectrum of A/c^p enables dynamic per-step scaling
    (applied while the tracked lower end is below ``dynamic_until``); only b must be a true upper bound
    (an eigenvalue below a merely lags behind, one above b could leave the convergence region).
    """
    b = A.shape[0]
    dt = A.dtype
    I = eye_like(A)
    cp64 = cp.double()
    M = A * (1.0 / cp64).to(dt)[:, None, None]
    c = cp64 ** (1.0 / p)
    X = I * ((1.0 / c) if inverse else c).to(dt)[:, None, None]
    res = _residual_norm(M, I)
    res0 = res.clone()
    accept = min(stagnation_accept, quadratic_start)
    active = torch.ones(b, dtype=torch.bool)
    converged = torch.zeros(b, dtype=torch.bool)
    iters = torch.zeros(b, dtype=torch.int64)
    reason = ["max_iter"] * b
    history = [res.clone()] if record_history else []
    per_iter = 1 + matmul_count_power(p) + 1
    matmuls = 0.0
    done_now = res <= tol
    converged |= done_now
    active &= ~done_now
    for i in torch.nonzero(done_now).flatten().tolist():
        reason[i] = "tol"
    ia, ib = (
        (np.array(interval[0], dtype=float), np.array(interval[1], dtype=float)) if interval else (None, None)
    )
    coef = (p + 1) / p
    for _k in range(max_iter):
        if not bool(active.any()):
            break
        if ia is not None and ib is not None:
            scale_now = ia < dynamic_until
            s = np.where(scale_now, best_step_scale(np.maximum(ia, 1e-300), ib, p), 1.0)
            if bool(scale_now.any()):
                st = torch.as_tensor(s, dtype=torch.float64)
                M = M * st.to(dt)[:, None, None]
                X = X * (st ** ((1.0 / p) if inverse else (-1.0 / p))).to(dt)[:, None, None]
            fa, fb = scalar_map(s * ia, p), scalar_map(s * ib, p)
            top = np.where((s * ia <= 1) & (s * ib >= 1), 1.0, np.maximum(fa, fb))
            ia, ib = np.minimum(fa, fb), top
        T = M * (-1.0 / p)
        T.diagonal(dim1=-2, dim2=-1).add_(coef)
        X_new = X @ T if inverse else torch.linalg.solve(T, X)
        M_new = matrix_power(T, p) @ M
        matmuls += per_iter
        res_new = _residual_norm(M_new, I)
        finite = torch.isfinite(res_new)
        if not bool(finite.all()) or not bool(torch.isfinite(X_new).all()):
            finite = finite & torch.isfinite(X_new).flatten(1).all(-1)
            res_new = torch.where(finite, res_new, torch.full_like(res_new, float("inf")))
        diverged = active & (~finite | (res_new > divergence_factor * torch.clamp(res0, min=1.0)))
        hit_tol = active & ~diverged & (res_new <= tol)
        stagnated = active & ~diverged & ~hit_tol & (res < quadratic_start) & (res_new > 0.5 * res)
        take_new = active & ~diverged & ~(stagnated & (res_new >= res))
        X = _select(take_new, X_new, X)
        M = _select(take_new, M_new, M)
        iters = iters + active.long()
        res = torch.where(take_new, res_new, res)
        if record_history:
            history.append(res.clone())
        for i in torch.nonzero(diverged).flatten().tolist():
            reason[i] = "divergence"
        for i in torch.nonzero(hit_tol).flatten().tolist():
            reason[i] = "tol"
        for i in torch.nonzero(stagnated).flatten().tolist():
            reason[i] = "stagnation"
        converged |= hit_tol | (stagnated & (res <= accept))
        active &= ~(diverged | hit_tol | stagnated)
    return NewtonOutcome(
        X=X,
        converged=converged,
        iterations=iters,
        residual=res,
        reason=reason,
        matmuls=matmuls,
        history=history,
    )
