"""The Kronecker-factored (Shampoo) preconditioner on a stack of same-shape blocks.

Shampoo (Gupta, Koren & Singer 2018, Alg. 1/2; Anil et al. 2020; Shi et al. 2023, §2-3): for a block
G of order k with factor dims i, the statistics are the mode-i Gram matrices

    L_i <- beta2 L_i + (1 - beta2) G_(i) G_(i)^T        (beta2 = 1: L_i <- L_i + G_(i) G_(i)^T),

G_(i) the mode-i matricisation, and the preconditioned direction is the multilinear product
G x_1 L_1^{-1/p_1} x_2 ... x_k L_k^{-1/p_k} (for matrices, L^{-1/4} G R^{-1/4}).

Statistics accumulate their upper triangle (see :func:`shampoo.state.mirror_upper_`); the periodic
``refresh`` hands the due factors to :mod:`shampoo.roots` (through :mod:`shampoo.refresh`) as plain stacked tensors.

Options that reduce the statistics work (GroupOptions fields; all off by default):

* ``statistics_frequency = k`` (Anil et al. 2020, §5; Google's scalable_shampoo
  ``statistics_compute_steps``): the factors are updated only at the parameter steps t with
  ``(t - start_preconditioning_step) % k == 0``, each time with the gradient of that step alone (the
  gradients of the steps in between do not enter the factors; first moment, grafting and diagonal
  statistics still see every gradient). The EMA counts updates, not steps: after u updates
  L = (1 - beta2) sum_j beta2^(u - j) G_j G_j^T over the updated steps (horizon k / (1 - beta2)
  steps; beta2^k keeps the horizon in steps), and the bias correction is 1 - beta2^u with
  u = :func:`statistics_updates` (t) instead of 1 - beta2^t. The schedule is a closed form of t,
  k and start mod k: no state, so checkpoints resume bitwise mid-period and every rank of a
  distributed run updates the same steps. See :class:`shampoo.config.GroupOptions`.
* ``statistics_dtype = torch.bfloat16``: G is rounded to bf16 and G G^T accumulated in the factor's
  dtype (fp32): the semantics of a bf16 GEMM with fp32 accumulation and output (CUDA: one
  ``baddbmm`` with ``out_dtype``; CPU has no such kernel, so the bf16-rounded G is multiplied by the
  fp32 kernel, exact products and the same fp32 sums).
* a symmetric-product kernel (BLAS ``?syrk``) was measured and not adopted: see
  :class:`shampoo.config.GroupOptions` and experiments/bench_work_options.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Protocol

import torch

from ..refresh import RootJob
from ..state import FactorState
from .base import Stack, StepContext, StepOptions, reuse_buffer

if TYPE_CHECKING:
    from ..state import BlockState


def matricize(G: torch.Tensor, dim: int) -> torch.Tensor:
    """Mode-``dim`` matricisation of a stack G (b, *shape): (b, n_dim, numel / n_dim)."""
    b = G.shape[0]
    if G.ndim == 3:
        return G if dim == 0 else G.mT
    return G.movedim(dim + 1, 1).reshape(b, G.shape[dim + 1], -1)


def precondition(X: torch.Tensor, roots: list[torch.Tensor | None], work: dict | None = None) -> torch.Tensor:
    """X x_1 R_1 x_2 ... x_k R_k for a stack X (b, *shape) and symmetric R_i (b, n_i, n_i) or None.

    Each step contracts the leading dim and rotates it to the end (Y^T R), so after k steps the dims
    are back in order; matrices take the two-GEMM path R_1 X R_2.

    ``work``: a dict of reusable product buffers (the caller's, one per bucket): the GEMMs then write
    into them (``torch.bmm(..., out=)``, the same kernel and result) instead of allocating fresh
    (b, m, n) tensors each step, which on CPU cost page faults (glibc hands blocks of >= 128 KiB back
    to the kernel on free). The result is then one of those buffers: valid until the next call with
    the same ``work``.
    """
    b, shape = X.shape[0], X.shape[1:]

    def bmm(key: int, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        if work is None:
            return torch.bmm(A, B)
        work[key] = reuse_buffer(work.get(key), (b, A.shape[1], B.shape[2]), X)
        return torch.bmm(A, B, out=work[key])

    if len(shape) == 2 and roots[0] is not None and roots[1] is not None:
        return bmm(1, bmm(0, roots[0], X), roots[1])
    Y = X
    for i, R in enumerate(roots):
        Y = Y.reshape(b, shape[i], -1)
        Y = bmm(i, Y.mT, R) if R is not None else Y.mT
    return Y.reshape(X.shape)


@dataclass
class KroneckerState:
    """Per factor dim (slot): statistics and roots (b, n, n), and each block's FactorState."""

    dims: tuple[int, ...]  # block dims with a factor
    ps: tuple[Fraction, ...]  # their roots p
    ndim: int  # block order
    factors: list[torch.Tensor]
    roots: list[torch.Tensor]
    records: list[list[FactorState]] = field(default_factory=list)  # [slot][position]
    work: dict = field(default_factory=dict)  # precondition()'s product buffers (not state)


def statistics_due(t: int, k: int, start: int) -> bool:
    """Whether parameter step t updates the factors (``statistics_frequency`` k)."""
    return k == 1 or (t - start) % k == 0


def statistics_updates(t: int, k: int, start: int) -> int:
    """Factor updates after parameter step t: the steps s in [1, t] with (s - start) % k == 0.

    The first is s0 = 1 + (start - 1) % k (<= min(k, start)); k = 1 gives t.
    """
    if k == 1:
        return t
    first = 1 + (start - 1) % k
    return 0 if t < first else (t - first) // k + 1


@dataclass(frozen=True)
class Kronecker:
    """Shampoo's per-block preconditioner: beta2 is the factor EMA (1.0: a sum, as AdaGrad).

    ``statistics_frequency``, ``start`` and ``statistics_dtype`` are the group's options of the same
    names (``start`` = ``start_preconditioning_step``); see the module
    docstring and :class:`shampoo.config.GroupOptions`.
    """

    beta2: float
    statistics_frequency: int = 1
    start: int = 1
    statistics_dtype: torch.dtype | None = None

    def due(self, t: int) -> bool:
        return statistics_due(t, self.statistics_frequency, self.start)

    def updates(self, t: int) -> int:
        return statistics_updates(t, self.statistics_frequency, self.start)

    def init(self, stack: Stack) -> KroneckerState:
        dims = tuple(i for i, p in enumerate(stack.roots) if p is not None)
        b = stack.size
        st = KroneckerState(dims, tuple(stack.roots[d] for d in dims), len(stack.shape), [], [])
        for d in dims:
            n = stack.shape[d]
            st.factors.append(torch.zeros(b, n, n, dtype=stack.factor_dtype, device=stack.device))
            eye = torch.eye(n, dtype=stack.dtype, device=stack.device)
            st.roots.append(eye.expand(b, n, n).clone())
            st.records.append([])
        return st

    def bind(self, state: KroneckerState, j: int, block: BlockState) -> None:
        block.factors = [
            FactorState(
                dim=d,
                n=state.factors[k].shape[-1],
                root_p=p,
                matrix=state.factors[k][j],
                root=state.roots[k][j],
            )
            for k, (d, p) in enumerate(zip(state.dims, state.ps, strict=True))
        ]
        for k, f in enumerate(block.factors):
            state.records[k].append(f)

    def update(self, state: KroneckerState, G: torch.Tensor, ctx: StepContext) -> None:
        if not state.factors:
            return
        rows: torch.Tensor | None = None  # positions of G (and of ctx's selection) that update
        if self.statistics_frequency > 1:
            due = [self.due(t) for t in ctx.steps]
            if not any(due):
                return
            if not all(due):
                rows = torch.tensor([i for i, d in enumerate(due) if d], device=G.device)
                G = G.index_select(0, rows)
        fdtype = state.factors[0].dtype
        Gs = G
        if self.statistics_dtype is not None and G.dtype != self.statistics_dtype:
            Gs = G.to(self.statistics_dtype)  # the rounded gradient whose statistics are accumulated
        fused = (
            Gs.device.type == "cuda" and Gs.dtype != fdtype and Gs.dtype in (torch.bfloat16, torch.float16)
        )
        if not fused and Gs.dtype != fdtype:
            Gs = Gs.to(fdtype)  # exact: products of bf16 values are exact in fp32; sums in fdtype
        b2 = self.beta2
        beta, alpha = (1.0, 1.0) if b2 == 1.0 else (b2, 1.0 - b2)
        sel = ctx.sel if rows is None else (rows if ctx.sel is None else ctx.sel.index_select(0, rows))
        for k, d in enumerate(state.dims):
            store = state.factors[k]
            F = store if sel is None else store.index_select(0, sel)
            Gi = matricize(Gs, d)
            if fused:  # bf16 GEMM, fp32 accumulation and output (cuBLAS); CUDA only, not run here
                F.copy_(torch.baddbmm(F, Gi, Gi.mT, out_dtype=fdtype, beta=beta, alpha=alpha))
            else:
                F.baddbmm_(Gi, Gi.mT, beta=beta, alpha=alpha)
            if sel is not None:
                store.index_copy_(0, sel, F)

    def direction(
        self, state: KroneckerState, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, float]:
        roots: list[torch.Tensor | None] = [None] * state.ndim
        for k, d in enumerate(state.dims):
            roots[d] = ctx.take(state.roots[k])
        return precondition(m, roots, state.work), 1.0

    def ready(self, state: KroneckerState, j: int) -> bool:
        """A block uses its Kronecker preconditioner once any of its factors has a root."""
        return any(slot[j].has_root for slot in state.records)

    def refresh(
        self, state: KroneckerState, positions: list[int], steps: list[int], label: Callable[[int, int], str]
    ) -> list[RootJob]:
        """The root jobs of the due blocks, one per factor dim (solved in batches by shampoo.roots)."""
        return [
            RootJob(
                factors=state.factors[k],
                roots=state.roots[k],
                records=state.records[k],
                p=state.ps[k],
                positions=positions,
                steps=steps,
                label=lambda j, d=d: label(j, d),
                updates=None if self.statistics_frequency == 1 else [self.updates(t) for t in steps],
            )
            for k, d in enumerate(state.dims)
        ]

    def accumulators(self, state: KroneckerState) -> list[torch.Tensor]:
        return []  # non-finite statistics are reset by shampoo.refresh at the next root round


class KroneckerOptions(StepOptions, Protocol):
    """The group options :func:`kronecker_for` reads (:class:`shampoo.config.GroupOptions`)."""

    statistics_frequency: int
    start_preconditioning_step: int
    statistics_dtype: torch.dtype | None


def kronecker_for(opts: KroneckerOptions) -> Kronecker:
    """The Kronecker transform of a group: beta2 and the statistics options (statistics_frequency,
    statistics_dtype; see :class:`shampoo.config.GroupOptions`)."""
    return Kronecker(
        beta2=opts.beta2,
        statistics_frequency=opts.statistics_frequency,
        start=opts.start_preconditioning_step,
        statistics_dtype=opts.statistics_dtype,
    )


__all__ = [
    "Kronecker",
    "KroneckerOptions",
    "KroneckerState",
    "kronecker_for",
    "matricize",
    "precondition",
    "statistics_due",
    "statistics_updates",
]
