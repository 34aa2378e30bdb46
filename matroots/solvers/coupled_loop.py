"""The stopping contract of coupled_newton (:func:`matroots.solvers.newton_loop.coupled_newton_iterate`)
for any coupled root iteration whose progress is measured by a matrix M_k -> I.

An iteration here is a state (a tuple of matrices, e.g. (X_k,) or (Y_k, Z_k)) and its residual matrix
M_k, advanced by a ``step(k, rows, state, M) -> (state, M)`` on the rows of the batch still iterating.
Each element stops on ``||M_k - I||_F <= tol``; on stagnation (once the residual is below
``quadratic_start`` it must at least halve each step; the better of the last two iterates is kept and
counts as converged when its residual is <= min(``accept``, ``quadratic_start``)); on a plateau above
``quadratic_start`` (``PLATEAU_STEPS`` steps without a new minimum of the residual: a rounding floor the
quadratic phase never reaches, e.g. bf16 at kappa >= 1e5, which would otherwise run to
``max_iter``; not converged); on divergence
(non-finite values, or the residual growing ``divergence_factor`` times past max(res_0, 1)); and at
``max_iter``. That is the test that makes coupled_newton's ``converged`` a promise about the answer:
M_k = f(X_k, A) holds as an identity in exact arithmetic, so ||M_k - I|| small means the iterate is the
root of a matrix near A (each solver's docstring states its invariant).

A residual recomputed from two factors (M = Z Y) cannot be resolved below ~u ||Z|| ||Y||, so
``floor_scale`` may raise the stagnation acceptance by that factor, as the Newton-Schulz inverse does
with kappa_F (:mod:`matroots.solvers.newton_schulz`). Residual norms are taken in float32 for 16-bit formats. Elements that stop leave the active set: the
products are counted per element (``matmuls_each``), as coupled_newton does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..core import precision
from ..core.errors import UnsupportedExponentError
from .newton_checks import check_resolvable_exponent

State = tuple[torch.Tensor, ...]
Step = Callable[[int, torch.Tensor, State, torch.Tensor], tuple[State, torch.Tensor]]


@dataclass
class LoopOutcome:
    """Final states (b, n, n) per state slot, and the per-element stop record."""

    state: State
    converged: torch.Tensor  # (b,) bool
    iterations: torch.Tensor  # (b,) int64
    residual: torch.Tensor  # (b,) float64
    reason: list[str]
    matmuls_each: torch.Tensor  # (b,) float64
    history: list[torch.Tensor] = field(default_factory=list)


def residual_norms(M: torch.Tensor) -> list[float]:
    """||M - I||_F per batch element (float32 for 16-bit formats)."""
    W = M if M.dtype in (torch.float32, torch.float64) else M.float()
    I = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
    return [float(v) for v in torch.linalg.matrix_norm(W - I).reshape(-1).tolist()]


def default_tol(dtype: torch.dtype, n: int, p: int) -> float:
    """coupled_newton's tolerance 4 p sqrt(n) u, capped at 0.05 so that the stagnation test (which starts
    below 1/2) decides in the 16-bit formats, where 4 p sqrt(n) u can exceed 1 (bf16, n = 256, p = 4)."""
    return min(precision.default_tol(dtype, n, p), 0.05)


def check_resolvable(p: int, dtype: torch.dtype, n: int, method: str) -> None:
    """Refuse (UnsupportedExponentError) a p whose residual M_k - I cannot be resolved in ``dtype``.

    fp32/fp64: coupled_newton's rule, 4 p sqrt(n) u < 1 (:func:`~matroots.solvers.newton_core.check_resolvable_exponent`).
    16-bit formats: the residual's rounding floor ~p sqrt(n) u must lie below 1/2, where the stagnation
    test starts (with the tolerance capped by :func:`default_tol`, the stagnation test decides there).
    """
    if dtype in (torch.float32, torch.float64):
        check_resolvable_exponent(p, dtype, n, method)
        return
    fmt = precision.info(dtype)
    if p * math.sqrt(n) * fmt.unit_roundoff < 0.5:
        return
    raise UnsupportedExponentError(
        f"{method}: p = {p} at n = {n} cannot be resolved in {fmt.name}: the residual's rounding floor "
        f"p sqrt(n) u = {p * math.sqrt(n) * fmt.unit_roundoff:.2f} is not below 1/2; use a wider compute "
        "dtype or method='eigh'"
    )


PLATEAU_STEPS = 4
"""Steps without a new minimum of the residual after which an element whose residual is still at least
``quadratic_start`` stops, not converged (reason ``"plateau"``). A linear phase, however slow, lowers its
residual every step (Newton-Schulz at kappa 1e8: ~2% a step); a rounding floor fluctuates."""


def _flat(flat: list[int], i: int, r_new: float, best: list[float]) -> int:
    """Count the steps since element i's residual last set a new minimum (returned)."""
    flat[i] = 0 if r_new < best[i] else flat[i] + 1
    return flat[i]


def run_coupled(
    state: State,
    M: torch.Tensor,
    step: Step,
    *,
    tol: float,
    max_iter: int,
    accept: float,
    per_iter: float,
    record_history: bool = False,
    quadratic_start: float = 0.5,
    divergence_factor: float = 1e3,
    floor_scale: Callable[[State], list[float]] | None = None,
    stagnation_from: list[int] | None = None,
) -> LoopOutcome:
    """Iterate ``step`` on the batch until every element stops (see the module docstring).

    ``stagnation_from``: per element, the first step k whose result is tested for stagnation (default
    0). A scheduled iteration whose first steps are not contractions towards I (the minimax steps of
    polar_express map m = 1 to 1 - E_k) would otherwise stop at its start when M_0 is already near I.

    ``floor_scale(state)``: per row, a factor >= 1 by which the rounding floor of the residual exceeds
    the identity's (a residual M = Z Y recomputed from two factors carries an error ~ u ||Z|| ||Y||);
    a stagnated element is accepted at ``accept`` times that factor (still at most ``quadratic_start``).
    """
    b = M.shape[0]
    state = tuple(s.clone() for s in state)
    M = M.clone()
    tr = _Tracker.start(residual_norms(M), tol, accept, quadratic_start, divergence_factor, stagnation_from)
    history = [torch.tensor(tr.res, dtype=torch.float64)] if record_history else []
    for k in range(max_iter):
        idx = [i for i in range(b) if tr.active[i]]
        if not idx:
            break
        rows = torch.tensor(idx, dtype=torch.long)
        whole = len(idx) == b
        sub = state if whole else tuple(s.index_select(0, rows) for s in state)
        new_state, new_M = step(k, rows, sub, M if whole else M.index_select(0, rows))
        take_rows = _judge_step(tr, k, idx, new_state, new_M, floor_scale)
        if take_rows:
            sel = torch.tensor(take_rows, dtype=torch.long)
            dst = rows.index_select(0, sel)
            state = tuple(
                s.index_copy(0, dst, ns.index_select(0, sel)) for s, ns in zip(state, new_state, strict=True)
            )
            M = M.index_copy(0, dst, new_M.index_select(0, sel))
        if record_history:
            history.append(torch.tensor(tr.res, dtype=torch.float64))
    return tr.outcome(state, per_iter, history)


def _judge_step(
    tr: _Tracker,
    k: int,
    idx: list[int],
    new_state: State,
    new_M: torch.Tensor,
    floor_scale: Callable[[State], list[float]] | None,
) -> list[int]:
    """Judge step k's result for the active elements ``idx``; the positions (in ``idx``) of those whose
    new iterate is kept."""
    res_new = residual_norms(new_M)
    finite = torch.stack([torch.isfinite(s).flatten(1).all(-1) for s in new_state]).all(0).tolist()
    scale = floor_scale(new_state) if floor_scale is not None else [1.0] * len(idx)
    return [j for j, i in enumerate(idx) if tr.judge(i, k, res_new[j] if finite[j] else math.inf, scale[j])]


@dataclass
class _Tracker:
    """Per element of the batch: the residual and stop record of the iteration so far."""

    tol: float
    accept: float  # already capped at quadratic_start
    quadratic_start: float
    divergence_factor: float
    res: list[float]
    res0: list[float]
    converged: list[bool]
    reason: list[str]
    active: list[bool]
    iters: list[int]
    armed: list[int]  # the first step k tested for stagnation and plateau
    best: list[float]  # the smallest residual since armed
    flat: list[int]  # steps since the last new minimum

    @classmethod
    def start(
        cls,
        res: list[float],
        tol: float,
        accept: float,
        quadratic_start: float,
        divergence_factor: float,
        stagnation_from: list[int] | None,
    ) -> _Tracker:
        """The record before the first step: elements already within ``tol`` have converged."""
        b = len(res)
        converged = [r <= tol for r in res]
        return cls(
            tol=tol,
            accept=min(accept, quadratic_start),
            quadratic_start=quadratic_start,
            divergence_factor=divergence_factor,
            res=res,
            res0=list(res),
            converged=converged,
            reason=["tol" if c else "max_iter" for c in converged],
            active=[not c for c in converged],
            iters=[0] * b,
            armed=[0] * b if stagnation_from is None else list(stagnation_from),
            best=[math.inf] * b,
            flat=[0] * b,
        )

    def judge(self, i: int, k: int, r_new: float, scale: float) -> bool:
        """Record step k of element i (new residual ``r_new``, inf if not finite); whether its new
        iterate is kept."""
        r_old = self.res[i]
        self.iters[i] += 1
        take = True
        if not math.isfinite(r_new) or r_new > self.divergence_factor * max(self.res0[i], 1.0):
            self.reason[i], take, self.active[i] = "divergence", False, False
        elif r_new <= self.tol:
            self.reason[i], self.converged[i], self.res[i], self.active[i] = "tol", True, r_new, False
        elif (
            r_old >= self.quadratic_start
            and k >= self.armed[i]
            and _flat(self.flat, i, r_new, self.best) >= PLATEAU_STEPS
        ):
            self.reason[i], self.active[i] = "plateau", False  # a rounding floor above the quadratic phase
            self.res[i] = r_new
        elif r_old < self.quadratic_start and r_new > 0.5 * r_old and k >= self.armed[i]:
            self.reason[i], self.active[i] = "stagnation", False
            take = r_new < r_old  # keep the better of the last two iterates
            if take:
                self.res[i] = r_new
            self.converged[i] = self.res[i] <= min(self.accept * max(scale, 1.0), self.quadratic_start)
        else:
            self.res[i] = r_new
        if k >= self.armed[i]:  # progress is judged from the schedule's tail on
            self.best[i] = min(self.best[i], r_new)
        return take

    def outcome(self, state: State, per_iter: float, history: list[torch.Tensor]) -> LoopOutcome:
        """The loop's result: the final states and this record as tensors."""
        return LoopOutcome(
            state=state,
            converged=torch.tensor(self.converged, dtype=torch.bool),
            iterations=torch.tensor(self.iters, dtype=torch.int64),
            residual=torch.tensor(self.res, dtype=torch.float64),
            reason=self.reason,
            matmuls_each=torch.tensor(self.iters, dtype=torch.float64) * per_iter,
            history=history,
        )
