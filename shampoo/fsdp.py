"""Shampoo on ``fully_shard``ed (FSDP2) models: every rank preconditions blocks of its own shard.

FSDP2 (``torch.distributed.fsdp.fully_shard``) keeps each parameter as a DTensor placed
``Shard(0)`` over the shard dimension of a device mesh (HSDP: ``(Replicate(), Shard(0))`` on a 2-D
mesh): rank r of W holds rows [r c, (r + 1) c) of dim 0, c = ceil(d_0 / W) (``torch.chunk``), and
after the backward its gradient is the same shard of the averaged gradient (a reduce-scatter).

The **local-shard strategy** (``FSDPConfig(strategy="local_shard")``, the approach of Meta's
DistributedShampoo "fully shard" distributor; Shi et al. 2023) cuts dim 0 at the shard boundaries
before blocking (``row_shards`` = W, :func:`shampoo.blocking.layout_param`), so every block lies in
one rank's rows; each rank keeps the statistics, roots, first moments and grafting state of its own
blocks and steps them on its local tensors (``to_local()``) exactly as a single process steps a
parameter. The step's math needs no optimizer collective. Two kinds of small ones keep the ranks
consistent: per param group, the agreement on non-finite gradients and directions
(``consistent_skips``: a parameter non-finite on any rank's shard is skipped on every rank, as one
process skips the whole parameter; without it, the shards' step counts and root schedules would
drift apart), and per step a status word (``status_check``) so that a rank whose roots failed, or
that died or hangs inside the step, stops the others with a clear error within ``timeout`` instead
of leaving them in FSDP's next all-gather.

How the preconditioner differs from single-process blocking: a block never spans rows of two
shards, so a weight of d_0 rows on W ranks has blocks of at most min(max_preconditioner_dim,
ceil(d_0 / W)) rows; the Kronecker factor over those rows sees the rows' correlations within the
shard only (a block-diagonal approximation of the single-process factor with W blocks), and each
block's grafting norm is over its own rows. ``Shampoo(..., row_shards=W)`` reproduces that blocking
on one process (the tests compare the two). Where max_preconditioner_dim divides ceil(d_0 / W) the
blocks are those of single-process blocking.

Checkpoints: ``state_dict()`` is per rank and needs no collective: each parameter's entries with the
blocks of this rank (block indices of the whole parameter's layout, so the ranks' block keys are
disjoint and their union is the single-process state dict with ``row_shards``), its heavy-ball
momentum buffer as a DTensor of the parameter's placement. That is the layout
``torch.distributed.checkpoint`` saves and reshards: saved on W ranks, it loads on W' ranks (or one
process with ``row_shards=W``) wherever the blocking is the same and every block still lies in one
rank's rows: fix the blocking with ``row_shards=W`` (a group option) and load where the new shard
boundaries are block boundaries (always at W' = 1; at W' = 2W when max_preconditioner_dim divides
ceil(d_0 / 2W)); otherwise loading says which block straddles which boundary.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .blocking import MergedDim, ParamLayout, layout_param, row_pieces
from .comm import DistributedError, RemoteRankError, all_gather_flat
from .config import GroupOptions
from .distributed import BlockSharding, CommStats, DDPConfig, _as_timedelta
from .engine import GroupEngine, GroupPlan, state_dtype
from .errors import InvalidShampooArgumentError

logger = logging.getLogger(__name__)

STRATEGIES = ("local_shard", "owner")


class ShardLayoutError(DistributedError, ValueError):
    """A parameter's sharding does not fit the local-shard strategy (a placement other than
    ``Shard(0)``/``Replicate()``, or a block that straddles two ranks' rows)."""


@dataclass(frozen=True, kw_only=True)
class FSDPConfig:
    """Options of Shampoo on ``fully_shard``ed models (``Shampoo(..., distributed=FSDPConfig())``).

    Args:
        strategy: ``"local_shard"`` (default): each rank preconditions blocks of its own shard (see
            :mod:`shampoo.fsdp`; no optimizer traffic but the small agreement words, blocks cut at
            the shard boundaries). ``"owner"``: the blocks of the whole parameters (single-process
            blocking), each one's statistics and roots on one owner rank (LPT over all ranks, as
            :class:`~shampoo.DDPConfig`); per group and step, one all-gather of the gradient rows
            over the shard dim and one of the owned directions, each rank applying its own rows.
        share_roots: under HSDP with ``"local_shard"``, the replicas of a shard split its blocks
            (LPT over the replicate dim of the mesh) and all-gather their directions over it, so
            each block's statistics and roots are computed once per shard instead of once per
            replica (as :class:`~shampoo.DDPConfig` splits them). False: every replica computes
            all of its shard's blocks (no traffic over the replicate dim).
        communication_dtype, cost_model: of the direction all-gathers of ``"owner"`` and of
            ``share_roots``, as in :class:`~shampoo.DDPConfig`.
        status_check: after each step, one all-gather of a status word per rank (W floats): a
            Shampoo error on one rank (e.g. :class:`~shampoo.RootComputationError`) is raised on every
            rank as :class:`~shampoo.comm.RemoteRankError` at the same step, and a rank that died or
            hangs in its step is a :class:`~shampoo.comm.DistributedTimeoutError` after ``timeout``.
            False: no optimizer collective at all; a failing rank then leaves the others waiting
            in FSDP's next collective until the process group's timeout.
        consistent_skips: a parameter whose gradient (or search direction) is non-finite on one
            rank's shard is skipped on every rank, so that its shards keep one step count, one root
            schedule and one update: one all-gather of a flag per parameter of the group before
            the statistics (gradients) and one after the directions (W x (1 + n) floats each, n the
            group's parameters). False: each rank skips its own shard only (no collective; the
            shards of a parameter then drift apart: its rows on one rank stay, the others move,
            and their step counts differ from then on). Under ``"owner"`` the gradient verdicts
            are always agreed (a block's owner reads the rows of every shard).
        process_group: the group of the status word and of the skip agreement; None is the
            default (world) group.
        timeout: bound on the status word's wait (a ``timedelta`` or seconds).
    """

    strategy: str = "local_shard"
    status_check: bool = True
    consistent_skips: bool = True
    share_roots: bool = True
    communication_dtype: torch.dtype | str = torch.float32
    cost_model: str = "roots"
    process_group: Any = None
    timeout: datetime.timedelta | float = field(default_factory=lambda: datetime.timedelta(minutes=10))

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InvalidShampooArgumentError("strategy", self.strategy, f"one of {STRATEGIES}")
        # checked (and normalised) as DDPConfig checks them
        ddp = DDPConfig(communication_dtype=self.communication_dtype, cost_model=self.cost_model)
        object.__setattr__(self, "communication_dtype", ddp.communication_dtype)
        for name in ("status_check", "consistent_skips", "share_roots"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidShampooArgumentError(name, getattr(self, name), "True or False")
        if self.process_group is not None and not isinstance(self.process_group, dist.ProcessGroup):
            raise InvalidShampooArgumentError(
                "process_group", self.process_group, "a torch.distributed.ProcessGroup or None"
            )
        object.__setattr__(self, "timeout", _as_timedelta(self.timeout))


# ----------------------------------------------------------------------------------------------------
# Shards and their layouts


def _dtensor_type() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed support
        return None
    return DTensor


def is_dtensor(t: Any) -> bool:
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


@dataclass(frozen=True)
class ShardInfo:
    """Where a parameter's local rows sit: shard ``index`` of ``count`` along dim 0."""

    index: int
    count: int


def shard_info(p: torch.Tensor, name: Any = None) -> ShardInfo:
    """The row shard of ``p`` this rank holds: ``ShardInfo(0, 1)`` for a plain tensor; for a DTensor,
    its position along the mesh dim placed ``Shard(0)`` (other mesh dims must be ``Replicate()``)."""
    if not is_dtensor(p):
        return ShardInfo(0, 1)
    from torch.distributed.tensor import Replicate, Shard

    mesh, placements = p.device_mesh, p.placements
    shard_dims = [i for i, pl in enumerate(placements) if isinstance(pl, Shard)]
    bad = [pl for pl in placements if not isinstance(pl, Shard | Replicate)]
    if bad or len(shard_dims) > 1 or any(placements[i].dim != 0 for i in shard_dims):
        raise ShardLayoutError(
            f"parameter {name!r} is placed {placements}; Shampoo's local-shard strategy needs rows "
            "sharded over one mesh dim (Shard(0), as fully_shard places them) and Replicate() on the "
            "others (HSDP)"
        )
    if not shard_dims:
        return ShardInfo(0, 1)
    md = shard_dims[0]
    info = ShardInfo(int(mesh.get_local_rank(md)), int(mesh.size(md)))
    pieces = row_pieces(int(p.shape[0]), info.count)
    a, b = pieces[info.index] if info.index < len(pieces) else (0, 0)
    local = p.to_local()
    if local.dim() != p.dim() or int(local.shape[0]) != b - a:
        raise ShardLayoutError(
            f"parameter {name!r}: local shard of shape {tuple(local.shape)} is not rows [{a}, {b}) of "
            f"{tuple(p.shape)} as torch.chunk over {info.count} ranks places them (a custom "
            "shard_placement_fn?); the local-shard strategy needs fully_shard's default row chunks"
        )
    return info


def local_layout(full: ParamLayout, info: ShardInfo) -> ParamLayout:
    """The blocks of ``full`` (a whole parameter's layout) in shard ``info``'s rows, with slices into
    the local tensor's merged view; block indices stay those of ``full``. Raises
    :class:`ShardLayoutError` if a block straddles the shard's boundary."""
    if info.count == 1:
        return full
    d0 = full.shape[0]
    pieces = row_pieces(d0, info.count)
    a, b = pieces[info.index] if info.index < len(pieces) else (0, 0)
    if (a, b) == (0, d0):
        return full
    if a == b:  # this rank holds no rows of the parameter
        return ParamLayout(full.param_index, full.shape, (MergedDim((0,), 0, None),), ())
    m0 = full.merged[0]
    inner = full.merged_shape[0] // d0  # 0 < a < b < d0 here, so dim 0 is merged dim 0's first
    lo, hi = a * inner, b * inner
    blocks = []
    for spec in full.blocks:
        s = spec.slices[0]
        if s.stop <= lo or s.start >= hi:
            continue
        if s.start < lo or s.stop > hi:
            raise ShardLayoutError(
                f"parameter {full.param_index} block {spec.index} spans rows [{s.start // inner}, "
                f"{-(-s.stop // inner)}) of dim 0, across the boundary of shard {info.index} of "
                f"{info.count} (rows [{a}, {b})); with row_shards fixed, every shard boundary must be a "
                "block boundary: use row_shards=None (as sharded) or a world size whose shards split "
                "the saved blocks"
            )
        sl = (slice(s.start - lo, s.stop - lo), *spec.slices[1:])
        blocks.append(dataclasses.replace(spec, slices=sl))
    merged = (dataclasses.replace(m0, size=hi - lo), *full.merged[1:])
    return ParamLayout(full.param_index, full.shape, merged, tuple(blocks))


def _is_shard(placement: Any) -> bool:
    from torch.distributed.tensor import Shard

    return isinstance(placement, Shard)


class GradientGather:
    """The "owner" strategy's whole gradients of one param group, gathered from the shards.

    Each rank sends the rows of every parameter it holds, padded to ceil(d_0 / S) rows (S ranks
    along the shard dim of the mesh, ``torch.chunk`` rows), in one flat buffer; one
    ``all_gather_into_tensor`` over the shard dim's group (bounded by the timeout) moves the
    group's gradients, and the rows are copied into one whole-gradient buffer per parameter (the
    engine's view of the parameter). Parameters that are not sharded pass through.
    """

    def __init__(self, params: Sequence[Any], gather: Callable[..., None]) -> None:
        self._all_gather = gather  # all_gather_flat(out, inp, group, what), timed and bounded
        self.group: Any = None
        self.size = 1
        self.pieces: list[list[tuple[int, int]] | None] = []
        self.offsets: list[int] = []
        self.rows_here: list[tuple[int, int]] = []
        self.full: list[torch.Tensor] = []
        dtypes = set()
        segment = 0
        for i, p in enumerate(params):
            info = shard_info(p, i)
            local = p.to_local() if is_dtensor(p) else p
            self.full.append(
                torch.empty(p.shape, dtype=p.dtype, device=local.device) if info.count > 1 else local
            )
            if info.count == 1:
                self.pieces.append(None)
                self.offsets.append(0)
                self.rows_here.append((0, int(p.shape[0]) if p.dim() else 1))
                continue
            md = next(d for d, pl in enumerate(p.placements) if _is_shard(pl))
            pg = p.device_mesh.get_group(md)
            if self.group is None:
                self.group, self.size = pg, info.count
            elif dist.get_process_group_ranks(pg) != dist.get_process_group_ranks(self.group):
                raise ShardLayoutError(
                    f"parameter {i} of the group is sharded over other ranks than parameter 0's; the "
                    "owner strategy gathers a group's gradients over one shard group (one mesh)"
                )
            d0 = int(p.shape[0])
            pieces = row_pieces(d0, info.count)
            inner = p.numel() // d0 if d0 else 0
            self.pieces.append(pieces)
            self.offsets.append(segment)
            segment += -(-d0 // info.count) * inner
            self.rows_here.append(pieces[info.index] if info.index < len(pieces) else (0, 0))
            dtypes.add(p.dtype)
        self.dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        self.segment = segment
        self._send: torch.Tensor | None = None
        self._recv: torch.Tensor | None = None

    def gather(self, present: list[int], grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """The whole gradients of the ``present`` parameters (``grads``: their local shards)."""
        if self.group is None:
            return grads
        device = self.full[0].device
        if self._send is None:
            self._send = torch.zeros(self.segment, dtype=self.dtype, device=device)
            self._recv = torch.empty(self.size * self.segment, dtype=self.dtype, device=device)
        for i, g in zip(present, grads, strict=True):
            if self.pieces[i] is not None and g.numel():
                self._send[self.offsets[i] : self.offsets[i] + g.numel()].copy_(g.reshape(-1))
        assert self._recv is not None
        self._all_gather(
            self._recv, self._send, self.group,
            "the all-gather of gradient rows (FSDPConfig(strategy='owner'))",
        )  # fmt: skip
        table = self._recv.view(self.size, self.segment)
        out = []
        for i, g in zip(present, grads, strict=True):
            pieces = self.pieces[i]
            if pieces is None:
                out.append(g)
                continue
            full = self.full[i]
            rows = full.view(full.shape[0], -1)
            inner = rows.shape[1]
            for r, (a, b) in enumerate(pieces):
                o = self.offsets[i]
                rows[a:b].copy_(table[r, o : o + (b - a) * inner].view(b - a, inner))
            out.append(full)
        return out

    def rows(self, i: int, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows of parameter ``i``'s whole-shaped tensor ``t`` (a view)."""
        if self.pieces[i] is None:
            return t
        a, b = self.rows_here[i]
        return t[a:b]


# ----------------------------------------------------------------------------------------------------
# The optimizer's side


class FSDPSharding:
    """The local-shard strategy on one rank: local tensors, their layouts, the status word, state."""

    def __init__(self, config: FSDPConfig) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise DistributedError(
                "Shampoo(distributed=FSDPConfig(...)) needs torch.distributed to be initialised (the "
                "model is fully_shard'ed on a device mesh); pass distributed=None for a single process"
            )
        self.config = config
        self.rank = dist.get_rank(config.process_group)
        self.world_size = dist.get_world_size(config.process_group)
        self.device: torch.device | None = None
        self.owner = config.strategy == "owner"
        #: the block assignment and direction all-gather ("owner": over all ranks; share_roots:
        #: over the replicate dim), None where each rank computes all of its blocks
        self.gatherer: BlockSharding | None = None
        self._set_up = False
        self._gathers: dict[int, GradientGather] = {}  # "owner": per param group
        #: time in this strategy's own collectives (agreement, status word, gradient rows); the
        #: direction all-gather's is ``gatherer.comm`` (:meth:`comm_seconds` adds them)
        self.comm = CommStats()

    def comm_seconds(self) -> float:
        """Cumulative seconds in every optimizer collective of this rank (waits included)."""
        return self.comm.seconds + (self.gatherer.comm.seconds if self.gatherer is not None else 0.0)

    def _gather(self, out: torch.Tensor, inp: torch.Tensor, group: Any, what: str) -> None:
        t0 = time.perf_counter()
        all_gather_flat(out, inp, group, self.config.timeout, what)  # type: ignore[arg-type]
        self.comm.seconds += time.perf_counter() - t0
        self.comm.calls += 1
        self.comm.bytes_sent += inp.numel() * inp.element_size()

    def _ddp(self, group: Any) -> DDPConfig:
        c = self.config
        return DDPConfig(
            communication_dtype=c.communication_dtype,
            cost_model=c.cost_model,
            process_group=group,
            timeout=c.timeout,
        )

    def setup(self, param_groups: Sequence[dict[str, Any]]) -> None:
        """Decide, once (at the first engine), who computes which block: "owner" assigns every block
        of the whole parameters over ``process_group``; ``share_roots`` under HSDP assigns the local
        blocks over the mesh's replicate dim (the same for every parameter, else refused)."""
        if self._set_up:
            return
        self._set_up = True
        if self.owner:
            self.gatherer = BlockSharding(self._ddp(self.config.process_group))
            return
        if not self.config.share_roots:
            return
        groups = {}
        for p in (p for g in param_groups for p in g["params"] if is_dtensor(p)):
            rep = [
                d for d, pl in enumerate(p.placements) if not _is_shard(pl) and int(p.device_mesh.size(d)) > 1
            ]
            if len(rep) > 1:
                raise ShardLayoutError(
                    f"a parameter is replicated over {len(rep)} mesh dims ({p.placements}); "
                    "share_roots needs one replicate dim: pass FSDPConfig(share_roots=False)"
                )
            pg = p.device_mesh.get_group(rep[0]) if rep else None
            groups[tuple(dist.get_process_group_ranks(pg)) if pg is not None else None] = pg
        if len(groups) > 1:
            raise ShardLayoutError(
                f"the parameters are replicated over different rank sets ({sorted(map(str, groups))}); "
                "share_roots needs one replicate group for all: pass FSDPConfig(share_roots=False)"
            )
        pg = next(iter(groups.values()), None)
        if pg is not None:
            self.gatherer = BlockSharding(self._ddp(pg), layouts=self.all_layouts)

    def all_layouts(self, param_groups: Sequence[dict[str, Any]]) -> list[Any]:
        """Every block of this rank's shards of the param groups (what the replicas share)."""
        specs: list[Any] = []
        index = 0
        for g in param_groups:
            params = list(g["params"])
            for lay in self.layouts(params, index, GroupOptions.from_group(g)):
                specs.extend(lay.blocks)
            index += len(params)
        return specs

    # -- the engine's tensors ("owner": the whole parameters' gradients and directions) -------------

    def engine_tensors(self, gi: int, params: Sequence[Any]) -> list[Any]:
        """What group ``gi``'s engine steps: the local shards, or under "owner" the whole
        gradients (the gathered buffers of :class:`GradientGather`)."""
        if not self.owner:
            return self.local(params)
        gather = self._gathers[gi] = GradientGather(params, self._gather)
        return list(gather.full)

    def localise(self, eng: GroupEngine, params: Sequence[Any]) -> None:
        """Under "owner", the momentum buffers hold this rank's rows only (the update is applied
        to the local shard; the blocks' state stays on their owners)."""
        if not self.owner:
            return
        for st, p in zip(eng.states, self.local(params), strict=True):
            if st.momentum_buffer is not None:
                st.momentum_buffer = torch.zeros_like(
                    p, dtype=state_dtype(p.dtype), memory_format=torch.contiguous_format
                )

    def engine_grads(self, gi: int, present: list[int], grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """The gradients the engine takes: the local ones, or under "owner" the whole gradients
        (one all-gather over the shard dim per group and step)."""
        return self._gathers[gi].gather(present, grads) if self.owner else grads

    def assemble(
        self, plan: GroupPlan, present: list[int], outputs: Sequence[Any], count: int
    ) -> list[torch.Tensor]:
        """The directions of the present parameters, all-gathered by :attr:`gatherer` (whole ones
        under "owner", the local shard's under ``share_roots``); another rank's failure raises
        :class:`RemoteRankError` here after this rank took its part in the skip agreement."""
        assert self.gatherer is not None
        try:
            return self.gatherer.assemble(plan, present, outputs)
        except RemoteRankError as err:
            if not self.owner:
                self.agree([], [], count, "search directions", error=err)
            raise

    def local_rows(self, gi: int, present: list[int], dirs: list[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's rows of each direction (views): under "owner" the whole directions' rows,
        otherwise the directions as they are."""
        if not self.owner:
            return dirs
        gather = self._gathers[gi]
        return [gather.rows(i, d) for i, d in zip(present, dirs, strict=True)]

    def failed(self, plan: GroupPlan, count: int, err: BaseException) -> None:
        """This rank's directions failed (``err``, re-raised by the caller): take part in the
        collectives the other ranks wait in (the direction all-gather, the skip agreement)."""
        if self.gatherer is not None:
            self.gatherer.report_failure(plan, err)
        if not self.owner:
            self.agree([], [], count, "search directions", error=err)

    @staticmethod
    def local(tensors: Sequence[Any]) -> list[Any]:
        """Each tensor's local shard (``to_local()``, sharing its storage), plain tensors as they are."""
        return [t.to_local() if is_dtensor(t) else t for t in tensors]

    def layouts(
        self, params: Sequence[torch.Tensor], first_index: int, opts: GroupOptions
    ) -> list[ParamLayout]:
        """The local layouts of a group's parameters: each whole parameter laid out with
        ``row_shards`` = the group's, or its shard count when None, then restricted to this rank's
        rows; under ``"owner"`` the whole parameters' layouts (``row_shards`` the group's, or 1)."""
        out = []
        for i, p in enumerate(params):
            info = shard_info(p, first_index + i)
            full = layout_param(
                first_index + i,
                tuple(p.shape),
                max_preconditioner_dim=opts.max_preconditioner_dim,
                merge_dims_=opts.merge_dims,
                exponent_override=opts.exponent_override,
                vector_policy=opts.vector_policy,
                row_shards=opts.row_shards or (1 if self.owner else info.count),
            )
            out.append(full if self.owner else local_layout(full, info))
            if self.device is None:
                self.device = p.device
        return out

    # -- the status word ---------------------------------------------------------------------------

    def status(self, error: BaseException | None = None) -> None:
        """One all-gather of every rank's status after a step (or its failure ``error``, which the
        caller re-raises): a failure elsewhere raises :class:`RemoteRankError` here."""
        if not self.config.status_check or self.world_size == 1:
            return
        device = self.device or torch.device("cpu")
        inp = torch.tensor([0.0 if error is None else 1.0], device=device)
        out = torch.empty(self.world_size, device=device)
        if error is not None:
            logger.error("shampoo fsdp: rank %d failed: %s", self.rank, error)
        self._gather(
            out, inp, self.config.process_group,
            "the status word of the Shampoo step (FSDPConfig.status_check)",
        )  # fmt: skip
        failed = [r for r, s in enumerate(out.tolist()) if s != 0.0 and r != self.rank]
        if failed and error is None:  # a failed rank re-raises its own error
            raise RemoteRankError(
                f"rank(s) {failed} failed in the Shampoo step (see their log for the error); every rank "
                "stops at the same step"
            )

    # -- agreement on skipped parameters ------------------------------------------------------------

    def agree(
        self, present: Sequence[int], finite: Sequence[bool], count: int, what: str,
        error: BaseException | None = None,
    ) -> list[bool]:  # fmt: skip
        """Per present parameter, whether it is finite on *every* rank (``consistent_skips``).

        ``present``: local indices (of ``count`` in the group) of the parameters stepped here and
        ``finite`` their local verdicts. One all-gather of ``[status, bad_0, ..., bad_{count-1}]``
        per rank: a parameter is skipped everywhere when any rank's shard of it is non-finite.
        ``error``: this rank failed before reaching its verdicts (a Shampoo error, re-raised by the
        caller); it still takes part, and every other rank raises :class:`RemoteRankError` here.
        """
        if self.world_size == 1 or not (self.config.consistent_skips or self.owner):
            return list(finite)  # "owner" always agrees: the owners read every shard's rows
        device = self.device or torch.device("cpu")
        inp = torch.zeros(1 + count, device=device)
        if error is not None:
            inp[0] = 1.0
        else:
            bad = [i for i, ok in zip(present, finite, strict=True) if not ok]
            if bad:
                inp[1 + torch.tensor(bad, device=device)] = 1.0
        out = torch.empty(self.world_size * (1 + count), device=device)
        self._gather(
            out, inp, self.config.process_group,
            f"the agreement on non-finite {what} (FSDPConfig.consistent_skips)",
        )  # fmt: skip
        table = out.view(self.world_size, 1 + count)
        failed = [r for r, s in enumerate(table[:, 0].tolist()) if s != 0.0 and r != self.rank]
        if error is not None:
            return []
        if failed:
            raise RemoteRankError(
                f"rank(s) {failed} failed in the Shampoo step (see their log for the error); every rank "
                "stops at the same step"
            )
        anybad = table[:, 1:].amax(dim=0).tolist()
        return [anybad[i] == 0.0 for i in present]

    def dump_directory(self, directory: Any) -> Path:
        """Where this rank dumps its factors: ``directory/rank<r>`` (ranks hold different blocks)."""
        return Path(directory) / f"rank{self.rank}"

    # -- state -------------------------------------------------------------------------------------

    @staticmethod
    def export_state(
        state: dict[Any, dict[str, Any]],
        param_groups: Sequence[dict[str, Any]],
        keys: Sequence[Sequence[Any]],
    ) -> dict[Any, dict[str, Any]]:
        """This rank's state in the layout of ``torch.distributed.checkpoint``: the momentum buffer
        (the parameter's local shape) as a DTensor placed like its parameter; the blocks as they are
        (this rank's, keyed by their index in the whole parameter)."""
        from torch.distributed.tensor import DTensor

        params = {
            k: p
            for g, ks in zip(param_groups, keys, strict=True)
            for k, p in zip(ks, g["params"], strict=True)
        }
        out = {}
        for key, flat in state.items():
            p = params.get(key)
            mom = flat.get("momentum_buffer")
            if mom is not None and is_dtensor(p):
                flat = dict(flat)
                flat["momentum_buffer"] = DTensor.from_local(
                    mom, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
                )
            out[key] = flat
        return out

    @staticmethod
    def import_state(state_dict: dict[str, Any]) -> dict[str, Any]:
        """A state dict with every DTensor replaced by this rank's local shard (what the engine's
        local state is restored from); anything else as it is."""
        state = state_dict.get("state")
        if not isinstance(state, dict):
            return state_dict
        local = {
            k: (
                {n: (v.to_local() if is_dtensor(v) else v) for n, v in d.items()}
                if isinstance(d, dict)
                else d
            )
            for k, d in state.items()
        }
        return {**state_dict, "state": local}


__all__ = [
    "STRATEGIES",
    "FSDPConfig",
    "FSDPSharding",
    "GradientGather",
    "ShardInfo",
    "ShardLayoutError",
    "is_dtensor",
    "local_layout",
    "shard_info",
]
