"""Worker processes forked from one preloaded multiprocessing forkserver, reaped at exit.

A spawned worker is a fresh interpreter that spends seconds of CPU importing torch and matroots
(4.4-4.6 s for ``python -c "import torch, shampoo, matroots"`` on this project's 2-core machine). The
forkserver imports them once per process and forks each worker from that clean, single-threaded
server (no OpenMP pool, no process group), which is what Python 3.14 does by default on Linux.

Two things the standard library leaves undone are done here:

* **Reaping.** Python never waits for its forkserver: at exit the server sees its pipe close and
  leaves, unwaited. Its CPU time, and that of every worker it forked, then never reaches the parent's
  ``getrusage(RUSAGE_CHILDREN)`` (a 4-unit sweep burning 6 s of CPU in its workers measured 4.6 s from
  the caller), so ``time`` and ``experiments/time_claims.py`` would undercount. :func:`start_method`
  registers an exit handler that stops and waits for the server.
* **Platforms without a forkserver** (Windows) get ``spawn``.

What a forked worker does not see is a change of an environment variable that torch reads at import
(``OMP_NUM_THREADS``, ``ATEN_CPU_CAPABILITY``, ``MKL_*``) made after the server started: those apply as
they were at the first start, as for torch in the parent itself. Callers that read the environment at
run time hand the current one to their workers (``matroots.study.runner``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import multiprocessing
import multiprocessing.forkserver
from collections.abc import Sequence
from typing import Any


def _stop_server() -> None:
    """Stop the forkserver and wait for it, so its CPU time and its workers' reach this process."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    stop = getattr(server, "_stop", None)  # CPython >= 3.8
    if stop is not None:
        with contextlib.suppress(OSError, ChildProcessError, ValueError):
            stop()


@functools.cache
def _reap_at_exit() -> None:
    """Register :func:`_stop_server` at exit, once per process."""
    atexit.register(_stop_server)


def start_method(preload: Sequence[str]) -> str:
    """``"forkserver"`` with ``preload`` imported in the server (when this process first starts it),
    reaped at exit; ``"spawn"`` where the platform has no forkserver."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.forkserver.set_forkserver_preload([m for m in preload if m and m != "__main__"])
    _reap_at_exit()
    return "forkserver"


def context(preload: Sequence[str]) -> Any:
    """The multiprocessing context of :func:`start_method` (for ``ProcessPoolExecutor(mp_context=)``)."""
    return multiprocessing.get_context(start_method(preload))


__all__ = ["context", "start_method"]
