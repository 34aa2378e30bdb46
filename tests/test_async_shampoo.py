"""Shampoo(root_schedule="async"): roots computed on a background thread from a snapshot of the
factors and installed a fixed number of steps later (issue 24; docs/design.md §6).

* max_root_delay=0 is the synchronous optimizer bit for bit (the round runs inline: the same
  computation by construction), for every registered root solver, SOAP's basis updates, the
  fallback and the statistics-reset paths.
* delay k: the roots in use after step s are exactly those the synchronous optimizer computed from
  the factors of the documented step T(s) (latest submission T with T + k <= s; submissions at the
  first step falling due after the previous one, or at its install step if one fell due meanwhile).
  The gradients are a fixed stream (set by hand), so both runs have the same factors at every step
  whatever roots they apply; both compute with one intra-op thread, so the same kernels see the same
  bits (bitwise by construction).
* failures in the worker go through the failure policy at install, in the training thread; a
  non-numerical error is re-raised there; a hung round times out; no thread is left behind.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from _async_runs import (
    assert_same,
    grad_stream,
    make_params,
    model_run,
    one_thread,  # noqa: F401  (an autouse fixture: imported to apply here)
    submissions,
)

import shampoo
from matroots import MatrootsNumericalError
from matroots.core.errors import InvalidArgumentError
from matroots.solvers import EighConfig, SolverConfig, registry
from shampoo.errors import RootRoundTimeoutError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import golden_runs

SYNC_CASES = [golden_runs.Case(f"solver_{s}", {"root_solver": s}) for s in registry.available()]
SYNC_CASES += [
    golden_runs.Case(f"soap_{b}", {"preconditioner": shampoo.SOAP(basis_update=b)})
    for b in ("eigh_warm", "eigh", "qr")
]
SYNC_CASES += [
    golden_runs.Case("fallback", {"root_solver": golden_runs.FailsInFp32()}),
    golden_runs.Case("overflow_reset", {}, overflow_step=3),
    golden_runs.Case("statistics_frequency_2", {"statistics_frequency": 2}),
]


@pytest.mark.parametrize("case", SYNC_CASES, ids=[c.name for c in SYNC_CASES])
def test_delay_zero_is_sync_bitwise(case: golden_runs.Case) -> None:
    sync = golden_runs.run_case(case)
    delayed = golden_runs.Case(
        case.name, {**case.options, "root_schedule": "async", "max_root_delay": 0}, case.fast, case.ranks,
        case.overflow_step,
    )  # fmt: skip
    assert_same(golden_runs.run_case(delayed), sync)


# -- delay k: the documented snapshot ---------------------------------------------------------------


def _roots(opt: shampoo.Shampoo) -> dict[tuple, torch.Tensor]:
    out = {}
    for eng in opt._engines:
        for st in eng.states if eng is not None else []:
            for b in st.blocks:
                for f in b.factors:
                    out[(st.key, b.spec.index, f.dim)] = f.root.clone()
    return out


def _run(steps: int, grads: list, **options) -> tuple[list[dict], shampoo.Shampoo]:
    """Step an optimizer on the fixed gradient stream; the roots in use after each step."""
    params = make_params()
    opt = shampoo.Shampoo(params, lr=1e-2, betas=(0.9, 0.99), eps=1e-3, eps_mode="relative",
                          max_preconditioner_dim=4, exponent_override={3: 0.25}, **options)  # fmt: skip
    out = []
    for t in range(steps):
        for (_, p), g in zip(params, grads[t], strict=True):
            p.grad = g.clone()
        opt.step()
        out.append(_roots(opt))
    return out, opt


DELAY_CASES = [
    # (frequency, start, delay, solver, warm_start): every submission lands on a step where the
    # synchronous run computes roots too (with frequency < delay a warm start would differ: off)
    (3, 3, 1, "eigh", True),
    (3, 3, 3, "eigh", True),
    (3, 3, 2, "coupled_newton", True),
    (3, 3, 2, "eigh_warm", True),
    (1, 1, 2, "eigh", False),
    (2, 2, 4, "coupled_newton", False),
    (1, 2, 1, "newton_schulz", False),
]


@pytest.mark.parametrize(("freq", "start", "delay", "solver", "warm"), DELAY_CASES)
def test_delay_k_applies_the_roots_of_the_documented_step(freq, start, delay, solver, warm) -> None:
    steps = 16
    grads = grad_stream(steps)
    common = dict(precondition_frequency=freq, start_preconditioning_step=start, root_solver=solver,
                  warm_start=warm)  # fmt: skip
    sync, _ = _run(steps, grads, **common)
    got, opt = _run(steps, grads, **common, root_schedule="async", max_root_delay=delay, root_threads=1)
    subs = submissions(steps, start, freq, delay)
    identity = _run(1, grads, **{**common, "start_preconditioning_step": 10**6})[0][0]
    for s in range(1, steps + 1):
        installed = [t for t in subs if t + delay <= s]
        want = sync[installed[-1] - 1] if installed else identity
        assert got[s - 1].keys() == want.keys()
        bad = [k for k in want if not torch.equal(got[s - 1][k], want[k])]
        assert not bad, (s, installed[-1:] or None, bad[:3])
    # the diagnostics say the same: generation, snapshot step and age of the installed roots
    status = opt.root_status()
    assert status and {(r.generation, r.snapshot_step, r.age) for r in status} == {
        (len([t for t in subs if t + delay <= steps]), subs[-1] if subs[-1] + delay <= steps else subs[-2],
         steps - (subs[-1] if subs[-1] + delay <= steps else subs[-2])),
    }  # fmt: skip
    pending = [t for t in subs if t + delay > steps]
    assert {r.pending for r in status} == {(pending[0], pending[0] + delay) if pending else None}


# -- failures -----------------------------------------------------------------------------------------


class RaisesNumerical(SolverConfig):
    """A primary solver that always fails numerically, recording the threads it ran on."""

    name = "raises_numerical"
    threads: ClassVar[list[str]] = []

    def solve(self, A, p, **kw):  # type: ignore[override]
        RaisesNumerical.threads.append(threading.current_thread().name)
        raise MatrootsNumericalError("no root today")


class RaisesInputError(SolverConfig):
    name = "raises_input_error"

    def solve(self, A, p, **kw):  # type: ignore[override]
        raise InvalidArgumentError("this solver refuses every input")


def _counters(opt: shampoo.Shampoo) -> list[tuple]:
    return [
        (
            f.primary_failures,
            f.fallback_uses,
            f.failures,
            f.consecutive_failures,
            f.solver,
            f.converged,
        )
        for d in opt.diagnostics()
        for f in d.factors
    ]


def test_worker_failure_goes_through_the_failure_policy_at_install() -> None:
    grads = grad_stream(7)
    common = dict(precondition_frequency=2, start_preconditioning_step=2, root_solver=RaisesNumerical())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, sync = _run(6, grads, **common)  # rounds at 2, 4, 6
    RaisesNumerical.threads.clear()
    params = make_params()
    opt = shampoo.Shampoo(params, lr=1e-2, max_preconditioner_dim=4, exponent_override={3: 0.25},
                          root_schedule="async", max_root_delay=1, **common)  # fmt: skip
    for t in range(7):  # rounds submitted at 2, 4, 6, installed at 3, 5, 7
        for (_, p), g in zip(params, grads[t], strict=True):
            p.grad = g.clone()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        failures = [w for w in caught if issubclass(w.category, shampoo.RootFailureWarning)]
        assert len(failures) == (1 if t + 1 in (3, 5, 7) else 0), t + 1  # reported at install
    assert RaisesNumerical.threads and set(RaisesNumerical.threads) == {"shampoo-roots"}
    assert _counters(opt) == _counters(sync)  # the fallback supplied every root, counted as in sync
    assert all(c[:3] == (3, 3, 0) for c in _counters(opt))


def test_non_numerical_error_in_the_worker_is_raised_at_install() -> None:
    grads = grad_stream(4)
    params = make_params()
    opt = shampoo.Shampoo(params, lr=1e-2, max_preconditioner_dim=4, exponent_override={3: 0.25},
                          precondition_frequency=2, start_preconditioning_step=2,
                          root_solver=RaisesInputError(), root_schedule="async", max_root_delay=2)  # fmt: skip
    for t in range(3):  # submitted at 2, still in flight at 3
        for (_, p), g in zip(params, grads[t], strict=True):
            p.grad = g.clone()
        opt.step()
    for (_, p), g in zip(params, grads[3], strict=True):
        p.grad = g.clone()
    with pytest.raises(InvalidArgumentError, match="refuses every input"):
        opt.step()  # step 4 installs
    assert opt._roots.thread_alive  # the worker survived; the round is gone, no root installed
    assert all(r.pending is None and r.generation == 0 for r in opt.root_status())


class Hangs(SolverConfig):
    name = "hangs"
    release = threading.Event()

    def solve(self, A, p, **kw):  # type: ignore[override]
        Hangs.release.wait(60)
        return EighConfig().solve(A, p, **kw)


def test_hung_round_times_out_then_installs_when_it_finishes() -> None:
    Hangs.release.clear()
    grads = grad_stream(5)
    params = make_params()
    opt = shampoo.Shampoo(params, lr=1e-2, max_preconditioner_dim=4, exponent_override={3: 0.25},
                          precondition_frequency=2, start_preconditioning_step=2, root_solver=Hangs(),
                          root_schedule="async", max_root_delay=1, root_timeout=0.2)  # fmt: skip
    try:
        for t in range(2):
            for (_, p), g in zip(params, grads[t], strict=True):
                p.grad = g.clone()
            opt.step()
        for (_, p), g in zip(params, grads[2], strict=True):
            p.grad = g.clone()
        with pytest.raises(RootRoundTimeoutError, match=r"still running after 0\.2 s"):
            opt.step()  # step 3 installs the round of step 2, which hangs
        assert all(r.pending == (2, 3) for r in opt.root_status())  # still in flight
    finally:
        Hangs.release.set()
    opt.step()  # the same gradients again (step 4): the round finished and installs; step 4 submits
    assert all(r.generation == 1 and r.snapshot_step == 2 and r.pending == (4, 5) for r in opt.root_status())


# -- threads and exit paths ---------------------------------------------------------------------------


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "shampoo-roots"]


def test_no_thread_left_after_del_and_the_training_thread_budget_is_kept() -> None:
    gc.collect()  # the optimizers of earlier tests, and their threads
    for t in _workers():
        t.join(10)
    before = len(_workers())
    grads = grad_stream(4)
    threads = []
    for _ in range(3):
        _, opt = _run(4, grads, precondition_frequency=2, start_preconditioning_step=2,
                      root_schedule="async", max_root_delay=1, root_threads=2)  # fmt: skip
        assert torch.get_num_threads() == 1  # the worker's set_num_threads(2) is its own
        threads.append(opt._roots._executor._thread)
        del opt
    gc.collect()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert len(_workers()) == before


_SCRIPT = """
import signal, sys, threading, time, torch, shampoo
from matroots.solvers import EighConfig, SolverConfig

class Slow(SolverConfig):
    name = "slow"
    def solve(self, A, p, **kw):
        time.sleep({sleep})
        return EighConfig().solve(A, p, **kw)

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(6, 5))
opt = shampoo.Shampoo([w], precondition_frequency=1, start_preconditioning_step=1, root_solver=Slow(),
                      root_schedule="async", max_root_delay=1)
def step():
    w.grad = torch.randn(6, 5)
    opt.step()
{body}
"""


def _script(body: str, sleep: float = 0.0) -> subprocess.CompletedProcess:
    code = _SCRIPT.format(body=body, sleep=sleep)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_exception_in_the_training_loop_exits_without_hanging() -> None:
    p = _script("step()\nraise RuntimeError('the training loop failed')", sleep=30.0)
    assert p.returncode == 1 and "the training loop failed" in p.stderr


def test_keyboard_interrupt_while_waiting_then_clean_shutdown() -> None:
    # SIGINT first gets Python's default handler: a child of a non-interactive shell's background job
    # (`cmd &`, CI runners) inherits SIGINT as SIG_IGN, and the interrupt then does nothing (the flake).
    # No fixed sleep: the round blocks on a gate, and the interrupt comes once the worker is inside the
    # round and the main thread waits for it in RootExecutor.result (seen in its stack), however slow
    # the first step is under load. The interrupt is a real SIGINT to the main thread, as Ctrl-C is:
    # _thread.interrupt_main() only sets Python's flag, which a thread blocked in a lock does not see
    # until the wait ends (here: until the gate's 60 s timeout).
    body = """
signal.signal(signal.SIGINT, signal.default_int_handler)
gate, inside = threading.Event(), threading.Event()
def _gated(self, A, p, **kw):
    inside.set()
    gate.wait(60)
    return EighConfig().solve(A, p, **kw)
Slow.solve = _gated
main = threading.main_thread().ident
def _interrupt_when_waiting():
    inside.wait(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        f = sys._current_frames().get(main)
        while f is not None and f.f_code.co_name != "result":
            f = f.f_back
        if f is not None and "async_roots" in f.f_code.co_filename:
            print("waiting", flush=True)
            break
        time.sleep(0.01)
    signal.pthread_kill(main, signal.SIGINT)  # a real signal (Ctrl-C) wakes the blocked wait
step()  # submits a round that runs until the gate opens
threading.Thread(target=_interrupt_when_waiting, daemon=True).start()
try:
    step()  # waits for it at install
except KeyboardInterrupt:
    print("interrupted")
gate.set()
worker = opt._roots._executor._thread
del opt
import gc; gc.collect()
worker.join(30)
print("alive" if worker.is_alive() else "stopped")
"""
    p = _script(body)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["waiting", "interrupted", "stopped"]


def test_interpreter_exit_with_a_round_in_flight() -> None:
    p = _script("step()\nprint('bye')", sleep=60.0)
    assert p.returncode == 0 and p.stdout.strip() == "bye", p.stderr


# -- arguments ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"root_schedule": "later"}, "root_schedule must be one of"),
        ({"root_schedule": "async", "max_root_delay": -1}, "max_root_delay must be an integer >= 0"),
        ({"root_schedule": "async", "max_root_delay": 1.5}, "max_root_delay must be an integer >= 0"),
        ({"root_schedule": "async", "root_threads": 0}, "root_threads must be an integer >= 1"),
        ({"root_schedule": "async", "root_timeout": 0}, "root_timeout must be a positive number"),
    ],
)
def test_schedule_arguments_are_checked(kw: dict, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        shampoo.Shampoo([torch.nn.Parameter(torch.randn(3, 3))], **kw)


# -- state dicts, copies --------------------------------------------------------------------------------


def _result(model, opt) -> dict:
    return golden_runs.flatten_result(model, opt.state_dict())


ASYNC = {"root_schedule": "async", "precondition_frequency": 3, "start_preconditioning_step": 3}


@pytest.mark.parametrize("delay", [0, 2, 4])
def test_resume_with_rounds_in_flight_is_bitwise(delay: int, tmp_path) -> None:
    kw = {**ASYNC, "max_root_delay": delay}
    whole = _result(*model_run(kw, range(1, 15)))
    model, opt = model_run(kw, range(1, 8))  # delay 2: the round of step 6 is in flight (installs at 8)
    if delay:
        assert any(r.pending for r in opt.root_status())
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    torch.save(model.state_dict(), tmp_path / "model.pt")
    del opt
    torch.manual_seed(0)
    model2 = golden_runs.Tiny()
    model2.load_state_dict(torch.load(tmp_path / "model.pt"))
    opt2 = shampoo.Shampoo(model2.named_parameters(), **{**golden_runs.BASE, **kw})
    opt2.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    assert [r.pending for r in opt2.root_status()] == [r.pending for r in model_status(kw, 7)]
    assert_same(_result(*model_run(kw, range(8, 15), model2, opt2)), whole)


def model_status(kw: dict, steps: int) -> list:
    return model_run(kw, range(1, steps + 1))[1].root_status()


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "state_dict"])
def test_copies_and_state_dicts_do_not_disturb_the_schedule(how: str) -> None:
    import copy
    import pickle

    kw = {**ASYNC, "max_root_delay": 2}
    whole = _result(*model_run(kw, range(1, 15)))
    model, opt = model_run(kw, range(1, 8))
    if how == "state_dict":
        opt.state_dict()  # the saving run goes on as if nothing happened
        twin_model, twin = model, opt
    else:
        copied = (
            copy.deepcopy((model, opt)) if how == "deepcopy" else pickle.loads(pickle.dumps((model, opt)))
        )
        twin_model, twin = copied
        assert_same(_result(*model_run(kw, range(8, 15), model, opt)), whole)  # the original
    assert_same(_result(*model_run(kw, range(8, 15), twin_model, twin)), whole)


def test_a_malformed_saved_schedule_is_refused_before_loading() -> None:
    kw = {**ASYNC, "max_root_delay": 2}
    model, opt = model_run(kw, range(1, 8))
    sd = opt.state_dict()
    sd["shampoo"]["root_schedule"]["pending"][0]["install_at"] = 7  # installs at the saved step: not pending
    before = _result(model, opt)
    with pytest.raises(shampoo.StateDictError, match="installed after the saved step 7"):
        opt.load_state_dict(sd)
    assert_same(_result(model, opt), before)


# -- stress: the schedule replayed over many steps ------------------------------------------------------


# The synchronous reference roots of _stress by (steps, freq): the cases differing in delay share them.
_STRESS_SYNC: dict[tuple[int, int], list[list[torch.Tensor]]] = {}


def _stress(steps: int, freq: int, delay: int) -> None:
    import weakref

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    grads = [[torch.randn(4, 3, generator=g), torch.randn(3, generator=g)] for _ in range(steps)]

    def run(**kw):
        params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
        opt = shampoo.Shampoo(params, lr=1e-3, eps=1e-3, eps_mode="relative", precondition_frequency=freq,
                              start_preconditioning_step=freq, warm_start=False, **kw)  # fmt: skip
        return params, opt

    def roots(opt):
        return [f.root.clone() for st in opt._engines[0].states for b in st.blocks for f in b.factors]

    params, sync = run()
    want = _STRESS_SYNC.get((steps, freq))  # the synchronous replay depends on (steps, freq) only
    if want is None:
        want = []
        for t in range(steps):
            for p, gr in zip(params, grads[t], strict=True):
                p.grad = gr
            sync.step()
            want.append(roots(sync))
        _STRESS_SYNC[(steps, freq)] = want
    params, opt = run(root_schedule="async", max_root_delay=delay)
    subs = submissions(steps, freq, freq, delay)
    tickets = {}
    for t in range(steps):
        for p, gr in zip(params, grads[t], strict=True):
            p.grad = gr
        opt.step()
        s = t + 1
        installed = [x for x in subs if x + delay <= s]
        got = roots(opt)
        ref = want[installed[-1] - 1] if installed else [torch.eye(r.shape[-1]) for r in got]
        assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True)), s  # no race: the replay
        assert len(opt._roots.in_flight()) <= 1  # one round per block, and nothing piles up
        tickets.update({r.ticket.id: weakref.ref(r.ticket) for r in opt._roots.in_flight()})
    gc.collect()
    assert (
        len(tickets) == len(subs) and sum(w() is not None for w in tickets.values()) <= 1
    )  # installed rounds are released
    thread = opt._roots._executor._thread
    del opt
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


@pytest.mark.parametrize(("freq", "delay"), [(1, 1), (1, 2), (3, 1), (3, 2)])
def test_stress_short(freq: int, delay: int) -> None:
    _stress(60, freq, delay)


@pytest.mark.slow
@pytest.mark.parametrize(("freq", "delay"), [(1, 1), (1, 2), (3, 1), (3, 2)])
def test_stress_2000_steps(freq: int, delay: int) -> None:
    _stress(2000, freq, delay)
