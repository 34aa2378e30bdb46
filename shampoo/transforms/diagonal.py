"""The diagonal (AdaGrad-style) preconditioner of vector blocks (Duchi et al. 2011, eq. (1) with a
diagonal matrix; Shi et al. 2023, §3.2 for 1-D parameters under Shampoo):

    u <- beta2 u + (1 - beta2) g^2   (beta2 = 1: u <- u + g^2),    d = m / (sqrt(u / c) + eps),

c = 1 - beta2^t with bias correction (else 1). Grafted like every block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..refresh import RootJob
from .base import Stack, StepContext, col

if TYPE_CHECKING:
    from ..state import BlockState


@dataclass
class DiagonalState:
    u: torch.Tensor  # (b, *shape) accumulated squared gradients


@dataclass(frozen=True)
class Diagonal:
    beta2: float
    eps: float
    use_bias_correction: bool = True

    def init(self, stack: Stack) -> DiagonalState:
        return DiagonalState(stack.zeros())

    def bind(self, state: DiagonalState, j: int, block: BlockState) -> None:
        block.diagonal = state.u[j]

    def update(self, state: DiagonalState, G: torch.Tensor, ctx: StepContext) -> None:
        u = ctx.take(state.u)
        if self.beta2 == 1.0:
            u.addcmul_(G, G)
        else:
            u.mul_(self.beta2).addcmul_(G, G, value=1.0 - self.beta2)
        ctx.put(state.u, u)

    def direction(
        self, state: DiagonalState, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        denom = ctx.take(state.u).sqrt()
        scale: torch.Tensor | float = 1.0
        if self.use_bias_correction and self.beta2 < 1.0:
            # sqrt(u / c) + eps = (sqrt(u) + eps sqrt(c)) / sqrt(c), c = 1 - beta2^t
            c = ctx.per_block([(1.0 - self.beta2**t) ** 0.5 for t in ctx.steps])
            denom.add_(col(c, denom.ndim, denom.dtype) * self.eps)
            scale = c
        else:
            denom.add_(self.eps)
        return torch.div(m, denom, out=denom), scale

    def ready(self, state: DiagonalState, j: int) -> bool:
        return True

    def refresh(
        self, state: DiagonalState, positions: list[int], steps: list[int], label: Callable[[int, int], str]
    ) -> list[RootJob]:
        return []

    def accumulators(self, state: DiagonalState) -> list[torch.Tensor]:
        return [state.u]


__all__ = ["Diagonal", "DiagonalState"]
