"""Grafting methods as small init / update / direction triples on stacked blocks (optax style).

Every function works on a stack of same-shape blocks, shape (b, *block_shape), so a whole bucket is
one elementwise kernel. ``grad`` is the (weight-decayed) gradient, ``m_hat`` the bias-corrected
gradient EMA that the optimizer preconditions (equal to ``grad`` when beta1 = 0). The formulas match
torch.optim exactly so that grafting alone reproduces it:

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
    """sqrt(1 - beta2^t) for Adam (1 otherwise); ``steps`` an int or a per-block tensor."""
    if not (use and isinstance(cfg, AdamGrafting)):
        return 1.0
    if isinstance(steps, int):
        return (1.0 - cfg.beta2**steps) ** 0.5
    return (1.0 - torch.pow(cfg.beta2, steps.double())).sqrt()


def direction(
    cfg: GraftingConfig,
    state: torch.Tensor | None,
    m_hat: torch.Tensor,
    bc2_sqrt: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """The grafting direction (a new tensor, or ``m_hat`` itself for sgd / none)."""
    if state is None:
        return m_hat
    eps = cfg.eps  # type: ignore[attr-defined]
    if isinstance(cfg, AdamGrafting):
        denom = state.sqrt()
        if isinstance(bc2_sqrt, torch.Tensor):
            denom.div_(bc2_sqrt.to(denom.dtype).view(-1, *([1] * (denom.ndim - 1))))
        elif bc2_sqrt != 1.0:
            denom.div_(bc2_sqrt)
        denom.add_(eps)
    else:
        denom = state.sqrt().add_(eps)
    return m_hat / denom


__all__ = ["bias_correction2", "direction", "has_state", "init", "update"]
