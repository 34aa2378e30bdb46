"""The per-block transform interface and the pipeline that composes transforms (optax's ``chain``).

Every transform works on a *stack* of same-shape blocks (b, *block_shape) of one param group and
owns a small typed state (a dataclass of stacked tensors). Its methods:

* ``init(stack)``: the state for a stack described by :class:`Stack`;
* ``bind(state, j, block)``: give block j's :class:`~shampoo.state.BlockState` its typed views
  into that state (what diagnostics, checkpoints and users inspect);
* ``update(state, G, ctx)``: fold the stacked gradient G of the selected blocks into the statistics;
* ``direction(state, m, ctx)``: (D, s), the direction of block j being s_j D_j (s a float or a
  (b,) tensor, folded by the caller into the one pass that writes the direction out);
* preconditioners also have ``ready(state, j)`` (may block j use its preconditioner yet?),
  ``refresh(state, positions, steps, label)`` (the periodic work: root jobs, see
  :mod:`shampoo.refresh`) and ``accumulators(state)`` (tensors to check for overflow).

A :class:`Pipeline` is one bucket's composition: an optional first moment (the EMA m of the
gradient, Adam's beta1), an optional preconditioner (Kronecker, diagonal, or any object with the
methods above) and a grafting transform (Agarwal et al. 2020: the preconditioned direction is
rescaled per block to the norm of the grafting direction). Its :meth:`Pipeline.direction` is the
whole per-block update rule in one place.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from ..implementation import DEFAULT_IMPLEMENTATION, ShampooImplementation
from ..refresh import RootJob

if TYPE_CHECKING:
    from ..state import BlockState


@dataclass(frozen=True)
class Stack:
    """What a transform needs to create the state of a stack of blocks."""

    size: int  # number of blocks b
    shape: tuple[int, ...]  # block shape
    roots: tuple[Any, ...]  # per block dim, the root p of its Kronecker factor (None: no factor)
    dtype: torch.dtype  # of the first moment, grafting/diagonal state and roots
    device: torch.device
    factor_dtype: torch.dtype  # of Kronecker statistics

    def zeros(self) -> torch.Tensor:
        return torch.zeros((self.size, *self.shape), dtype=self.dtype, device=self.device)


class StepOptions(Protocol):
    """What a transform reads of its param group's options (:class:`shampoo.config.GroupOptions`
    has them all; the transforms depend on this much, not on the config module)."""

    @property
    def beta2(self) -> float: ...

    use_bias_correction: bool
    eps: float
    eps_mode: str
    psd: str | None
    factor_dtype: torch.dtype
    root_dtype: torch.dtype
    failure: Any


@dataclass(frozen=True)
class StepContext:
    """One step of the selected blocks of a stack: rows ``sel`` (None: all), their parameter steps."""

    opts: StepOptions
    steps: list[int]
    sel: torch.Tensor | None
    device: torch.device
    # the optimizer's fast paths (its ``implementation=``): Adam grafting reads ``fused_adam``
    impl: ShampooImplementation = DEFAULT_IMPLEMENTATION

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """The selected rows of a stacked state (the storage itself when every row is selected)."""
        return t if self.sel is None else t.index_select(0, self.sel)

    def put(self, t: torch.Tensor, value: torch.Tensor) -> None:
        """Write rows taken by :meth:`take` back (a no-op when they were the storage itself)."""
        if self.sel is not None:
            t.index_copy_(0, self.sel, value)

    def per_block(self, values: Sequence[float]) -> float | torch.Tensor:
        """A float when all blocks agree (the common case), else a (b,) float64 tensor."""
        return per_block(list(values), 1, self.device)


@runtime_checkable
class Preconditioner(Protocol):
    """A per-block preconditioner (Kronecker, diagonal, ...); see the module docstring.

    Any object with these seven methods is one (a structural protocol: a class of the user's need not
    name it). A class that subclasses it explicitly writes ``init``, ``update`` and ``direction``
    and inherits the rest: no per-block view (``bind``), always ready, no periodic work, no
    accumulators to check.
    """

    @abstractmethod
    def init(self, stack: Stack) -> Any: ...

    @abstractmethod
    def update(self, state: Any, G: torch.Tensor, ctx: StepContext) -> None: ...

    @abstractmethod
    def direction(self, state: Any, m: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, Any]: ...

    def bind(self, state: Any, j: int, block: BlockState) -> None:
        """Give block j's typed state its views into ``state`` (default: none)."""
        return None

    def ready(self, state: Any, j: int) -> bool:
        """Whether block j may use this preconditioner yet (default: always)."""
        return True

    def refresh(
        self, state: Any, positions: list[int], steps: list[int], label: Callable[[int, int], str]
    ) -> list[RootJob]:
        """The periodic work of the due blocks, as root jobs (default: none)."""
        return []

    def accumulators(self, state: Any) -> list[torch.Tensor]:
        """The stacked accumulators to check for overflow (default: none)."""
        return []


class Grafting(Protocol):
    """A grafting method as a transform (see :mod:`shampoo.grafting`)."""

    def init(self, stack: Stack) -> Any: ...
    def bind(self, state: Any, j: int, block: BlockState) -> None: ...
    def update(self, state: Any, G: torch.Tensor, ctx: StepContext) -> None: ...
    def direction(self, state: Any, m: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, Any]: ...
    def graft(self, pre: torch.Tensor, pre_scale: Any, d: torch.Tensor, d_scale: Any) -> Any: ...
    def graft_with_norms(
        self, pre: torch.Tensor, pre_scale: Any, d: torch.Tensor, d_scale: Any
    ) -> tuple[Any, torch.Tensor | None, torch.Tensor | None]: ...
    def fused_update(
        self, state: Any, m: torch.Tensor, G: torch.Tensor, ctx: StepContext, beta1: float
    ) -> bool: ...
    def accumulators(self, state: Any) -> list[torch.Tensor]: ...


@dataclass
class PipelineState:
    """The typed states of one bucket's transforms (None where the pipeline has no such stage)."""

    first_moment: Any
    preconditioner: Any
    grafting: Any


@dataclass(frozen=True)
class Pipeline:
    """first moment -> preconditioner -> grafting, for one bucket of same-shape blocks."""

    first_moment: Any  # a FirstMoment or None (beta1 = 0)
    preconditioner: Preconditioner | None  # None: the grafting direction alone
    grafting: Grafting

    def init(self, stack: Stack) -> PipelineState:
        fm, pre = self.first_moment, self.preconditioner
        return PipelineState(
            fm.init(stack) if fm is not None else None,
            pre.init(stack) if pre is not None else None,
            self.grafting.init(stack),
        )

    def bind(self, state: PipelineState, j: int, block: BlockState) -> None:
        if self.first_moment is not None:
            self.first_moment.bind(state.first_moment, j, block)
        if self.preconditioner is not None:
            self.preconditioner.bind(state.preconditioner, j, block)
        self.grafting.bind(state.grafting, j, block)

    def update(self, state: PipelineState, G: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Fold G into every statistic; returns m, the gradient EMA (G itself when beta1 = 0). The
        bias correction 1/(1 - beta1^t) of m is folded into the output scale by :meth:`direction`."""
        fused = self.first_moment is not None and self.grafting.fused_update(
            state.grafting, state.first_moment.m, G, ctx, self.first_moment.beta1
        )  # Adam grafting: both moments in one pass
        if not fused:
            self.grafting.update(state.grafting, G, ctx)
        if self.preconditioner is not None:
            self.preconditioner.update(state.preconditioner, G, ctx)
        if self.first_moment is None:
            return G
        if fused:
            return state.first_moment.m
        return self.first_moment.update(state.first_moment, G, ctx)

    def ready(self, state: PipelineState, j: int) -> bool:
        return self.preconditioner is not None and self.preconditioner.ready(state.preconditioner, j)

    def direction(
        self, state: PipelineState, m: torch.Tensor, ctx: StepContext, use: list[bool]
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """Search directions of the selected blocks as (D, s): block j's direction is s_j D_j.

        ``use[j]``: block j is past ``start_preconditioning_step`` and its preconditioner is
        :meth:`ready`; otherwise its direction is the grafting direction.
        """
        D, scale, _ = self.direction_with_norms(state, m, ctx, use)
        return D, scale

    def direction_with_norms(
        self, state: PipelineState, m: torch.Tensor, ctx: StepContext, use: list[bool]
    ) -> tuple[torch.Tensor, torch.Tensor | float, torch.Tensor | None]:
        """:meth:`direction` and the (b,) Frobenius norms ||D_j|| that grafting computed on the way
        (None when it computed none: no grafting norms, or no preconditioned block)."""
        bc1: torch.Tensor | float = 1.0
        if self.first_moment is not None:
            bc1 = self.first_moment.bias_correction(ctx)
        d, d_scale = self.grafting.direction(state.grafting, m, ctx)
        if self.preconditioner is None or not any(use):
            return d, _div(d_scale, bc1), None
        pre, pre_scale = self.preconditioner.direction(state.preconditioner, m, ctx)
        pre_scale, pn, gn = self.grafting.graft_with_norms(pre, pre_scale, d, d_scale)
        if all(use):
            return pre, _div(pre_scale, bc1), pn
        mask = torch.tensor(use, device=ctx.device)
        D = torch.where(mask.view(-1, *([1] * (pre.ndim - 1))), pre, d)
        k = len(ctx.steps)
        scale = torch.where(mask, _vec(pre_scale, k, ctx.device), _vec(d_scale, k, ctx.device))
        norms = None if pn is None or gn is None else torch.where(mask, pn, gn)
        return D, _div(scale, bc1), norms

    def refresh(
        self, state: PipelineState, positions: list[int], steps: list[int], label: Callable[[int, int], str]
    ) -> list[RootJob]:
        if self.preconditioner is None:
            return []
        return self.preconditioner.refresh(state.preconditioner, positions, steps, label)

    def reset_non_finite(self, state: PipelineState, size: int) -> list[int]:
        """Zero every accumulator row (grafting, diagonal) that became NaN/Inf, and that block's first
        moment (it holds the same huge gradient); returns the positions reset."""
        bad = torch.zeros(size, dtype=torch.bool)
        accs = list(self.grafting.accumulators(state.grafting))
        if self.preconditioner is not None:
            accs += self.preconditioner.accumulators(state.preconditioner)
        for t in accs:
            sums = t.reshape(size, -1).sum(-1, dtype=torch.promote_types(t.dtype, torch.float32))
            if bool((~torch.isfinite(sums)).any()):
                rows = ~torch.isfinite(t).reshape(size, -1).all(-1)
                t[rows.to(t.device)] = 0.0
                bad |= rows.cpu()
        if self.first_moment is not None and bool(bad.any()):
            m = state.first_moment.m
            m[bad.to(m.device)] = 0.0
        return bad.nonzero().flatten().tolist()


def col(x: torch.Tensor | float, ndim: int, dtype: torch.dtype) -> torch.Tensor | float:
    """A per-block (b,) tensor shaped to broadcast over a stack of ndim dims."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype).view(-1, *([1] * (ndim - 1)))
    return x


def _vec(x: torch.Tensor | float, k: int, device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64)
    return torch.full((k,), float(x), dtype=torch.float64, device=device)


def _div(a: torch.Tensor | float, b: torch.Tensor | float) -> torch.Tensor | float:
    if not isinstance(b, torch.Tensor) and b == 1.0:
        return a
    return a / b


def per_block(values: list[float], ndim: int, device: torch.device) -> float | torch.Tensor:
    """A float when all values agree (the common case), else a (b, 1, ..., 1) float64 tensor."""
    first = values[0]
    if all(v == first for v in values):
        return first
    return torch.tensor(values, dtype=torch.float64, device=device).view(-1, *([1] * (ndim - 1)))


_CONSTANTS: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}


def constant(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-d tensor holding ``value``, for kernels that only read it (a step count, a fill value):
    one per value, dtype and device, shared by every bucket and step (the last few kept), instead
    of a new one per use. Never written to."""
    key = (value, dtype, device)
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) >= 16:
            _CONSTANTS.clear()
        t = _CONSTANTS[key] = torch.tensor(value, dtype=dtype, device=device)
    return t


def block_norms(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Frobenius norm of each block of a stack, shape (b,) (accumulated in ``dtype`` if given)."""
    flat = x if x.ndim == 2 else x.reshape(x.shape[0], -1)  # a (b, n) stack is its own reshape
    return torch.linalg.vector_norm(flat, dim=1, dtype=dtype)


__all__ = [
    "Grafting",
    "Pipeline",
    "PipelineState",
    "Preconditioner",
    "Stack",
    "StepContext",
    "StepOptions",
    "block_norms",
    "col",
    "constant",
    "per_block",
]


def reuse_buffer(buf: torch.Tensor | None, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """``buf`` if it has ``shape`` and ``like``'s dtype and device, else a new empty tensor of that kind.

    Per-bucket outputs of the step are written into buffers kept across steps (``out=``): a fresh
    (b, *shape) tensor per step costs page faults on CPU, since glibc hands blocks of >= 128 KiB back
    to the kernel on free.
    """
    if (
        buf is None
        or tuple(buf.shape) != tuple(shape)
        or buf.dtype != like.dtype
        or buf.device != like.device
    ):
        return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
    return buf
