"""A fake :class:`shampoo.root_transfer.CudaSeam` for running the CUDA root paths on the CPU
(tests/test_root_transfer.py): its training stream runs at once, its side streams defer every copy
until an event recorded after it is waited for, its fresh buffers are NaN, and every call is logged
with its thread; :func:`install_fake` routes every background round of a test through it."""

from __future__ import annotations

import contextlib
import itertools
import threading

import pytest
import torch

from shampoo import root_pipeline, root_transfer
from shampoo.root_transfer import CudaHost, map_tensors


class FakeStream:
    def __init__(self, name: str, immediate: bool = False) -> None:
        self.name, self.immediate = name, immediate
        self.issued = 0
        self.pending: list[tuple[int, str, torch.Tensor, torch.Tensor]] = []  # (index, kind, dst, src)


class FakeEvent:
    def __init__(self, i: int) -> None:
        self.id, self.stream, self.upto = i, None, 0


def _poison(t: torch.Tensor) -> torch.Tensor:
    """Fill a fresh buffer with what no solve or install can read unnoticed."""
    if t.dtype.is_floating_point:
        return t.fill_(float("nan"))
    return t.fill_(True) if t.dtype == torch.bool else t.fill_(-(2**31))


class FakeSeam:
    """:class:`shampoo.root_transfer.CudaSeam` on the CPU: the training stream runs at once, a side
    stream defers its copies until an event recorded after them is synchronized or waited for by the
    training stream; every call is logged with its thread."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.lock = threading.RLock()
        self.training = FakeStream("training", immediate=True)
        self.streams: list[FakeStream] = []
        self.pinned_buffers: list[torch.Tensor] = []
        self.active: dict[int, FakeStream] = {}  # thread id -> the stream its kernels go to (``on``)
        self._ids = itertools.count()

    def note(self, *entry: object) -> None:
        with self.lock:
            self.log.append((*entry, threading.current_thread().name))

    def is_pinned(self, t: torch.Tensor) -> bool:
        return any(t is b for b in self.pinned_buffers)

    def pending_on(self, t: torch.Tensor) -> int:
        """Copies not yet run that read or write ``t``'s memory."""
        with self.lock:
            ptr = t.untyped_storage().data_ptr()
            return sum(
                ptr in (d.untyped_storage().data_ptr(), s.untyped_storage().data_ptr())
                for st in self.streams
                for _, _, d, s in st.pending
            )

    def _run(self, ev: FakeEvent) -> None:
        with self.lock:
            st = ev.stream
            assert st is not None, "an event waited for before it was recorded"
            for op in [op for op in st.pending if op[0] < ev.upto]:
                st.pending.remove(op)
                op[2].copy_(op[3])
                self.note("run", op[1], st.name)

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.training

    def new_stream(self, device: torch.device) -> FakeStream:
        s = FakeStream(f"side{len(self.streams)}")
        self.streams.append(s)
        self.note("new_stream", s.name)
        return s

    def event(self) -> FakeEvent:
        return FakeEvent(next(self._ids))

    def record(self, ev: FakeEvent, stream: FakeStream) -> None:
        with self.lock:
            ev.stream, ev.upto = stream, stream.issued
        self.note("record", ev.id, stream.name)

    def synchronize(self, ev: FakeEvent) -> None:
        self.note("synchronize", ev.id)
        self._run(ev)

    def wait_event(self, stream: FakeStream, ev: FakeEvent) -> None:
        self.note("wait_event", stream.name, ev.id)
        if stream.immediate:  # the training stream runs at once: waiting is completing the copies
            self._run(ev)
        else:
            assert ev.stream is self.training, "a side stream waits on the training stream only"

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: FakeStream) -> None:
        kind = "d2h" if self.is_pinned(dst) else "h2d"
        assert kind == "d2h" or self.is_pinned(src), "a host-to-device copy reads a pinned buffer"
        assert not stream.immediate, "the copies run on a side stream"
        with self.lock:
            stream.pending.append((stream.issued, kind, dst, src))
            stream.issued += 1
        self.note("copy", kind, stream.name)

    @contextlib.contextmanager
    def on(self, stream: FakeStream):
        name = threading.get_ident()
        self.note("on", stream.name)
        self.active[name] = stream
        try:
            yield
        finally:
            del self.active[name]
            self.note("off", stream.name)

    def record_stream(self, t: torch.Tensor, stream: FakeStream) -> None:
        assert not self.is_pinned(t)
        self.note("record_stream", stream.name)

    def pinned(self, size, stride, dtype) -> torch.Tensor:
        t = _poison(torch.empty_strided(size, stride, dtype=dtype))
        with self.lock:
            self.pinned_buffers.append(t)
        self.note("pinned", tuple(size), dtype)
        return t

    def empty(self, size, stride, dtype, device, stream: FakeStream) -> torch.Tensor:
        assert not stream.immediate
        self.note("empty", stream.name)
        return _poison(torch.empty_strided(size, stride, dtype=dtype, device=device))


def install_fake(monkeypatch: pytest.MonkeyPatch, kind: type = CudaHost) -> FakeSeam:
    """Every background round takes the CUDA path ``kind`` (the host path, or the side stream's)
    through one :class:`FakeSeam` (its ``made``: the transfers); the solve, the install and the
    pools' hand-outs check that nothing they depend on is pending."""
    seam, made = FakeSeam(), []
    host = kind is CudaHost

    def select(root_device: str, device: torch.device):
        t = kind(seam)
        for pool in (t.inputs, t.outputs) if host else ():
            acquire = pool.acquire

            def checked(like, acquire=acquire, pool=pool):
                buf = acquire(like)
                pool.handed_out = getattr(pool, "handed_out", 0) + 1  # the tests compare it with .allocated
                assert seam.pending_on(buf) == 0, "a pinned buffer handed out with a copy in flight"
                return buf

            pool.acquire = checked
        made.append(t)
        return t

    compute = root_transfer.compute

    def solve(snap):
        for t in [snap.A, *_tensors(snap.extra)] if host else ():
            assert seam.is_pinned(t) and seam.pending_on(t) == 0, "solved before its input was copied"
        if not host:
            assert threading.get_ident() in seam.active, "solved off the side stream"
        seam.note("compute")
        return compute(snap)

    install = root_pipeline.install_round

    def installed(prep, results):
        for res in (res for part in results for res in part):
            for t in root_transfer.installed_tensors(res):
                assert not seam.is_pinned(t) and seam.pending_on(t) == 0, "installed before it landed"
        seam.note("install")
        return install(prep, results)

    monkeypatch.setattr(root_transfer, "select_transfer", select)
    monkeypatch.setattr(root_transfer, "compute", solve)
    monkeypatch.setattr(root_pipeline, "install_round", installed)
    seam.made = made
    return seam


def _tensors(obj: object) -> list[torch.Tensor]:
    """The tensors inside ``obj`` (tuples, lists, dataclasses)."""
    out: list[torch.Tensor] = []
    map_tensors(obj, lambda t: out.append(t) or t)
    return out
