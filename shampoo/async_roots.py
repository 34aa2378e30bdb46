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
  budget. In torch 2.13 (OpenMP backend) ``torch.set_num_threads`` sets the calling thread's OpenMP
  nthreads-var and MKL's thread-local count, *and* the process-wide default that a thread copies the
  first time it runs a parallel op: a thread that already ran one keeps its budget, but every thread
  started later would inherit the worker's. So the executor's creator waits for the worker to set its
  budget and then restores the default it had (:meth:`RootExecutor.__init__`). A round's
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

from .errors import InvalidShampooArgumentError, RootRoundTimeoutError, ShampooError

# --- the schedule ---------------------------------------------------------------------------------------


@dataclass
class _Pending:
    submitted: int
    install_at: int
    generation: int


@dataclass
class RootSchedule:
    """Which factor rounds to submit and to install at each step (pure bookkeeping on step numbers).

    Whether a factor *falls due* at a step is the caller's synchronous rule (``precondition_frequency``
    and ``start_preconditioning_step`` on the parameter's step); ``delay``: the round submitted at step
    ``t`` is installed at the start of step ``t + delay``. Keys are any hashable names of what one round
    refreshes (the optimizer uses blocks: all factors of a block are refreshed together, as in the
    synchronous schedule).
    """

    delay: int
    _pending: dict[Hashable, _Pending] = field(default_factory=dict, repr=False)
    _missed: set[Hashable] = field(default_factory=set, repr=False)
    _generation: dict[Hashable, int] = field(default_factory=dict, repr=False)
    #: key -> (generation, step whose factors the installed root was computed from)
    _installed: dict[Hashable, tuple[int, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        v = self.delay
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidShampooArgumentError("max_root_delay", v, "an integer >= 0")

    def due(self, key: Hashable, falls_due: bool) -> bool:
        """Whether ``key``'s round is submitted now: it falls due now (``falls_due``, the synchronous
        rule) or fell due while its previous round was pending, and none of its rounds is pending.
        A step at which it falls due while one is pending is remembered, so the round is submitted at
        the step that installs the pending one (the in-step order installs first)."""
        if key in self._pending:
            if falls_due:
                self._missed.add(key)
            return False
        return falls_due or key in self._missed

    def submit(self, key: Hashable, step: int) -> _Pending:
        if key in self._pending:
            raise ShampooError(
                f"a root round for {key!r} is already in flight (submitted at step "
                f"{self._pending[key].submitted}); at most one per factor"
            )
        self._missed.discard(key)
        gen = self._generation.get(key, 0) + 1
        self._generation[key] = gen
        p = _Pending(submitted=step, install_at=step + self.delay, generation=gen)
        self._pending[key] = p
        return p

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
        self._installed[key] = (p.generation, p.submitted)
        return p.generation

    def drop(self, key: Hashable) -> None:
        """Forget ``key``'s pending round (it raised, or the state it refreshes was replaced): the
        factor keeps its installed root and is submitted again when it next falls due."""
        self._pending.pop(key, None)

    def age(self, key: Hashable, step: int) -> int | None:
        """Steps since the installed root's factors were snapshotted (None: never installed)."""
        got = self._installed.get(key)
        return None if got is None else step - got[1]

    def installed(self, key: Hashable) -> tuple[int, int] | None:
        """(generation, snapshot step) of ``key``'s installed root (None: never installed)."""
        return self._installed.get(key)

    def pending(self) -> dict[Hashable, tuple[int, int]]:
        """key -> (submitted step, install step) of every round in flight (for state dicts)."""
        return {k: (p.submitted, p.install_at) for k, p in self._pending.items()}

    def missed(self, key: Hashable) -> bool:
        """Whether ``key`` fell due while its round was pending (submitted at that round's install)."""
        return key in self._missed

    def restore(
        self,
        key: Hashable,
        *,
        generation: int,
        installed: tuple[int, int] | None,
        pending: tuple[int, int] | None = None,
        missed: bool = False,
    ) -> None:
        """Set ``key``'s bookkeeping from a checkpoint (see :meth:`installed`, :meth:`pending`)."""
        self._generation[key] = generation
        if installed is not None:
            self._installed[key] = installed
        if pending is not None:
            self._pending[key] = _Pending(pending[0], pending[1], generation)
        if missed:
            self._missed.add(key)

    def generation(self, key: Hashable) -> int:
        """Rounds submitted for ``key`` so far (the installed one's generation is :meth:`installed`)."""
        return self._generation.get(key, 0)


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
        self.cancelled = False  # a queued round that is no longer wanted is skipped by the worker

    def done(self) -> bool:
        return self._event.is_set()

    def _finish(self, outcome: RoundOutcome) -> None:
        self._outcome = outcome
        self._event.set()


_STOP = object()


def _worker(jobs: queue.SimpleQueue, num_threads: int, ready: threading.Event) -> None:
    torch.set_num_threads(num_threads)  # this thread's budget and the default (the creator restores it)
    torch.get_num_threads()  # marks this thread initialised, so the restored default cannot reach it
    ready.set()
    while True:
        item = jobs.get()
        if item is _STOP:
            return
        ticket, fn, args = item
        if ticket.cancelled:
            ticket._finish(RoundOutcome(error=ShampooError("the root round was cancelled")))
            continue
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
        self.check_arguments(num_threads, timeout)
        self.num_threads = num_threads
        self.timeout = timeout
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        before = torch.get_num_threads()  # the creator's budget (initialised from the default if new)
        ready = threading.Event()
        self._thread = threading.Thread(
            target=_worker, args=(self._jobs, num_threads, ready), name=name, daemon=True
        )
        self._thread.start()
        ready.wait(10.0)
        if num_threads != before:  # the worker's set_num_threads also moved the process default back
            torch.set_num_threads(before)
        self._closed = False
        self._finalizer = weakref.finalize(self, RootExecutor._stop_queue, self._jobs)
        _LIVE.add(self)

    @staticmethod
    def check_arguments(num_threads: object, timeout: object) -> None:
        """The executor's arguments as the optimizer names them (``root_threads``, ``root_timeout``)."""
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise InvalidShampooArgumentError("root_threads", num_threads, "an integer >= 1")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise InvalidShampooArgumentError("root_timeout", timeout, "a positive number of seconds or None")

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
