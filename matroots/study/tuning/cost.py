"""Cost measurement in the same process as the solves: CPU seconds and GEMM-equivalents.

A solver's ``res.matmuls`` counts the matrix products it spends, which is an honest cost only for the
GEMM-bound iterations (eigh reports 1.0: its eigendecomposition is not a product). The tuning sweep
therefore measures every solve's *process CPU time* (single torch thread, so it is immune to other
processes' load) and divides it by the CPU time of one n x n GEMM in the same working dtype, timed in
the same work unit: ``gemm_equivalents = cpu_seconds / gemm_seconds``. Both numbers are recorded.

On a CUDA device (a sweep grid or tune config with ``device = "cuda"``) the clock is the wall time
between two ``torch.cuda.synchronize`` calls instead of the process CPU time (the work is the
device's; the CPU only launches it), for the solves and for the GEMM alike, so their ratio is again
GEMM-equivalents. :func:`require_device` refuses a device this machine does not have before any
work starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ...core import precision
from ...core.errors import InvalidArgumentError

T = TypeVar("T")

#: A solve is repeated (and its minimum CPU time kept) while one run costs less than this many seconds.
REPEAT_BELOW_SECONDS = 0.05
#: At most this many runs of one cheap solve.
MAX_REPEATS = 3


class DeviceUnavailableError(InvalidArgumentError):
    """A sweep or tune asks for a device (e.g. "cuda") that this machine's torch cannot use."""


def require_device(device: str) -> torch.device:
    """``torch.device(device)`` if this process can run on it, else a :class:`DeviceUnavailableError`."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise DeviceUnavailableError(f"device {device!r}: sweeps run on 'cpu' or 'cuda[:N]'")
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA device; "
            "run this config on a machine with a GPU, or set device = 'cpu'"
        )
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here (cuda:0..)"
        )
    return dev


def clock(device: str | torch.device = "cpu") -> Callable[[], float]:
    """The cost clock of ``device``: process CPU time on the CPU; on CUDA, wall time read after a
    ``torch.cuda.synchronize`` (so a reading includes every kernel launched before it)."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return time.process_time

    def now() -> float:
        torch.cuda.synchronize(dev)
        return time.perf_counter()

    return now


def gemm_seconds(
    n: int, dtype: Any, *, device: str = "cpu", min_batch_seconds: float = 2e-3, batches: int = 5
) -> float:
    """Seconds of one (n x n) @ (n x n) product in ``dtype`` on ``device`` (its :func:`clock`).

    Warms up, then times ``batches`` batches of r products (r chosen so one batch takes at least
    ``min_batch_seconds``) and returns the smallest per-product time: the least disturbed measurement.
    """
    dt = precision.as_dtype(dtype)
    now = clock(device)
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, n, generator=g, dtype=torch.float64).to(device=device, dtype=dt)
    b = torch.randn(n, n, generator=g, dtype=torch.float64).to(device=device, dtype=dt)
    out = torch.empty(n, n, dtype=dt, device=device)
    for _ in range(3):
        torch.mm(a, b, out=out)
    reps = 1
    while True:
        t = now()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        el = now() - t
        if el >= min_batch_seconds or reps >= 1 << 16:
            break
        reps *= 4
    best = el / reps
    for _ in range(batches - 1):
        t = now()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        best = min(best, (now() - t) / reps)
    return max(best, 1e-9)


def timed(fn: Callable[[], T], *, device: str = "cpu") -> tuple[T, float]:
    """Run ``fn`` and return (its result, seconds on ``device``'s :func:`clock`).

    A run cheaper than :data:`REPEAT_BELOW_SECONDS` is repeated up to :data:`MAX_REPEATS` times and the
    smallest CPU time kept (the first run of a method in a process pays one-off warm-up costs). An
    exception of the first run propagates; the result returned is the first run's.
    """
    now = clock(device)
    t = now()
    out = fn()
    best = now() - t
    runs = 1
    while best < REPEAT_BELOW_SECONDS and runs < MAX_REPEATS:
        t = now()
        fn()
        best = min(best, now() - t)
        runs += 1
    return out, best


__all__ = [
    "MAX_REPEATS",
    "REPEAT_BELOW_SECONDS",
    "DeviceUnavailableError",
    "clock",
    "gemm_seconds",
    "require_device",
    "timed",
]
