"""Distributed Shampoo: which rank computes which block, and the all-gather of search directions.

Data-parallel Shampoo (Shi et al. 2023, "A Distributed Data-Parallel PyTorch Implementation of the
Distributed Shampoo Optimizer", §3.3 and Alg. 3) computes every block's statistics, inverse roots and
preconditioned direction on *one* rank only, the block's owner, and shares the directions with one
all-gather. Every rank then applies the same update, so parameters stay replicated as with
``DistributedDataParallel``.

This module holds the three pieces that are about distribution and nothing else:

* :class:`DDPConfig`: the options (communication dtype, cost model, process group, timeout);
* :func:`assign_blocks`: a greedy longest-processing-time (LPT) assignment of blocks to ranks by an
  estimated cost (Graham 1969: at most 4/3 - 1/(3m) times the optimal makespan). It is a pure function
  of the block layout, so it is identical on every rank without communication;
* :class:`~shampoo.comm.DirectionExchange` (in :mod:`shampoo.comm`): the coalesced all-gather. Each
  rank writes the directions of the blocks it owns into one buffer in the communication dtype, padded
  to the largest rank's size, and a single ``all_gather_into_tensor`` call per param group and step
  moves them all. A status word per rank travels in the same buffer so a numerical failure on one
  rank (:class:`~shampoo.errors.ShampooError`) is raised on every rank instead of leaving the others
  waiting.

The preconditioner math lives elsewhere; the optimizer asks this module who owns a block and hands it
the owned directions.

What each rank holds: the statistics, roots, first moments and grafting state of its own blocks
(about 1/world of the total), plus the replicated per-parameter parts (heavy-ball momentum buffers,
the direction workspace) and the exchange buffers ((1 + world) x the largest rank's segment).
``opt.diagnostics()`` and factor dumps cover the owned blocks only (dumps go to ``dump_dir/rank<r>``).
``opt.state_dict()`` is collective: it merges every rank's blocks into the single-process form.

FSDP2 (``fully_shard``ed models) is :mod:`shampoo.fsdp` (``FSDPConfig``): each rank preconditions
blocks of its own rows there, without this module's assignment or exchange.
"""

from __future__ import annotations

import datetime
import heapq
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .blocking import BlockKind, BlockSpec
from .comm import (
    DirectionExchange,
    DistributedError,
    DistributedTimeoutError,
    RemoteRankError,
    check_all_ranks,
)
from .config import GroupOptions
from .engine import GroupPlan, PlannedBlock, layout_group
from .errors import InvalidShampooArgumentError
from .state import ParamState, merge_shards

logger = logging.getLogger(__name__)

COMM_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
COST_MODELS = ("roots", "memory")


# ----------------------------------------------------------------------------------------------------
# Config


def _as_timedelta(value: Any) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        td = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        td = datetime.timedelta(seconds=float(value))
    else:
        raise InvalidShampooArgumentError("timeout", value, "a datetime.timedelta or seconds")
    if td.total_seconds() <= 0:
        raise InvalidShampooArgumentError("timeout", value, "positive")
    return td


@dataclass(frozen=True, kw_only=True)
class DDPConfig:
    """Options of data-parallel Shampoo (passed as ``Shampoo(..., distributed=DDPConfig(...))``).

    Args:
        communication_dtype: dtype of the all-gathered search directions: ``torch.float32``,
            ``torch.bfloat16`` or ``torch.float16`` (or "fp32", "bf16", "fp16"). bf16/fp16 halve the
            traffic at the price of rounding each direction to that format (unit roundoff 3.9e-3 /
            4.9e-4) before it is applied; every rank applies the same rounded update. fp16 overflows
            past 65504: fine for grafted directions (O(1) entries); an overflowed parameter's update
            is skipped with a counted warning, identically on every rank.
        cost_model: how a block's cost is estimated for load balancing. ``"roots"``: sum of n^3 over
            its Kronecker factors (the inverse-root work); ``"memory"``: sum of n^2 over its factors
            (the factor and root storage). Both add the block's element count so that blocks without
            factors (diagonal, graft-only) are spread too.
        process_group: the group whose ranks share the work; None is the default (world) group.
        timeout: bound on each collective's wait (a ``timedelta`` or seconds). A rank that dies or
            hangs makes the others raise :class:`DistributedTimeoutError` after this long instead of
            waiting forever. Keep it below the process group's own timeout to get the clear error.
    """

    communication_dtype: torch.dtype | str = torch.float32
    cost_model: str = "roots"
    process_group: Any = None
    timeout: datetime.timedelta | float = field(default_factory=lambda: datetime.timedelta(minutes=10))

    def __post_init__(self) -> None:
        dt = self.communication_dtype
        if isinstance(dt, str):
            if dt.lower() not in COMM_DTYPES:
                raise InvalidShampooArgumentError("communication_dtype", dt, "one of fp32/bf16/fp16")
            dt = COMM_DTYPES[dt.lower()]
        if dt not in (torch.float32, torch.bfloat16, torch.float16):
            raise InvalidShampooArgumentError("communication_dtype", dt, "torch.float32/bfloat16/float16")
        object.__setattr__(self, "communication_dtype", dt)
        if self.cost_model not in COST_MODELS:
            raise InvalidShampooArgumentError("cost_model", self.cost_model, f"one of {COST_MODELS}")
        if self.process_group is not None and not isinstance(self.process_group, dist.ProcessGroup):
            raise InvalidShampooArgumentError(
                "process_group", self.process_group, "a torch.distributed.ProcessGroup or None"
            )
        object.__setattr__(self, "timeout", _as_timedelta(self.timeout))

    def world(self) -> tuple[int, int]:
        """(rank, world size) in the configured group; raises if torch.distributed is not initialised."""
        if not (dist.is_available() and dist.is_initialized()):
            raise DistributedError(
                "Shampoo(distributed=DDPConfig(...)) needs torch.distributed to be initialised: call "
                "torch.distributed.init_process_group(...) first (torchrun sets the environment), or pass "
                "distributed=None for a single process"
            )
        return dist.get_rank(self.process_group), dist.get_world_size(self.process_group)


# ----------------------------------------------------------------------------------------------------
# Assignment of blocks to ranks


BlockKey = tuple[int, int]  # (param_index, block index)


def block_key(spec: BlockSpec) -> BlockKey:
    return (spec.param_index, spec.index)


def block_cost(spec: BlockSpec, cost_model: str = "roots") -> float:
    """Estimated cost of a block under ``cost_model`` (see :class:`DDPConfig`)."""
    if cost_model not in COST_MODELS:
        raise InvalidShampooArgumentError("cost_model", cost_model, f"one of {COST_MODELS}")
    power = 3 if cost_model == "roots" else 2
    factors = spec.factor_dims if spec.kind is BlockKind.SHAMPOO else ()
    return float(sum(spec.shape[i] ** power for i in factors) + spec.numel)


def lpt_assign(
    costs: Sequence[float], world_size: int, initial_loads: Sequence[float] | None = None
) -> tuple[int, ...]:
    """Greedy longest-processing-time assignment: the owner rank of each item.

    Items are taken in decreasing cost (ties by position) and each goes to the currently least-loaded
    rank (ties by lowest rank), starting from ``initial_loads`` (default zero). Deterministic: the
    same costs give the same owners on every rank.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads0 = [0.0] * world_size if initial_loads is None else [float(x) for x in initial_loads]
    if len(loads0) != world_size:
        raise ValueError(f"initial_loads has {len(loads0)} entries for world size {world_size}")
    owners = [0] * len(costs)
    heap = [(loads0[r], r) for r in range(world_size)]
    heapq.heapify(heap)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, r = heapq.heappop(heap)
        owners[i] = r
        heapq.heappush(heap, (load + float(costs[i]), r))
    return tuple(owners)


@dataclass(frozen=True)
class BlockAssignment:
    """Owner rank of every block, with the per-rank load it implies."""

    world_size: int
    owners: dict[BlockKey, int]
    loads: tuple[float, ...]

    def owner(self, spec: BlockSpec) -> int:
        return self.owners[block_key(spec)]

    def owned_by(self, rank: int) -> list[BlockKey]:
        """Keys owned by ``rank`` in canonical (param, block) order."""
        return sorted(k for k, r in self.owners.items() if r == rank)

    @property
    def imbalance(self) -> float:
        """max / mean load over ranks (1.0 is perfect balance)."""
        mean = sum(self.loads) / len(self.loads)
        return max(self.loads) / mean if mean > 0 else 1.0


def assign_blocks(
    specs: Sequence[BlockSpec],
    world_size: int,
    cost_model: str = "roots",
    previous: BlockAssignment | None = None,
) -> BlockAssignment:
    """Assign ``specs`` to ``world_size`` ranks by :func:`lpt_assign` on :func:`block_cost`.

    The specs are put in canonical (param_index, index) order first, so the result does not depend on
    the order they are passed in. With ``previous``, blocks it already assigns keep their owner and the
    new ones are spread from its loads on (for param groups added after the first step).
    """
    prev_owners = dict(previous.owners) if previous is not None else {}
    loads = list(previous.loads) if previous is not None else [0.0] * world_size
    if previous is not None and previous.world_size != world_size:
        raise ValueError(f"previous assignment is for {previous.world_size} ranks, not {world_size}")
    ordered = sorted((s for s in specs if block_key(s) not in prev_owners), key=block_key)
    keys = [block_key(s) for s in ordered]
    if len(set(keys)) != len(keys):
        raise ValueError("assign_blocks: duplicate (param_index, block index) keys")
    costs = [block_cost(s, cost_model) for s in ordered]
    owners = lpt_assign(costs, world_size, loads)
    for c, r in zip(costs, owners, strict=True):
        loads[r] += c
    return BlockAssignment(world_size, {**prev_owners, **dict(zip(keys, owners, strict=True))}, tuple(loads))


# ----------------------------------------------------------------------------------------------------
# The optimizer's side: ownership, assembly of directions, state


def layout_groups(param_groups: Sequence[dict[str, Any]]) -> list[BlockSpec]:
    """Every block of every parameter of ``param_groups``, laid out by the engine's own
    :func:`~shampoo.engine.layout_group` (param_index is the parameter's global position)."""
    specs: list[BlockSpec] = []
    index = 0
    for group in param_groups:
        params = list(group["params"])
        for lay in layout_group(params, index, GroupOptions.from_group(group)):
            specs.extend(lay.blocks)
        index += len(params)
    return specs


@dataclass
class CommStats:
    """Cumulative cost of the direction all-gathers on this rank."""

    calls: int = 0
    seconds: float = 0.0
    bytes_sent: int = 0

    def reset(self) -> None:
        self.calls, self.seconds, self.bytes_sent = 0, 0.0, 0


_Plan = tuple[list[list[PlannedBlock]], DirectionExchange, dict[tuple[int, int], int]]


class BlockSharding:
    """Data-parallel Shampoo's state on one rank: the assignment, one exchange plan per param group.

    The optimizer calls :meth:`owns` while it builds its per-group state (only owned blocks get
    statistics, roots and buckets), :meth:`assemble` where the search directions of a group meet,
    :meth:`report_failure` when computing its owned directions raised a Shampoo error, and
    :meth:`gather_state` in ``state_dict``.
    """

    def __init__(
        self,
        config: DDPConfig,
        layouts: Callable[[Sequence[dict[str, Any]]], list[BlockSpec]] = layout_groups,
    ) -> None:
        """``layouts``: every block of the param groups, as the engines lay them out (default: the
        whole parameters, :func:`layout_groups`; HSDP's replicas share the local shards' blocks,
        :mod:`shampoo.fsdp`)."""
        self.config = config
        self._layouts = layouts
        self.rank, self.world_size = config.world()
        self.assignment: BlockAssignment | None = None
        self.device: torch.device | None = None  # of the parameters (for collectives outside a step)
        self._plans: dict[int, tuple[GroupPlan, _Plan]] = {}
        self.comm = CommStats()
        logger.info(
            "shampoo distributed: rank %d of %d, communication %s, cost model %s",
            self.rank, self.world_size, config.communication_dtype, config.cost_model,
        )  # fmt: skip

    # -- ownership ---------------------------------------------------------------------------------

    def owns(self, spec: BlockSpec, param_groups: Sequence[dict[str, Any]]) -> bool:
        """Whether this rank computes ``spec``. The first call assigns every block of every group;
        blocks of groups added later are assigned on top of it."""
        key = block_key(spec)
        if self.device is None:
            self.device = next((p.device for g in param_groups for p in g["params"]), None)
        if self.assignment is None or key not in self.assignment.owners:
            self.assignment = assign_blocks(
                self._layouts(param_groups), self.world_size, self.config.cost_model, self.assignment
            )
            logger.info(
                "shampoo distributed: %d blocks over %d ranks, load max/mean %.3f",
                len(self.assignment.owners), self.world_size, self.assignment.imbalance,
            )  # fmt: skip
        return self.assignment.owners[key] == self.rank

    def _plan(self, group: GroupPlan) -> _Plan:
        """Per rank, the blocks it owns in a group; the exchange; and the position of each of this
        rank's (local param, block index) pairs in its send list."""
        cached = self._plans.get(id(group))
        if cached is not None and cached[0] is group:
            return cached[1]
        assert self.assignment is not None
        entries: list[list[PlannedBlock]] = [[] for _ in range(self.world_size)]
        for pb in group.blocks:
            entries[self.assignment.owner(pb.spec)].append(pb)
        exchange = DirectionExchange(
            [[pb.spec.numel for pb in per] for per in entries],
            self.rank,
            dtype=self.config.communication_dtype,  # type: ignore[arg-type]
            group=self.config.process_group,
            timeout=self.config.timeout,  # type: ignore[arg-type]
        )
        slot = {(pb.param, pb.spec.index): e for e, pb in enumerate(entries[self.rank])}
        plan = (entries, exchange, slot)
        self._plans[id(group)] = (group, plan)
        return plan

    # -- directions --------------------------------------------------------------------------------

    def assemble(self, group: GroupPlan, present: list[int], outputs: Sequence[Any]) -> list[torch.Tensor]:
        """All-gather the owned blocks' directions of one group (one collective) and write every
        block's direction into its parameter's direction tensor, in the parameter's dtype.

        ``outputs``: the :class:`~shampoo.engine.BucketDirections` (bucket index, positions, stacked
        directions D, per-block scale s, norms) of every owned bucket, as returned by the engine's
        ``block_directions`` (block j's direction is s_j D_j,
        and ``group.buckets[bi][j]`` says which block it is); s_j D_j is written straight into the
        send buffer. Blocks of parameters without a
        gradient this step are sent as zeros and not written.
        """
        entries, exchange, slot = self._plan(group)
        device = group.device
        send = exchange.send_views(device)
        filled = [False] * len(send)
        for bi, positions, D, scale, _norms in outputs:
            blocks = group.buckets[bi]
            sc = scale.to(D.dtype) if isinstance(scale, torch.Tensor) else scale
            for k, j in enumerate(positions):
                e = slot[(blocks[j].param, blocks[j].spec.index)]
                out = send[e].view(D.shape[1:])
                if isinstance(sc, torch.Tensor):
                    torch.mul(D[k], sc[k], out=out)
                elif sc != 1.0:
                    torch.mul(D[k], sc, out=out)
                else:
                    out.copy_(D[k])
                filled[e] = True
        for e, done in enumerate(filled):
            if not done:  # a parameter without a gradient this step
                send[e].zero_()
        t0 = time.perf_counter()
        gathered = exchange.exchange(device)
        self.comm.seconds += time.perf_counter() - t0
        self.comm.calls += 1
        self.comm.bytes_sent += exchange.bytes_per_rank
        views = group.direction_views(present)
        for per_rank, flats in zip(entries, gathered, strict=True):
            for pb, flat in zip(per_rank, flats, strict=True):
                view = views.get(pb.param)
                if view is not None:
                    view[pb.spec.slices].copy_(flat.view(pb.spec.shape))
        return [group.directions[i] for i in present]

    def report_failure(self, group: GroupPlan, err: BaseException) -> None:
        """This rank could not compute its directions of a group (``err``, a Shampoo error): take
        part in the group's collective with a failure status so every other rank raises
        :class:`RemoteRankError` at the same step instead of waiting. The caller re-raises ``err``."""
        _, exchange, _ = self._plan(group)
        logger.error("shampoo distributed: rank %d failed: %s", self.rank, err)
        exchange.exchange(group.device, error=f"{type(err).__name__}: {err}")

    def dump_directory(self, directory: Any) -> Path:
        """Where this rank dumps its factors: ``directory/rank<r>`` (ranks own different blocks)."""
        return Path(directory) / f"rank{self.rank}"

    # -- state -------------------------------------------------------------------------------------

    def gather_state(self, state: dict[Any, dict[str, Any]]) -> dict[Any, dict[str, Any]]:
        """The rank-independent optimizer state: every rank's owned blocks merged (collective).

        Each rank's ``flatten``ed state holds the replicated entries (step, momentum) and its owned
        blocks; :func:`shampoo.state.merge_shards` takes the union of the blocks by block index,
        which is the single-process state dict and loads on any number of ranks.
        """
        if self.world_size == 1:
            return state
        device = next(
            (v.device for d in state.values() for v in d.values() if isinstance(v, torch.Tensor)), self.device
        )
        check_all_ranks(
            "state_dict() (collective under distributed Shampoo: call it on every rank, then save on one)",
            device,
            self.config.process_group,
            self.config.timeout,  # type: ignore[arg-type]
        )
        cpu = {
            k: {n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in d.items()}
            for k, d in state.items()
        }
        shards: list[Any] = [None] * self.world_size
        dist.all_gather_object(shards, cpu, group=self.config.process_group)
        merged: dict[Any, dict[str, Any]] = {}
        keys = list(state) + [k for shard in shards for k in shard if k not in state]
        for key in dict.fromkeys(keys):
            mine = state.get(key)
            parts = [mine] if mine is not None else []
            parts += [shard[key] for r, shard in enumerate(shards) if r != self.rank and key in shard]
            dev = next((v.device for v in parts[0].values() if isinstance(v, torch.Tensor)), None)
            merged[key] = merge_shards(parts, dev if mine is not None else None)
        return merged


def state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of optimizer state held by this process, split into ``blocks`` (factor statistics, roots,
    first moments, grafting and diagonal state, transform state of the owned blocks) and ``replicated`` (per-parameter
    momentum buffers)."""
    blocks = replicated = 0
    for st in optimizer.state.values():
        if not isinstance(st, ParamState):  # another optimizer's state: nothing of Shampoo's
            continue
        for b in st.blocks:
            if not b.owned:
                continue
            for t in (b.first_moment, b.graft_state, b.diagonal):
                if t is not None:
                    blocks += t.numel() * t.element_size()
            for f in b.factors:
                for t in (f.matrix, f.root):
                    if t is not None:
                        blocks += t.numel() * t.element_size()
            for t in b.tensors.values():  # transform state (e.g. SOAP's eigenbases and second moments)
                blocks += t.numel() * t.element_size()
        mom = st.momentum_buffer
        if mom is not None:
            replicated += mom.numel() * mom.element_size()
    return {"blocks": blocks, "replicated": replicated, "total": blocks + replicated}


__all__ = [
    "COST_MODELS",
    "BlockAssignment",
    "BlockSharding",
    "CommStats",
    "DDPConfig",
    "DirectionExchange",
    "DistributedError",
    "DistributedTimeoutError",
    "RemoteRankError",
    "assign_blocks",
    "block_cost",
    "block_key",
    "layout_groups",
    "lpt_assign",
    "state_bytes",
]
