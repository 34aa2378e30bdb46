"""Stage 6 of :meth:`shampoo.Shampoo.step`: the parameter update from the search directions
(momentum, decoupled weight decay, w <- w - lr d), or straight from the buckets in one pass, and the
finiteness rules around it (a parameter whose gradient or direction is non-finite is skipped, with a
counted warning). Which path a group takes is chosen once per group and step
(:meth:`shampoo.Shampoo._apply_path`).
"""

from __future__ import annotations

import logging
import math
import warnings

import torch

from .config import GroupOptions
from .engine import BucketDirections, GroupEngine, state_dtype
from .errors import NonFiniteGradientWarning
from .state import ParamState

log = logging.getLogger("shampoo")


def direct(params: list[torch.Tensor]) -> bool:
    """Whether the update can be added straight from the buckets: every parameter contiguous (its
    merged shape is then a view) and of its state's dtype, which its buckets' directions have
    (16-bit parameters keep fp32 state, and their direction is rounded to the parameter's dtype
    first, as documented)."""
    return all(p.is_contiguous() and state_dtype(p.dtype) == p.dtype for p in params)


def all_finite(tensors: list[torch.Tensor]) -> list[bool]:
    """Per tensor, whether every entry is finite.

    Tested by the sum in at least float32: NaN or +-Inf entries make it NaN or Inf, and it cannot
    overflow for the gradients of practice (a 2-norm overflows for large fp16 gradients; an
    inf-norm costs ten times as much on CPU).
    """
    sums = [t.sum(dtype=state_dtype(t.dtype)) for t in tensors]  # at least float32
    return [math.isfinite(s) for s in torch.stack(sums).tolist()]  # one read, no isfinite kernels


def skip(states: list[ParamState], what: str) -> None:
    """Count a skipped update for each state and warn (:class:`NonFiniteGradientWarning`); called
    two frames below :meth:`shampoo.Shampoo.step` (``stacklevel`` counts on it)."""
    for st in states:
        st.skipped_steps += 1
    names = ", ".join(str(s.key) for s in states[:5]) + (" ..." if len(states) > 5 else "")
    msg = (
        f"shampoo: non-finite {what} for {len(states)} parameter(s) ({names}); their update was skipped "
        f"(skipped so far: {', '.join(str(s.skipped_steps) for s in states[:5])})"
    )
    log.warning(msg)
    warnings.warn(msg, NonFiniteGradientWarning, stacklevel=4)


def apply_from_buckets(
    eng: GroupEngine,
    opts: GroupOptions,
    idx: list[int],
    params: list[torch.Tensor],
    outputs: list[BucketDirections],
    finite: list[bool],
    factors: list[torch.Tensor | float] | None = None,
) -> None:
    """Stage 5-6 in one pass without momentum: decoupled weight decay, then w <- w - lr s_j D_j
    added straight from the buckets into the parameters' block views (no direction tensor is
    written and read back). ``finite``: per parameter, from :meth:`GroupEngine.finite_directions`;
    a parameter with a non-finite direction is skipped, as in :func:`apply_directions`. ``factors``:
    the outputs' -lr s_j from :meth:`GroupEngine.update_factors` (None: rounded by the scatter)."""
    skipped = frozenset(i for i, ok in zip(idx, finite, strict=True) if not ok)
    if skipped:
        skip([eng.states[i] for i in idx if i in skipped], "update")
    keep = [p for i, p in zip(idx, params, strict=True) if i not in skipped]
    if not keep:
        return
    if opts.weight_decay and opts.decoupled_weight_decay:
        torch._foreach_mul_(keep, 1.0 - opts.lr * opts.weight_decay)
    views = {i: eng.states[i].layout.merged_view(p) for i, p in zip(idx, params, strict=True)}
    for k, out in enumerate(outputs):
        f = None if factors is None else factors[k]
        eng.scatter(
            out.bucket, out.positions, out.D, out.scale, views, alpha=-opts.lr, skip=skipped, factor=f
        )


def apply_directions(
    eng: GroupEngine,
    opts: GroupOptions,
    idx: list[int],
    params: list[torch.Tensor],
    dirs: list[torch.Tensor],
    finite: list[bool] | None = None,
) -> None:
    """Stage 6: momentum, decoupled weight decay and the parameter update; never writes NaN/Inf.
    ``finite``: per parameter, whether its direction is finite (None: tested here)."""
    if finite is None:
        finite = all_finite(dirs)
    if not all(finite):
        skip([eng.states[i] for i, ok in zip(idx, finite, strict=True) if not ok], "update")
        keep = [k for k, ok in enumerate(finite) if ok]
        idx, params, dirs = [idx[k] for k in keep], [params[k] for k in keep], [dirs[k] for k in keep]
        if not idx:
            return
    if opts.momentum > 0:
        bufs = [eng.states[i].momentum_buffer for i in idx]
        torch._foreach_mul_(bufs, opts.momentum)  # type: ignore[arg-type]
        torch._foreach_add_(bufs, dirs)  # type: ignore[arg-type]
        if opts.nesterov:
            torch._foreach_add_(dirs, bufs, alpha=opts.momentum)  # type: ignore[arg-type]
        else:
            dirs = bufs  # type: ignore[assignment]
    if opts.weight_decay and opts.decoupled_weight_decay:
        torch._foreach_mul_(params, 1.0 - opts.lr * opts.weight_decay)
    torch._foreach_add_(params, dirs, alpha=-opts.lr)


__all__ = ["all_finite", "apply_directions", "apply_from_buckets", "direct", "skip"]
