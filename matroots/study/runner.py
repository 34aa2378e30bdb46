"""Resumable execution of keyed work units: a local process pool by default, a dask cluster on request.

Any job of the shape "a list of units, each with a key, each giving some rows" (a precision sweep, a
validation run, a tuning sweep) uses this module instead of writing its own pool::

    from matroots import runner

    runner.open_run(out, kind="sweep", config=cfg_dict, config_hash=h, resume=resume)
    stats = runner.run_units(units, job_fn, out, workers=2, scheduler=None, progress=True)
    df = runner.read_parts(out)
    runner.close_run(out, stats)

* A **unit** is any picklable object with a ``key`` attribute: a deterministic, file-safe string
  (letters, digits, ``-``, ``_``, ``.``; not starting with ``.``) that names it across runs.
* ``job_fn(unit) -> list[dict]`` is a picklable top-level function (or a ``functools.partial`` of one)
  returning the unit's rows. It should record expected failures in its rows rather than raise; an
  exception it raises is a bug and stops the run (finished units stay saved).

Run folder layout::

    provenance.json            kind, config and its hash, one record per start/resume (see open_run)
    parts/<key>.parquet        one file per finished unit, written atomically (temp file + rename)
    parts/.tmp-*.parquet       transient temp files; leftovers of a killed run are ignored and removed
    .started/<key>             start markers (local pool), to find the unit that killed a worker
    quarantine/<key>.*.parquet corrupted parts moved aside on resume, then recomputed

Guarantees: an interrupted run (Ctrl-C, kill -9 of the parent, of a worker, or of the dask client)
resumes by skipping the units whose part exists and reads back; no row is lost and none is written
twice. A worker that dies is replaced and its unit retried; a unit that takes a worker down
:data:`MAX_CRASHES` times is recorded by ``crash_rows(unit)`` (default: one row with failure
``"WorkerCrashed"``). On dask, dead workers are retried by the scheduler itself
(``distributed.scheduler.allowed-failures``) and a unit that still fails with ``KilledWorker`` is
recorded the same way. Dask workers return rows to the client, which writes the parts, so the cluster
needs no shared filesystem; the workers need matroots installed.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from ..core.errors import MatrootsInputError
from . import atomic, forkserver, provenance

log = logging.getLogger("matroots.study.runner")

PARTS = "parts"
RUNNING = ".started"
QUARANTINE = "quarantine"
PROVENANCE = "provenance.json"
TMP_PREFIX = atomic.TMP_PREFIX
MAX_CRASHES = 3
#: how long a stopped pool's manager thread may take to release its queues (it takes milliseconds)
MANAGER_JOIN_SECONDS = 5.0
_KEY = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]*$")

JobFn = Callable[[Any], list[dict[str, Any]]]


class RunFolderError(MatrootsInputError):
    """A run cannot start or continue in this folder (another config's run, rows without --resume,
    not writable). The message names the fix."""


class CorruptPartError(RuntimeError):
    """A part file cannot be read (truncated or overwritten); resuming the run recomputes it."""


@dataclass
class RunStats:
    """What one call of :func:`run_units` did."""

    units: int = 0
    skipped: int = 0
    ran: int = 0
    crashed: int = 0
    recomputed_corrupt: int = 0
    retried_crashed: int = 0
    removed_temp: int = 0
    seconds: float = 0.0
    scheduler: str = "local"


# --- files ------------------------------------------------------------------------------------------


def atomic_write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` to ``path`` atomically (:func:`matroots.study.atomic.write_parquet`: a hidden temp file
    in the same folder, fsync, rename), with the permissions a normally created file would have."""
    atomic.write_parquet(path, df)


def _atomic_write_json(obj: Any, path: Path) -> None:
    atomic.write_json(path, obj)


def part_path(out_dir: str | Path, key: str) -> Path:
    return Path(out_dir) / PARTS / f"{key}.parquet"


def _part_files(out_dir: Path) -> list[Path]:
    """Finished parts only: hidden files (temp files of an interrupted write) are not parts."""
    parts = out_dir / PARTS
    if not parts.exists():
        return []
    return sorted(p for p in parts.glob("*.parquet") if not p.name.startswith("."))


def done_units(out_dir: str | Path) -> set[str]:
    """Keys of units whose part is on disk (not checked for corruption; see :func:`run_units`)."""
    return {p.stem for p in _part_files(Path(out_dir))}


def _readable(path: Path) -> bool:
    import pyarrow.parquet as pq

    try:
        pq.read_table(path)
    except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) or OSError
        log.warning("part %s is unreadable (%s)", path.name, exc)
        return False
    return True


def clean_temp_files(out_dir: str | Path) -> int:
    """Remove temp files left by a write that was killed before its rename; return how many."""
    parts = Path(out_dir) / PARTS
    n = 0
    if parts.exists():
        for tmp in parts.glob(f"{TMP_PREFIX}*"):
            tmp.unlink(missing_ok=True)
            n += 1
    if n:
        log.warning("removed %d temp file(s) of an interrupted write in %s", n, parts)
    return n


def quarantine_corrupt_parts(out_dir: str | Path) -> list[str]:
    """Move unreadable parts to ``quarantine/`` so their units run again; return their keys."""
    out = Path(out_dir)
    bad = []
    for p in _part_files(out):
        if not _readable(p):
            q = out / QUARANTINE
            q.mkdir(exist_ok=True)
            os.replace(p, q / f"{p.stem}.{time.strftime('%Y%m%dT%H%M%S')}.parquet")
            bad.append(p.stem)
    if bad:
        log.warning(
            "%d corrupted part(s) moved to %s; their units will be recomputed", len(bad), out / QUARANTINE
        )
    return bad


CRASHED = "WorkerCrashed"


def crashed_parts(out_dir: str | Path) -> list[str]:
    """Keys of parts recorded for a unit that kept killing its worker (every row's failure is
    ``"WorkerCrashed"``): rows without data, which a resume retries unless told not to."""
    import pyarrow.parquet as pq

    keys = []
    for p in _part_files(Path(out_dir)):
        try:
            if "failure" not in pq.read_schema(p).names:
                continue
            failure = pq.read_table(p, columns=["failure"]).column("failure").to_pylist()
        except (OSError, ValueError):
            continue  # unreadable: quarantine_corrupt_parts deals with it
        if failure and all(f == CRASHED for f in failure):
            keys.append(p.stem)
    return keys


def _retry_crashed(out: Path) -> int:
    keys = crashed_parts(out)
    for k in keys:
        part_path(out, k).unlink(missing_ok=True)
    if keys:
        log.warning(
            "retrying %d unit(s) recorded as %s by an earlier run (%s); --no-retry-crashed keeps them",
            len(keys),
            CRASHED,
            ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else ""),
        )
    return len(keys)


def read_parts(out_dir: str | Path, order: Sequence[str] = ()) -> pd.DataFrame:
    """All rows of a run folder (finished parts so far), sorted stably by the ``order`` columns present.

    Raises :class:`CorruptPartError` naming the part when one cannot be read.
    """
    frames = []
    for p in _part_files(Path(out_dir)):
        try:
            frames.append(pd.read_parquet(p))
        except (OSError, ValueError) as exc:
            raise CorruptPartError(
                f"part {p} is corrupted ({type(exc).__name__}); rerun the same command with --resume to "
                "recompute it"
            ) from exc
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    cols = [c for c in order if c in df]
    return df.sort_values(cols, kind="stable").reset_index(drop=True) if cols else df


# --- provenance --------------------------------------------------------------------------------------


def _run_record(resume: bool) -> dict[str, Any]:
    return {
        "event": "resume" if resume else "start",
        "started": provenance.now(),
        "command": provenance.command_line(),
        "git": provenance.git(),
        "versions": provenance.versions(),
        "machine": provenance.machine(),
        "pid": os.getpid(),
    }


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=TMP_PREFIX)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise RunFolderError(
            f"cannot write to run folder {out} ({exc.strerror or exc}); choose a writable --out"
        ) from None


def open_run(
    out_dir: str | Path, *, kind: str, config: dict[str, Any], config_hash: str, resume: bool
) -> Path:
    """Create (or reopen) a run folder and record this start in its provenance.

    ``provenance.json`` holds ``kind``, ``config``, ``config_hash``, ``created`` and ``runs``: one record
    per start or resume (timestamps, command line, git commit, versions, machine), appended, never
    replaced, so a resumed run keeps the record of how it began. Refuses a folder holding another
    config's run, or rows of this one unless ``resume`` is set.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"--out {out} is a file, not a folder; choose a folder path")
    _check_writable(out)
    prov_path = out / PROVENANCE
    old: dict[str, Any] | None = None
    if prov_path.exists():
        try:
            old = json.loads(prov_path.read_text())
        except json.JSONDecodeError:
            raise RunFolderError(
                f"{prov_path} is not valid JSON; this folder's run cannot be identified: use another --out"
            ) from None
        if old.get("config_hash") != config_hash:
            raise RunFolderError(
                f"{out} holds a {old.get('kind', 'run')} of another config (hash {old.get('config_hash')}, "
                f"this one {config_hash}); use another --out"
            )
    if done_units(out) and not resume:
        raise RunFolderError(
            f"{out} already holds rows of this {kind}; pass --resume to continue it or choose another --out"
        )
    record = _run_record(resume=bool(old))
    if old is None:
        prov = {"kind": kind, "config_hash": config_hash, "config": config, "created": record["started"]}
        prov["runs"] = [record]
    else:
        prov = old
        runs = prov.setdefault("runs", [])
        first_git = next((r.get("git") for r in runs if r.get("git")), None)
        if first_git and record["git"] and first_git.get("commit") != record["git"].get("commit"):
            log.warning(
                "resuming %s with matroots at commit %s; it was started at %s",
                out,
                record["git"].get("commit"),
                first_git.get("commit"),
            )
        runs.append(record)
    _atomic_write_json(prov, prov_path)
    return out


def close_run(out_dir: str | Path, stats: RunStats) -> None:
    """Record the end of the latest start/resume (finish time and what ran) in provenance.json."""
    prov_path = Path(out_dir) / PROVENANCE
    if not prov_path.exists():
        return
    prov = json.loads(prov_path.read_text())
    runs = prov.setdefault("runs", [{}])
    runs[-1]["finished"] = provenance.now()
    runs[-1]["stats"] = asdict(stats)
    _atomic_write_json(prov, prov_path)


def read_provenance(out_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(out_dir) / PROVENANCE).read_text())


# --- execution -----------------------------------------------------------------------------------------


def _fault_injection(key: str) -> None:
    """Test hooks. With MATROOTS_SWEEP_CRASH_DIR set, the first worker to run each unit whose key starts
    with MATROOTS_SWEEP_CRASH_PREFIX dies with os._exit (a simulated kill -9 of a worker). With
    MATROOTS_SWEEP_HOLD_DIR set, a unit waits (at most 120 s) while a file named by its key exists
    there (to interrupt a run at a known point)."""
    hold_dir = os.environ.get("MATROOTS_SWEEP_HOLD_DIR")
    if hold_dir:
        deadline = time.monotonic() + 120
        while (Path(hold_dir) / key).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    crash_dir = os.environ.get("MATROOTS_SWEEP_CRASH_DIR")
    if not crash_dir or not key.startswith(os.environ.get("MATROOTS_SWEEP_CRASH_PREFIX", "")):
        return
    try:
        fd = os.open(Path(crash_dir) / key, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os._exit(137)


def _timed_job(job_fn: JobFn, unit: Any) -> list[dict[str, Any]]:
    """Run one unit; add its wall and process-CPU seconds to each row (``unit_wall_seconds``,
    ``unit_cpu_seconds``: the measured cost of the whole unit, which cost estimates are checked
    against; CPU time is immune to other processes' load)."""
    _fault_injection(unit.key)
    w, c = time.perf_counter(), time.process_time()
    rows = job_fn(unit)
    w, c = time.perf_counter() - w, time.process_time() - c
    return [dict(r, unit_wall_seconds=w, unit_cpu_seconds=c) for r in rows]


def _pool_job(job_fn: JobFn, unit: Any, out_dir: str) -> str:
    """Local-pool worker: mark the unit started, run it, write its part."""
    marker = Path(out_dir) / RUNNING / unit.key
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    rows = _timed_job(job_fn, unit)
    atomic_write_parquet(pd.DataFrame(rows), part_path(out_dir, unit.key))
    return unit.key


def _dask_job(job_fn: JobFn, unit: Any) -> list[dict[str, Any]]:
    """Dask worker: run the unit and return its rows (the client writes the part)."""
    return _timed_job(job_fn, unit)


def _default_crash_rows(unit: Any) -> list[dict[str, Any]]:
    return [{"unit": unit.key, "failure": CRASHED}]


def _record_crash(unit: Any, out: Path, crash_rows: Callable[[Any], list[dict[str, Any]]]) -> None:
    log.error(
        "unit %s killed a fresh worker of its own %d times in a row; recorded as %s (a resume retries it)",
        unit.key,
        MAX_CRASHES,
        CRASHED,
    )
    atomic_write_parquet(pd.DataFrame(crash_rows(unit)), part_path(out, unit.key))


class SchedulerLostError(RunFolderError):
    """The dask scheduler went away mid-run; finished units are saved and a resume continues."""


def check_scheduler(scheduler: Any) -> None:
    """Refuse a malformed dask scheduler address before anything runs (one-line RunFolderError)."""
    if scheduler is None or not isinstance(scheduler, str):
        return
    try:
        from distributed.comm import get_address_host_port, parse_address
    except ImportError:
        raise RunFolderError(
            "--scheduler needs dask.distributed: pip install 'matroots[dask]' (or drop --scheduler)"
        ) from None
    try:
        proto, _ = parse_address(scheduler)
        if proto in ("tcp", "tls", "ws", "wss"):
            get_address_host_port(scheduler)
    except (ValueError, TypeError) as exc:
        raise RunFolderError(
            f"--scheduler {scheduler!r} is not a dask scheduler address ({exc}); give tcp://HOST:PORT, "
            "e.g. tcp://127.0.0.1:8786, or drop --scheduler to use the local process pool"
        ) from None


def run_units(
    units: Sequence[Any],
    job_fn: JobFn,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    scheduler: Any = None,
    progress: bool = True,
    desc: str = "run",
    crash_rows: Callable[[Any], list[dict[str, Any]]] | None = None,
    retry_crashed: bool = True,
) -> RunStats:
    """Run every unit whose part is not yet in ``out_dir``; each finished unit becomes one part file.

    Args:
        units: picklable objects with a unique, file-safe ``key``.
        job_fn: picklable ``job_fn(unit) -> list[dict]`` giving the unit's rows.
        out_dir: the run folder (see :func:`open_run`, which should be called first).
        workers: local worker processes (default: the number of cores); ignored with ``scheduler``.
        scheduler: ``None`` for the local process pool, a dask scheduler address (``"tcp://host:8786"``)
            or a connected ``distributed.Client``.
        progress: show a tqdm bar.
        desc: label of the progress bar and log lines.
        crash_rows: rows recorded for a unit that kills its worker :data:`MAX_CRASHES` times.
        retry_crashed: run again the units an earlier run recorded as ``"WorkerCrashed"`` (default);
            ``False`` keeps those rows.

    Before running, temp files of an interrupted write are removed and unreadable parts are moved to
    ``quarantine/`` and recomputed. Ctrl-C (KeyboardInterrupt) stops at once: pending units are
    cancelled, the worker processes terminated (a unit they were running leaves no part), finished
    parts kept; the exception propagates.
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    keys = [u.key for u in units]
    bad = [k for k in keys if not isinstance(k, str) or not _KEY.match(k)]
    if bad:
        raise ValueError(f"unit keys must be file-safe strings not starting with '.'; got {bad[:3]}")
    if len(set(keys)) != len(keys):
        raise ValueError("unit keys must be unique")
    check_scheduler(scheduler)
    (out / PARTS).mkdir(parents=True, exist_ok=True)
    stats = RunStats(units=len(units), scheduler="local" if scheduler is None else str(scheduler))
    stats.removed_temp = clean_temp_files(out)
    stats.recomputed_corrupt = len(quarantine_corrupt_parts(out))
    if retry_crashed:
        stats.retried_crashed = _retry_crashed(out)
    shutil.rmtree(out / RUNNING, ignore_errors=True)  # start markers of an earlier, interrupted run
    finished = done_units(out)
    todo = [u for u in units if u.key not in finished]
    stats.skipped = len(units) - len(todo)
    crash_rows = crash_rows or _default_crash_rows
    log.info("%s: %d of %d units to run", desc, len(todo), len(units))
    if todo:
        from tqdm.std import tqdm  # text bar everywhere: tqdm.auto wants ipywidgets in notebooks

        bar = tqdm(total=len(todo), desc=desc, unit="unit", disable=not progress)
        try:
            if scheduler is None:
                stats.crashed = _run_local(todo, job_fn, out, workers or os.cpu_count() or 1, bar, crash_rows)
            else:
                stats.crashed = _run_dask(todo, job_fn, out, scheduler, bar, crash_rows)
        except KeyboardInterrupt:
            clean_temp_files(out)
            log.info("%s interrupted: finished units are saved; rerun with --resume to continue", desc)
            raise
        finally:
            bar.close()
    stats.ran = len(todo)
    shutil.rmtree(out / RUNNING, ignore_errors=True)
    stats.seconds = time.perf_counter() - t0
    return stats


def exit_after_interrupt(code: int = 130) -> NoReturn:
    """End this process now with ``code``, for a command that was interrupted (Ctrl-C) and has saved
    its work: flush the output, run the ``atexit`` handlers (logging's flush, multiprocessing's
    finalizers, which release the pool's semaphores), then leave without the interpreter's
    finalisation -- its collection of every module's objects took seconds with torch, pandas and
    scikit-learn loaded on a loaded machine, after the work had already stopped. Only for the
    process's own command line (the CLIs call it when ``argv`` is None), never inside a library
    call or a test process."""
    with contextlib.suppress(ValueError):  # not the main thread: leave the handler as it is
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _worker_init(environ: dict[str, str]) -> None:
    """Pool workers ignore SIGINT: a Ctrl-C reaches the whole process group, and the parent alone
    decides what stops (it terminates the workers), so no worker goes on to its next unit.

    A worker forked from the forkserver (see :func:`_pool_context`) would otherwise carry the
    environment of the moment that server started; it takes the parent's environment of now, as a
    spawned worker would (the runner's test hooks and the reference cache read it at run time)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)


def _pool_context(job_fn: JobFn) -> Any:
    """The local pool's multiprocessing context: workers forked from a forkserver that has imported
    torch, this runner and the job's module (:mod:`matroots.study.forkserver`: seconds of CPU saved per
    worker, and the pool starts a worker per unit whenever one died), spawn where there is none. The
    workers take the parent's current environment (:func:`_worker_init`)."""
    func = getattr(job_fn, "func", job_fn)  # a functools.partial's function
    return forkserver.context(["torch", "matroots.study.runner", getattr(func, "__module__", "")])


def _stop_pool(pool: cf.ProcessPoolExecutor) -> None:
    """Cancel the pool's pending units and terminate its workers now (not after their current units).

    ``ProcessPoolExecutor`` has no public way to stop running calls before Python 3.14
    (``terminate_workers``), so the worker processes are terminated through its process table."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() drops the pool's reference
    for p in procs:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            p.terminate()
    deadline = time.monotonic() + 1.0
    for p in procs:
        with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
            p.join(max(deadline - time.monotonic(), 0.0))
            if p.is_alive():
                p.kill()
                p.join(1.0)
    pool.shutdown(wait=False, cancel_futures=True)
    # The pool's manager thread now tears down its queues. Each queue lock's finaliser unlinks the
    # named semaphore and then tells multiprocessing's resource tracker; a process that exits between
    # those two steps (exit_after_interrupt's os._exit) makes the tracker print a "leaked semaphore"
    # warning and a failed unlink on the user's terminal after Ctrl-C. Wait (bounded) for it to finish.
    if manager is not None:
        with contextlib.suppress(RuntimeError):
            manager.join(MANAGER_JOIN_SECONDS)


def _run_batch(job_fn: JobFn, units: list[Any], out: Path, workers: int, bar: Any) -> bool:
    """Run units in one process pool; return True when a worker died (the pool broke).

    Any other exception (Ctrl-C, a bug in ``job_fn``, a full disk) stops the pool at once and
    propagates; the parts already written stay."""
    pool = cf.ProcessPoolExecutor(
        max_workers=min(workers, len(units)),
        mp_context=_pool_context(job_fn),
        initializer=_worker_init,
        initargs=(dict(os.environ),),
    )
    try:
        futs = {pool.submit(_pool_job, job_fn, u, str(out)): u for u in units}
        for fut in cf.as_completed(futs):
            fut.result()
            bar.update(1)
    except cf.process.BrokenProcessPool:
        _stop_pool(pool)
        return True
    except BaseException:
        _stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    return False


def _run_local(
    todo: list[Any],
    job_fn: JobFn,
    out: Path,
    workers: int,
    bar: Any,
    crash_rows: Callable[[Any], list[dict[str, Any]]],
) -> int:
    """Run units, replacing dead workers.

    A worker that dies (killed from outside, or by its unit) charges nobody: the units that had started
    (the suspects) are rerun one at a time, each in a fresh worker of its own. Only a death there
    counts against the unit, since nothing else ran in that process; :data:`MAX_CRASHES` deaths in a
    row record it with ``crash_rows`` (and a later resume retries it)."""
    crashes: dict[str, int] = {}
    started = out / RUNNING
    suspects: list[Any] = []
    n_crashed = 0
    while True:
        finished = done_units(out)
        pending = [u for u in todo if u.key not in finished]
        bar.n = len(todo) - len(pending)
        bar.refresh()
        if not pending:
            return n_crashed
        if suspects:
            u = suspects.pop(0)
            if u.key in finished:
                continue
            if _run_batch(job_fn, [u], out, 1, bar):
                crashes[u.key] = crashes.get(u.key, 0) + 1
                log.warning("unit %s killed a fresh worker of its own (%d)", u.key, crashes[u.key])
                if crashes[u.key] >= MAX_CRASHES:
                    _record_crash(u, out, crash_rows)
                    n_crashed += 1
                else:
                    suspects.append(u)
            continue
        if _run_batch(job_fn, pending, out, workers, bar):
            finished = done_units(out)
            suspects = [u for u in pending if (started / u.key).exists() and u.key not in finished]
            log.warning("a worker died; rerunning %d started units one at a time", len(suspects))


def _lost_scheduler(scheduler: Any, out: Path, exc: BaseException) -> SchedulerLostError:
    return SchedulerLostError(
        f"lost the dask scheduler {scheduler} mid-run ({type(exc).__name__}: {' '.join(str(exc).split())[:100]}); "
        f"{len(done_units(out))} finished units are saved in {out}: rerun with --resume once the "
        "scheduler is back (or drop --scheduler)"
    )


def _run_dask(
    todo: list[Any],
    job_fn: JobFn,
    out: Path,
    scheduler: Any,
    bar: Any,
    crash_rows: Callable[[Any], list[dict[str, Any]]],
) -> int:
    """Submit every unit to a dask cluster and write each part as its rows arrive."""
    try:
        import distributed
    except ImportError:
        raise RunFolderError(
            "--scheduler needs dask.distributed: pip install 'matroots[dask]' (or drop --scheduler)"
        ) from None
    if not log.isEnabledFor(logging.INFO):
        # dask logs a lost connection as a multi-line traceback; the runner reports it in one line.
        for name in ["distributed", *logging.root.manager.loggerDict]:
            if name.startswith("distributed"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    own = not isinstance(scheduler, distributed.Client)
    try:
        client = distributed.Client(scheduler, timeout="30s") if own else scheduler
    except (OSError, TimeoutError, ValueError) as exc:
        raise RunFolderError(
            f"cannot reach the dask scheduler at {scheduler} ({exc}); check the address or drop --scheduler"
        ) from None
    n_crashed = 0
    futs: dict[Any, Any] = {}
    try:
        futs = {
            client.submit(_dask_job, job_fn, u, key=f"matroots-{u.key}-{os.getpid()}", pure=False): u
            for u in todo
        }
        for fut in distributed.as_completed(futs):
            u = futs.pop(fut)
            try:
                rows = fut.result()
            except distributed.KilledWorker:
                _record_crash(u, out, crash_rows)
                n_crashed += 1
            except cf.CancelledError as exc:  # distributed.client.FutureCancelledError
                raise _lost_scheduler(scheduler, out, exc) from None
            else:
                atomic_write_parquet(pd.DataFrame(rows), part_path(out, u.key))
            fut.release()
            bar.update(1)
        if futs:  # as_completed ended early: the client lost its scheduler
            raise _lost_scheduler(scheduler, out, RuntimeError(f"{len(futs)} units never returned"))
    except (OSError, TimeoutError) as exc:  # CommClosedError and friends
        raise _lost_scheduler(scheduler, out, exc) from None
    finally:
        with contextlib.suppress(Exception):
            for fut in list(futs):
                fut.cancel()
        if own:
            with contextlib.suppress(Exception):
                client.close(timeout=5)
    return n_crashed
