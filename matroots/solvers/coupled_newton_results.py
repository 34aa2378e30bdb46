"""Results of coupled Newton assembled outside the iteration (:mod:`matroots.solvers.coupled_newton`):
a rerun of part of the batch merged into the first run, and the forward root with p = 1 (the matrix
itself, no iteration).
"""

from __future__ import annotations

import torch

from ..core import precision
from ..core.inputs import Problem
from .base import RawResult
from .newton_core import (
    NewtonOutcome,
)
from .newton_loop import materialise


def merge_rerun(out: NewtonOutcome, sub: NewtonOutcome, idx: list[int]) -> NewtonOutcome:
    """``out`` with the batch elements ``idx`` replaced by those of ``sub`` (a rerun of that subset).

    Iterations and products add up (the failed attempt was spent too; ``matmuls`` stays per matrix of
    the whole batch); the rerun's residual history is appended, the other elements repeating their
    final residual.
    """
    # the two runs may end in different formats (16-bit: one in the compute format, one already
    # unscaled in float32): the merge keeps the wider, which holds either's entries exactly
    X = out.X.to(torch.promote_types(out.X.dtype, sub.X.dtype), copy=True)
    X[idx] = sub.X.to(X.dtype)
    conv, iters, res = out.converged.clone(), out.iterations.clone(), out.residual.clone()
    conv[idx] = sub.converged
    iters[idx] = iters[idx] + sub.iterations
    res[idx] = sub.residual
    reason = list(out.reason)
    for j, i in enumerate(idx):
        reason[i] = sub.reason[j]
    each = None
    if out.matmuls_each is not None and sub.matmuls_each is not None:
        each = out.matmuls_each.clone()
        each[idx] = each[idx] + sub.matmuls_each
    history = list(out.history)
    for h in sub.history:
        full = (history[-1] if history else out.residual).clone()
        full[idx] = h
        history.append(full)
    return NewtonOutcome(
        X=X,
        converged=conv,
        iterations=iters,
        residual=res,
        reason=reason,
        matmuls=out.matmuls + sub.matmuls * len(idx) / out.X.shape[0],
        history=history,
        notes={**out.notes, **sub.notes},
        matmuls_each=each,
        compactions=out.compactions + sub.compactions,
    )


def identity_root(
    A: torch.Tensor,
    shift: torch.Tensor,
    cdt: torch.dtype,
    prob: Problem,
    info: dict,
    tol: float,
    matmuls: float,
) -> RawResult:
    """The forward root with p = 1: (A + shift I)^{1/1} is the matrix itself, no iteration (each entry
    rounded once: the sum in float64, then to the compute format; kept in fp32 where a 16-bit format
    cannot hold it). Twenty Newton steps on a non-normal matrix cost 66 u where u is the floor."""
    b = A.shape[0]
    X64 = materialise(A, shift, torch.float64)
    X = X64.to(cdt)
    if cdt not in (torch.float32, torch.float64) and not bool(torch.isfinite(X).all()):
        X = X64.float()
        info["root_dtype"] = f"the root does not fit {precision.info(cdt).name}: returned in fp32"
    info.update(
        scaling="none",
        stop_reason=["identity_root"] * b,
        tol=tol,
        backward_error=torch.zeros(b, dtype=torch.float64),
        newton_matmuls=torch.zeros(b, dtype=torch.float64),
    )
    return RawResult(
        root=X,
        converged=torch.ones(b, dtype=torch.bool),
        iterations=torch.zeros(b, dtype=torch.int64),
        residual=torch.zeros(b, dtype=torch.float64),
        matmuls=matmuls,
        history=[torch.zeros(b, dtype=torch.float64)] if prob.record_history else [],
        info=info,
    )


__all__ = [
    "identity_root",
    "merge_rerun",
]
