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
import math

import numpy as np
import torch

from .base import eye_like, matmul_count_power
from .newton_checks import (  # noqa: F401  (re-exported: the solvers import them from here)
    NewtonOutcome,
    check_resolvable_exponent,
    eigenvalue_backward_error,
    forward_backward_check,
    refuse_near_negative_axis,
)
from .workspace import Buffers as _Buffers


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


class _ActiveRows:
    """The first k rows of full-size (b, n, n) work buffers: the active elements, stored contiguously.

    ``view(buf)`` is ``buf[:k]`` (a contiguous view, so ``out=`` products write in place), or the 2-D
    ``buf[0]`` once a single element is left: mm is a few % faster than a batch-of-one bmm at n <= 256,
    and it is the arithmetic of a single-matrix solve.
    """

    def __init__(self, k: int) -> None:
        self.k = k

    def view(self, buf: torch.Tensor) -> torch.Tensor:
        return buf[0] if self.k == 1 else buf[: self.k]

    def per_elem(self, v: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        """(k,) scale factors shaped to multiply the active matrices."""
        return v.to(dt).reshape(()) if self.k == 1 else v.to(dt)[:, None, None]


class _PowerWorkspace:
    """T^p by binary powering into at most three reusable buffers (no fresh n x n temporaries).

    The buffers come from the iteration's :class:`~matroots.solvers.workspace.Buffers` (from the index
    ``first`` on) and have the full batch size; products write into their active rows
    (:class:`_ActiveRows`).
    """

    def __init__(self, pool: _Buffers, first: int) -> None:
        self.pool, self.first = pool, first
        self.bufs: list[torch.Tensor] = []

    def _free(self, rows: _ActiveRows, *busy: torch.Tensor | None) -> torch.Tensor:
        taken = {t.data_ptr() for t in busy if t is not None}
        for buf in self.bufs:
            if buf.data_ptr() not in taken:
                return rows.view(buf)
        buf = self.pool.take(self.first + len(self.bufs) + 1)[-1]
        self.bufs.append(buf)
        return rows.view(buf)

    def power(self, T: torch.Tensor, p: int, rows: _ActiveRows) -> torch.Tensor:
        """T^p (floor(log2 p) squarings + popcount(p) - 1 products, as :func:`matrix_power`)."""
        result: torch.Tensor | None = None
        base = T
        while True:
            if p & 1:
                if result is None:
                    result = base
                else:
                    out = self._free(rows, result, base)
                    result = torch.matmul(result, base, out=out)
            p >>= 1
            if not p:
                break
            out = self._free(rows, result, base)
            base = torch.matmul(base, base, out=out)
        assert result is not None
        return result


def _start_matrix(
    A: torch.Tensor,
    cp64: torch.Tensor,
    shift: torch.Tensor | None,
    dt: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """M_0 = (A + shift I)/c^p in the compute dtype ``dt`` (b, n, n), formed before the rounding to dt.

    A is scaled in its own format when that is float32/float64 and 1/c^p is comfortably inside its range;
    otherwise in float64 (a 16-bit compute format, or extreme magnitudes). The choice is made per
    element, so an element of a batch gets the arithmetic it gets when solved alone. ``out`` (b, n, n)
    in ``dt`` receives M_0 in the common case (same format, all elements safe), with the same arithmetic.
    """
    inv = 1.0 / cp64
    src = A.dtype
    if src in (torch.float32, torch.float64) and src == dt:
        fi = torch.finfo(src)
        safe = (inv > fi.tiny * 1e6) & (inv < fi.max / 1e6)
        if shift is not None:
            safe &= shift.abs() < fi.max / 1e6
    else:
        safe = torch.zeros_like(inv, dtype=torch.bool)
    if bool(safe.all()):
        if out is not None and A.dtype == dt:
            return _scaled(A, inv, shift, out)
        return _scaled(A, inv, shift).to(dt)
    if not bool(safe.any()):
        return _scaled(A.double(), inv, shift).to(dt)
    M = torch.empty(A.shape, dtype=dt, device=A.device)
    for i in range(A.shape[0]):
        work = A[i : i + 1] if bool(safe[i]) else A[i : i + 1].double()
        M[i] = _scaled(work, inv[i : i + 1], None if shift is None else shift[i : i + 1])[0]
    return M


def _scaled(
    work: torch.Tensor, inv: torch.Tensor, shift: torch.Tensor | None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """(work + shift I) * inv in work's dtype: a new tensor, or written into ``out``."""
    if shift is not None and bool((shift != 0).any()):
        # the shift first, then the scaling: A + shift I cancels exactly where they nearly cancel
        # (Sterbenz), whereas A/c^p + shift/c^p would cancel two large rounded numbers
        M = work.clone() if out is None else out.copy_(work)
        d = torch.diagonal(M, dim1=-2, dim2=-1)
        d += shift.to(work.dtype)[:, None]
        return M.mul_(inv.to(work.dtype)[:, None, None])
    if out is not None:
        return torch.mul(work, inv.to(work.dtype)[:, None, None], out=out)
    return work * inv.to(work.dtype)[:, None, None]


def _root_each(v: torch.Tensor, p: int) -> torch.Tensor:
    """v^(1/p) per element (float64), by the C library's pow on each value.

    torch's vectorised pow rounds differently in a full SIMD lane than in a short tensor (measured: one
    element of 32 differed in the last bit from its solve alone), which would make a batch element's c
    differ from that of its own solve.
    """
    return torch.tensor([math.pow(x, 1.0 / p) for x in v.tolist()], dtype=torch.float64)


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
    shift: torch.Tensor | None = None,
    compute_dtype: torch.dtype | None = None,
    top: float | None = None,
) -> NewtonOutcome:
    """Run the coupled iteration on a batch A (b, n, n), with per-element c^p ``cp`` (b,).

    The arithmetic runs in ``compute_dtype`` (default: A's dtype) on M_0 = (A + shift I)/c^p, where
    ``shift`` (b,) float64 is added before rounding (see :func:`_start_matrix`); the result X is in the
    compute dtype, or in float32 when it is 16-bit and the root would not fit it (``notes`` says so).
    ``top`` bounds the dynamic scaling's s b (see :func:`best_step_scale`; forward roots pass 1).

    Stops per element on ``||M_k - I||_F <= tol``, on stagnation (once the residual is below
    ``quadratic_start`` it must at least halve each step; the better iterate is kept and counts as
    converged when its residual is <= min(``stagnation_accept``, ``quadratic_start``)), on divergence
    (non-finite values or the residual growing ``divergence_factor`` times past max(res_0, 1)) and at
    ``max_iter``. ``interval`` = (a, b) bounds of the spectrum of A/c^p enables dynamic per-step scaling
    (applied while the tracked lower end is below ``dynamic_until``); only b must be a true upper bound
    (an eigenvalue below a merely lags behind, one above b could leave the convergence region).

    **Active set.** A batch does not wait for its slowest element: the elements still iterating occupy
    the first k rows of the work buffers, every step runs on those rows only, and an element that stops
    has its iterate (scaled by 1/c or c) written to the output and leaves; its row is filled by a
    continuing row from above the new active size (in place, two n x n copies, at most one move per
    departed element, against p + 2 products per row and step saved, so compacting at every departure
    always pays). Batched products over a subset are the products of each matrix alone where MKL
    rounds a stack element as it rounds the matrix alone (bitwise in fp32/fp64 whatever its row when
    every element sits at a fresh matrix's alignment, e.g. n = 16, and for any n under ``MKL_CBWR``;
    on AVX-512 EPYC an n = 33 fp64 element differs in its last bits), and a lone element runs on 2-D
    tensors as a single solve does, so each element's iterates, stop and iteration count are those of
    its own solve, up to that rounding where the BLAS is not batch-invariant. The work buffers are
    reused across calls (:mod:`matroots.solvers.workspace`: no page faults per call); the returned X
    is a fresh tensor.
    """
    b, n = A.shape[0], A.shape[-1]
    dt = compute_dtype if compute_dtype is not None else A.dtype
    cp64 = cp.double()
    pool = _Buffers((b, n, n), dt, A.device)
    try:
        return _iterate(
            A, p, cp64, pool, dt, tol=tol, max_iter=max_iter, stagnation_accept=stagnation_accept,
            inverse=inverse, interval=interval, record_history=record_history,
            quadratic_start=quadratic_start, divergence_factor=divergence_factor,
            dynamic_until=dynamic_until, shift=shift, top=top,
        )  # fmt: skip
    finally:
        pool.release()


def _iterate(
    A: torch.Tensor,
    p: int,
    cp64: torch.Tensor,
    pool: _Buffers,
    dt: torch.dtype,
    *,
    tol: float,
    max_iter: int,
    stagnation_accept: float,
    inverse: bool,
    interval: tuple[np.ndarray, np.ndarray] | None,
    record_history: bool,
    quadratic_start: float,
    divergence_factor: float,
    dynamic_until: float,
    shift: torch.Tensor | None,
    top: float | None,
) -> NewtonOutcome:
    """The body of :func:`coupled_newton_iterate`, on the work buffers of ``pool``."""
    b, n = A.shape[0], A.shape[-1]
    Xb, Mb, Tb, Xnb, Mnb, Rb = pool.take(6)
    M0 = _start_matrix(A, cp64, shift, dt, out=Mb)
    if M0.data_ptr() != Mb.data_ptr():
        Mb.copy_(M0)
    I = eye_like(M0)
    coef_I = I * ((p + 1) / p)
    c = _root_each(cp64, p)
    fast_out = dt in (torch.float32, torch.float64)
    factor = (1.0 / c) if inverse else c  # the final scaling X = X^ / c (inverse) or X^ c (forward root)
    factor_dt = factor.to(dt) if fast_out else None
    notes: dict[str, str] = {}
    solve_dt = dt if dt in (torch.float32, torch.float64) else torch.float32
    if not inverse and solve_dt != dt:
        notes["solve_dtype"] = (
            "torch.linalg.solve has no 16-bit CPU kernel: each T_k^{-1} Y_k ran in fp32 on the "
            f"{dt} operands and was rounded back to {dt}"
        )
    accept = min(stagnation_accept, quadratic_start)
    # Control flow on Python floats: one host transfer per iteration instead of a dozen tiny tensor ops.
    res = _residual_norm(Mb, I, Rb)
    res0 = list(res)
    converged = [r <= tol for r in res]
    reason = ["tol" if done else "max_iter" for done in converged]
    iters = [0] * b
    history = [torch.tensor(res, dtype=torch.float64)] if record_history else []
    per_iter = (1 if inverse else 4.0 / 3.0) + matmul_count_power(p) + 1
    check_x = dt not in (torch.float32, torch.float64)  # 16-bit X can overflow before M shows it
    ia, ib = (
        (np.array(interval[0], dtype=float), np.array(interval[1], dtype=float)) if interval else (None, None)
    )
    # The result: the scaled final iterates, written as elements stop (fast_out: X^ * factor directly,
    # the same product the final scaling of the whole batch would compute); a fresh tensor.
    X_out = torch.empty((b, n, n), dtype=dt, device=A.device)
    Xb.copy_(I.expand(b, n, n))
    # idx[j] is the batch element in row j of the work buffers (rows 0..k-1 are the active set).
    idx = list(range(b))
    rows = _ActiveRows(b)
    powers = _PowerWorkspace(pool, 6)
    compactions = 0

    def leave(i: int, final: torch.Tensor) -> None:
        if fast_out:
            torch.mul(final, factor_dt[i], out=X_out[i])
        else:
            X_out[i].copy_(final)

    def compact(stay: list[int]) -> None:
        """Keep the rows ``stay`` (increasing) as rows 0..len(stay)-1: each hole below the new size is
        filled by one continuing row from above it (two n x n copies per moved row, at most one per
        departed element; the element's arithmetic does not depend on its row)."""
        nonlocal idx, rows, compactions
        k_new = len(stay)
        keep = set(stay)
        holes = [j for j in range(k_new) if j not in keep]
        movers = [j for j in stay if j >= k_new]
        new_idx = list(idx[:k_new])
        for dst, src in zip(holes, movers, strict=True):
            Xb[dst].copy_(Xb[src])
            Mb[dst].copy_(Mb[src])
            new_idx[dst] = idx[src]
        idx = new_idx
        rows = _ActiveRows(k_new)
        compactions += 1

    start_stay = [j for j in range(b) if not converged[j]]
    for j in range(b):
        if converged[j]:
            leave(j, I)  # done at k = 0: the root of I/c
    if len(start_stay) < b:
        compact(start_stay)
        compactions -= 1  # not a departure of the iteration
    for _k in range(max_iter):
        if not idx:
            break
        X, M, T, X_new, M_new, R = (rows.view(t) for t in (Xb, Mb, Tb, Xnb, Mnb, Rb))
        if ia is not None and ib is not None:
            sel = np.array(idx)
            lo, hi = ia[sel], ib[sel]
            scale_now = lo < dynamic_until
            s = np.where(scale_now, best_step_scale(np.maximum(lo, 1e-300), hi, p, top), 1.0)
            if bool(scale_now.any()):
                st = torch.as_tensor(s, dtype=torch.float64)
                M.mul_(rows.per_elem(st, dt))
                X.mul_(rows.per_elem(_root_each(st, p if inverse else -p), dt))
            fa, fb = scalar_map(s * lo, p), scalar_map(s * hi, p)
            ia[sel] = np.minimum(fa, fb)
            ib[sel] = np.where((s * lo <= 1) & (s * hi >= 1), 1.0, np.maximum(fa, fb))
        torch.add(coef_I, M, alpha=-1.0 / p, out=T)
        if inverse:
            torch.matmul(X, T, out=X_new)
        elif solve_dt == dt:
            torch.linalg.solve(T, X, out=X_new)
        else:
            X_new.copy_(torch.linalg.solve(T.to(solve_dt), X.to(solve_dt)))
        torch.matmul(powers.power(T, p, rows), M, out=M_new)
        res_new = _residual_norm(M_new, I, R)
        if check_x:
            x_ok = torch.isfinite(X_new).reshape(rows.k, -1).all(-1).tolist()
            res_new = [r if ok else math.inf for r, ok in zip(res_new, x_ok, strict=True)]
        stay = []  # rows whose element continues (its new iterate is always taken)
        for j, i in enumerate(idx):
            r_old, r_new = res[i], res_new[j]
            iters[i] += 1
            take = True
            if not math.isfinite(r_new) or r_new > divergence_factor * max(res0[i], 1.0):
                reason[i], take = "divergence", False
            elif r_new <= tol:
                reason[i], converged[i], res[i] = "tol", True, r_new
            elif r_old < quadratic_start and r_new > 0.5 * r_old:
                reason[i] = "stagnation"
                take = r_new < r_old  # keep the better of the last two iterates
                if take:
                    res[i] = r_new
                converged[i] = res[i] <= accept
            else:
                res[i] = r_new
                stay.append(j)
                continue
            final = X_new if take else X
            leave(i, final if rows.k == 1 else final[j])
        Xb, Xnb = Xnb, Xb  # the continuing elements' iterates are the new ones
        Mb, Mnb = Mnb, Mb
        if len(stay) < rows.k:
            compact(stay)
        if record_history:
            history.append(torch.tensor(res, dtype=torch.float64))
    for j, i in enumerate(idx):  # stopped by max_iter
        leave(i, Xb[j])
    out_dt = dt
    if fast_out:
        X = X_out
    else:
        Xw = X_out.float() * factor.float()[:, None, None]
        big = Xw.abs().amax()
        # keep the root in the compute format unless it overflows (or underflows) there
        if bool(torch.isfinite(Xw).all()) and (
            float(big) > float(torch.finfo(dt).max) or 0 < float(big) < float(torch.finfo(dt).tiny)
        ):
            out_dt = torch.float32
            notes["root_dtype"] = f"the root does not fit {dt}: returned in fp32"
        X = Xw.to(out_dt)
    each = torch.tensor(iters, dtype=torch.float64) * per_iter
    return NewtonOutcome(
        X=X,
        converged=torch.tensor(converged, dtype=torch.bool),
        iterations=torch.tensor(iters, dtype=torch.int64),
        residual=torch.tensor(res, dtype=torch.float64),
        reason=reason,
        matmuls=float(each.mean()),
        history=history,
        notes=notes,
        matmuls_each=each,
        compactions=compactions,
    )
