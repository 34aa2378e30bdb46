"""Grafting methods as small init / update / direction triples on stacked blocks (optax style).

Every function works on a stack of same-shape blocks, shape (b, *block_shape), so a whole bucket is
one elementwise kernel. ``grad`` is the (weight-decayed) gradient, ``m_hat`` the bias-corrected
gradient EMA that the optimizer preconditions (equal to ``grad`` when beta1 = 0; the functions take
the uncorrected EMA and the optimizer folds 1/(1 - beta1^t) into its per-block output scale). The
formulas are torch.optim's, so that grafting alone reproduces it to rounding:

* sgd:      d = m_hat
* adagrad:  v += g^2;                          d = m_hat / (sqrt(v) + eps)        (Adagrad, lr_decay 0)
* rmsprop:  v = beta2 v + (1 - beta2) g^2;     d = m_hat / (sqrt(v) + eps)        (RMSprop, alpha=beta2)
* adam:     v = beta2 v + (1 - beta2) g^2;     d = m_hat / (sqrt(v) / sqrt(1 - beta2^t) + eps)
"""

from __future__ import annotations

import torch

from .config import AdaGradGrafting, AdamGrafting, GraftingConfig, RMSpropGrafting


def has_state(cfg: GraftingConfig) -> bool:
    """Whether the method keeps a second-moment accumulator."""
    return isinstance(cfg, AdaGradGrafting | RMSpropGrafting | AdamGrafting)


def init(cfg: GraftingConfig, like: torch.Tensor) -> torch.Tensor | None:
    """The method's state for a stack shaped like ``like`` (None when it keeps none)."""
    return torch.zeros_like(like) if has_state(cfg) else None


def update(cfg: GraftingConfig, state: torch.Tensor | None, grad: torch.Tensor) -> None:
    """Accumulate ``grad`` into ``state`` in place."""
    if isinstance(cfg, AdaGradGrafting):
        assert state is not None
        state.addcmul_(grad, grad)
    elif isinstance(cfg, RMSpropGrafting | AdamGrafting):
        assert state is not None
        state.mul_(cfg.beta2).addcmul_(grad, grad, value=1.0 - cfg.beta2)


def bias_correction2(cfg: GraftingConfig, steps: torch.Tensor | int, use: bool) -> torch.Tensor | float:
    """sqrt(1 - beta2^t) for Adam (1 otherwise); ``steps`` an int or a per-block tensor (b,)."""
    if not (use and isinstance(cfg, AdamGrafting)):
        return 1.0
    if isinstance(steps, int):
        return (1.0 - cfg.beta2**steps) ** 0.5
    return (1.0 - torch.pow(cfg.beta2, steps.double())).sqrt()


def direction(
    cfg: GraftingConfig,
    state: torch.Tensor | None,
    m: torch.Tensor,
    bc2_sqrt: torch.Tensor | float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | float]:
    """The grafting direction of ``m`` as (d, s): the direction is s * d, with s a per-block factor
    (a float, or a (b,) tensor) that the caller folds into a later pass.

    Adam's sqrt(v / (1 - beta2^t)) + eps is computed as (sqrt(v) + eps sqrt(1 - beta2^t)) / sqrt(1 - beta2^t),
    which saves a pass over the state. ``d`` is ``m`` itself for sgd / none.
    """
    if state is None:
        return m, 1.0
    eps = cfg.eps  # type: ignore[attr-defined]
    denom = state.sqrt()
    scale: torch.Tensor | float = 1.0
    if isinstance(cfg, AdamGrafting) and isinstance(bc2_sqrt, torch.Tensor):
        scale = bc2_sqrt.to(denom.dtype)
        denom.add_((eps * scale).view(-1, *([1] * (denom.ndim - 1))))
    elif isinstance(cfg, AdamGrafting):
        scale = bc2_sqrt
        denom.add_(eps * bc2_sqrt)
    else:
        denom.add_(eps)
    return torch.div(m, denom, out=denom), scale


__all__ = ["bias_correction2", "direction", "has_state", "init", "update"]
