"""SOAP's eigenbasis refreshes off the critical path: ``preconditioner="soap"`` with
``root_schedule="async"`` (issue 24; docs/design.md §6).

A refresh that falls due at step t is snapshotted there (the statistics after step t's update, the
bases in use) and installed at the start of step t + max_root_delay. The synchronous SOAP computes the
same snapshot at the start of step t + 1 (Vyas et al. 2024, Alg. 1: the basis never sees the gradient
it rotates), so:

* delay 1 is the synchronous SOAP bit for bit (the same inputs, the same computation, installed at the
  same point, one intra-op thread on both threads: bitwise by construction), for every basis update,
  the fallback and the statistics-reset paths;
* delay k: the bases in use after step s are those of the statistics of the documented step T(s)
  (latest submission T with T + k <= s). With ``basis_update="eigh"`` a basis is a function of the
  statistics alone, and the gradients are a fixed stream set by hand, so the reference is a
  synchronous run refreshing every step: its bases after step T + 1 are those of step T's statistics;
* a failure in the worker goes through the failure policy at install; a non-numerical error is raised
  at the install step in the training thread; a round in flight survives a checkpoint.
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path

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
import shampoo.transforms.soap as soap_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import golden_runs


def _async(case: golden_runs.Case, delay: int) -> golden_runs.Case:
    opts = {**case.options, "root_schedule": "async", "max_root_delay": delay, "root_threads": 1}
    return golden_runs.Case(case.name, opts, case.fast, case.ranks, case.overflow_step)


SYNC_CASES = [
    golden_runs.Case(f"soap_{b}", {"preconditioner": shampoo.SOAP(basis_update=b)})
    for b in ("eigh_warm", "eigh", "qr")
]
SYNC_CASES += [
    golden_runs.Case("soap_overflow_reset", {"preconditioner": "soap"}, overflow_step=3),
    golden_runs.Case(
        "soap_frequency_1",
        {"preconditioner": "soap", "precondition_frequency": 1, "start_preconditioning_step": 1},
    ),
]


@pytest.mark.parametrize("case", SYNC_CASES, ids=[c.name for c in SYNC_CASES])
def test_delay_one_is_the_synchronous_soap_bitwise(case: golden_runs.Case) -> None:
    got, want = golden_runs.run_case(_async(case, 1)), golden_runs.run_case(case)
    # a refresh due at the last step: the synchronous SOAP records it in ``basis_pending`` (computed at
    # the next update), the background one has it in flight in the root schedule (``root_status``)
    pending = [k for k in want if k.endswith("basis_pending")]
    assert pending and all(int(got[k]) == 0 for k in pending)
    assert {int(want[k]) for k in pending} <= {0, golden_runs.STEPS}
    assert_same(
        {k: v for k, v in got.items() if k not in pending},
        {k: v for k, v in want.items() if k not in pending},
    )


# -- delay k: the documented snapshot -----------------------------------------------------------------


def _bases(opt: shampoo.Shampoo) -> dict[tuple, torch.Tensor]:
    sd = opt.state_dict()["state"]
    return {
        (k, name): v.clone() for k, st in sd.items() for name, v in st.items() if name.endswith("eigenbasis")
    }


def _run(
    steps: int, grads: list, *, basis_update: str = "eigh", **options
) -> tuple[list[dict], shampoo.Shampoo]:
    """SOAP on the fixed gradient stream; the bases in use after each step."""
    params = make_params()
    opt = shampoo.Shampoo(params, lr=1e-2, betas=(0.9, 0.99), max_preconditioner_dim=4,
                          preconditioner=shampoo.SOAP(basis_update=basis_update), **options)  # fmt: skip
    out = []
    for t in range(steps):
        for (_, p), g in zip(params, grads[t], strict=True):
            p.grad = g.clone()
        opt.step()
        out.append(_bases(opt))
    return out, opt


@pytest.mark.parametrize(("freq", "start", "delay"), [(1, 1, 2), (3, 3, 2), (2, 2, 3), (3, 3, 1)])
def test_delay_k_installs_the_bases_of_the_documented_step(freq: int, start: int, delay: int) -> None:
    steps = 14
    grads = grad_stream(steps)
    every, _ = _run(steps, grads, precondition_frequency=1, start_preconditioning_step=1)
    got, opt = _run(steps, grads, precondition_frequency=freq, start_preconditioning_step=start,
                    root_schedule="async", max_root_delay=delay)  # fmt: skip
    identity = _run(1, grads, precondition_frequency=1, start_preconditioning_step=10**6)[0][0]
    subs = submissions(steps, start, freq, delay)
    for s in range(1, steps + 1):
        installed = [t for t in subs if t + delay <= s]
        want = every[installed[-1]] if installed else identity  # every[T]: after step T + 1
        assert got[s - 1].keys() == want.keys()
        bad = [k for k in want if not torch.equal(got[s - 1][k], want[k])]
        assert not bad, (s, installed[-1:] or None, bad[:3])
    done = [t for t in subs if t + delay <= steps]
    status = opt.root_status()  # the matrix blocks (the vector keeps its diagonal preconditioner)
    assert status and {(r.generation, r.snapshot_step, r.age) for r in status} == {
        (len(done), done[-1], steps - done[-1])
    }
    pending = [t for t in subs if t + delay > steps]
    assert {r.pending for r in status} == {(pending[0], pending[0] + delay) if pending else None}


# -- failures -----------------------------------------------------------------------------------------


def test_worker_failure_falls_back_as_in_sync_and_warns_at_install(monkeypatch) -> None:
    threads: list[str] = []

    def fails(A, Q, p, opts, work):
        threads.append(threading.current_thread().name)
        return "MatrootsNumericalError: no warm basis today"

    monkeypatch.setattr(soap_mod, "_eigh_warm", fails)
    grads = grad_stream(7)

    def run(**kw) -> tuple[shampoo.Shampoo, list[int]]:
        params = make_params()
        opt = shampoo.Shampoo(params, lr=1e-2, betas=(0.9, 0.99), max_preconditioner_dim=4,
                              preconditioner=shampoo.SOAP(basis_update="eigh_warm"), precondition_frequency=2,
                              start_preconditioning_step=2, **kw)  # fmt: skip
        per_step = []
        for t in range(7):
            for (_, p), g in zip(params, grads[t], strict=True):
                p.grad = g.clone()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                opt.step()
            failed = [w for w in caught if issubclass(w.category, shampoo.RootFailureWarning)]
            assert all(
                "eigenbasis computations failed with 'soap:eigh_warm'" in str(w.message) for w in failed
            )
            per_step.append(len(failed))
        return opt, per_step

    sync, sync_warnings = run()  # due at 2, 4, 6: computed at the next update, 3, 5, 7
    threads.clear()
    opt, got_warnings = run(root_schedule="async", max_root_delay=2)  # installed at 4, 6; 6's in flight
    per_round = sync_warnings[2]  # one warning per bucket and round, as in sync
    assert per_round > 0 and sync_warnings == [0, 0, per_round, 0, per_round, 0, per_round]
    assert got_warnings == [0, 0, 0, per_round, 0, per_round, 0]  # at install, in the training thread
    assert threads and set(threads) == {"shampoo-roots"}
    got = [
        (f.solver, f.primary_failures, f.fallback_uses, f.failures)
        for d in opt.diagnostics()
        for f in d.factors
    ]
    ref = [(f.solver, f.primary_failures, f.fallback_uses) for d in sync.diagnostics() for f in d.factors]
    assert got and all(g == ("soap:eigh_warm[fallback eigh]", 2, 2, 0) for g in got)  # installs at 4, 6
    assert all(r[0] == "soap:eigh_warm[fallback eigh]" and r[1] == 3 for r in ref)  # sync: 3, 5, 7


def test_non_numerical_error_in_the_worker_is_raised_at_install(monkeypatch) -> None:
    def breaks(A, dtype):
        raise RuntimeError("the basis solver broke")

    monkeypatch.setattr(soap_mod, "_eigh", breaks)
    grads = grad_stream(4)
    params = make_params()
    opt = shampoo.Shampoo(params, lr=1e-2, max_preconditioner_dim=4, precondition_frequency=2,
                          start_preconditioning_step=2, preconditioner=shampoo.SOAP(basis_update="eigh"),
                          root_schedule="async", max_root_delay=2)  # fmt: skip
    for t in range(3):  # due at 2, still in flight at 3
        for (_, p), g in zip(params, grads[t], strict=True):
            p.grad = g.clone()
        opt.step()
    for (_, p), g in zip(params, grads[3], strict=True):
        p.grad = g.clone()
    with pytest.raises(RuntimeError, match="the basis solver broke"):
        opt.step()  # step 4 installs
    assert opt._roots.thread_alive
    assert all(r.pending is None and r.generation == 0 for r in opt.root_status())


# -- checkpoints ----------------------------------------------------------------------------------------


def test_resume_with_a_basis_round_in_flight_is_bitwise(tmp_path) -> None:
    kw = {"preconditioner": "soap", "root_schedule": "async", "max_root_delay": 2,
          "precondition_frequency": 3, "start_preconditioning_step": 3}  # fmt: skip
    whole = golden_runs.flatten_result(*(lambda m, o: (m, o.state_dict()))(*model_run(kw, range(1, 15))))
    model, opt = model_run(kw, range(1, 8))  # the refresh due at 6 installs at 8
    assert {r.pending for r in opt.root_status()} == {(6, 8)}
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    torch.save(model.state_dict(), tmp_path / "model.pt")
    del opt
    torch.manual_seed(0)
    model2 = golden_runs.Tiny()
    model2.load_state_dict(torch.load(tmp_path / "model.pt"))
    opt2 = shampoo.Shampoo(model2.named_parameters(), **{**golden_runs.BASE, **kw})
    opt2.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    assert {r.pending for r in opt2.root_status()} == {(6, 8)}
    model2, opt2 = model_run(kw, range(8, 15), model2, opt2)
    assert_same(golden_runs.flatten_result(model2, opt2.state_dict()), whole)
