"""One param group's blocks: layout, typed state, buckets, and stages 2-4 of the step pipeline.

A :class:`GroupEngine` is built at a group's first step (or state load). It lays out every
parameter (:mod:`shampoo.blocking`), creates the typed :class:`~shampoo.state.ParamState` of each,
stacks the blocks this process owns into :class:`~shampoo.preconditioner.BlockBucket` s, and runs
statistics, roots and directions on them (:meth:`GroupEngine.block_directions`). Gradients enter the
buckets and directions leave them through :meth:`GroupEngine.gather` / :meth:`GroupEngine.scatter`,
one strided copy per evenly tiled parameter.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .blocking import BlockSpec, ParamLayout, layout_param, tile_grid, tiled_view
from .config import DiagnosticsConfig, GroupOptions
from .errors import FactorResetWarning
from .implementation import DEFAULT_IMPLEMENTATION, ShampooImplementation
from .preconditioner import BlockBucket, block_norms
from .refresh import RootJob, synchronous, warn
from .root_pipeline import GroupRounds, merge_reports
from .roots import compute_roots
from .state import BlockState, ParamState

log = logging.getLogger("shampoo")


@dataclass(frozen=True)
class PlannedBlock:
    """One block of a group as the sharding layer sees it."""

    param: int  # local index of its parameter in the group
    spec: BlockSpec  # global param index, block index, shape, slices into the merged view
    owned: bool  # whether this process computes it


@dataclass(frozen=True)
class GroupPlan:
    """What distribution needs from a group's engine, and nothing else (typed, built once).

    ``blocks``: every block of every parameter of the group (owned or not), in (param, block)
    order. ``buckets[bi][j]``: the block at position j of owned bucket bi, i.e. where the direction
    ``D[k]`` of a :class:`BucketDirections` ``(bi, positions, D, s, norms)`` of
    :meth:`GroupEngine.block_directions` with ``positions[k] = j`` belongs. ``merged_shapes[i]``
    and ``directions[i]``: parameter i's merged shape (the space its blocks' slices index) and its
    direction workspace, which the assembly fills in place.
    """

    blocks: tuple[PlannedBlock, ...]
    buckets: tuple[tuple[PlannedBlock, ...], ...]
    merged_shapes: tuple[tuple[int, ...], ...]
    directions: tuple[torch.Tensor, ...]

    @property
    def device(self) -> torch.device:
        return self.directions[0].device if self.directions else torch.device("cpu")

    def direction_views(self, present: list[int]) -> dict[int, torch.Tensor]:
        """The direction workspaces of the ``present`` parameters in their merged shapes (views)."""
        return {i: self.directions[i].view(self.merged_shapes[i]) for i in present}


def layout_group(params: list[torch.Tensor], first_index: int, opts: GroupOptions) -> list[ParamLayout]:
    """The block layout of a group's parameters (global indices from ``first_index``): the one
    derivation the engine and the block-to-rank assignment share."""
    return [
        layout_param(
            first_index + i,
            tuple(p.shape),
            max_preconditioner_dim=opts.max_preconditioner_dim,
            merge_dims_=opts.merge_dims,
            exponent_override=opts.exponent_override,
            vector_policy=opts.vector_policy,
            row_shards=opts.row_shards or 1,
        )
        for i, p in enumerate(params)
    ]


@dataclass(frozen=True)
class Segment:
    """Consecutive positions of one parameter in a bucket (tiling: see blocking.tile_grid)."""

    param: int
    start: int
    count: int
    tiling: tuple[tuple[int, ...], tuple[int, ...]] | None


@functools.cache
def state_dtype(param_dtype: torch.dtype) -> torch.dtype:
    """The dtype of a parameter's optimizer state: float32 for fp16/bf16 parameters, else its own.

    First moment, grafting and diagonal accumulators, roots and the momentum buffer of 16-bit
    parameters are kept in float32: in fp16, Adam grafting's g^2 underflows and its eps (1e-8) rounds
    to 0, so every direction would be m / 0 and every step skipped; bf16 has 8 bits of mantissa, too
    few for an EMA with beta2 = 0.999. Directions are rounded to the parameter's dtype once, when the
    update is applied. Factor statistics use ``factor_dtype`` (float32 by default).
    """
    return torch.promote_types(param_dtype, torch.float32)


def _rounded(scale: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """A per-block factor as the (b,) tensor of ``like``'s dtype (and device) that multiplies the
    directions ``like``, as :meth:`GroupEngine.scatter` rounds it."""
    b = like.shape[0]
    if isinstance(scale, torch.Tensor):
        flat = scale if scale.shape == (b,) else scale.reshape(-1).expand(b)
        return flat.to(device=like.device, dtype=like.dtype)
    return torch.full((b,), scale, dtype=torch.float64, device=like.device).to(like.dtype)


def _bounds(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The bounds ||D_j|| |f_j| of (norms, factors) pairs, in float64, as one vector: the products
    of the pairs' float64 copies (exact conversions; the concatenation promotes as ``double()`` does),
    in three operations however many pairs there are."""
    if len(pairs) == 1:
        norms, f = pairs[0]
        return norms.double() * f.double().abs()
    norms = torch.cat([n for n, _ in pairs]).double()
    return norms * torch.cat([f for _, f in pairs]).double().abs()


def _times(scale: torch.Tensor | float, alpha: float, like: torch.Tensor) -> torch.Tensor | float:
    """alpha s rounded once to ``like``'s dtype (a float scale: the float alpha s)."""
    return (scale * alpha).to(like.dtype) if isinstance(scale, torch.Tensor) else scale * alpha


class BucketDirections(NamedTuple):
    """The directions of one bucket's present blocks: block ``positions[k]``'s is
    ``scale[k] * D[k]`` (``scale`` a float or a (b,) tensor); ``norms[k]`` = ||D[k]|| where grafting
    computed it on the way (None otherwise), which :meth:`GroupEngine.finite_directions` uses."""

    bucket: int
    positions: list[int]
    D: torch.Tensor
    scale: torch.Tensor | float
    norms: torch.Tensor | None = None


class GroupEngine:
    """Layout, typed state and buckets of one param group (built at its first step or load)."""

    def __init__(
        self,
        params: list[torch.Tensor],
        keys: list[str | int],
        first_index: int,
        opts: GroupOptions,
        owns: Callable[[BlockSpec], bool],
        layouts: list[ParamLayout] | None = None,
        impl: ShampooImplementation | None = None,
    ):
        """``layouts``: the parameters' block layouts when not :func:`layout_group`'s (the local
        shards of ``fully_shard``ed parameters, :mod:`shampoo.fsdp`). ``impl``: the optimizer's
        fast paths (its ``implementation=``)."""
        self.params = params
        self.impl = impl if impl is not None else DEFAULT_IMPLEMENTATION
        self.structure = opts.structure()
        self.states: list[ParamState] = []
        if layouts is None:
            layouts = layout_group(params, first_index, opts)
        for p, key, layout in zip(params, keys, layouts, strict=True):
            blocks = [BlockState(spec=s, owned=owns(s)) for s in layout.blocks]
            mom = (
                torch.zeros_like(p, dtype=state_dtype(p.dtype), memory_format=torch.contiguous_format)
                if opts.momentum > 0
                else None
            )
            self.states.append(ParamState(key=key, layout=layout, blocks=blocks, momentum_buffer=mom))
        groups: dict[tuple[Any, ...], list[tuple[int, BlockState]]] = {}
        for i, (p, st) in enumerate(zip(params, self.states, strict=True)):
            for bs in st.blocks:
                if bs.owned:
                    groups.setdefault((*bs.spec.bucket_key, p.dtype, p.device), []).append((i, bs))
        self.buckets: list[BlockBucket] = []
        self.members: list[list[int]] = []  # per bucket: local param index of each position
        for (*_, dtype, device), items in groups.items():
            self.buckets.append(
                BlockBucket([bs for _, bs in items], opts, state_dtype(dtype), device, self.impl)
            )
            self.members.append([i for i, _ in items])
        self.segments = [self._segments(b, m) for b, m in zip(self.buckets, self.members, strict=True)]
        self.directions = [torch.empty_like(p, memory_format=torch.contiguous_format) for p in params]
        self.plan = self._make_plan()
        self._targets: dict[int, list[torch.Tensor | None]] = {}

    def _make_plan(self) -> GroupPlan:
        planned = {
            (i, b.spec.index): PlannedBlock(i, b.spec, b.owned)
            for i, st in enumerate(self.states)
            for b in st.blocks
        }
        buckets = tuple(
            tuple(planned[(i, b.spec.index)] for i, b in zip(members, bucket.blocks, strict=True))
            for bucket, members in zip(self.buckets, self.members, strict=True)
        )
        return GroupPlan(
            blocks=tuple(planned.values()),
            buckets=buckets,
            merged_shapes=tuple(st.layout.merged_shape for st in self.states),
            directions=tuple(self.directions),
        )

    def _segments(self, bucket: BlockBucket, members: list[int]) -> list[Segment]:
        """Runs of consecutive bucket positions of one parameter; tiled when they are all its blocks."""
        segs: list[Segment] = []
        for j, i in enumerate(members):
            if segs and segs[-1].param == i:
                segs[-1] = Segment(i, segs[-1].start, segs[-1].count + 1, None)
            else:
                segs.append(Segment(i, j, 1, None))
        out = []
        for seg in segs:
            layout = self.states[seg.param].layout
            idx = [bucket.blocks[j].spec.index for j in range(seg.start, seg.start + seg.count)]
            tiling = tile_grid(layout) if idx == [b.index for b in layout.blocks] else None
            out.append(Segment(seg.param, seg.start, seg.count, tiling))
        return out

    def gather(self, bi: int, positions: list[int], merged: dict[int, torch.Tensor]) -> torch.Tensor:
        """The stacked gradient blocks of bucket ``bi`` at ``positions`` (one strided copy per tiled
        parameter when every block is present)."""
        bucket, members = self.buckets[bi], self.members[bi]
        if len(positions) < len(members):
            G = torch.stack([merged[members[j]][bucket.blocks[j].spec.slices] for j in positions])
            return G if G.dtype == bucket.dtype else G.to(bucket.dtype)
        buf = bucket.grad_buffer
        for seg, dst in zip(self.segments[bi], self._gather_targets(bi), strict=True):
            src = merged[seg.param]
            if dst is not None:  # a whole tiled parameter; one block: its merged view is the block
                assert seg.tiling is not None
                grid, shape = seg.tiling
                dst.copy_(src if seg.count == 1 else tiled_view(src, grid, shape))
            else:
                for j in range(seg.start, seg.start + seg.count):
                    buf[j].copy_(src[bucket.blocks[j].spec.slices])
        return buf

    def _gather_targets(self, bi: int) -> list[torch.Tensor | None]:
        """Per segment of bucket ``bi``, where :meth:`gather` copies a tiled parameter's gradient:
        its rows of the bucket's gradient buffer viewed as (*grid, *block shape) (None: not tiled).
        Built at the first gather and kept (the buffer lives as long as the bucket); not pickled,
        since a copy's buffer is another tensor (:meth:`__getstate__`)."""
        targets = self._targets.get(bi)
        if targets is None:
            buf = self.buckets[bi].grad_buffer
            targets = self._targets[bi] = [
                None
                if seg.tiling is None
                else buf[seg.start : seg.start + seg.count].view(*seg.tiling[0], *seg.tiling[1])
                for seg in self.segments[bi]
            ]
        return targets

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the cached views of :meth:`_gather_targets` (rebuilt on first use)."""
        return {k: v for k, v in self.__dict__.items() if k != "_targets"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._targets = {}

    def scatter(
        self,
        bi: int,
        positions: list[int],
        D: torch.Tensor,
        scale: torch.Tensor | float,
        views: dict[int, torch.Tensor],
        alpha: float | None = None,
        skip: frozenset[int] = frozenset(),
        factor: torch.Tensor | float | None = None,
    ) -> None:
        """Write s_j D_j into the direction views of the parameters (the inverse of :meth:`gather`).

        ``alpha``: add alpha s_j D_j to the views instead (the parameters themselves: the update
        applied straight from the bucket, see :func:`shampoo.update.apply_from_buckets`), one
        ``add_``/``addcmul_`` per tiled parameter. ``skip``: parameters left untouched. ``factor``:
        alpha s_j as :meth:`update_factors` rounded it (None: rounded here, the same way).
        """
        bucket, members = self.buckets[bi], self.members[bi]
        sc: torch.Tensor | float
        if alpha is None:
            sc = scale.to(D.dtype) if isinstance(scale, torch.Tensor) else scale
        else:  # alpha s_j rounded once (float64 -> D's dtype)
            sc = factor if factor is not None else _times(scale, alpha, D)

        def emit(out: torch.Tensor, src: torch.Tensor, s: torch.Tensor | float) -> None:
            if alpha is not None:
                if isinstance(s, torch.Tensor):
                    out.addcmul_(src, s)
                else:
                    out.add_(src, alpha=s)
            elif isinstance(s, torch.Tensor) or s != 1.0:
                torch.mul(src, s, out=out)
            else:
                out.copy_(src)

        if len(positions) == len(members):
            for seg in self.segments[bi]:
                if seg.tiling is None or seg.param in skip:
                    continue
                if seg.count == 1:  # the parameter is one block: its merged view is the block
                    s1 = sc[seg.start : seg.start + 1] if isinstance(sc, torch.Tensor) else sc
                    emit(views[seg.param], D[seg.start], s1)  # (the tiled views' sizes less 1s)
                    continue
                grid, shape = seg.tiling
                src = D[seg.start : seg.start + seg.count].view(*grid, *shape)
                out = tiled_view(views[seg.param], grid, shape)
                seg_s = (
                    sc[seg.start : seg.start + seg.count].view(*grid, *([1] * len(shape)))
                    if isinstance(sc, torch.Tensor)
                    else sc
                )
                emit(out, src, seg_s)
            todo = [
                (k, k)
                for seg in self.segments[bi]
                if seg.tiling is None
                for k in range(seg.start, seg.start + seg.count)
            ]
        else:
            todo = list(enumerate(positions))
        for k, j in todo:
            if members[j] in skip:
                continue
            out = views[members[j]][bucket.blocks[j].spec.slices]
            emit(out, D[k], sc[k] if isinstance(sc, torch.Tensor) else sc)

    @staticmethod
    def update_factors(outputs: list[BucketDirections], alpha: float) -> list[torch.Tensor | float]:
        """Per output, alpha s_j rounded to its directions' dtype: the factor :meth:`scatter` adds
        alpha s_j D_j with, computed once for it and :meth:`finite_directions`."""
        return [_times(out.scale, alpha, out.D) for out in outputs]

    def finite_directions(
        self,
        present: list[int],
        outputs: list[BucketDirections],
        alpha: float | None = None,
        written: bool = True,
        factors: list[torch.Tensor | float] | None = None,
    ) -> list[bool]:
        """Per present parameter: whether every entry of its direction, s_j D_j rounded to the
        parameter's dtype, is finite (a parameter without blocks here: True); with ``alpha``, also
        every alpha s_j D_j (the update -lr s_j D_j); ``written=False``: only the latter (the update
        added straight from the buckets by :meth:`scatter`, where s_j D_j is never formed).

        Proved from the block norms grafting computed where it did: |s_j D_j|_ik <= |s_j| ||D_j||,
        with s_j the factor :meth:`scatter` multiplies by (rounded to D's dtype, as is alpha s_j), so
        a finite bound below half the dtype's largest value proves block j finite with no pass over
        it (``shampoo.grafting``). Blocks without norms get theirs computed (one pass, as the sum test
        of the directions costs); a block whose bound fails is tested entrywise. In fp16 the bound is
        ||s_j D_j||_F <= 32752: exceeded only by directions of entries ~1e2 (Adam-grafted ones are ~1).
        ``factors``: the outputs' alpha s_j from :meth:`update_factors` (None: computed here).
        """
        checks = []  # per output: (its big, norms, the factors its bound multiplies)
        for k, out in enumerate(outputs):
            members = self.members[out.bucket]
            big = torch.finfo(self.params[members[out.positions[0]]].dtype).max / 2
            # norms computed here are summed in float64: fp32 squares of entries below ~1e-23 vanish
            norms = out.norms if out.norms is not None else block_norms(out.D, torch.float64)
            fs = [_rounded(out.scale, out.D)] if written or alpha is None else []
            if alpha is not None:
                fs.append(_rounded(out.scale * alpha if factors is None else factors[k], out.D))
            checks.append((big, norms, fs))
        # all bounds of one big and device at once: one host sync per parameter dtype and device
        # (one, usually); a bound <= big is finite (NaN and +inf compare False; norms, |f| >= 0)
        kinds: dict[tuple[float, torch.device], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for big, norms, factors in checks:
            kinds.setdefault((big, norms.device), []).extend((norms, f) for f in factors)
        if all(bool((_bounds(pairs) <= big).all()) for (big, _), pairs in kinds.items()):
            return [True] * len(present)
        bad: set[int] = set()
        for out, (big, norms, factors) in zip(outputs, checks, strict=True):
            members = self.members[out.bucket]
            ok = torch.ones(out.D.shape[0], dtype=torch.bool, device=out.D.device)
            for f in factors:
                bound = _bounds([(norms, f)])
                ok &= torch.isfinite(bound) & (bound <= big)
            if bool(ok.all()):
                continue
            for k in (~ok).nonzero().flatten().tolist():
                i = members[out.positions[k]]
                dtype = self.params[i].dtype
                if not all(bool(torch.isfinite((out.D[k] * f[k]).to(dtype)).all()) for f in factors):
                    bad.add(i)
        return [i not in bad for i in present]

    def _check_accumulators(self, bucket: BlockBucket) -> None:
        reset = bucket.reset_non_finite_accumulators()
        if not reset:
            return
        names = [
            f"{self.states[self.members[self.buckets.index(bucket)][j]].key!s}[block {bucket.blocks[j].spec.index}]"
            for j in reset
        ]
        msg = (
            f"shampoo: the grafting/diagonal accumulators of {len(names)} block(s) became non-finite "
            f"({', '.join(names[:5])}{' ...' if len(names) > 5 else ''}), typically g^2 overflowing after "
            "one huge gradient; they were reset to zero, with the blocks' first moments (without the reset the block would never move "
            "again). Clip gradients if this repeats."
        )
        warn(msg, FactorResetWarning)

    def refresh_jobs(
        self, selected: dict[tuple[str | int, int], int]
    ) -> tuple[list[RootJob], list[tuple[str | int, int]]]:
        """The root jobs of the owned blocks ``selected`` ((parameter key, block index) -> the
        parameter step their round was due at), in the order :meth:`block_directions` makes them
        (buckets, then positions), and those blocks' keys (a checkpointed round resubmitted)."""
        jobs, blocks = [], []
        for bi, bucket in enumerate(self.buckets):
            pos = [j for j in range(len(bucket.blocks)) if self.block_key(bi, j) in selected]
            if not pos:
                continue
            ts = [selected[self.block_key(bi, j)] for j in pos]
            label = lambda j, d, bi=bi: self.label(bi, j, d)  # noqa: E731
            new = bucket.refresh(pos, ts, label)
            jobs.extend(new)
            if new:
                blocks.extend(self.block_key(bi, j) for j in pos)
        return jobs, blocks

    def block_key(self, bi: int, position: int) -> tuple[str | int, int]:
        """(parameter key, block index) of bucket ``bi``'s block at ``position``."""
        return self.states[self.members[bi][position]].key, self.buckets[bi].blocks[position].spec.index

    def label(self, bi: int, position: int, dim: int) -> str:
        """A factor's name in messages: ``key[block i, dim d]``."""
        spec = self.buckets[bi].blocks[position].spec
        key = self.states[self.members[bi][position]].key
        return f"{key!s}[block {spec.index}, dim {dim}]"

    def block_directions(
        self,
        opts: GroupOptions,
        present: list[int],
        grads: list[torch.Tensor],
        diag: DiagnosticsConfig,
        rounds: GroupRounds | None = None,
    ) -> tuple[list[BucketDirections], Any]:
        """Stages 2-4 on the owned blocks of the present parameters.

        Returns the :class:`BucketDirections` of every bucket with present blocks (block j's
        direction is s_j D_j), and the roots report. ``rounds``: the root schedule of
        ``root_schedule="async"`` (:mod:`shampoo.root_pipeline`): its rounds due now are installed
        first, it decides which blocks are refreshed and runs their round; None: every due round
        is computed here (:func:`~shampoo.roots.compute_roots`).
        """
        installed = rounds.install() if rounds is not None else None
        merged = {i: self.states[i].layout.merged_view(g) for i, g in zip(present, grads, strict=True)}
        work = []
        for bi, (bucket, members) in enumerate(zip(self.buckets, self.members, strict=True)):
            positions = [j for j, i in enumerate(members) if i in merged]
            if not positions:
                continue
            full = len(positions) == len(members)
            sel = None if full else torch.tensor(positions, device=bucket.device)
            G = self.gather(bi, positions, merged)
            steps = [self.states[members[j]].step for j in positions]
            m = bucket.update_statistics(sel, G, opts, steps)
            work.append((bi, bucket, positions, sel, m, steps))
        start, freq = opts.start_preconditioning_step, opts.precondition_frequency
        for _bi, bucket, _positions, _sel, _m, steps in work:
            if any(t % freq == 0 for t in steps):  # amortised: once per precondition_frequency steps
                self._check_accumulators(bucket)
        jobs, blocks = [], []
        for bi, bucket, positions, _sel, _m, steps in work:
            due = [
                (j, t)
                for j, t in zip(positions, steps, strict=True)
                if t >= start
                and (
                    (t - start) % freq == 0
                    if rounds is None
                    else rounds.due(*self.block_key(bi, j), (t - start) % freq == 0)
                )
            ]
            if due:
                pos, ts = [j for j, _ in due], [t for _, t in due]
                label = lambda j, d, bi=bi: self.label(bi, j, d)  # noqa: E731
                new = bucket.refresh(pos, ts, label)
                jobs.extend(new)
                if new:
                    blocks.extend(self.block_key(bi, j) for j in pos)
        if rounds is None:
            now = synchronous(jobs)
            report = compute_roots(now, opts, diag, self.impl) if now else None
        else:
            report = merge_reports(installed, rounds.submit(jobs, blocks, opts, diag, self.impl))
        out = []
        for bi, bucket, positions, sel, m, steps in work:
            use = [t >= start and bucket.ready(j) for j, t in zip(positions, steps, strict=True)]
            out.append(BucketDirections(bi, positions, *bucket.directions(sel, m, opts, steps, use)))
        return out, report


__all__ = [
    "BucketDirections",
    "GroupEngine",
    "GroupPlan",
    "PlannedBlock",
    "Segment",
    "layout_group",
    "state_dtype",
]
