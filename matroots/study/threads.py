"""One compute thread per study unit: torch's intra-op pool and the BLAS pools of numpy and scipy.

Every unit of a sweep, a tune or a validation run works on one core: its CPU times are its costs (a
solve's CPU seconds over one GEMM's, a training step's CPU seconds), and N workers on N cores must not
each start a thread per core. ``torch.set_num_threads(1)`` bounds torch alone; numpy's and scipy's
OpenBLAS (float64 products in the metrics and references, schur_newton's Schur forms, the validation's
root diagnostics) kept one thread per core in every worker, and an OpenBLAS thread on an oversubscribed
core waits busily. Measured (a 12-unit tiny validation protocol, 2 workers on 2 cores beside other work,
load 6-7): 49.5 s wall with the BLAS pools at their default, 27.2 s with ``OPENBLAS_NUM_THREADS=1``.
"""

from __future__ import annotations

import functools
import os

import torch


def one_thread() -> None:
    """Run this process's torch and BLAS work on one thread each (cheap after the first call)."""
    limit_threads(1)


def limit_threads(n: int) -> None:
    """Run this process's torch and BLAS work on ``n`` threads each (the test suite gives each of its
    xdist workers its share of the cores this way)."""
    torch.set_num_threads(n)
    _limit_blas(os.getpid(), n)  # per process: a forked worker limits its own pools again


@functools.cache
def _limit_blas(pid: int, n: int) -> None:
    import numpy  # noqa: F401  (load the BLAS libraries first: threadpoolctl limits the loaded ones)
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n, user_api="blas")


__all__ = ["limit_threads", "one_thread"]
