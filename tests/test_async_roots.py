"""The asynchronous-roots building blocks (shampoo.async_roots): the bounded-staleness schedule is the
synchronous one at delay 0 and installs exactly `delay` steps after submitting otherwise, with one round
per factor in flight (one falling due meanwhile is submitted at the install); the executor runs rounds on its own thread with its own thread budget, hands back
exceptions instead of losing them, times out a hung round, and leaves no thread behind."""

from __future__ import annotations

import gc
import itertools
import subprocess
import sys
import threading
import time

import pytest
import torch

from matroots.core.errors import InvalidArgumentError
from shampoo.async_roots import RootExecutor, RootSchedule
from shampoo.errors import RootRoundTimeoutError, ShampooError


def _simulate(
    frequency: int, delay: int, steps: int, start: int = 1
) -> tuple[list[int], list[tuple[int, int]]]:
    """Drive one factor through `steps` steps (numbered from 1; it falls due by the synchronous rule);
    return submit steps and (install step, submitted step) pairs, in the documented in-step order:
    install, submit, install."""
    s = RootSchedule(delay)
    submits, installs = [], []
    for step in range(1, steps + 1):
        for phase in (0, 1, 2):
            if phase == 1:
                if s.due("L", step >= start and (step - start) % frequency == 0):
                    s.submit("L", step)
                    submits.append(step)
                continue
            for k in s.installs(step):
                submitted = s.pending()[k][0]
                s.mark_installed(k, step)
                installs.append((step, submitted))
    return submits, installs


@pytest.mark.parametrize(("frequency", "start"), [(1, 1), (3, 3), (10, 10), (3, 1), (4, 6)])
def test_delay_zero_is_the_synchronous_schedule(frequency: int, start: int) -> None:
    submits, installs = _simulate(frequency, 0, 60, start)
    sync = [t for t in range(1, 61) if t >= start and (t - start) % frequency == 0]
    assert submits == sync
    assert installs == [(t, t) for t in sync]  # installed within the step that computed it


@pytest.mark.parametrize(("frequency", "delay"), [(3, 1), (3, 2), (3, 3), (10, 4), (1, 1), (1, 2), (3, 5)])
def test_install_exactly_delay_steps_later_one_in_flight(frequency: int, delay: int) -> None:
    submits, installs = _simulate(frequency, delay, 80, frequency)
    assert [sub for _, sub in installs] == submits[: len(installs)]
    assert all(step == sub + delay for step, sub in installs)  # never earlier, never later
    # at most one in flight: each submission after the first happens at or after the previous install
    for prev_install, nxt in zip(installs, submits[1:], strict=False):
        assert nxt >= prev_install[0]
    # the next submission: the first step falling due after the previous one, or its install step
    for a, b in itertools.pairwise(submits):
        first_due = next(t for t in range(a + 1, 200) if (t - frequency) % frequency == 0)
        assert b == max(first_due, a + delay)


def test_schedule_age_generation_and_errors() -> None:
    s = RootSchedule(2)
    assert s.age("R", 1) is None and s.installed("R") is None
    assert s.due("R", True)
    s.submit("R", 1)
    assert not s.due("R", True) and s.missed("R")  # fell due while pending: submitted at install
    with pytest.raises(ShampooError, match="already in flight"):
        s.submit("R", 2)
    assert s.installs(2) == [] and s.installs(3) == ["R"]
    with pytest.raises(ShampooError, match="installs at step 3, not 2"):
        s.mark_installed("R", 2)  # before its install step: the ranks would disagree
    assert s.mark_installed("R", 3) == 1
    assert s.due("R", False)  # the missed round
    assert s.age("R", 7) == 6 and s.installed("R") == (1, 1)  # computed from step 1's factors
    s.submit("R", 10)
    assert not s.missed("R") and s.generation("R") == 2
    assert s.mark_installed("R", 12) == 2
    s.submit("R", 13)
    s.drop("R")  # a round that raised: forgotten, the installed roots stay
    assert s.installed("R") == (2, 10) and s.pending() == {} and not s.due("R", False)
    for bad in (-1, 1.0, True):
        with pytest.raises(InvalidArgumentError, match="must be an integer"):
            RootSchedule(bad)


_BUDGET_PROBE = """
import threading, torch
from shampoo.async_roots import RootExecutor
torch.set_num_threads(2)
def fresh():
    out = []
    t = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    t.start(); t.join()
    return out[0]
with RootExecutor(num_threads=1) as ex:
    worker = ex.result(ex.submit("L", torch.get_num_threads)).value
    print(torch.get_num_threads(), worker, fresh())
"""


def test_executor_budget_leaves_the_process_default_alone() -> None:
    """torch.set_num_threads also sets the default a new thread copies: the worker's budget of 1 must
    not become it (the creator restores it once the worker has set and initialised its own)."""
    out = subprocess.run(
        [sys.executable, "-c", _BUDGET_PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["2", "1", "2"]  # the creator's 2, the worker's 1, a new thread's 2


def test_executor_runs_in_background_with_its_own_thread_budget() -> None:
    main_threads = torch.get_num_threads()
    with RootExecutor(num_threads=1) as ex:
        seen = ex.result(ex.submit("L", lambda: (threading.current_thread().name, torch.get_num_threads())))
        assert seen.error is None and seen.value == ("shampoo-roots", 1) and seen.seconds >= 0
        assert torch.get_num_threads() == main_threads  # the training thread's budget is untouched
        # a snapshot taken at submit time is what the round sees, whatever the caller does next
        factor = torch.eye(4, dtype=torch.float64) * 4.0
        gate = threading.Event()
        ticket = ex.submit("R", lambda f: (gate.wait(5), torch.linalg.eigvalsh(f))[1], factor.clone())
        factor.mul_(100.0)  # a later EMA update of the live factor
        gate.set()
        out = ex.result(ticket, timeout=10)
        torch.testing.assert_close(out.value, torch.full((4,), 4.0, dtype=torch.float64), rtol=0, atol=0)


def test_executor_hands_back_exceptions_and_keeps_working() -> None:
    with RootExecutor() as ex:
        boom = ValueError("solver exploded")

        def fail() -> None:
            raise boom

        out = ex.result(ex.submit("L", fail), timeout=10)
        assert out.error is boom and out.value is None
        assert ex.alive  # the worker survived
        assert ex.result(ex.submit("L", lambda: 7), timeout=10).value == 7
        kb = ex.result(ex.submit("L", lambda: (_ for _ in ()).throw(KeyboardInterrupt())), timeout=10)
        assert isinstance(kb.error, KeyboardInterrupt) and ex.alive


def test_hung_round_times_out_and_can_be_collected_later() -> None:
    release = threading.Event()
    with RootExecutor(timeout=0.2) as ex:
        ticket = ex.submit("L", lambda: release.wait(30) and "late")
        t0 = time.monotonic()
        with pytest.raises(RootRoundTimeoutError, match=r"still running after 0\.2 s"):
            ex.result(ticket)
        assert time.monotonic() - t0 < 5
        release.set()
        assert ex.result(ticket, timeout=10).value == "late"


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shampoo-roots"]


def test_shutdown_and_garbage_collection_leave_no_thread() -> None:
    before = len(_workers())
    ex = RootExecutor()
    assert len(_workers()) == before + 1
    ex.shutdown()
    assert len(_workers()) == before
    with pytest.raises(ShampooError, match="shut down"):
        ex.submit("L", lambda: None)
    ex2 = RootExecutor()
    thread = ex2._thread
    del ex2
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    for bad in (0, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="root_threads"):
            RootExecutor(num_threads=bad)
    with pytest.raises(InvalidArgumentError, match="root_timeout"):
        RootExecutor(timeout=0)


def test_interpreter_exit_with_a_hung_round_does_not_hang() -> None:
    code = (
        "import threading; from shampoo.async_roots import RootExecutor\n"
        "ex = RootExecutor()\n"
        "ex.submit('L', threading.Event().wait)\n"  # never returns
        "print('bye')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "bye", p.stderr
