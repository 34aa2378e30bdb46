"""An optimizer's root rounds on the fixed-delay schedule: ``Shampoo(root_schedule="async")``.

Anil et al. 2020 (arXiv 2002.09018) §4 and App. E compute the inverse roots on otherwise idle host
CPUs while training goes on with the previous roots. :class:`RootPipeline` is that pipeline for one
optimizer, built on the one refresh engine (:mod:`shampoo.refresh`) with the Kronecker roots' refresher
(:class:`shampoo.roots.KroneckerRoots`): a due round is **prepared** in the training thread
(:func:`prepare_round`: the synchronous round's chunks, each a :class:`~shampoo.refresh.Snapshot`
taken with ``copy=True``: the bias-corrected, mirrored factors and the warm starts copied), **solved**
on the background thread of a :class:`~shampoo.async_roots.RootExecutor` (the round's
:class:`~shampoo.root_transfer.RootTransfer` ``solve``: :func:`shampoo.refresh.compute` of each
snapshot, which reads only the snapshot), and **installed** in the training
thread (:func:`install_round`: :meth:`shampoo.refresh.Round.install` and ``finish``: roots written,
statistics that were non-finite reset, counters, the failure policy's warnings and errors) at the start of step ``t + delay`` of the
group (``delay = max_root_delay``; :class:`~shampoo.async_roots.RootSchedule`), waiting for it if it
has not finished. ``delay = 0`` solves inline, which is :func:`~shampoo.roots.compute_roots` itself.
Between the halves a :class:`~shampoo.root_transfer.RootTransfer` moves the round to where it is
solved (``ShampooImplementation.root_device``): as it is on the CPU, through pinned host memory on
CUDA (:mod:`shampoo.root_transfer`).

Steps here are the optimizer's global step (``Shampoo._global_step``, the same on every rank); a
block falls due by the synchronous rule on its parameter's step. The schedule's keys are blocks
``(group, parameter key, block index)``: all factors of a block are refreshed together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from . import root_transfer
from .async_roots import RootExecutor, RootSchedule, RoundTicket
from .config import DiagnosticsConfig, GroupOptions
from .errors import InvalidShampooArgumentError, StateDictError
from .implementation import DEFAULT_IMPLEMENTATION, ShampooImplementation
from .refresh import PreparedRound, Result, RootJob, Round, RoundReport, Snapshot, synchronous
from .roots import KroneckerRoots, compute_roots, round_chunks

BlockKey = tuple[int, Any, int]  # (group index, parameter key, block index)

SCHEDULES = ("sync", "async")


def prepare_round(
    jobs: list[RootJob],
    opts: GroupOptions,
    diag: DiagnosticsConfig,
    impl: ShampooImplementation = DEFAULT_IMPLEMENTATION,
    saved: dict[int, tuple[torch.Tensor, bool]] | None = None,
) -> PreparedRound:
    """The training-thread half before the solve: the chunks of the synchronous round, each
    snapshotted with ``copy=True`` (nothing aliases live state). ``saved``: the inputs of a
    checkpointed round, per factor record (``id``): (input, reset)."""
    parts = []
    kron = [j for j in jobs if j.refresher is None]
    if kron:
        rnd = Round(KroneckerRoots(opts, diag, impl))
        parts.append((rnd, [_snapshot(rnd, c, saved) for c in round_chunks(kron, opts, impl)]))
    own: dict[int, tuple[Round, list[Snapshot]]] = {}
    for job in jobs:
        if job.refresher is not None:  # one Round per refresher (one warning, limits after it)
            rnd, snaps = own.setdefault(id(job.refresher), (Round(job.refresher(opts)), []))
            snaps.append(_snapshot(rnd, [job], saved))
    return PreparedRound(parts + list(own.values()))


def _snapshot(
    rnd: Round, jobs: list[RootJob], saved: dict[int, tuple[torch.Tensor, bool]] | None
) -> Snapshot:
    return rnd.snapshot(jobs, copy=True) if saved is None else _saved_snapshot(rnd, jobs, saved)


def _saved_snapshot(rnd: Round, jobs: list[RootJob], saved: dict[int, tuple[torch.Tensor, bool]]) -> Snapshot:
    """A snapshot of ``jobs`` whose inputs are the saved ones (the warm starts are read as
    :meth:`shampoo.refresh.Round.snapshot` reads them: the roots, or bases, in use)."""
    r = rnd.refresher
    records = [job.records[i] for job in jobs for i in job.positions]
    rows = [saved[id(f)] for f in records]
    A = torch.stack([a for a, _ in rows]).to(jobs[0].factors.device)
    steps = [t for job in jobs for t in job.steps]
    snap = Snapshot(
        r, jobs, records, jobs[0].p, A, [bool(x) for _, x in rows], steps, [f.kappa for f in records]
    )
    snap.extra = r.prepare(snap, records, True)
    return snap


def install_round(prep: PreparedRound, results: list[list[Result]]) -> RoundReport | None:
    """The training-thread half after the solve, per part: each chunk installed, then the part's
    warning and limits (:meth:`shampoo.refresh.Round.install`, :meth:`~shampoo.refresh.Round.finish`)."""
    report = None
    for (rnd, _), part in zip(prep.parts, results, strict=True):
        for res in part:
            rnd.install(res)
        report = merge_reports(report, rnd.finish())
    return report


@dataclass
class _Round:
    group: int
    submitted: int
    install_at: int
    keys: list[BlockKey]
    prep: PreparedRound
    ticket: RoundTicket
    transfer: root_transfer.RootTransfer
    sent: Any  # what the transfer's solve reads (the prepared round itself when solved in place)


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


def _places(engines: list[Any]) -> dict[int, tuple[Any, int, int]]:
    """id of every owned factor record -> (parameter key, block index, dim)."""
    return {
        id(f): (st.key, b.spec.index, f.dim)
        for eng in engines
        if eng is not None
        for st in eng.states
        for b in st.blocks
        if b.owned
        for f in b.factors
    }


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
        #: (root_device, device) -> its transfer, made on first use (keeps the pinned buffers)
        self._transfers: dict[tuple[str, torch.device], root_transfer.RootTransfer] = {}
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
                results = r.transfer.receive(r.sent, outcome.value)
                report = merge_reports(report, install_round(r.prep, results))
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
        impl: ShampooImplementation = DEFAULT_IMPLEMENTATION,
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
                now = synchronous(jobs)
                return compute_roots(now, opts, diag, impl) if now else None
            finally:
                self.foreground_seconds += time.perf_counter() - t0
                for key in keys:
                    self.schedule.mark_installed(key, step)
        try:
            prep = prepare_round(jobs, opts, diag, impl)
            self._start(group, step, step + self.delay, keys, prep, impl)
        except BaseException:
            for key in keys:
                self.schedule.drop(key)
            raise
        finally:
            self.foreground_seconds += time.perf_counter() - t0
        return None

    def _start(
        self,
        group: int,
        step: int,
        at: int,
        keys: list[BlockKey],
        prep: PreparedRound,
        impl: ShampooImplementation,
    ) -> None:
        """Send a prepared round on its way (its transfer) and queue its solve."""
        device = prep.snaps[0].A.device
        transfer = self._transfers.get((impl.root_device, device))
        if transfer is None:
            transfer = root_transfer.select_transfer(impl.root_device, device)
            self._transfers[(impl.root_device, device)] = transfer
        sent = transfer.send(prep)
        if self._executor is None:
            self._executor = RootExecutor(self.threads, timeout=self.timeout)
        ticket = self._executor.submit(tuple(keys), transfer.solve, sent)
        self._rounds.append(_Round(group, step, at, keys, prep, ticket, transfer, sent))

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

    def export(self, engines: list[Any]) -> dict[str, Any]:
        """The schedule and the rounds in flight as plain data (``state_dict``, copies, pickles).

        ``blocks``: per block with rounds, [group, parameter key, block index, rounds submitted,
        generation installed (0: none), its snapshot step (-1: none), fell due while pending].
        ``pending``: per round in flight, its group, submitted and install steps and, per factor,
        [parameter key, block index, dim, parameter step, reset, input]: the snapshotted input it
        solves (bias-corrected, mirrored), so a loaded optimizer solves the same round again and
        installs it at the same step (the warm starts are the roots in use, saved anyway: with one
        round per block in flight they are those of its submission).
        """
        where = _places(engines)
        blocks = []
        for gi, eng in enumerate(engines):
            for st in eng.states if eng is not None else []:
                for b in st.blocks:
                    if not b.owned:
                        continue
                    key = (gi, st.key, b.spec.index)
                    gen = self.schedule.generation(key)
                    if gen:
                        inst = self.schedule.installed(key) or (0, -1)
                        blocks.append(
                            [gi, st.key, b.spec.index, gen, inst[0], inst[1], self.schedule.missed(key)]
                        )
        pending = []
        for r in self._rounds:
            factors = []
            for snap in r.prep.snaps:
                for i, f in enumerate(snap.records):
                    key, index, dim = where[id(f)]
                    factors.append(
                        [key, index, dim, snap.steps[i], bool(snap.reset[i]), snap.A[i].detach().clone()]
                    )
            pending.append(
                {"group": r.group, "submitted": r.submitted, "install_at": r.install_at, "factors": factors}
            )
        return {"delay": self.delay, "blocks": blocks, "pending": pending}

    def load(self, data: dict[str, Any], engines: list[Any], options: Any, diag: DiagnosticsConfig) -> None:
        """Replace the schedule and the rounds in flight by :meth:`export`'s ``data`` (rounds of blocks
        this process owns are prepared from their saved inputs and submitted again, to install at
        their saved step). ``options(group)``: the group's :class:`GroupOptions`."""
        self.cancel()
        self.schedule = RootSchedule(self.delay)
        owned = {
            (gi, st.key, b.spec.index)
            for gi, eng in enumerate(engines)
            for st in (eng.states if eng is not None else [])
            for b in st.blocks
            if b.owned
        }
        rounds: dict[tuple[int, int, int], list[list[Any]]] = {}
        for r in data.get("pending", []):
            rounds.setdefault((r["group"], r["submitted"], r["install_at"]), []).extend(r["factors"])
        pending = {(gi, f[0], f[1]): (sub, at) for (gi, sub, at), fs in rounds.items() for f in fs}
        for gi, key, index, gen, inst_gen, inst_step, missed in data.get("blocks", []):
            k = (gi, key, index)
            if k in owned:
                installed = (inst_gen, inst_step) if inst_gen else None
                self.schedule.restore(
                    k, generation=gen, installed=installed, pending=pending.get(k), missed=missed
                )
        for (gi, sub, at), factors in sorted(rounds.items(), key=lambda kv: kv[0][1]):
            mine = [f for f in factors if (gi, f[0], f[1]) in owned]
            if not mine:
                continue
            eng = engines[gi]
            jobs, blocks = eng.refresh_jobs({(f[0], f[1]): f[3] for f in mine})
            inputs = {(f[0], f[1], f[2]): (f[5], f[4]) for f in mine}
            where = _places([eng])
            saved = {
                id(job.records[j]): inputs[where[id(job.records[j])]] for job in jobs for j in job.positions
            }
            prep = prepare_round(jobs, options(gi), diag, eng.impl, saved)
            self._start(gi, sub, at, [(gi, key, index) for key, index in blocks], prep, eng.impl)

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
        self,
        jobs: list[RootJob],
        blocks: list[tuple[Any, int]],
        opts: GroupOptions,
        diag: DiagnosticsConfig,
        impl: ShampooImplementation = DEFAULT_IMPLEMENTATION,
    ) -> RoundReport | None:
        keys = [(self.group, param, block) for param, block in blocks]
        return self.pipeline.submit(self.group, self.step, jobs, keys, opts, diag, impl)


def check_schedule(root_schedule: Any, max_root_delay: Any) -> None:
    """The optimizer-wide schedule options (typed errors naming the argument and what is allowed)."""
    if root_schedule not in SCHEDULES:
        raise InvalidShampooArgumentError(
            "root_schedule", root_schedule,
            f"one of {SCHEDULES} (roots computed in the step, or on a background thread and installed "
            "max_root_delay steps later)",
        )  # fmt: skip
    RootSchedule(max_root_delay)  # validates the delay


def check_schedule_state(data: Any, step: int) -> None:
    """A saved root schedule (:meth:`RootPipeline.export`) is well formed, before anything is loaded
    (:class:`~shampoo.errors.StateDictError` naming what is wrong)."""
    where = "state dict 'shampoo.root_schedule'"
    if not isinstance(data, dict):
        raise StateDictError(f"{where} must be a dict, got {type(data).__name__}")
    blocks, pending = data.get("blocks", []), data.get("pending", [])
    if not isinstance(blocks, list) or not all(isinstance(b, list | tuple) and len(b) == 7 for b in blocks):
        raise StateDictError(f"{where}['blocks'] must be a list of 7-entry rows (see RootPipeline.export)")
    for r in pending if isinstance(pending, list) else [None]:
        if not isinstance(r, dict) or not {"group", "submitted", "install_at", "factors"} <= r.keys():
            raise StateDictError(
                f"{where}['pending'] must be a list of rounds (group, submitted, install_at, factors)"
            )
        if not (isinstance(r["install_at"], int) and r["install_at"] > step >= r["submitted"]):
            raise StateDictError(
                f"{where}: a round in flight submitted at step {r['submitted']!r} installs at step "
                f"{r['install_at']!r}; a saved round is submitted by and installed after the saved step {step}"
            )
        for f in r["factors"]:
            a = f[5] if isinstance(f, list | tuple) and len(f) == 6 else None
            if not isinstance(a, torch.Tensor) or a.ndim != 2 or a.shape[0] != a.shape[1]:
                raise StateDictError(f"{where}: a pending factor's input must be an (n, n) tensor")
            if not bool(torch.isfinite(a).all()):
                raise StateDictError(f"{where}: a pending factor's input is not finite")


__all__ = [
    "SCHEDULES",
    "BlockKey",
    "GroupRounds",
    "RootPipeline",
    "RootStatus",
    "check_schedule",
    "merge_reports",
]
