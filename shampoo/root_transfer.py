"""Where a background root round is solved, and how its tensors get there and back.

Anil et al. 2020, "Scalable Second Order Optimization for Deep Learning" (arXiv 2002.09018), §4 and
App. E: the inverse roots are computed on otherwise idle host CPUs while the accelerator trains on
with the previous ones. A round of :class:`shampoo.root_pipeline.RootPipeline` is prepared (the
snapshots, ``copy=True``) and installed in the training thread and solved on the background thread;
a :class:`RootTransfer` sits between those halves, one class per device kind behind one protocol:

* :class:`SameDevice` (CPU parameters, and ``root_device="same"``): the snapshot is solved where it
  lives, no copies, no streams: exactly the pipeline without a transfer.
* :class:`CudaHost` (CUDA parameters under ``root_device="auto"`` or ``"host"``): at submission an
  event is recorded on the training stream and a side stream, waiting for it, copies every
  snapshot tensor into pinned host buffers (``non_blocking``; buffers reused across rounds, one
  pool per direction keyed by size, stride and dtype) and records a *copied* event. The background
  thread waits for that event, solves on the CPU (:func:`shampoo.refresh.compute`, the same code as
  a CPU round) and stages the results it installs (roots, bases, the refresher's carry; the
  verdicts stay CPU tensors, as on every device) in pinned buffers. At install the side stream
  copies them into device tensors allocated on it (``non_blocking``; it need not wait for the
  training stream's step in flight) and records a *landed* event the training stream waits on
  before anything reads them; a staging buffer is reused only once its landed event completed, and
  a device tensor used on a stream other than its own is marked with ``record_stream``. Every
  ``torch.cuda`` call goes through a :class:`CudaSeam`, so the tests run this class on the CPU with
  a fake seam that defers each copy until its event is waited for (tests/test_root_transfer.py).
* :class:`CudaSide` (``root_device="device"``): solved on the GPU, on a side stream of the background
  thread that waits for an event recorded on the training stream at submission; the training stream
  waits for the solve's *done* event at install. No host copy; the same kernels as ``"same"``, whose
  background thread launches them on its default stream (in line with the training stream's work).

The values are copied exactly (same dtype, same strides), so a CUDA round solved on the host computes
what a CPU round computes from the same factors.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from .errors import ShampooError
from .refresh import PreparedRound, Result, Snapshot, compute


class RootTransfer(Protocol):
    """How a prepared round reaches the solver and its results come back (module docstring)."""

    name: str

    def send(self, prep: PreparedRound) -> Any:
        """Training thread, after preparing: start moving the round; returns what :meth:`solve` reads."""
        ...

    def solve(self, sent: Any) -> list[list[Result]]:
        """Background thread: the round's results per part (:func:`shampoo.refresh.compute`)."""
        ...

    def receive(self, sent: Any, results: list[list[Result]]) -> list[list[Result]]:
        """Training thread, at install: the results as the training stream may read them."""
        ...


class SameDevice:
    """Solve where the snapshot lives (CPU; CUDA under ``root_device="same"``): no copies."""

    name = "same"

    def send(self, prep: PreparedRound) -> PreparedRound:
        return prep

    def solve(self, sent: PreparedRound) -> list[list[Result]]:
        return [[compute(snap) for snap in snaps] for _, snaps in sent.parts]

    def receive(self, sent: PreparedRound, results: list[list[Result]]) -> list[list[Result]]:
        return results


class CudaSeam:
    """Every ``torch.cuda`` call :class:`CudaHost` makes (the tests substitute a recording fake)."""

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def event(self) -> Any:
        return torch.cuda.Event()

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def on(self, stream: Any) -> Any:
        """A context in which the calling thread's kernels go to ``stream``."""
        return torch.cuda.stream(stream)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def pinned(self, size: torch.Size, stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(size, stride, dtype=dtype, pin_memory=True)

    def empty(
        self, size: torch.Size, stride: tuple[int, ...], dtype: torch.dtype, device: torch.device, stream: Any
    ) -> torch.Tensor:
        with torch.cuda.stream(stream):  # allocated on ``stream``: its copy need not wait for training
            return torch.empty_strided(size, stride, dtype=dtype, device=device)


def dense_stride(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s strides when they are a permutation of a dense layout, else the contiguous ones."""
    order = sorted(range(t.ndim), key=lambda d: (t.stride(d), -d))
    expect, dense = 1, True
    for d in order:
        if t.size(d) != 1 and t.stride(d) != expect:
            dense = False
        expect *= t.size(d)
    if dense:
        return tuple(t.stride())
    out, acc = [0] * t.ndim, 1
    for d in reversed(range(t.ndim)):
        out[d], acc = acc, acc * t.size(d)
    return tuple(out)


Key = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]


class PinnedPool:
    """Pinned host buffers by (size, stride, dtype), reused; a buffer released with an event is
    handed out again only after that event completed (its copy is done)."""

    def __init__(self, seam: Any) -> None:
        self.seam = seam
        self._free: dict[Key, list[tuple[torch.Tensor, Any]]] = {}
        self._lock = threading.Lock()
        #: buffers allocated so far, per key (the tests read it: one per shape in steady state)
        self.allocated: dict[Key, int] = {}

    def acquire(self, like: torch.Tensor) -> torch.Tensor:
        """A pinned buffer with ``like``'s size, dense stride and dtype (a free one if any)."""
        key = (tuple(like.shape), dense_stride(like), like.dtype)
        with self._lock:
            free = self._free.get(key)
            got = free.pop(0) if free else None
            if got is None:
                self.allocated[key] = self.allocated.get(key, 0) + 1
        if got is None:
            return self.seam.pinned(like.shape, key[1], like.dtype)
        buf, event = got
        if event is not None:
            self.seam.synchronize(event)  # the copy that last read it is done
        return buf

    def release(self, buf: torch.Tensor, event: Any = None) -> None:
        """Give ``buf`` back; ``event``: the copy reading it, to complete before its reuse."""
        key = (tuple(buf.shape), tuple(buf.stride()), buf.dtype)
        with self._lock:
            self._free.setdefault(key, []).append((buf, event))


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with every tensor inside (tuples, lists, dataclasses) replaced by ``fn`` of it."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(map_tensors(x, fn) for x in obj))
    if isinstance(obj, tuple | list):
        return type(obj)(map_tensors(x, fn) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def _memo(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` once per tensor object (aliases stay aliases: a result's final roots are its primary's)."""
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def once(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in seen:
            seen[id(t)] = (t, fn(t))
        return seen[id(t)][1]

    return once


def map_installed(res: Result, fn: Callable[[torch.Tensor], torch.Tensor]) -> Result:
    """``res`` with the tensors an install writes into device state mapped by ``fn``: the final
    results, the primary's results, bases and carry (not the verdicts, CPU tensors everywhere)."""
    f = _memo(fn)
    out = res.primary
    primary = dataclasses.replace(
        out,
        roots=None if out.roots is None else f(out.roots),
        bases=None if out.bases is None else f(out.bases),
        carry=map_tensors(out.carry, f),
    )
    return dataclasses.replace(res, final=f(res.final), primary=primary)


@dataclasses.dataclass
class HostRound:
    """A round in flight on the host path: the device snapshots (installed into), their host copies
    (solved), the copied event and the pinned input buffers (released after the solve)."""

    prep: PreparedRound
    device: torch.device
    host: list[list[Snapshot]]
    copied: Any
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor] = dataclasses.field(default_factory=list)


class CudaHost:
    """CUDA factors solved on the host CPU (module docstring); ``seam``: the ``torch.cuda`` calls."""

    name = "host"

    def __init__(self, seam: Any = None) -> None:
        self.seam = CudaSeam() if seam is None else seam
        self.inputs = PinnedPool(self.seam)  # device -> host (acquired in the training thread)
        self.outputs = PinnedPool(self.seam)  # host -> device (acquired in the background thread)
        self._side: dict[torch.device, Any] = {}

    def side_stream(self, device: torch.device) -> Any:
        """The side stream of ``device`` (one per device, made on first use)."""
        if device not in self._side:
            self._side[device] = self.seam.new_stream(device)
        return self._side[device]

    def send(self, prep: PreparedRound) -> HostRound:
        seam = self.seam
        device = prep.snaps[0].A.device
        current, side = seam.current_stream(device), self.side_stream(device)
        produced = seam.event()
        seam.record(produced, current)  # the snapshots are written on the training stream
        seam.wait_event(side, produced)
        inputs: list[torch.Tensor] = []

        def down(t: torch.Tensor) -> torch.Tensor:
            if t.device != device:
                return t
            buf = self.inputs.acquire(t)
            seam.copy(buf, t, side)
            seam.record_stream(t, side)  # a cancelled round's source is not reused mid-copy
            inputs.append(buf)
            return buf

        f = _memo(down)
        host = [
            [dataclasses.replace(s, A=f(s.A), extra=map_tensors(s.extra, f)) for s in snaps]
            for _, snaps in prep.parts
        ]
        copied = seam.event()
        seam.record(copied, side)
        return HostRound(prep, device, host, copied, inputs)

    def solve(self, sent: HostRound) -> list[list[Result]]:
        self.seam.synchronize(sent.copied)  # the host copies are complete
        try:
            results = [[compute(snap) for snap in snaps] for snaps in sent.host]
        finally:
            for buf in sent.inputs:
                self.inputs.release(buf)
            sent.inputs = []

        def stage(t: torch.Tensor) -> torch.Tensor:
            buf = self.outputs.acquire(t)
            buf.copy_(t)
            sent.outputs.append(buf)
            return buf

        return [[map_installed(res, stage) for res in part] for part in results]

    def receive(self, sent: HostRound, results: list[list[Result]]) -> list[list[Result]]:
        seam, device = self.seam, sent.device
        current, side = seam.current_stream(device), self.side_stream(device)

        def up(t: torch.Tensor) -> torch.Tensor:
            dst = seam.empty(t.shape, tuple(t.stride()), t.dtype, device, side)
            seam.copy(dst, t, side)
            seam.record_stream(dst, current)  # read by the training stream: not reused before that
            return dst

        out = []
        for part, snaps in zip(results, (snaps for _, snaps in sent.prep.parts), strict=True):
            out.append(
                [
                    dataclasses.replace(map_installed(res, up), snap=snap)
                    for res, snap in zip(part, snaps, strict=True)
                ]
            )
        landed = seam.event()
        seam.record(landed, side)
        seam.wait_event(current, landed)  # nothing on the training stream reads the roots before
        for buf in sent.outputs:
            self.outputs.release(buf, landed)
        sent.outputs = []
        return out


@dataclasses.dataclass
class SideRound:
    """A round in flight on a side stream: the snapshots, the training stream's event before them,
    the solve's done event (set by :meth:`CudaSide.solve`)."""

    prep: PreparedRound
    side: Any
    produced: Any
    done: Any = None


class CudaSide:
    """CUDA factors solved on the GPU on a side stream (module docstring); ``seam`` as :class:`CudaHost`'s."""

    name = "device"

    def __init__(self, seam: Any = None) -> None:
        self.seam = CudaSeam() if seam is None else seam
        self._side: dict[torch.device, Any] = {}

    def send(self, prep: PreparedRound) -> SideRound:
        seam = self.seam
        device = prep.snaps[0].A.device
        if device not in self._side:
            self._side[device] = seam.new_stream(device)
        side, produced = self._side[device], seam.event()
        seam.record(produced, seam.current_stream(device))
        for s in prep.snaps:  # read on the side stream: their memory is not reused before
            for t in [s.A, *_listed(s.extra)]:
                if t.device == device:
                    seam.record_stream(t, side)
        return SideRound(prep, side, produced)

    def solve(self, sent: SideRound) -> list[list[Result]]:
        seam = self.seam
        with seam.on(sent.side):
            seam.wait_event(sent.side, sent.produced)
            results = [[compute(snap) for snap in snaps] for _, snaps in sent.prep.parts]
            sent.done = seam.event()
            seam.record(sent.done, sent.side)
        return results

    def receive(self, sent: SideRound, results: list[list[Result]]) -> list[list[Result]]:
        seam = self.seam
        device = sent.prep.snaps[0].A.device
        current = seam.current_stream(device)
        seam.wait_event(current, sent.done)
        for res in (res for part in results for res in part):
            for t in installed_tensors(res):
                if t.device == device:
                    seam.record_stream(t, current)  # made on the side stream, read by training
        return results


def _listed(obj: Any) -> list[torch.Tensor]:
    """The tensors inside ``obj`` (:func:`map_tensors`' containers)."""
    out: list[torch.Tensor] = []
    map_tensors(obj, lambda t: out.append(t) or t)
    return out


def installed_tensors(res: Result) -> list[torch.Tensor]:
    """The tensors of ``res`` an install writes into device state (:func:`map_installed`), once each."""
    out: list[torch.Tensor] = []
    map_installed(res, lambda t: out.append(t) or t)
    return out


def select_transfer(root_device: str, device: torch.device) -> RootTransfer:
    """The transfer for a round whose factors live on ``device`` under ``root_device``
    (:class:`shampoo.ShampooImplementation`): on CUDA the host path (``"auto"``, ``"host"``), a side
    stream (``"device"``) or in place (``"same"``); elsewhere in place."""
    if device.type == "cuda" and root_device in ("auto", "host"):
        return CudaHost()
    if device.type == "cuda" and root_device == "device":
        return CudaSide()
    if root_device in ("host", "device") and device.type not in ("cpu", "cuda"):
        raise ShampooError(
            f"root_device={root_device!r} is a CUDA path; factors on {device.type!r} have none here "
            "(use root_device='same' or 'auto')"
        )
    return SameDevice()


__all__ = [
    "CudaHost",
    "CudaSeam",
    "CudaSide",
    "HostRound",
    "PinnedPool",
    "RootTransfer",
    "SameDevice",
    "SideRound",
    "installed_tensors",
    "map_installed",
    "map_tensors",
    "select_transfer",
]
