"""Reusable (b, n, n) work buffers for the batched solvers: no page faults for every call's scratch.

Fresh large tensors are expensive on CPU: every page is faulted in on first touch, and glibc hands a
freed multi-MiB block back to the kernel, so a batched solve would pay ~500 faults per 2 MiB buffer
on every call, where the loop over its blocks keeps its small buffers in the heap (the measurement
is in docs/design.md §3, "Work buffers").

:class:`Buffers` keeps the scratch tensors of one shape, dtype and device per thread between calls:
the most recent two sets whose total size is at most ``CACHE_BYTES`` (48 MiB each: the nine buffers
of a p = 4 solve of 32 x 128 or 8 x 256 in fp64 take 36 MiB); larger sets are allocated per call,
where the faults cost little next to the O(n^3) work. A set is taken out of the
cache while in use, so a nested or concurrent call (another thread) never shares it. Callers must not
return a buffer (or a view of one) to their own caller: results are fresh tensors.
"""

from __future__ import annotations

import math
import threading

import torch

CACHE_BYTES = 48 * 2**20
_local = threading.local()


def _cache() -> dict:
    cache = getattr(_local, "sets", None)
    if cache is None:
        cache = _local.sets = {}
    return cache


class Buffers:
    """A set of equally shaped scratch tensors, from the calling thread's cache where one is free.

    ``take(k)`` returns the first k (allocating the missing ones, uninitialised); ``release()`` puts
    the set back for the next call (use ``try/finally``).
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> None:
        self.shape, self.dtype, self.device = tuple(shape), dtype, torch.device(device)
        self.key = (self.shape, dtype, self.device)
        self.size = math.prod(self.shape) * torch.empty((), dtype=dtype).element_size()
        self.bufs: list[torch.Tensor] = _cache().pop(self.key, [])  # taken: nobody else gets this set

    def take(self, k: int) -> list[torch.Tensor]:
        """The first k buffers of the set (allocated on first use)."""
        while len(self.bufs) < k:
            self.bufs.append(torch.empty(self.shape, dtype=self.dtype, device=self.device))
        return self.bufs[:k]

    def release(self) -> None:
        """Return the set to the thread's cache (at most two sets, each within ``CACHE_BYTES``)."""
        if not self.bufs or self.size * len(self.bufs) > CACHE_BYTES:
            return
        cache = _cache()
        cache.pop(self.key, None)
        cache[self.key] = self.bufs  # most recent last
        while len(cache) > 2:
            cache.pop(next(iter(cache)))


def clear_cache() -> None:
    """Free the calling thread's cached work buffers."""
    _cache().clear()


__all__ = ["CACHE_BYTES", "Buffers", "clear_cache"]
