"""The coalesced all-gather of Shampoo search directions, and the errors of distributed Shampoo.

:class:`DirectionExchange` is a static plan built once per param group: each rank flattens the
directions of the blocks it owns into one persistent buffer in the communication dtype, padded to the
largest rank's size, and a single ``all_gather_into_tensor`` moves them all (Shi et al. 2023, §3.3).
A status word per rank travels in the same buffer, so a numerical failure on one rank is raised on
every rank instead of leaving the others waiting, and every wait is bounded by a timeout.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from .errors import ShampooError

# Status word carried in front of each rank's segment of the gathered buffer.
_STATUS_OK = 0.0
_STATUS_FAILED = 1.0


class DistributedError(ShampooError):
    """A collective of distributed Shampoo failed, timed out, or a rank reported an error."""


class DistributedTimeoutError(DistributedError, TimeoutError):
    """A collective did not complete within ``DDPConfig.timeout``: another rank failed or is stuck."""


class RemoteRankError(DistributedError):
    """Another rank raised a Shampoo error while computing the search directions of its blocks."""


# ----------------------------------------------------------------------------------------------------
# Coalesced all-gather of search directions


def all_gather_flat(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Any,
    timeout: datetime.timedelta,
    what: str = "the all-gather of Shampoo search directions",
) -> None:
    """One all-gather of equal-size flat buffers, waited on with a bound; typed errors."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    try:
        work = fn(out, inp, group=group, async_op=True)
        work.wait(timeout=timeout)
    except RuntimeError as err:  # torch.distributed reports timeouts and lost peers as RuntimeError
        rank = dist.get_rank(group)
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "timed out" in msg.lower() or "timeout" in msg.lower():
            raise DistributedTimeoutError(
                f"rank {rank}: {what} did not complete within {timeout.total_seconds():g} s; another "
                f"rank has probably failed or is stuck (check its log). Backend said: {msg}"
            ) from err
        raise DistributedError(
            f"rank {rank}: {what} failed; another rank has probably crashed (check its log). "
            f"Backend said: {msg}"
        ) from err


def check_all_ranks(what: str, device: torch.device, group: Any, timeout: datetime.timedelta) -> None:
    """A bounded rendezvous before a collective that has no timeout of its own (``all_gather_object``):
    raises :class:`DistributedTimeoutError` naming ``what`` if not every rank reaches it in time."""
    if dist.get_world_size(group) == 1:
        return
    inp = torch.ones(1, device=device)
    out = torch.empty(dist.get_world_size(group), device=device)
    all_gather_flat(out, inp, group, timeout, what)


class DirectionExchange:
    """A static plan for the all-gather of search directions, built once per layout.

    Args:
        numels: for each rank, the element counts of the blocks it owns, in the order it will pass
            their directions (the same order on every rank).
        rank: this process's rank in ``group``.
        dtype: communication dtype.
        group: process group (None: default group).
        timeout: bound on the wait of the collective.

    Rank r's segment of the buffer is ``[status, d_1.flatten(), d_2.flatten(), ..., padding]``; all
    segments have the size of the largest one.
    """

    def __init__(
        self,
        numels: Sequence[Sequence[int]],
        rank: int,
        *,
        dtype: torch.dtype = torch.float32,
        group: Any = None,
        timeout: datetime.timedelta = datetime.timedelta(minutes=10),
    ) -> None:
        self.numels = [list(map(int, n)) for n in numels]
        self.world_size = len(self.numels)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        self.rank = rank
        self.dtype = dtype
        self.group = group
        self.timeout = timeout
        self.segment = 1 + max((sum(n) for n in self.numels), default=0)
        self._send: torch.Tensor | None = None
        self._recv: torch.Tensor | None = None
        self._offsets = []
        for ns in self.numels:
            offs, o = [], 1
            for n in ns:
                offs.append(o)
                o += n
            self._offsets.append(offs)

    @property
    def bytes_per_rank(self) -> int:
        """Bytes each rank sends (its padded segment)."""
        return self.segment * torch.empty((), dtype=self.dtype).element_size()

    def _buffers(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The persistent send and receive buffers on ``device`` (allocated once, zero padding)."""
        if self._send is None or self._send.device != device:
            self._send = torch.zeros(self.segment, dtype=self.dtype, device=device)
            self._recv = (
                self._send
                if self.world_size == 1
                else torch.zeros(self.world_size * self.segment, dtype=self.dtype, device=device)
            )
        assert self._recv is not None
        return self._send, self._recv

    def send_views(self, device: torch.device) -> list[torch.Tensor]:
        """Flat views of this rank's owned blocks in the send buffer, to be written in place before
        :meth:`exchange` (saves a copy over :meth:`gather`)."""
        send, _ = self._buffers(device)
        return [
            send[o : o + n] for n, o in zip(self.numels[self.rank], self._offsets[self.rank], strict=True)
        ]

    def gather(
        self,
        local: Sequence[torch.Tensor | None],
        device: torch.device | None = None,
        *,
        error: str | None = None,
    ) -> list[list[torch.Tensor]]:
        """All-gather: ``local`` are this rank's owned directions (None: zeros); returns, per rank,
        its directions as flat tensors in the communication dtype (views into the receive buffer,
        valid until the next exchange).

        Every rank, the sender included, gets its directions back from the buffer, so with a narrow
        communication dtype all ranks see the same rounded values. ``error``: this rank failed to
        compute its directions (a message); it still takes part in the collective, then every rank
        raises :class:`RemoteRankError` (the failing rank re-raises its own error after this call).
        """
        if device is None:
            device = next((t.device for t in local if t is not None), torch.device("cpu"))
        if error is None:
            views = self.send_views(device)
            if len(local) != len(views):
                raise ValueError(f"rank {self.rank}: expected {len(views)} directions, got {len(local)}")
            for t, v in zip(local, views, strict=True):
                if t is None:
                    v.zero_()
                elif t.numel() != v.numel():
                    raise ValueError(
                        f"rank {self.rank}: a direction has {t.numel()} elements, expected {v.numel()}"
                    )
                else:
                    v.copy_(t.reshape(-1))
        return self.exchange(device, error=error)

    def exchange(self, device: torch.device, *, error: str | None = None) -> list[list[torch.Tensor]]:
        """The collective on the send buffer as filled through :meth:`send_views`; see :meth:`gather`."""
        send, recv = self._buffers(device)
        send[0] = _STATUS_FAILED if error is not None else _STATUS_OK
        if self.world_size > 1:
            all_gather_flat(recv, send, self.group, self.timeout)
        table = recv.view(self.world_size, self.segment)
        status = table[:, 0].tolist()
        failed = [r for r in range(self.world_size) if status[r] != _STATUS_OK]
        if failed:
            others = [r for r in failed if r != self.rank]
            if others:
                raise RemoteRankError(
                    f"rank(s) {others} failed while computing Shampoo search directions (see their "
                    "log for the error); every rank stops at the same step"
                )
            return []
        return [
            [table[r, o : o + n] for n, o in zip(self.numels[r], self._offsets[r], strict=True)]
            for r in range(self.world_size)
        ]


__all__ = ["DirectionExchange", "DistributedError", "DistributedTimeoutError", "RemoteRankError"]
