"""The coupled Newton loop on a batch: the active set, the work buffers and the stopping rules.

The iteration, its scalings and the forward root's start are those of :mod:`matroots.solvers.newton_core`
(Guo & Higham 2006, eq. (3.9); Higham 2008, eq. (7.18)); this module runs it on a (b, n, n) batch
(:func:`coupled_newton_iterate`), with M_0 formed before rounding to the compute format
(:func:`_start_matrix`, shared with the other coupled iterations), and A + shift I itself
(:func:`materialise`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .base import eye_like, matmul_count_power
from .newton_checks import NewtonOutcome
from .newton_core import best_step_scale, scalar_map
from .workspace import Buffers as _Buffers


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


def materialise(A: torch.Tensor, shift: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A + shift I as a new tensor in ``dtype`` (default A's); the shift is added in that format."""
    out = A.to(dtype if dtype is not None else A.dtype, copy=True)
    if bool((shift != 0).any()):
        d = torch.diagonal(out, dim1=-2, dim2=-1)
        d += shift.to(out.dtype)[:, None]
    return out


def shifted_fro(A: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """||A + shift I||_F per batch element, in float64 (b,)."""
    if not bool((shift != 0).any()):
        # accumulated in float64 without a float64 copy of A (bitwise the norm of A.double())
        return torch.linalg.matrix_norm(A, dtype=torch.float64)
    return torch.linalg.matrix_norm(materialise(A, shift, torch.float64))


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
        return _CoupledLoop(
            A, p, cp64, pool, dt, tol=tol, max_iter=max_iter, stagnation_accept=stagnation_accept,
            inverse=inverse, interval=interval, record_history=record_history,
            quadratic_start=quadratic_start, divergence_factor=divergence_factor,
            dynamic_until=dynamic_until, shift=shift, top=top,
        ).run()  # fmt: skip
    finally:
        pool.release()


class _CoupledLoop:
    """One run of the coupled iteration (Higham 2008, eq. (7.18)) on the work buffers of a pool.

    The phases of a step are methods: the dynamic rescaling (:meth:`_rescale`), the step itself
    (:meth:`_step`), the residuals (:meth:`_residuals`) and the stopping rules (:meth:`_judge`); the
    active set (:meth:`_leave`, :meth:`_compact`) and the final scaling (:meth:`_outcome`) are the
    bookkeeping around them (:func:`coupled_newton_iterate` documents all of it).
    """

    def __init__(
        self,
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
    ) -> None:
        """The start: M_0 = (A + shift I)/c^p in the compute format, X^_0 = I, and the residuals
        ||M_0 - I||_F (an element already within ``tol`` stops at k = 0)."""
        b, n = A.shape[0], A.shape[-1]
        self.p, self.dt, self.inverse = p, dt, inverse
        self.tol, self.max_iter, self.record_history = tol, max_iter, record_history
        self.quadratic_start, self.divergence_factor = quadratic_start, divergence_factor
        self.dynamic_until, self.top = dynamic_until, top
        self.Xb, self.Mb, self.Tb, self.Xnb, self.Mnb, self.Rb = pool.take(6)
        M0 = _start_matrix(A, cp64, shift, dt, out=self.Mb)
        if M0.data_ptr() != self.Mb.data_ptr():
            self.Mb.copy_(M0)
        self.I = eye_like(M0)
        self.coef_I = self.I * ((p + 1) / p)
        c = _root_each(cp64, p)
        self.fast_out = dt in (torch.float32, torch.float64)
        # the final scaling X = X^ / c (inverse) or X^ c (forward root)
        self.factor = (1.0 / c) if inverse else c
        self.factor_dt = self.factor.to(dt) if self.fast_out else None
        self.notes: dict[str, str] = {}
        self.solve_dt = dt if dt in (torch.float32, torch.float64) else torch.float32
        if not inverse and self.solve_dt != dt:
            self.notes["solve_dtype"] = (
                "torch.linalg.solve has no 16-bit CPU kernel: each T_k^{-1} Y_k ran in fp32 on the "
                f"{dt} operands and was rounded back to {dt}"
            )
        self.accept = min(stagnation_accept, quadratic_start)
        # Control flow on Python floats: one host transfer per iteration instead of a dozen tiny tensor ops.
        self.res = _residual_norm(self.Mb, self.I, self.Rb)
        self.res0 = list(self.res)
        self.converged = [r <= tol for r in self.res]
        self.reason = ["tol" if done else "max_iter" for done in self.converged]
        self.iters = [0] * b
        self.history = [torch.tensor(self.res, dtype=torch.float64)] if record_history else []
        self.per_iter = (1 if inverse else 4.0 / 3.0) + matmul_count_power(p) + 1
        self.check_x = dt not in (torch.float32, torch.float64)  # 16-bit X can overflow before M shows it
        self.ia, self.ib = (
            (np.array(interval[0], dtype=float), np.array(interval[1], dtype=float))
            if interval
            else (None, None)
        )
        # The result: the scaled final iterates, written as elements stop (fast_out: X^ * factor directly,
        # the same product the final scaling of the whole batch would compute); a fresh tensor.
        self.X_out = torch.empty((b, n, n), dtype=dt, device=A.device)
        self.Xb.copy_(self.I.expand(b, n, n))
        # idx[j] is the batch element in row j of the work buffers (rows 0..k-1 are the active set).
        self.idx = list(range(b))
        self.rows = _ActiveRows(b)
        self.powers = _PowerWorkspace(pool, 6)
        self.compactions = 0

    def run(self) -> NewtonOutcome:
        """Iterate until every element has stopped or ``max_iter`` steps are done."""
        b = len(self.idx)
        start_stay = [j for j in range(b) if not self.converged[j]]
        for j in range(b):
            if self.converged[j]:
                self._leave(j, self.I)  # done at k = 0: the root of I/c
        if len(start_stay) < b:
            self._compact(start_stay)
            self.compactions -= 1  # not a departure of the iteration
        for _k in range(self.max_iter):
            if not self.idx:
                break
            X, M, T, X_new, M_new, R = (
                self.rows.view(t) for t in (self.Xb, self.Mb, self.Tb, self.Xnb, self.Mnb, self.Rb)
            )
            if self.ia is not None and self.ib is not None:
                self._rescale(X, M)
            self._step(X, M, T, X_new, M_new)
            stay = self._judge(self._residuals(M_new, R, X_new), X, X_new)
            self.Xb, self.Xnb = self.Xnb, self.Xb  # the continuing elements' iterates are the new ones
            self.Mb, self.Mnb = self.Mnb, self.Mb
            if len(stay) < self.rows.k:
                self._compact(stay)
            if self.record_history:
                self.history.append(torch.tensor(self.res, dtype=torch.float64))
        for j, i in enumerate(self.idx):  # stopped by max_iter
            self._leave(i, self.Xb[j])
        return self._outcome()

    def _rescale(self, X: torch.Tensor, M: torch.Tensor) -> None:
        """Dynamic scaling: M_k <- s M_k, X_k <- s^{1/p} X_k (a new c), with s from
        :func:`best_step_scale` on the tracked interval [a, b] of M_k, which then follows the scalar map
        f (newton_core module docstring)."""
        p = self.p
        sel = np.array(self.idx)
        lo, hi = self.ia[sel], self.ib[sel]
        scale_now = lo < self.dynamic_until
        s = np.where(scale_now, best_step_scale(np.maximum(lo, 1e-300), hi, p, self.top), 1.0)
        if bool(scale_now.any()):
            st = torch.as_tensor(s, dtype=torch.float64)
            M.mul_(self.rows.per_elem(st, self.dt))
            X.mul_(self.rows.per_elem(_root_each(st, p if self.inverse else -p), self.dt))
        fa, fb = scalar_map(s * lo, p), scalar_map(s * hi, p)
        self.ia[sel] = np.minimum(fa, fb)
        self.ib[sel] = np.where((s * lo <= 1) & (s * hi >= 1), 1.0, np.maximum(fa, fb))

    def _step(
        self, X: torch.Tensor, M: torch.Tensor, T: torch.Tensor, X_new: torch.Tensor, M_new: torch.Tensor
    ) -> None:
        """One coupled step (Higham 2008, eq. (7.18)): T_k = ((p+1) I - M_k)/p, X_{k+1} = X_k T_k
        (forward root: Y_{k+1} = T_k^{-1} Y_k), M_{k+1} = T_k^p M_k."""
        torch.add(self.coef_I, M, alpha=-1.0 / self.p, out=T)
        if self.inverse:
            torch.matmul(X, T, out=X_new)
        elif self.solve_dt == self.dt:
            torch.linalg.solve(T, X, out=X_new)
        else:
            X_new.copy_(torch.linalg.solve(T.to(self.solve_dt), X.to(self.solve_dt)))
        torch.matmul(self.powers.power(T, self.p, self.rows), M, out=M_new)

    def _residuals(self, M_new: torch.Tensor, R: torch.Tensor, X_new: torch.Tensor) -> list[float]:
        """||M_{k+1} - I||_F per active row; inf where a 16-bit X_{k+1} overflowed."""
        res_new = _residual_norm(M_new, self.I, R)
        if self.check_x:
            x_ok = torch.isfinite(X_new).reshape(self.rows.k, -1).all(-1).tolist()
            res_new = [r if ok else math.inf for r, ok in zip(res_new, x_ok, strict=True)]
        return res_new

    def _judge(self, res_new: list[float], X: torch.Tensor, X_new: torch.Tensor) -> list[int]:
        """The stopping rules per active row (divergence, tol, stagnation; :func:`coupled_newton_iterate`):
        an element that stops leaves with its final iterate. Returns the rows that continue."""
        stay = []  # rows whose element continues (its new iterate is always taken)
        for j, i in enumerate(self.idx):
            r_old, r_new = self.res[i], res_new[j]
            self.iters[i] += 1
            take = True
            if not math.isfinite(r_new) or r_new > self.divergence_factor * max(self.res0[i], 1.0):
                self.reason[i], take = "divergence", False
            elif r_new <= self.tol:
                self.reason[i], self.converged[i], self.res[i] = "tol", True, r_new
            elif r_old < self.quadratic_start and r_new > 0.5 * r_old:
                self.reason[i] = "stagnation"
                take = r_new < r_old  # keep the better of the last two iterates
                if take:
                    self.res[i] = r_new
                self.converged[i] = self.res[i] <= self.accept
            else:
                self.res[i] = r_new
                stay.append(j)
                continue
            final = X_new if take else X
            self._leave(i, final if self.rows.k == 1 else final[j])
        return stay

    def _leave(self, i: int, final: torch.Tensor) -> None:
        """Element ``i`` stops: its scaled final iterate goes to the result."""
        if self.fast_out:
            torch.mul(final, self.factor_dt[i], out=self.X_out[i])
        else:
            self.X_out[i].copy_(final)

    def _compact(self, stay: list[int]) -> None:
        """Keep the rows ``stay`` (increasing) as rows 0..len(stay)-1: each hole below the new size is
        filled by one continuing row from above it (two n x n copies per moved row, at most one per
        departed element; the element's arithmetic does not depend on its row)."""
        k_new = len(stay)
        keep = set(stay)
        holes = [j for j in range(k_new) if j not in keep]
        movers = [j for j in stay if j >= k_new]
        new_idx = list(self.idx[:k_new])
        for dst, src in zip(holes, movers, strict=True):
            self.Xb[dst].copy_(self.Xb[src])
            self.Mb[dst].copy_(self.Mb[src])
            new_idx[dst] = self.idx[src]
        self.idx = new_idx
        self.rows = _ActiveRows(k_new)
        self.compactions += 1

    def _outcome(self) -> NewtonOutcome:
        """The result: X = X^ / c (inverse) or X^ c, kept in the compute format unless it does not fit
        (16-bit: then fp32, and ``notes`` says so), with each element's products."""
        dt = self.dt
        out_dt = dt
        if self.fast_out:
            X = self.X_out
        else:
            Xw = self.X_out.float() * self.factor.float()[:, None, None]
            big = Xw.abs().amax()
            # keep the root in the compute format unless it overflows (or underflows) there
            if bool(torch.isfinite(Xw).all()) and (
                float(big) > float(torch.finfo(dt).max) or 0 < float(big) < float(torch.finfo(dt).tiny)
            ):
                out_dt = torch.float32
                self.notes["root_dtype"] = f"the root does not fit {dt}: returned in fp32"
            X = Xw.to(out_dt)
        each = torch.tensor(self.iters, dtype=torch.float64) * self.per_iter
        return NewtonOutcome(
            X=X,
            converged=torch.tensor(self.converged, dtype=torch.bool),
            iterations=torch.tensor(self.iters, dtype=torch.int64),
            residual=torch.tensor(self.res, dtype=torch.float64),
            reason=self.reason,
            matmuls=float(each.mean()),
            history=self.history,
            notes=self.notes,
            matmuls_each=each,
            compactions=self.compactions,
        )
