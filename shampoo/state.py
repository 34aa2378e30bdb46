"""Typed per-parameter, per-block and per-factor state, and its flattening for ``state_dict``.

Tensors in :class:`BlockState` and :class:`FactorState` are views into the stacked storage of their
bucket (:class:`shampoo.preconditioner.BlockBucket`), so batched kernels update them in place while
each block still has typed, inspectable state. ``flatten``/``restore`` turn a :class:`ParamState`
into a plain dict of tensors and numbers (picklable with ``torch.load(weights_only=True)``) and back.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch

from .blocking import BlockSpec, ParamLayout
from .errors import StateDictError


@dataclass
class FactorState:
    """One Kronecker factor of a block: statistics, current inverse root and root bookkeeping."""

    dim: int
    n: int
    root_p: Fraction
    matrix: torch.Tensor  # (n, n) view into the bucket's factor storage
    root: torch.Tensor  # (n, n) view into the bucket's root storage; identity until the first root
    has_root: bool = False
    root_step: int = 0  # parameter step of the current root
    consecutive_failures: int = 0  # rounds in a row without a usable root from any solver
    consecutive_primary_failures: int = 0  # rounds in a row in which the configured solver failed
    failures: int = 0
    primary_failures: int = 0
    fallback_uses: int = 0
    # The last root computation (diagnostics):
    solver: str = ""
    iterations: int = 0
    residual: float = math.nan
    converged: bool = False
    seconds: float = 0.0
    kappa: float = math.nan
    error: str = ""


# FactorState fields that are tensors or fixed by the layout (not flattened as bookkeeping).
_FACTOR_FIXED = ("dim", "n", "root_p", "matrix", "root")


@dataclass
class BlockState:
    """State of one block. Tensors are None for blocks this process does not own (distributed)."""

    spec: BlockSpec
    owned: bool = True
    first_moment: torch.Tensor | None = None  # EMA of the gradient (beta1 > 0)
    graft_state: torch.Tensor | None = None  # second moment of the grafting method
    diagonal: torch.Tensor | None = None  # diagonal preconditioner accumulator (DIAGONAL blocks)
    factors: list[FactorState] = field(default_factory=list)


@dataclass
class ParamState:
    """State of one parameter."""

    key: str | int  # the parameter's name, or its position when the optimizer has no names
    layout: ParamLayout
    blocks: list[BlockState]
    step: int = 0  # updates applied (non-finite and absent gradients do not count)
    skipped_steps: int = 0  # updates skipped because of non-finite gradients or updates
    momentum_buffer: torch.Tensor | None = None  # heavy-ball momentum of the search direction


def flatten(state: ParamState) -> dict[str, Any]:
    """A flat dict of cloned tensors and plain values describing ``state``."""
    out: dict[str, Any] = {
        "step": state.step,
        "skipped_steps": state.skipped_steps,
        "shape": tuple(state.layout.shape),
    }
    if state.momentum_buffer is not None:
        out["momentum_buffer"] = state.momentum_buffer.clone()
    for b in state.blocks:
        if not b.owned:
            continue
        pre = f"blocks.{b.spec.index}."
        out[pre + "shape"] = tuple(b.spec.shape)
        for name in ("first_moment", "graft_state", "diagonal"):
            t = getattr(b, name)
            if t is not None:
                out[pre + name] = t.clone()
        for f in b.factors:
            fp = f"{pre}factors.{f.dim}."
            out[fp + "matrix"] = f.matrix.clone()
            out[fp + "root"] = f.root.clone()
            for fld in dataclasses.fields(FactorState):
                if fld.name not in _FACTOR_FIXED:
                    out[fp + fld.name] = getattr(f, fld.name)
    return out


def _copy_into(dst: torch.Tensor, src: Any, what: str) -> None:
    if not isinstance(src, torch.Tensor) or tuple(src.shape) != tuple(dst.shape):
        got = tuple(src.shape) if isinstance(src, torch.Tensor) else type(src).__name__
        raise StateDictError(f"state for {what} has shape {got}, expected {tuple(dst.shape)}")
    dst.copy_(src)


def restore(state: ParamState, flat: dict[str, Any]) -> None:
    """Load ``flat`` (from :func:`flatten`) into ``state`` in place, copying into existing storage."""
    key = state.key
    if tuple(flat.get("shape", state.layout.shape)) != tuple(state.layout.shape):
        raise StateDictError(
            f"parameter {key!r}: saved shape {flat['shape']} differs from the parameter's {state.layout.shape}"
        )
    state.step = int(flat["step"])
    state.skipped_steps = int(flat.get("skipped_steps", 0))
    if "momentum_buffer" in flat:
        if state.momentum_buffer is None:
            raise StateDictError(f"parameter {key!r}: the state has a momentum buffer but momentum is 0")
        _copy_into(state.momentum_buffer, flat["momentum_buffer"], f"{key!r} momentum_buffer")
    for b in state.blocks:
        if not b.owned:
            continue
        pre = f"blocks.{b.spec.index}."
        saved = flat.get(pre + "shape")
        if saved is None or tuple(saved) != tuple(b.spec.shape):
            raise StateDictError(
                f"parameter {key!r} block {b.spec.index}: saved block shape {saved} differs from "
                f"{b.spec.shape}; the blocking options (max_preconditioner_dim, merge_dims, "
                "exponent_override, vector_policy) must match the run that saved the state"
            )
        for name in ("first_moment", "graft_state", "diagonal"):
            t = getattr(b, name)
            if t is not None:
                if pre + name not in flat:
                    raise StateDictError(f"parameter {key!r} block {b.spec.index}: {name} missing from state")
                _copy_into(t, flat[pre + name], f"{key!r} block {b.spec.index} {name}")
        for f in b.factors:
            fp = f"{pre}factors.{f.dim}."
            if fp + "matrix" not in flat:
                raise StateDictError(f"parameter {key!r} block {b.spec.index}: factor {f.dim} missing")
            _copy_into(f.matrix, flat[fp + "matrix"], f"{key!r} {fp}matrix")
            _copy_into(f.root, flat[fp + "root"], f"{key!r} {fp}root")
            for fld in dataclasses.fields(FactorState):
                if fld.name not in _FACTOR_FIXED and fp + fld.name in flat:
                    setattr(f, fld.name, flat[fp + fld.name])


__all__ = ["BlockState", "FactorState", "ParamState", "flatten", "restore"]
