"""One bucket of same-shape blocks and the pipeline of transforms that updates it.

:func:`pipeline_for` is the per-block update rule of a param group in one place: which first moment,
preconditioner and grafting transform a block of each kind gets (:mod:`shampoo.transforms`,
:mod:`shampoo.grafting`). A :class:`BlockBucket` stacks the state of same-shape, same-kind blocks
(b, ...) so that every transform runs as one batched kernel (``baddbmm``, ``bmm``, elementwise ops
over the whole stack); the per-block typed states (:class:`shampoo.state.BlockState`) hold views
into that storage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .blocking import BlockKind
from .config import GroupOptions
from .errors import InconsistentPickleError
from .implementation import DEFAULT_IMPLEMENTATION, ShampooImplementation
from .refresh import RootJob
from .state import BlockState, FactorState, mirror_upper_
from .transforms import (
    Diagonal,
    FirstMoment,
    Pipeline,
    Preconditioner,
    Stack,
    StepContext,
    block_norms,
    kronecker_for,
    matricize,
    per_block,
    precondition,
)


def pipeline_for(kind: BlockKind, opts: GroupOptions) -> Pipeline:
    """The transforms of a block of ``kind`` in a group with options ``opts``:

    * first moment m = EMA(g, beta1) (none when beta1 = 0);
    * preconditioner: Kronecker factors for Shampoo blocks, AdaGrad-style diagonal for vector blocks,
      none for graft-only blocks; the group's ``preconditioner`` option (a transform) replaces the
      Kronecker one;
    * grafting: the group's grafting config's own transform.
    """
    pre: Preconditioner | None
    if kind is BlockKind.SHAMPOO:
        pre = opts.preconditioner if opts.preconditioner is not None else kronecker_for(opts)
    elif kind is BlockKind.DIAGONAL:
        pre = Diagonal(beta2=opts.beta2, eps=opts.diagonal_eps, use_bias_correction=opts.use_bias_correction)
    else:
        pre = None
    return Pipeline(
        first_moment=FirstMoment(opts.beta1, opts.use_bias_correction) if opts.beta1 > 0 else None,
        preconditioner=pre,
        grafting=opts.grafting.transform(),
    )


class BlockBucket:
    """Same-shape, same-kind blocks of one param group, with stacked state: the engine's one handle
    on a stack (it reaches the pipeline and its state only through the methods below: statistics,
    refresh jobs, directions, readiness, the accumulator reset).

    Args:
        blocks: the (owned) blocks, all with the same ``spec.bucket_key``.
        opts: the group's options.
        dtype, device: of the parameters (first moment, grafting state, roots); factor statistics
            are kept in ``opts.factor_dtype``.
    """

    def __init__(
        self,
        blocks: list[BlockState],
        opts: GroupOptions,
        dtype: torch.dtype,
        device: torch.device,
        impl: ShampooImplementation | None = None,
    ):
        spec = blocks[0].spec
        self.impl = impl if impl is not None else DEFAULT_IMPLEMENTATION
        self.blocks = blocks
        self.kind = spec.kind
        self.shape = spec.shape
        self.factor_dims = spec.factor_dims
        self.dtype = dtype
        self.device = device
        self.pipeline = pipeline_for(spec.kind, opts)
        stack = Stack(len(blocks), spec.shape, spec.roots, dtype, device, opts.factor_dtype)
        self.state = self.pipeline.init(stack)
        for j, bs in enumerate(blocks):
            self.pipeline.bind(self.state, j, bs)
        self.grad_buffer = stack.zeros()  # reused for the stacked gradient of a full step

    def __len__(self) -> int:
        return len(self.blocks)

    # -- pickle ---------------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The bucket's attributes and where each block tensor lies in the stacked storage.

        Plain pickle serialises each tensor's storage on its own, so a block's view would come back as
        a copy apart from its stack (the batched kernels would update the stack and leave the copy
        stale). :meth:`__setstate__` makes each such tensor a view of its stack again. (deepcopy and
        ``torch.save`` keep shared storages themselves; the rebinding is then a no-op.)
        """
        stacks: dict[int, int] = {}
        for k, t in enumerate(_tensors(self.state)):
            stacks.setdefault(t.untyped_storage().data_ptr(), k)
        views = []
        for j, block in enumerate(self.blocks):
            for path, t in _block_tensors(block):
                k = stacks.get(t.untyped_storage().data_ptr())
                if k is not None:
                    views.append((j, path, k, t.storage_offset(), tuple(t.shape), t.stride()))
        return {**self.__dict__, "_views": views}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore the attributes and make each recorded block tensor a view of its stack again.

        Raises:
            InconsistentPickleError: a recorded view names a block, tensor or stack the bucket does
                not have, lies outside its stack's storage, or differs from the stack there in
                dtype, shape or bits (a pickle edited by hand, or mixed from two optimizers).
        """
        state = dict(state)
        views = state.pop("_views", [])
        self.__dict__.update(state)
        stacks = _tensors(self.state)
        for j, path, k, offset, shape, stride in views:
            view = _stacked_view(self.blocks, stacks, j, path, k, offset, shape, stride)
            _set(self.blocks[j], path, view)

    def context(self, sel: torch.Tensor | None, opts: GroupOptions, steps: list[int]) -> StepContext:
        return StepContext(opts, steps, sel, self.device, self.impl)

    def update_statistics(
        self, sel: torch.Tensor | None, G: torch.Tensor, opts: GroupOptions, steps: list[int]
    ) -> torch.Tensor:
        """Fold the stacked gradient G of the selected blocks (``sel`` None: all) into every statistic;
        returns m, the gradient EMA (see :meth:`shampoo.transforms.Pipeline.update`)."""
        return self.pipeline.update(self.state, G, self.context(sel, opts, steps))

    def directions(
        self,
        sel: torch.Tensor | None,
        m: torch.Tensor,
        opts: GroupOptions,
        steps: list[int],
        use_preconditioner: list[bool],
    ) -> tuple[torch.Tensor, torch.Tensor | float, torch.Tensor | None]:
        """(D, s, norms) of the selected blocks: block j's direction is s_j D_j, and norms[j] is
        ||D_j|| where grafting computed it (see
        :meth:`shampoo.transforms.Pipeline.direction_with_norms`)."""
        ctx = self.context(sel, opts, steps)
        return self.pipeline.direction_with_norms(self.state, m, ctx, use_preconditioner)

    def refresh(
        self, positions: list[int], steps: list[int], label: Callable[[int, int], str]
    ) -> list[RootJob]:
        """The periodic work of the due blocks at ``positions`` (their parameter ``steps``): the
        preconditioner's root jobs for the refresh engine (:mod:`shampoo.refresh`); ``label(j, d)``
        names factor d of block j in messages."""
        return self.pipeline.refresh(self.state, positions, steps, label)

    def ready(self, position: int) -> bool:
        """Whether the block at ``position`` may use its preconditioner (e.g. has a root)."""
        return self.pipeline.ready(self.state, position)

    def reset_non_finite_accumulators(self) -> list[int]:
        """Zero the grafting / diagonal accumulator of every block where it became NaN/Inf (one huge
        gradient makes g^2 overflow), and that block's first moment, which holds the same gradient
        (with a fresh second moment it would give huge, then non-finite, directions for hundreds of
        steps); returns the positions reset. Without the reset an infinite Adam second moment makes
        the block's direction 0 for ever, silently."""
        return self.pipeline.reset_non_finite(self.state, len(self.blocks))


def _tensors(obj: object) -> list[torch.Tensor]:
    """The stacked tensors of a transform state (dataclasses, lists, tuples, dicts), in a fixed order;
    not those of the per-block states it may keep (e.g. Kronecker's records: views, not stacks)."""
    if isinstance(obj, BlockState | FactorState):
        return []
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors(getattr(obj, f.name))]
    return []


def _stacked_view(
    blocks: list[BlockState],
    stacks: list[torch.Tensor],
    j: int,
    path: tuple[str | int, ...],
    k: int,
    offset: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
) -> torch.Tensor:
    """The view of stack ``k`` that block ``j``'s tensor at ``path`` was when pickled, after checking
    that it fits (see :meth:`BlockBucket.__setstate__`); raises InconsistentPickleError naming what
    mismatched."""
    name = ".".join(map(str, path))
    where = f"unpickling a BlockBucket: block {j}'s {name}"
    allowed = (
        "each block tensor must be a view of one of the bucket's stacked tensors with the same dtype, "
        "shape and bits (as pickle.dumps of a Shampoo writes it); to move state between optimizers, "
        "use state_dict() / load_state_dict()"
    )
    if not 0 <= j < len(blocks):
        raise InconsistentPickleError(f"{where}: the bucket has {len(blocks)} blocks; {allowed}")
    try:
        old = _get(blocks[j], path)
    except (AttributeError, KeyError, IndexError, TypeError):
        old = None
    if not isinstance(old, torch.Tensor):
        raise InconsistentPickleError(f"{where}: the block has no tensor there; {allowed}")
    if not 0 <= k < len(stacks):
        raise InconsistentPickleError(
            f"{where} is recorded in stacked tensor {k}, but the bucket has {len(stacks)}; {allowed}"
        )
    stack = stacks[k]
    size = stack.untyped_storage().nbytes() // stack.element_size()
    last = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
    if offset < 0 or min(stride, default=0) < 0 or (0 not in shape and last >= size):
        raise InconsistentPickleError(
            f"{where}: offset {offset}, shape {tuple(shape)}, stride {tuple(stride)} lie outside stacked "
            f"tensor {k}'s storage of {size} elements; {allowed}"
        )
    view = stack.as_strided(shape, stride, offset)
    if view.dtype != old.dtype or view.shape != old.shape:
        raise InconsistentPickleError(
            f"{where} is {old.dtype} {tuple(old.shape)}, its place in stacked tensor {k} is "
            f"{view.dtype} {tuple(view.shape)}; {allowed}"
        )
    if not _same_bits(view, old):
        raise InconsistentPickleError(f"{where} differs from stacked tensor {k} at its place; {allowed}")
    return view


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included), for tensors of one dtype and shape."""
    return a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _block_tensors(block: BlockState) -> Iterator[tuple[tuple[str | int, ...], torch.Tensor]]:
    """(path, tensor) of every tensor of a block's state: its fields, declared tensors and factors."""
    for name in ("first_moment", "graft_state", "diagonal"):
        t = getattr(block, name)
        if t is not None:
            yield (name,), t
    for name, t in block.tensors.items():
        yield ("tensors", name), t
    for k, f in enumerate(block.factors):
        for name in ("matrix", "root", "basis"):
            t = getattr(f, name)
            if t is not None:
                yield ("factors", k, name), t


def _get(block: BlockState, path: tuple[str | int, ...]) -> torch.Tensor:
    obj: Any = block
    for key in path:
        obj = obj[key] if isinstance(key, int) or isinstance(obj, dict) else getattr(obj, key)
    return obj


def _set(block: BlockState, path: tuple[str | int, ...], value: torch.Tensor) -> None:
    obj = _get(block, path[:-1]) if len(path) > 1 else block
    if isinstance(obj, dict):
        obj[path[-1]] = value
    else:
        setattr(obj, path[-1], value)


__all__ = [
    "BlockBucket",
    "block_norms",
    "kronecker_for",
    "matricize",
    "mirror_upper_",
    "per_block",
    "pipeline_for",
    "precondition",
]
