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

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .base import eye_like, matmul_count_power


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


def _residual_norm(M: torch.Tensor, I: torch.Tensor, out: torch.Tensor | None = None) -> list[float]:
    """||M - I||_F per batch element, computed in M's dtype (float32 for 16-bit formats).

    ``out`` (same shape and dtype as M) receives M - I, avoiding a fresh n x n temporary.
    """
    if M.dtype in (torch.float32, torch.float64):
        D = torch.sub(M, I, out=out) if out is not None else M - I
        norms = torch.linalg.matrix_norm(D).tolist()
    else:
        norms = torch.linalg.matrix_norm(M.float() - I.float()).tolist()
    return norms if isinstance(norms, list) else [norms]  # a single 2-D matrix gives a float


class _PowerWorkspace:
    """T^p by binary powering into at most three reusable buffers (no fresh n x n temporaries).

    Fresh large tensors are expensive on CPU: every one is page-faulted in on first touch (about 4 ms
    per 4 MiB at n = 1024), which the iteration would otherwise pay several times per step.
    """

    def __init__(self) -> None:
        self.bufs: list[torch.Tensor] = []

    def _free(self, like: torch.Tensor, *busy: torch.Tensor | None) -> torch.Tensor:
        for buf in self.bufs:
            if all(buf is not b for b in busy):
                return buf
        buf = torch.empty_like(like)
        self.bufs.append(buf)
        return buf

    def power(self, T: torch.Tensor, p: int) -> torch.Tensor:
        """T^p (floor(log2 p) squarings + popcount(p) - 1 products, as :func:`matrix_power`)."""
        result: torch.Tensor | None = None
        base = T
        while True:
            if p & 1:
                if result is None:
                    result = base
                else:
                    out = self._free(T, result, base)
                    result = torch.matmul(result, base, out=out)
            p >>= 1
            if not p:
                break
            out = self._free(T, result, base)
            base = torch.matmul(base, base, out=out)
        assert result is not None
        return result


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
    coef_I = I * ((p + 1) / p)
    cp64 = cp.double()
    # A single matrix runs on 2-D tensors: mm is a few % faster than a batch-of-one bmm at n <= 256.
    single = b == 1

    def per_elem(v: torch.Tensor) -> torch.Tensor:  # (b,) scale factors against the matrices
        return v.to(dt).reshape(()) if single else v.to(dt)[:, None, None]

    M = (A[0] if single else A) * per_elem(1.0 / cp64)
    c = cp64 ** (1.0 / p)
    X = I * per_elem((1.0 / c) if inverse else c)
    # Work buffers reused every step; X/X_new and M/M_new swap roles when a step is accepted.
    T, X_new, M_new, R = (torch.empty_like(M) for _ in range(4))
    powers = _PowerWorkspace()
    accept = min(stagnation_accept, quadratic_start)
    # Control flow on Python floats: one host transfer per iteration instead of a dozen tiny tensor ops.
    res = _residual_norm(M, I, R)
    res0 = list(res)
    active = [not (r <= tol) for r in res]
    converged = [not a for a in active]
    reason = ["tol" if done else "max_iter" for done in converged]
    iters = [0] * b
    history = [torch.tensor(res, dtype=torch.float64)] if record_history else []
    per_iter = 1 + matmul_count_power(p) + 1
    matmuls = 0.0
    check_x = dt not in (torch.float32, torch.float64)  # 16-bit X can overflow before M shows it
    ia, ib = (
        (np.array(interval[0], dtype=float), np.array(interval[1], dtype=float)) if interval else (None, None)
    )
    for _k in range(max_iter):
        if not any(active):
            break
        if ia is not None and ib is not None:
            scale_now = (ia < dynamic_until) & np.array(active)  # never rescale a finished element
            s = np.where(scale_now, best_step_scale(np.maximum(ia, 1e-300), ib, p), 1.0)
            if bool(scale_now.any()):
                st = torch.as_tensor(s, dtype=torch.float64)
                M.mul_(per_elem(st))
                X.mul_(per_elem(st ** ((1.0 / p) if inverse else (-1.0 / p))))
            fa, fb = scalar_map(s * ia, p), scalar_map(s * ib, p)
            top = np.where((s * ia <= 1) & (s * ib >= 1), 1.0, np.maximum(fa, fb))
            ia, ib = np.minimum(fa, fb), top
        torch.add(coef_I, M, alpha=-1.0 / p, out=T)
        if inverse:
            torch.matmul(X, T, out=X_new)
        else:
            X_new = torch.linalg.solve(T, X)
        torch.matmul(powers.power(T, p), M, out=M_new)
        matmuls += per_iter
        res_new = _residual_norm(M_new, I, R)
        if check_x:
            x_ok = torch.isfinite(X_new).reshape(b, -1).all(-1).tolist()
            res_new = [r if ok else math.inf for r, ok in zip(res_new, x_ok, strict=True)]
        take = [False] * b
        for i in range(b):
            if not active[i]:
                continue
            r_old, r_new = res[i], res_new[i]
            iters[i] += 1
            if not math.isfinite(r_new) or r_new > divergence_factor * max(res0[i], 1.0):
                reason[i], active[i] = "divergence", False
            elif r_new <= tol:
                reason[i], active[i], converged[i], take[i], res[i] = "tol", False, True, True, r_new
            elif r_old < quadratic_start and r_new > 0.5 * r_old:
                reason[i], active[i] = "stagnation", False
                if r_new < r_old:  # keep the better of the last two iterates
                    take[i], res[i] = True, r_new
                converged[i] = res[i] <= accept
            else:
                take[i], res[i] = True, r_new
        if all(take):
            X, X_new = X_new, X
            M, M_new = M_new, M
        else:
            for i in (i for i, tk in enumerate(take) if tk):
                X[i].copy_(X_new[i])
                M[i].copy_(M_new[i])
        if record_history:
            history.append(torch.tensor(res, dtype=torch.float64))
    return NewtonOutcome(
        X=X.unsqueeze(0) if single else X,
        converged=torch.tensor(converged, dtype=torch.bool),
        iterations=torch.tensor(iters, dtype=torch.int64),
        residual=torch.tensor(res, dtype=torch.float64),
        reason=reason,
        matmuls=matmuls,
        history=history,
    )
