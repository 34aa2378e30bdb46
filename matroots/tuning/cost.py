"""Cost measurement in the same process as the solves: CPU seconds and GEMM-equivalents.

A solver's ``res.matmuls`` counts the matrix products it spends, which is an honest cost only for the
GEMM-bound iterations (eigh reports 1.0: its eigendecomposition is not a product). The tuning sweep
therefore measures every solve's *process CPU time* (single torch thread, so it is immune to other
processes' load) and divides it by the CPU time of one n x n GEMM in the same working dtype, timed in
the same work unit: ``gemm_equivalents = cpu_seconds / gemm_seconds``. Both numbers are recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .. import precision

T = TypeVar("T")

#: A solve is repeated (and its minimum CPU time kept) while one run costs less than this many seconds.
REPEAT_BELOW_SECONDS = 0.05
#: At most this many runs of one cheap solve.
MAX_REPEATS = 3


def gemm_seconds(n: int, dtype: Any, *, min_batch_seconds: float = 2e-3, batches: int = 5) -> float:
    """CPU seconds of one (n x n) @ (n x n) product in ``dtype`` on CPU.

    Warms up, then times ``batches`` batches of r products (r chosen so one batch takes at least
    ``min_batch_seconds``) and returns the smallest per-product time: the least disturbed measurement.
    """
    dt = precision.as_dtype(dtype)
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, n, generator=g, dtype=torch.float64).to(dt)
    b = torch.randn(n, n, generator=g, dtype=torch.float64).to(dt)
    out = torch.empty(n, n, dtype=dt)
    for _ in range(3):
        torch.mm(a, b, out=out)
    reps = 1
    while True:
        t = time.process_time()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        el = time.process_time() - t
        if el >= min_batch_seconds or reps >= 1 << 16:
            break
        reps *= 4
    best = el / reps
    for _ in range(batches - 1):
        t = time.process_time()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        best = min(best, (time.process_time() - t) / reps)
    return max(best, 1e-9)


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """Run ``fn`` and return (its result, process CPU seconds).

    A run cheaper than :data:`REPEAT_BELOW_SECONDS` is repeated up to :data:`MAX_REPEATS` times and the
    smallest CPU time kept (the first run of a method in a process pays one-off warm-up costs). An
    exception of the first run propagates; the result returned is the first run's.
    """
    t = time.process_time()
    out = fn()
    best = time.process_time() - t
    runs = 1
    while best < REPEAT_BELOW_SECONDS and runs < MAX_REPEATS:
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
        runs += 1
    return out, best


__all__ = ["MAX_REPEATS", "REPEAT_BELOW_SECONDS", "gemm_seconds", "timed"]
