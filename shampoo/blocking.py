"""Which blocks a parameter is cut into, and what each costs. No tensors, no state: pure layout.

A parameter of shape (d_1, ..., d_k) is preconditioned as follows (Gupta et al. 2018; Anil et al.
2020, §3 "blocking"; Shi et al. 2023, §3.2 "merging and blocking"):

1. Dims of size 1 are dropped.
2. Consecutive dims are merged, from the last dim backwards, while their product stays
   <= ``max_preconditioner_dim`` (a conv kernel (64, 3, 3, 3) becomes (64, 27)). Dims with an
   exponent override are never merged.
3. Every preconditioned dim is cut into chunks of at most ``max_preconditioner_dim``; the blocks are
   the Cartesian product of the chunks. Dims that are not preconditioned (exponent 0) are not cut.
   With ``row_shards = R > 1`` the parameter's dim 0 is first cut into the R pieces ``torch.chunk``
   makes (rows of ceil(d_0 / R); FSDP2's ``Shard(0)`` on R ranks), each piece is chunked on its own,
   and no block straddles two pieces (the blocks of a ``fully_shard``ed parameter; see
   :mod:`shampoo.fsdp`). A piece of rows is a contiguous range of the merged dim 0.
4. Each preconditioned dim i of a block gets a Kronecker factor of its size n_i and the inverse root
   p_i = 1/e_i, default e_i = 1/(2k) with k the block's order (L^{-1/4} G R^{-1/4} for matrices).

Parameters that were 0-D or 1-D to begin with follow ``vector_policy``: ``"diagonal"`` (an
AdaGrad-style diagonal preconditioner, grafted like any block), ``"graft"`` (the grafting direction
alone), or ``"shampoo"`` (a full-matrix factor per chunk, exponent 1/2).

The layout says *which blocks exist and what they cost*; who computes them is decided elsewhere
(``owner`` maps in the optimizer), so a distributed optimizer only has to assign blocks to ranks.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import Any

import torch

from .errors import InvalidShampooArgumentError


@dataclass(frozen=True, kw_only=True)
class ExponentOverride:
    """Per-dimension inverse exponents e (the factor of that dimension is raised to -e).

    Keyed by the order of the *original* parameter, as in Meta's distributed_shampoo::

        ExponentOverride.from_mapping({2: {1: 0.0}, 4: 0.25, 1: 0.5})

    means: for 2-D parameters do not precondition dim 1 (e = 0), precondition every dim of 4-D
    parameters with exponent 1/4, and 1-D parameters (with ``vector_policy="shampoo"``) with 1/2.
    Unlisted dims use the default e = 1/(2 k), k the order of the block after merging small dims
    (Gupta et al. 2018: L^{-1/4} G R^{-1/4} for matrices). Dims with an override are never merged.
    """

    entries: tuple[tuple[int, float | tuple[tuple[int, float], ...]], ...] = ()

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for order, val in self.entries:
            if not isinstance(order, int) or order < 0 or order in seen:
                raise InvalidShampooArgumentError(
                    "exponent_override order", order, "an int >= 0, each order once"
                )
            seen.add(order)
            vals = [val] if not isinstance(val, tuple) else [v for _, v in val]
            if isinstance(val, tuple):
                for d, _ in val:
                    if not isinstance(d, int) or not 0 <= d < max(order, 1):
                        raise InvalidShampooArgumentError(
                            f"exponent_override dim (order {order})", d, f"an int in [0, {max(order, 1)})"
                        )
            for v in vals:
                if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                    raise InvalidShampooArgumentError("exponent_override exponent", v, "finite and >= 0")

    @classmethod
    def from_mapping(cls, value: Mapping[int, Any] | ExponentOverride | None) -> ExponentOverride:
        if value is None:
            return cls()
        if isinstance(value, ExponentOverride):
            return value
        if not isinstance(value, Mapping):
            raise InvalidShampooArgumentError("exponent_override", value, "a mapping order -> exponent(s)")
        items: list[tuple[int, Any]] = []
        for order, val in sorted(value.items()):
            if isinstance(val, Mapping):
                items.append((order, tuple(sorted((int(d), float(e)) for d, e in val.items()))))
            else:
                items.append((order, float(val)))
        return cls(entries=tuple(items))

    def for_order(self, order: int) -> tuple[float | None, ...]:
        """Override per dim of a tensor of this order (None = default)."""
        for o, val in self.entries:
            if o == order:
                if isinstance(val, tuple):
                    d = dict(val)
                    return tuple(d.get(i) for i in range(order))
                return (val,) * order
        return (None,) * order


class BlockKind(StrEnum):
    """How a block's search direction is formed."""

    SHAMPOO = "shampoo"  # Kronecker-factored preconditioner, grafted
    DIAGONAL = "diagonal"  # AdaGrad-style diagonal preconditioner, grafted
    GRAFT = "graft"  # the grafting method's direction alone


@dataclass(frozen=True)
class MergedDim:
    """A dimension of the merged view: the original dims it covers, its size and its exponent."""

    dims: tuple[int, ...]
    size: int
    exponent: float | None  # None: the default 1/(2k); 0: not preconditioned


@dataclass(frozen=True)
class BlockSpec:
    """One block of one parameter.

    Attributes:
        param_index: position of the parameter in the optimizer's flat parameter list.
        index: block number within the parameter.
        kind: how its direction is formed.
        slices: where the block sits in the parameter's merged view.
        shape: the block's shape (merged dims).
        roots: per block dim, the root p of its factor (A^{-1/p}), or None when not preconditioned.
    """

    param_index: int
    index: int
    kind: BlockKind
    slices: tuple[slice, ...]
    shape: tuple[int, ...]
    roots: tuple[Fraction | None, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def factor_dims(self) -> tuple[int, ...]:
        """Block dims that carry a Kronecker factor."""
        return tuple(i for i, p in enumerate(self.roots) if p is not None)

    @property
    def root_cost(self) -> float:
        """Work of one root computation, in flops up to a constant: sum of n^3 over the factors."""
        return float(sum(self.shape[i] ** 3 for i in self.factor_dims))

    @property
    def step_cost(self) -> float:
        """Per-step flops: statistics (2 numel n) plus preconditioning (2 numel n) per factor, plus
        a few elementwise passes."""
        return float(sum(4 * self.numel * self.shape[i] for i in self.factor_dims) + 8 * self.numel)

    @property
    def state_numel(self) -> int:
        """Elements of Kronecker state (a factor and a root per preconditioned dim)."""
        return sum(2 * self.shape[i] ** 2 for i in self.factor_dims)

    @property
    def bucket_key(self) -> tuple[object, ...]:
        """Blocks with equal keys are stacked and processed together."""
        return (self.kind, self.shape, self.roots)


@dataclass(frozen=True)
class ParamLayout:
    """How one parameter is cut: its merged view and its blocks."""

    param_index: int
    shape: tuple[int, ...]
    merged: tuple[MergedDim, ...]
    blocks: tuple[BlockSpec, ...]

    @functools.cached_property
    def merged_shape(self) -> tuple[int, ...]:
        return tuple(m.size for m in self.merged) or (1,)

    def merged_view(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (the parameter's shape) viewed in the merged shape (a copy only if not viewable);
        ``t`` itself when it has that shape already (a matrix: the same sizes and strides as its
        view, without the operation)."""
        shape = self.merged_shape
        return t if t.shape == shape else t.reshape(shape)


def merge_dims(
    shape: tuple[int, ...],
    max_dim: int,
    overrides: tuple[float | None, ...],
    merge: bool = True,
) -> tuple[MergedDim, ...]:
    """Drop unit dims and merge runs of default-exponent dims while the product is <= ``max_dim``.

    Merging runs from the last dim backwards, so trailing small dims (kernel sizes, heads) merge
    first: (64, 3, 3, 3) -> (64, 27) for max_dim 1024.
    """
    out: list[MergedDim] = []
    for d in reversed(range(len(shape))):
        size, e = shape[d], overrides[d]
        if size == 1:
            continue
        if merge and out and e is None and out[0].exponent is None and out[0].size * size <= max_dim:
            first = out.pop(0)
            out.insert(0, MergedDim(dims=(d, *first.dims), size=size * first.size, exponent=None))
        else:
            out.insert(0, MergedDim(dims=(d,), size=size, exponent=e))
    return tuple(out)


def _chunks(size: int, max_dim: int) -> list[slice]:
    return [slice(s, min(s + max_dim, size)) for s in range(0, size, max_dim)]


def row_pieces(rows: int, pieces: int) -> list[tuple[int, int]]:
    """The row ranges [a, b) of ``torch.chunk(t, pieces, dim=0)`` for a dim 0 of ``rows`` (ceil(rows /
    pieces) rows each, the last shorter; fewer than ``pieces`` ranges when the rows run out), which
    is how FSDP2's ``Shard(0)`` places rows on ranks (ranks past the last range hold none)."""
    if pieces < 1:
        raise InvalidShampooArgumentError("row_shards", pieces, "an int >= 1")
    size = -(-rows // pieces) if rows else 0
    return [(a, min(a + size, rows)) for a in range(0, rows, size)] if size else []


def _dim0_bounds(shape: tuple[int, ...], merged: tuple[MergedDim, ...], pieces: int) -> list[int]:
    """Where the ``row_shards`` pieces start in the merged dim 0 (the first is 0); [0] when dim 0 is
    not cut (one piece, or dim 0 of size 1 and dropped)."""
    if pieces == 1 or not merged or merged[0].dims[0] != 0:
        return [0]
    inner = math.prod(shape[d] for d in merged[0].dims[1:])
    return [a * inner for a, _ in row_pieces(shape[0], pieces)]


def _cut(size: int, max_dim: int, starts: list[int], split: bool) -> list[slice]:
    """The pieces [starts[k], starts[k+1]) of a dim of ``size``, each chunked by ``max_dim`` when
    ``split`` (a preconditioned dim) or kept whole."""
    out: list[slice] = []
    for a, b in zip(starts, [*starts[1:], size], strict=True):
        if split:
            out.extend(slice(a + s.start, a + s.stop) for s in _chunks(b - a, max_dim))
        else:
            out.append(slice(a, b))
    return out


def root_from_exponent(e: float) -> Fraction | None:
    """p = 1/e as an exact rational (None for e = 0: not preconditioned)."""
    if e == 0:
        return None
    frac = Fraction(e).limit_denominator(10**6)
    return 1 / frac


def layout_param(
    param_index: int,
    shape: tuple[int, ...],
    *,
    max_preconditioner_dim: int,
    merge_dims_: bool = True,
    exponent_override: ExponentOverride | None = None,
    vector_policy: str = "diagonal",
    row_shards: int = 1,
) -> ParamLayout:
    """The :class:`ParamLayout` of a parameter of ``shape`` under the given options (``row_shards``:
    see the module docstring, step 3)."""
    shape = tuple(int(s) for s in shape)
    override = (exponent_override or ExponentOverride()).for_order(len(shape))
    if len(shape) <= 1 and vector_policy != "shampoo":
        merged = merge_dims(shape, max_preconditioner_dim, override, merge=False)
        kind = BlockKind.DIAGONAL if vector_policy == "diagonal" else BlockKind.GRAFT
        full = tuple(m.size for m in merged) or (1,)
        starts = _dim0_bounds(shape, merged, row_shards)
        vec = []
        for i, sl in enumerate(_cut(full[0], 1, starts, False)):
            rest = tuple(slice(0, s) for s in full[1:])
            bshape = (sl.stop - sl.start, *full[1:])
            vec.append(BlockSpec(param_index, i, kind, (sl, *rest), bshape, (None,) * len(full)))
        return ParamLayout(param_index, shape, merged, tuple(vec))
    merged = merge_dims(shape, max_preconditioner_dim, override, merge=merge_dims_)
    if not merged:
        # 0-D, or every dim of size 1: a single scalar block. A 1x1 "factor" is a diagonal one.
        block = BlockSpec(param_index, 0, BlockKind.DIAGONAL, (slice(0, 1),), (1,), (None,))
        return ParamLayout(param_index, shape, merged, (block,))
    order = len(merged)
    exps = [m.exponent if m.exponent is not None else 1.0 / (2 * order) for m in merged]
    roots = tuple(root_from_exponent(e) for e in exps)
    per_dim = [
        _chunks(m.size, max_preconditioner_dim) if p is not None else [slice(0, m.size)]
        for m, p in zip(merged, roots, strict=True)
    ]
    starts = _dim0_bounds(shape, merged, row_shards)
    if len(starts) > 1:
        per_dim[0] = _cut(merged[0].size, max_preconditioner_dim, starts, roots[0] is not None)
    kind = BlockKind.SHAMPOO if any(p is not None for p in roots) else BlockKind.GRAFT
    blocks = []
    for i, sl in enumerate(itertools.product(*per_dim)):
        bshape = tuple(s.stop - s.start for s in sl)
        broots = roots if kind is BlockKind.SHAMPOO else (None,) * order
        blocks.append(BlockSpec(param_index, i, kind, tuple(sl), bshape, broots))
    return ParamLayout(param_index, shape, merged, tuple(blocks))


def tile_grid(layout: ParamLayout) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(grid, block shape) when the parameter's blocks are equal and tile its merged view evenly.

    Then block j of the parameter is ``tiled_view(t, grid, shape)[np.unravel_index(j, grid)]``, so all
    of them move in one strided copy instead of one copy per block.
    """
    shapes = {b.shape for b in layout.blocks}
    if len(shapes) != 1:
        return None
    (shape,) = shapes
    merged = layout.merged_shape
    if len(shape) != len(merged) or any(m % c for m, c in zip(merged, shape, strict=True)):
        return None
    grid = tuple(m // c for m, c in zip(merged, shape, strict=True))
    return (grid, shape) if math.prod(grid) == len(layout.blocks) else None


def tiled_view(t: torch.Tensor, grid: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    """A view of ``t`` (in its merged shape) as (*grid, *shape): the blocks, in block order."""
    k = len(grid)
    split = t.view(*(x for pair in zip(grid, shape, strict=True) for x in pair))
    return split.permute(*range(0, 2 * k, 2), *range(1, 2 * k, 2))


__all__ = [
    "BlockKind",
    "BlockSpec",
    "MergedDim",
    "ParamLayout",
    "layout_param",
    "merge_dims",
    "root_from_exponent",
    "row_pieces",
    "tile_grid",
    "tiled_view",
]
