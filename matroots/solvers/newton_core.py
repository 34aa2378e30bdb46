"""The coupled Newton iteration for A^{-1/p} (and A^{1/p}), shared by coupled_newton and schur_newton.

Guo & Higham, "A Schur-Newton method for the matrix p-th root and its inverse", SIMAX 28(3), 2006,
eq. (3.9); Higham, *Functions of Matrices*, 2008, eq. (7.18):

    X_0 = I/c,  M_0 = A/c^p,  T_k = ((p+1) I - M_k)/p,  X_{k+1} = X_k T_k,  M_{k+1} = T_k^p M_k,

with M_k -> I and X_k -> A^{-1/p}. The forward root uses Y_k = X_k^{-1}: Y_0 = c I, Y_{k+1} = T_k^{-1} Y_k.
Each eigenvalue m of M follows the scalar map f(m) = ((p+1-m)/p)^p m, which converges to 1 for
0 < m < p+1.

The iterate is normalised: X^_0 = I (Y^_0 = I), X^_k -> (A/c^p)^{-1/p}, and the factor 1/c (c) is applied
once at the end, in float64 where the compute format is 16-bit; M_0 = A/c^p + (shift/c^p) I is formed
before rounding to the compute format, so neither c nor an eps shift has to be representable there.

**Forward root and the choice of c.** A rounding error E in M_k reaches the result as X_k L_g(M_k, E),
g(m) = m^{-1/p}; in the eigenbasis its (i, j) entry carries the divided difference g[m_i, m_j], which is
~ m^{-1-1/p} when both m_i and m_j are small. Guo & Higham's c (eq. 3.11) sends the largest eigenvalue
of M_0 to ~p+1, where T_0 is nearly singular and f(m_max) ~ f(m_min) is tiny: after one step the largest
and the smallest eigen-directions of A are both small in M_1, and their rounding errors couple
with weight ~ 1/m_min ~ kappa. The inverse root tolerates that (its condition number is ~kappa/p), but
the forward root Y = X^{-1} does not: its error becomes ~kappa u instead of ~kappa^{1-1/p} u / p
(hilb(10), p = 2, fp64: 5e-4). For forward roots the callers therefore keep the spectrum of M_0 in
(0, beta_p] with f(beta_p) = 1/2 (:func:`forward_top`; beta_2 = 2, c^p = lambda_max/beta_p), and the
dynamic scaling keeps the top of the interval below beta_p (``top``): no eigenvalue of M_k ever falls
below 1/2 from above, the coupling weight stays ~1/m_min of the small directions alone, and the forward
error tracks cond(A^{1/p}) u (hilb(10), p = 2: 3e-12). It costs about one iteration over Guo & Higham's c.

Optional dynamic scaling: when a spectral interval [a, b] of M_k is known, rescale M_k <- s M_k
(X_k <- s^{1/p} X_k, exactly as a new c) with s maximising min(f(sa), f(sb)) subject to s b <= top;
the interval is tracked through f. This keeps X_0 a function of A, so the iteration still converges to
A^{-1/p}.

The solve T_k^{-1} Y_k of the forward root runs in float32 when the compute format is 16-bit (torch has
no Half/BFloat16 CPU kernel for it) and is rounded back; :attr:`NewtonOutcome.notes` says so. It is
counted as 4/3 of a matrix product (LU plus n right-hand sides: 8n^3/3 flops against 2n^3).
"""

from __future__ import annotations

import functools

import numpy as np

from .newton_checks import (  # noqa: F401  (re-exported: the solvers import them from here)
    NewtonOutcome,
    check_resolvable_exponent,
    eigenvalue_backward_error,
    forward_backward_check,
    refuse_near_negative_axis,
)


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


GH_MAX_P = 8
"""Largest p for which inverse roots start from Guo & Higham's c (see :func:`capped_start`)."""


def capped_start(p: int, inverse: bool) -> bool:
    """True when M_0's spectrum must stay in (0, beta_p] (:func:`forward_top`) rather than reach ~p+1.

    Always for forward roots. For inverse roots the coupling error of Guo & Higham's start is ~kappa u,
    within the budget C cond(A^{-1/p}) u ~ C (kappa/p) u only while p is small; past ``GH_MAX_P`` it is
    not (fp64, kappa 1e6, p = 1e10: 1800 u against cond ~ 1), and the capped start is used there too.
    """
    return (not inverse) or p > GH_MAX_P


@functools.cache
def forward_top(p: int) -> float:
    """beta_p >= 1 with f(beta_p) = 1/2: the largest eigenvalue of M a forward root lets M_0 (or a dynamic
    step) start with. Beyond it f falls towards 0 at p+1 and the top eigen-direction would become small,
    coupling with the small ones (module docstring). beta = 1.71 (p=1), 2.00 (p=2), 2.44 (p=8)."""
    lo, hi = 1.0, p + 1.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if float(scalar_map(np.array(mid), p)) >= 0.5:
            lo = mid
        else:
            hi = mid
    return lo


def best_step_scale(a: np.ndarray, b: np.ndarray, p: int, top: float | None = None) -> np.ndarray:
    """s maximising min(f(s a), f(s b)) over 0 < s b <= top, for intervals 0 < a <= b (vectorised).

    ``top`` defaults to (p+1)(1 - 1e-3), just inside the convergence region; forward roots pass 1.
    """
    top = (p + 1) * (1 - 1e-3) if top is None else top
    lo = np.minimum(1.0 / b, top / b)
    hi = np.minimum(1.0 / a, top / b)
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
    :func:`~matroots.solvers.newton_loop.coupled_newton_iterate`: ||M_k - I||_F = sqrt(sum mult (m - 1)^2) <= tol, or stagnation.
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
