"""The diagonal (AdaGrad-style) preconditioner of vector blocks (Duchi et al. 2011, eq. (1) with a
diagonal matrix; Shi et al. 2023, §3.2 for 1-D parameters under Shampoo):

    u <- beta2 u + (1 - beta2) g^2   (beta2 = 1: u <- u + g^2),    d = m / (sqrt(u / c) + eps),

c = 1 - beta2^t with bias correction (else 1): the step's one second-moment rule,
:class:`~shampoo.transforms.moments.SecondMoment`. Grafted like every block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..refresh import RootJob
from .base import Stack, StepContext
from .moments import SecondMoment

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
        SecondMoment(self.beta2, self.eps).update(u, G)
        ctx.put(state.u, u)

    def direction(
        self, state: DiagonalState, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        rule = SecondMoment(self.beta2, self.eps)
        return rule.direction(ctx.take(state.u), m, ctx.steps, bias_correction=self.use_bias_correction)

    def ready(self, state: DiagonalState, j: int) -> bool:
        return True

    def refresh(
        self, state: DiagonalState, positions: list[int], steps: list[int], label: Callable[[int, int], str]
    ) -> list[RootJob]:
        return []

    def accumulators(self, state: DiagonalState) -> list[torch.Tensor]:
        return [state.u]


__all__ = ["Diagonal", "DiagonalState"]
