"""The Kronecker-factored (Shampoo) preconditioner on a stack of same-shape blocks.

Shampoo (Gupta, Koren & Singer 2018, Alg. 1/2; Anil et al. 2020; Shi et al. 2023, §2-3): for a block
G of order k with factor dims i, the statistics are the mode-i Gram matrices

    L_i <- beta2 L_i + (1 - beta2) G_(i) G_(i)^T        (beta2 = 1: L_i <- L_i + G_(i) G_(i)^T),

G_(i) the mode-i matricisation, and the preconditioned direction is the multilinear product
G x_1 L_1^{-1/p_1} x_2 ... x_k L_k^{-1/p_k} (for matrices, L^{-1/4} G R^{-1/4}).

Statistics accumulate their upper triangle (see :func:`shampoo.state.mirror_upper_`); the periodic
``refresh`` hands the due factors to :mod:`shampoo.roots` as plain stacked tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

import torch

from ..roots import RootJob
from ..state import FactorState
from .base import Stack, StepContext

if TYPE_CHECKING:
    from ..state import BlockState


def matricize(G: torch.Tensor, dim: int) -> torch.Tensor:
    """Mode-``dim`` matricisation of a stack G (b, *shape): (b, n_dim, numel / n_dim)."""
    b = G.shape[0]
    if G.ndim == 3:
        return G if dim == 0 else G.mT
    return G.movedim(dim + 1, 1).reshape(b, G.shape[dim + 1], -1)


def precondition(X: torch.Tensor, roots: list[torch.Tensor | None]) -> torch.Tensor:
    """X x_1 R_1 x_2 ... x_k R_k for a stack X (b, *shape) and symmetric R_i (b, n_i, n_i) or None.

    Each step contracts the leading dim and rotates it to the end (Y^T R), so after k steps the dims
    are back in order; matrices take the two-GEMM path R_1 X R_2.
    """
    b, shape = X.shape[0], X.shape[1:]
    if len(shape) == 2 and roots[0] is not None and roots[1] is not None:
        return torch.bmm(torch.bmm(roots[0], X), roots[1])
    Y = X
    for i, R in enumerate(roots):
        Y = Y.reshape(b, shape[i], -1)
        Y = torch.bmm(Y.mT, R) if R is not None else Y.mT
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


@dataclass(frozen=True)
class Kronecker:
    """Shampoo's per-block preconditioner: beta2 is the factor EMA (1.0: a sum, as AdaGrad)."""

    beta2: float

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
        Gf = G if G.dtype == state.factors[0].dtype else G.to(state.factors[0].dtype)
        b2 = self.beta2
        for k, d in enumerate(state.dims):
            F = ctx.take(state.factors[k])
            Gi = matricize(Gf, d)
            if b2 == 1.0:
                F.baddbmm_(Gi, Gi.mT)
            else:
                F.baddbmm_(Gi, Gi.mT, beta=b2, alpha=1.0 - b2)
            ctx.put(state.factors[k], F)

    def direction(
        self, state: KroneckerState, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, float]:
        roots: list[torch.Tensor | None] = [None] * state.ndim
        for k, d in enumerate(state.dims):
            roots[d] = ctx.take(state.roots[k])
        return precondition(m, roots), 1.0

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
            )
            for k, d in enumerate(state.dims)
        ]

    def accumulators(self, state: KroneckerState) -> list[torch.Tensor]:
        return []  # non-finite statistics are reset by shampoo.roots at the next root round


__all__ = ["Kronecker", "KroneckerState", "matricize", "precondition"]
