"""Root rounds off the training thread: a bounded-staleness schedule and a background executor.

Anil et al. 2020, "Scalable Second Order Optimization for Deep Learning" (arXiv 2002.09018), §4 and
App. E: the inverse p-th roots are computed asynchronously on otherwise idle host CPUs while training
goes on with the previous preconditioner. This module holds the two pieces that do not depend on how
a preconditioner computes its roots:

* :class:`RootSchedule` decides, from step numbers alone, when a factor's round is **submitted**
  and when its result is **installed**. A round submitted at step ``t`` is installed at the start of
  step ``t + delay`` (``delay = max_root_delay``), never earlier and never later: every rank derives
  the same install step from the same step count, so data-parallel ranks always apply the same root
  generation, and a run is reproducible (the roots used at step ``s`` are those of the factors
  snapshotted at the documented step ``t <= s``). ``delay = 0`` installs within the step that
  submitted, which is the synchronous schedule. At most one round per factor is in flight: a round
  that falls due while the previous one is still pending is submitted, overdue, at the step that
  installs the previous one (so the refresh interval is ``max(frequency, delay)``). Within a step
  the order is: install what is due, submit what is due, install again (``delay = 0`` rounds).
* :class:`RootExecutor` runs submitted rounds on one background thread with its own intra-op thread
  budget (``torch.set_num_threads`` is per calling thread in torch 2.13 — OpenMP's nthreads-var is a
  per-thread setting — so the worker's budget leaves the training thread's untouched). A round's
  exception is captured and handed back at install time in the training thread; it never disappears
  in the worker and never kills the process. :meth:`RootExecutor.result` with a timeout raises
  :class:`~shampoo.errors.RootRoundTimeoutError` for a round that hangs. Shutdown is explicit
  (:meth:`RootExecutor.shutdown`), on garbage collection of the owner, and at interpreter exit; the
  worker is a daemon thread, so a hung round cannot hang the exit.

The caller (the refresh engine) snapshots what a round reads at submit time — the bias-corrected
factors, cloned — so the EMA updates of later steps cannot race with the computation.
"""

from __future__ import annotations

import atexit
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from matroots.core.errors import InvalidArgumentError

from .errors import RootRoundTimeoutError, ShampooError

# --- the schedule ---------------------------------------------------------------------------------------


@dataclass
class _Pending:
    submitted: int
    install_at: int
    generation: int


@dataclass
class RootSchedule:
    """Which factor rounds to submit and to install at each step (pure bookkeeping on step numbers).

    ``frequency``: a round falls due at steps ``t`` with ``t % frequency == 0`` (the synchronous
    ``precondition_frequency`` rule). ``delay``: the round submitted at ``t`` is installed at the start
    of step ``t + delay``.
    """

    frequency: int
    delay: int
    _pending: dict[Hashable, _Pending] = field(default_factory=dict, repr=False)
    _generation: dict[Hashable, int] = field(default_factory=dict, repr=False)
    #: key -> the step whose factors the installed root was computed from
    _installed_from: dict[Hashable, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name, value, low in (
            ("precondition_frequency", self.frequency, 1),
            ("max_root_delay", self.delay, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"{name} must be an integer >= {low}, got {value!r}")

    def installs(self, step: int) -> list[Hashable]:
        """Keys whose pending round must be installed at the start of ``step`` (in submission order)."""
        return [k for k, p in self._pending.items() if p.install_at <= step]

    def mark_installed(self, key: Hashable, step: int) -> int:
        """Record that ``key``'s pending round was installed at ``step``; returns its generation.

        Installing before the round's install step would break the contract every rank relies on
        (the roots in use are a function of the step count alone): that is refused.
        """
        p = self._pending[key]
        if step < p.install_at:
            raise ShampooError(
                f"the root round for {key!r} submitted at step {p.submitted} installs at step "
                f"{p.install_at}, not {step} (max_root_delay = {self.delay})"
            )
        del self._pending[key]
        self._installed_from[key] = p.submitted
        return p.generation

    def due(self, key: Hashable, step: int) -> bool:
        """Whether ``key`` should be submitted at ``step``: it is due and none of its rounds is pending.

        A factor never refreshed (its first round) is due at any step, so that the first round is never
        skipped because a step count was not a multiple of the frequency.
        """
        if key in self._pending:
            return False
        if key not in self._installed_from:
            return True
        last = self._installed_from[key]
        return step % self.frequency == 0 or step - last >= self.frequency

    def submit(self, key: Hashable, step: int) -> _Pending:
        if key in self._pending:
            raise ShampooError(
                f"a root round for {key!r} is already in flight (submitted at step "
                f"{self._pending[key].submitted}); at most one per factor"
            )
        gen = self._generation.get(key, 0) + 1
        self._generation[key] = gen
        p = _Pending(submitted=step, install_at=step + self.delay, generation=gen)
        self._pending[key] = p
        return p

    def age(self, key: Hashable, step: int) -> int | None:
        """Steps since the installed root's factors were snapshotted (None: never installed)."""
        last = self._installed_from.get(key)
        return None if last is None else step - last

    def pending(self) -> dict[Hashable, tuple[int, int]]:
        """key -> (submitted step, install step) of every round in flight (for state dicts)."""
        return {k: (p.submitted, p.install_at) for k, p in self._pending.items()}


# --- the executor ---------------------------------------------------------------------------------------


@dataclass
class RoundOutcome:
    """What a round returned, or the exception it raised (re-raised by nobody: the caller decides)."""

    value: Any = None
    error: BaseException | None = None
    seconds: float = 0.0


class RoundTicket:
    """A submitted round: :meth:`done` polls, :meth:`RootExecutor.result` waits for it."""

    _ids = itertools.count()

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.id = next(self._ids)
        self._event = threading.Event()
        self._outcome: RoundOutcome | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def _finish(self, outcome: RoundOutcome) -> None:
        self._outcome = outcome
        self._event.set()


_STOP = object()


def _worker(jobs: queue.SimpleQueue, num_threads: int) -> None:
    torch.set_num_threads(num_threads)  # this thread's intra-op budget only (see the module docstring)
    while True:
        item = jobs.get()
        if item is _STOP:
            return
        ticket, fn, args = item
        t0 = time.perf_counter()
        try:
            outcome = RoundOutcome(value=fn(*args))
        except BaseException as exc:  # handed to the training thread; a worker must never die of it
            outcome = RoundOutcome(error=exc)
        outcome.seconds = time.perf_counter() - t0
        ticket._finish(outcome)


_LIVE: weakref.WeakSet[RootExecutor] = weakref.WeakSet()


def _shutdown_all() -> None:
    for ex in list(_LIVE):
        ex.shutdown(wait=False)


atexit.register(_shutdown_all)


class RootExecutor:
    """One background thread that runs root rounds in submission order.

    ``num_threads``: the worker's intra-op thread budget (>= 1). ``timeout``: the default wait of
    :meth:`result` in seconds (None waits forever).
    """

    def __init__(self, num_threads: int = 1, *, timeout: float | None = None, name: str = "shampoo-roots"):
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise InvalidArgumentError(f"root_threads must be an integer >= 1, got {num_threads!r}")
        if timeout is not None and not timeout > 0:
            raise InvalidArgumentError(
                f"root_timeout must be a positive number of seconds or None, got {timeout!r}"
            )
        self.num_threads = num_threads
        self.timeout = timeout
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=_worker, args=(self._jobs, num_threads), name=name, daemon=True
        )
        self._thread.start()
        self._closed = False
        self._finalizer = weakref.finalize(self, RootExecutor._stop_queue, self._jobs)
        _LIVE.add(self)

    @staticmethod
    def _stop_queue(jobs: queue.SimpleQueue) -> None:
        jobs.put(_STOP)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> RoundTicket:
        """Queue ``fn(*args)`` (arguments already snapshotted by the caller); returns its ticket."""
        if self._closed:
            raise ShampooError("the root executor was shut down; no round can be submitted")
        ticket = RoundTicket(key)
        self._jobs.put((ticket, fn, args))
        return ticket

    def result(self, ticket: RoundTicket, timeout: float | None = None) -> RoundOutcome:
        """Wait for ``ticket``'s round (at most ``timeout`` s, default the executor's) and return its outcome.

        Raises :class:`RootRoundTimeoutError` when the round is still running after the timeout; the
        round keeps its place (a later call may still collect it).
        """
        wait = self.timeout if timeout is None else timeout
        if not ticket._event.wait(wait):
            raise RootRoundTimeoutError(
                f"the root round for {ticket.key!r} is still running after {wait} s; raise root_timeout "
                "or use a cheaper root solver (the previous roots stay in use)"
            )
        assert ticket._outcome is not None
        return ticket._outcome

    def shutdown(self, wait: bool = True, timeout: float | None = 10.0) -> None:
        """Stop the worker after the rounds already queued (``wait``: join it for at most ``timeout`` s)."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        _LIVE.discard(self)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> RootExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
