"""An optimizer's root rounds on the fixed-delay schedule: ``Shampoo(root_schedule="async")``.

Anil et al. 2020 (arXiv 2002.09018) §4 and App. E compute the inverse roots on otherwise idle host
CPUs while training goes on with the previous roots. :class:`RootPipeline` is that pipeline for one
optimizer, built on the root engine's halves (:mod:`shampoo.roots`): a due round is **prepared** in
the training thread (:func:`~shampoo.roots.prepare_round`: the bias-corrected, mirrored factors and
the warm starts copied, non-finite statistics reset), **solved** on the background thread of a
:class:`~shampoo.async_roots.RootExecutor` (:func:`~shampoo.roots.solve_round`, which reads only the
copies), and **installed** in the training thread (:func:`~shampoo.roots.install_round`: roots
written, counters, the failure policy's warnings and errors) at the start of step ``t + delay`` of the
group (``delay = max_root_delay``; :class:`~shampoo.async_roots.RootSchedule`), waiting for it if it
has not finished. ``delay = 0`` solves inline, which is :func:`~shampoo.roots.compute_roots` itself.

Steps here are the optimizer's global step (``Shampoo._global_step``, the same on every rank); a
block falls due by the synchronous rule on its parameter's step. The schedule's keys are blocks
``(group, parameter key, block index)``: all factors of a block are refreshed together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from matroots.core.errors import InvalidArgumentError

from .async_roots import RootExecutor, RootSchedule, RoundTicket
from .config import DiagnosticsConfig, GroupOptions
from .roots import PreparedRound, RoundReport, compute_roots, install_round, prepare_round, solve_round
from .transforms.base import RootJob

BlockKey = tuple[int, Any, int]  # (group index, parameter key, block index)

SCHEDULES = ("sync", "async")


@dataclass
class _Round:
    group: int
    submitted: int
    install_at: int
    keys: list[BlockKey]
    prep: PreparedRound
    ticket: RoundTicket


@dataclass(frozen=True)
class RootStatus:
    """One block's roots under the schedule: ``generation`` of the installed roots (0: none yet),
    ``snapshot_step`` the global step whose factors they were computed from, ``age`` the steps since
    then, ``pending`` (submitted step, install step) of a round in flight, None otherwise."""

    group: int
    param: Any
    block: int
    generation: int
    snapshot_step: int | None
    age: int | None
    pending: tuple[int, int] | None


def merge_reports(a: RoundReport | None, b: RoundReport | None) -> RoundReport | None:
    """The sum of two round reports (None: no round)."""
    if a is None or b is None:
        return a if b is None else b
    return RoundReport(
        factors=a.factors + b.factors,
        primary_failures=a.primary_failures + b.primary_failures,
        failures=a.failures + b.failures,
        seconds=a.seconds + b.seconds,
        solver_seconds=a.solver_seconds + b.solver_seconds,
        factor_resets=a.factor_resets + b.factor_resets,
        failed_labels=a.failed_labels + b.failed_labels,
    )


class RootPipeline:
    """The root rounds of one optimizer under ``max_root_delay = delay`` (module docstring).

    ``threads``: the background thread's intra-op budget; ``timeout``: seconds an install waits for a
    round before :class:`~shampoo.errors.RootRoundTimeoutError` (None: no limit). The executor thread
    starts with the first delayed round and stops on :meth:`close`, when the optimizer is collected,
    or at interpreter exit.
    """

    def __init__(self, delay: int, threads: int = 1, timeout: float | None = None) -> None:
        self.schedule = RootSchedule(delay)
        self.delay = delay
        self.threads = threads
        self.timeout = timeout
        RootExecutor.check_arguments(threads, timeout)
        self._executor: RootExecutor | None = None
        self._rounds: list[_Round] = []
        #: seconds the training thread waited for background rounds, and the rounds' own seconds
        self.wait_seconds = 0.0
        self.background_seconds = 0.0
        #: seconds the training thread spent preparing and installing rounds (delay 0: computing them)
        self.foreground_seconds = 0.0

    def seconds(self) -> tuple[float, float, float]:
        """(foreground, wait, background) seconds so far (see the attributes)."""
        return self.foreground_seconds, self.wait_seconds, self.background_seconds

    # -- the step ---------------------------------------------------------------------------------------

    def due(self, key: BlockKey, falls_due: bool) -> bool:
        """Whether block ``key`` is refreshed now (``falls_due``: the synchronous rule)."""
        return self.schedule.due(key, falls_due)

    def install(self, group: int, step: int) -> RoundReport | None:
        """Install group ``group``'s rounds whose install step has come (waiting for them), in
        submission order; the failure policy reports here, in the training thread."""
        report = None
        for r in [r for r in self._rounds if r.group == group and r.install_at <= step]:
            assert self._executor is not None
            t0 = time.perf_counter()
            try:
                outcome = self._executor.result(r.ticket, self.timeout)
            finally:
                self.wait_seconds += time.perf_counter() - t0
            self._rounds.remove(r)
            self.background_seconds += outcome.seconds
            if outcome.error is not None:  # not a numerical failure (those are outcomes): as sync raises
                for key in r.keys:
                    self.schedule.drop(key)
                raise outcome.error
            for key in r.keys:
                self.schedule.mark_installed(key, step)
            t1 = time.perf_counter()
            try:
                report = merge_reports(report, install_round(r.prep, outcome.value))
            finally:
                self.foreground_seconds += time.perf_counter() - t1
        return report

    def submit(
        self,
        group: int,
        step: int,
        jobs: list[RootJob],
        keys: list[BlockKey],
        opts: GroupOptions,
        diag: DiagnosticsConfig,
    ) -> RoundReport | None:
        """Submit the round of ``jobs`` (the due blocks ``keys`` of group ``group``) at ``step``; with
        delay 0 it is computed and installed now (:func:`~shampoo.roots.compute_roots`)."""
        if not jobs:
            return None
        for key in keys:
            self.schedule.submit(key, step)
        t0 = time.perf_counter()
        if self.delay == 0:
            try:
                return compute_roots(jobs, opts, diag)
            finally:
                self.foreground_seconds += time.perf_counter() - t0
                for key in keys:
                    self.schedule.mark_installed(key, step)
        try:
            prep = prepare_round(jobs, opts, diag)
        except BaseException:
            for key in keys:
                self.schedule.drop(key)
            raise
        finally:
            self.foreground_seconds += time.perf_counter() - t0
        if self._executor is None:
            self._executor = RootExecutor(self.threads, timeout=self.timeout)
        ticket = self._executor.submit(tuple(keys), solve_round, prep)
        self._rounds.append(_Round(group, step, step + self.delay, keys, prep, ticket))
        return None

    # -- state ------------------------------------------------------------------------------------------

    def in_flight(self) -> list[_Round]:
        return list(self._rounds)

    def cancel(self) -> None:
        """Drop every round in flight (the state it would install into is being replaced)."""
        for r in self._rounds:
            r.ticket.cancelled = True
            for key in r.keys:
                self.schedule.drop(key)
        self._rounds.clear()

    def status(self, key: BlockKey, step: int) -> RootStatus:
        got = self.schedule.installed(key)
        return RootStatus(
            group=key[0],
            param=key[1],
            block=key[2],
            generation=0 if got is None else got[0],
            snapshot_step=None if got is None else got[1],
            age=self.schedule.age(key, step),
            pending=self.schedule.pending().get(key),
        )

    def close(self) -> None:
        """Stop the background thread (rounds still queued are skipped)."""
        for r in self._rounds:
            r.ticket.cancelled = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    @property
    def thread_alive(self) -> bool:
        return self._executor is not None and self._executor.alive


@dataclass(frozen=True)
class GroupRounds:
    """The pipeline as one group's step sees it (what :meth:`shampoo.engine.GroupEngine.block_directions`
    calls): install what is due, say which blocks are refreshed, submit them."""

    pipeline: RootPipeline
    group: int
    step: int

    def install(self) -> RoundReport | None:
        return self.pipeline.install(self.group, self.step)

    def due(self, param: Any, block: int, falls_due: bool) -> bool:
        return self.pipeline.due((self.group, param, block), falls_due)

    def submit(
        self, jobs: list[RootJob], blocks: list[tuple[Any, int]], opts: GroupOptions, diag: DiagnosticsConfig
    ) -> RoundReport | None:
        keys = [(self.group, param, block) for param, block in blocks]
        return self.pipeline.submit(self.group, self.step, jobs, keys, opts, diag)


def check_schedule(root_schedule: Any, max_root_delay: Any) -> None:
    """The optimizer-wide schedule options (typed errors naming the argument and what is allowed)."""
    if root_schedule not in SCHEDULES:
        raise InvalidArgumentError(
            f"root_schedule must be one of {SCHEDULES} (roots computed in the step, or on a background "
            f"thread and installed max_root_delay steps later), got {root_schedule!r}"
        )
    RootSchedule(max_root_delay)  # validates the delay


__all__ = [
    "SCHEDULES",
    "BlockKey",
    "GroupRounds",
    "RootPipeline",
    "RootStatus",
    "check_schedule",
    "merge_reports",
]
