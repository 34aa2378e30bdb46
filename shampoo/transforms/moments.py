"""The first moment: m <- beta1 m + (1 - beta1) g (Adam's EMA of the gradient, Kingma & Ba 2015, Alg. 1).

It is what the preconditioner and the grafting method are applied to. Its bias correction
1/(1 - beta1^t) is a per-block factor that :class:`~shampoo.transforms.base.Pipeline` folds into the
output scale (no pass over the state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .base import Stack, StepContext

if TYPE_CHECKING:
    from ..state import BlockState


@dataclass
class FirstMomentState:
    m: torch.Tensor  # (b, *shape)


@dataclass(frozen=True)
class FirstMoment:
    beta1: float
    use_bias_correction: bool = True

    def init(self, stack: Stack) -> FirstMomentState:
        return FirstMomentState(stack.zeros())

    def bind(self, state: FirstMomentState, j: int, block: BlockState) -> None:
        block.first_moment = state.m[j]

    def update(self, state: FirstMomentState, G: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        m = ctx.take(state.m)
        m.lerp_(G, 1.0 - self.beta1)
        ctx.put(state.m, m)
        return m

    def bias_correction(self, ctx: StepContext) -> torch.Tensor | float:
        """1 - beta1^t per block (a float when the blocks agree), 1.0 without bias correction."""
        if not self.use_bias_correction:
            return 1.0
        return ctx.per_block([1.0 - self.beta1**t for t in ctx.steps])


__all__ = ["FirstMoment", "FirstMomentState"]
