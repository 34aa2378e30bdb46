"""The moments of the gradient (Kingma & Ba 2015, Alg. 1).

* :class:`FirstMoment`: m <- beta1 m + (1 - beta1) g, Adam's EMA of the gradient. It is what the
  preconditioner and the grafting method are applied to. Its bias correction 1/(1 - beta1^t) is a
  per-block factor that :class:`~shampoo.transforms.base.Pipeline` folds into the output scale (no
  pass over the state).
* :class:`SecondMoment`: the one rule for every diagonal second moment of the step, v <- beta2 v +
  (1 - beta2) g^2 (beta2 = 1: v <- v + g^2) and d = m / (sqrt(v / c) + eps), c = 1 - beta2^t with
  bias correction, else 1: Adam (Kingma & Ba 2015, Alg. 1, with torch.optim.Adam's eps), RMSprop
  (Tieleman & Hinton 2012; no bias correction), AdaGrad (Duchi et al. 2011, eq. (1) with a diagonal
  matrix; beta2 = 1). Used by the grafting methods (:mod:`shampoo.grafting`), the diagonal
  preconditioner (:mod:`shampoo.transforms.diagonal`) and SOAP's rotated second moment
  (:mod:`shampoo.transforms.soap`), each on its own state tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .base import Stack, StepContext, col, per_block

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


@dataclass(frozen=True)
class SecondMoment:
    """The diagonal second moment v of a stack and the direction it gives (module docstring)."""

    beta2: float  # in (0, 1]; 1: the sum of squares (AdaGrad)
    eps: float

    def update(self, v: torch.Tensor, G: torch.Tensor) -> None:
        """v <- beta2 v + (1 - beta2) G o G in place (v <- v + G o G when beta2 = 1)."""
        if self.beta2 == 1.0:
            v.addcmul_(G, G)
        else:
            v.mul_(self.beta2).addcmul_(G, G, value=1.0 - self.beta2)

    def direction(
        self,
        v: torch.Tensor,
        m: torch.Tensor,
        steps: list[int],
        *,
        bias_correction: bool,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """(D, s) with s D = m / (sqrt(v / c) + eps) per block, c = 1 - beta2^t (t: the block's step)
        with ``bias_correction`` and beta2 < 1, else c = 1. Computed as (m / (sqrt(v) + eps sqrt(c)))
        / sqrt(c): 1 / sqrt(c) is the per-block factor s the caller folds into a later pass, which
        saves a pass over the state. D is written into ``out`` (a buffer of v's shape) when given,
        else into a new tensor; v and m are not written."""
        denom = v.sqrt() if out is None else torch.sqrt(v, out=out)
        if not (bias_correction and self.beta2 < 1.0):
            denom.add_(self.eps)
            return torch.div(m, denom, out=denom), 1.0
        c = per_block([(1.0 - self.beta2**t) ** 0.5 for t in steps], 1, denom.device)
        denom.add_(col(c, denom.ndim, denom.dtype) * self.eps)
        return torch.div(m, denom, out=denom), c


__all__ = ["FirstMoment", "FirstMomentState", "SecondMoment"]
