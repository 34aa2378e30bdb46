"""Where a background root round is solved (``ShampooImplementation.root_device``; shampoo/root_transfer.py).

The CUDA host path (:class:`shampoo.root_transfer.CudaHost`) is run here on the CPU through a fake
:class:`~shampoo.root_transfer.CudaSeam`: its streams *defer* every copy until an event after it is
waited for, and its fresh buffers are poisoned (NaN), so a solve that read its inputs before their
copy, or an install that read the roots before theirs, would change the numbers. Checked:

* the fake-CUDA path trains bitwise as the CPU path (the documented-snapshot tests of
  tests/test_async_shampoo.py and the SOAP delay-1-is-sync tests of tests/test_async_soap.py, run
  through it; a checkpoint with a round in flight);
* the order of operations: an event on the training stream before the side stream's device-to-host
  copies, the solve only once its inputs landed, host-to-device copies on the side stream, the
  training stream waiting on them before the install reads anything, ``record_stream`` on the device
  tensors another stream uses, and no pinned buffer handed out with a copy pending on it; pinned
  buffers allocated once per shape and reused;
* the side-stream path (:class:`~shampoo.root_transfer.CudaSide`, ``root_device="device"``) the same
  way: bitwise the CPU path, the solve on the side stream after the training stream's event, the
  install after the solve's event;
* on a machine with CUDA (skipped elsewhere): SOAP at delay 1 solved on the GPU (worker's stream or
  side stream) is the synchronous SOAP bitwise; the host path on real streams is the host path with
  blocking copies bitwise, and the device path to rounding.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import test_async_shampoo as tas
import test_async_soap as tsoap
import torch
from _async_runs import (
    assert_same,
    one_thread,  # noqa: F401  (an autouse fixture: imported to apply here)
)
from _fake_cuda import FakeSeam, install_fake

import shampoo
from shampoo import root_transfer
from shampoo.errors import ShampooError
from shampoo.root_transfer import CudaHost, CudaSide, PinnedPool, SameDevice

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import golden_runs


@pytest.fixture(params=[CudaHost, CudaSide], ids=["host", "side_stream"])
def fake_cuda(monkeypatch, request) -> FakeSeam:
    """Every background round of the test on a fake CUDA path (the host path, the side stream)."""
    return install_fake(monkeypatch, request.param)


# -- selection ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["gpu", "", None, 1, "HOST"])
def test_root_device_is_validated(value) -> None:
    with pytest.raises(shampoo.InvalidShampooArgumentError, match=r"^root_device must be one of"):
        shampoo.ShampooImplementation(root_device=value)


def test_the_transfer_is_chosen_by_root_device_and_the_factors_device() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    for value in shampoo.implementation.ROOT_DEVICES:
        assert isinstance(root_transfer.select_transfer(value, cpu), SameDevice)  # CPU: as before
    assert isinstance(root_transfer.select_transfer("auto", cuda), CudaHost)  # touches no CUDA yet
    assert isinstance(root_transfer.select_transfer("host", cuda), CudaHost)
    assert isinstance(root_transfer.select_transfer("device", cuda), CudaSide)
    assert isinstance(root_transfer.select_transfer("same", cuda), SameDevice)
    for value in ("host", "device"):
        with pytest.raises(ShampooError, match=f"^root_device='{value}' is a CUDA path; factors on 'meta'"):
            root_transfer.select_transfer(value, torch.device("meta"))


def test_a_pinned_buffer_is_reused_only_after_its_copy() -> None:
    seam = FakeSeam()
    side = seam.new_stream(torch.device("cpu"))
    pool = PinnedPool(seam)
    like = torch.randn(2, 3, 3).mT  # a permuted dense layout is kept
    buf = pool.acquire(like)
    assert buf.stride() == like.stride() and buf.shape == like.shape
    dst = torch.empty(2, 3, 3)
    buf.copy_(like)
    seam.copy(dst, buf, side)  # an H2D copy reading buf, in flight
    landed = seam.event()
    seam.record(landed, side)
    pool.release(buf, landed)
    assert seam.pending_on(buf) == 1
    again = pool.acquire(like)
    assert again is buf and seam.pending_on(buf) == 0 and torch.equal(dst, like)  # waited, then reused
    assert pool.allocated == {((2, 3, 3), like.stride(), torch.float32): 1}
    assert pool.acquire(like) is not buf  # in use: a second buffer
    assert pool.allocated[((2, 3, 3), like.stride(), torch.float32)] == 2


# -- the fake-CUDA path is the CPU path -----------------------------------------------------------------


@pytest.mark.parametrize(("freq", "start", "delay", "solver", "warm"), tas.DELAY_CASES)
def test_fake_cuda_applies_the_roots_of_the_documented_step(fake_cuda, freq, start, delay, solver, warm):
    tas.test_delay_k_applies_the_roots_of_the_documented_step(freq, start, delay, solver, warm)
    assert fake_cuda.made and any(e[0] == "compute" for e in fake_cuda.log)


@pytest.mark.parametrize("case", tsoap.SYNC_CASES, ids=[c.name for c in tsoap.SYNC_CASES])
def test_fake_cuda_soap_delay_one_is_the_synchronous_soap_bitwise(fake_cuda, case) -> None:
    tsoap.test_delay_one_is_the_synchronous_soap_bitwise(case)
    assert fake_cuda.made


CASES = [golden_runs.Case("fallback", {"root_solver": golden_runs.FailsInFp32()}),
         golden_runs.Case("overflow_reset", {}, overflow_step=3),
         golden_runs.Case("eigh_warm", {"root_solver": "eigh_warm"})]  # fmt: skip


@pytest.mark.parametrize("kind", [CudaHost, CudaSide], ids=["host", "side_stream"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fake_cuda_equals_the_cpu_path_bitwise(case: golden_runs.Case, kind: type, monkeypatch) -> None:
    kw = {**case.options, "root_schedule": "async", "max_root_delay": 2, "root_threads": 1}
    case = golden_runs.Case(case.name, kw, case.fast, case.ranks, case.overflow_step)
    want = golden_runs.run_case(case)
    with monkeypatch.context() as m:
        seam = install_fake(m, kind)
        got = golden_runs.run_case(case)
    assert seam.made and any(e[0] == "install" for e in seam.log)
    assert_same(got, want)


def test_fake_cuda_resume_with_a_round_in_flight_is_bitwise(fake_cuda, tmp_path) -> None:
    tas.test_resume_with_rounds_in_flight_is_bitwise(2, tmp_path)
    tsoap.test_resume_with_a_basis_round_in_flight_is_bitwise(tmp_path)
    assert len(fake_cuda.made) >= 4  # each optimizer made its own


# -- the sequence ---------------------------------------------------------------------------------------


def _two_groups(steps: int, seam: FakeSeam) -> list:
    """Two groups of equal shapes, a round each every 2 steps (delay 2: two rounds in flight)."""
    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(6, 4)) for _ in range(2)]
    opt = shampoo.Shampoo([{"params": [ps[0]]}, {"params": [ps[1]]}], lr=1e-2, precondition_frequency=1,
                          start_preconditioning_step=1, root_schedule="async", max_root_delay=2)  # fmt: skip
    g = torch.Generator().manual_seed(1)
    counts: list = []
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(6, 4, generator=g)
        opt.step()
        t = seam.made[0]
        if isinstance(t, CudaHost):
            counts.append((sum(t.inputs.allocated.values()), sum(t.outputs.allocated.values())))
    for r in opt._roots.in_flight():  # the rounds of step 11: solved, not installed
        assert r.ticket._event.wait(60)
    return counts


def test_the_order_of_the_host_path(monkeypatch) -> None:
    fake_cuda = install_fake(monkeypatch, CudaHost)
    counts = _two_groups(12, fake_cuda)
    assert len(fake_cuda.made) == 1 and len(fake_cuda.streams) == 1  # one transfer, one side stream
    # pinned buffers are reused: per shape at most one per round that can hold it at once (one round
    # per group in flight; whether the two groups' rounds overlap is the worker thread's timing), while
    # every one of the 12 rounds takes its buffers from the pools
    transfer = fake_cuda.made[0]
    assert counts[-1][0] > 0
    for pool in (transfer.inputs, transfer.outputs):
        assert pool.allocated and all(n <= 2 for n in pool.allocated.values()), pool.allocated
        assert pool.handed_out >= 12 * len(pool.allocated) > sum(pool.allocated.values())
    log = [e for e in fake_cuda.log if e[0] not in ("new_stream", "pinned")]
    training = [e[:-1] for e in log if e[-1] == "MainThread"]
    worker = [e[:-1] for e in log if e[-1] == "shampoo-roots"]
    # a send: event on the training stream, the side stream waits on it, copies, the copied event
    sends = [i for i, e in enumerate(training) if e[0] == "record" and e[2] == "training"]
    assert len(sends) == 12  # each group submits at 1, 3, ..., 11
    for i in sends:
        assert training[i + 1] == ("wait_event", "side0", training[i][1])
        j = i + 2
        while training[j][0] == "copy":
            assert training[j] == ("copy", "d2h", "side0") and training[j + 1] == ("record_stream", "side0")
            j += 2
        assert j > i + 2 and training[j][0] == "record" and training[j][2] == "side0"
    # the worker synchronizes a copied event before each solve (the solve checked its inputs landed)
    computes = [i for i, e in enumerate(worker) if e[0] == "compute"]
    assert computes and all(any(x[0] == "synchronize" for x in worker[:i]) for i in computes)
    # a receive: copies into side-stream tensors, the landed event, the training stream waits on it
    # (running the side stream's copies in order), then the install
    installs = [i for i, e in enumerate(training) if e[0] == "install"]
    assert len(installs) == 10  # at 3, 5, ..., 11; the rounds of step 11 are in flight
    for i in installs:
        assert training[i - 1] == ("run", "h2d", "side0")
        k = i - 1
        while training[k][0] == "run":
            k -= 1
        assert training[k][:2] == ("wait_event", "training")
        assert training[k - 1] == ("record", training[k][2], "side0")
        j = k - 2
        while training[j] == ("record_stream", "training"):
            assert training[j - 1] == ("copy", "h2d", "side0") and training[j - 2] == ("empty", "side0")
            j -= 3
        assert j < k - 2
    assert not any(e[:2] == ("run", "h2d") for e in worker)  # the training stream's wait ran them


def test_the_order_of_the_side_stream_path(monkeypatch) -> None:
    seam = install_fake(monkeypatch, CudaSide)
    _two_groups(12, seam)
    assert len(seam.made) == 1 and len(seam.streams) == 1
    log = [e for e in seam.log if e[0] != "new_stream"]
    training = [e[:-1] for e in log if e[-1] == "MainThread"]
    worker = [e[:-1] for e in log if e[-1] == "shampoo-roots"]
    assert not any(e[0] in ("copy", "pinned", "empty") for e in seam.log)  # no host copy
    # a send: the event on the training stream, the snapshots marked as read on the side stream
    produced = [e[1] for e in training if e[0] == "record" and e[2] == "training"]
    assert len(produced) == 12
    # a solve: on the side stream, after waiting for its send's event; its done event last
    rounds = [i for i, e in enumerate(worker) if e[0] == "on"]
    assert len(rounds) == 12
    done = []
    for n, i in enumerate(rounds):
        assert worker[i + 1] == ("wait_event", "side0", produced[n])
        end = worker.index(("off", "side0"), i)
        assert worker[i + 2 : end - 1] and all(e == ("compute",) for e in worker[i + 2 : end - 1])
        assert worker[end - 1][0] == "record" and worker[end - 1][2] == "side0"
        done.append(worker[end - 1][1])
    # an install: the training stream waits for the done event, marks the results it reads
    installs = [i for i, e in enumerate(training) if e[0] == "install"]
    assert len(installs) == 10
    waited = []
    for i in installs:
        k = i - 1
        while training[k] == ("record_stream", "training"):
            k -= 1
        assert k < i - 1 and training[k][:2] == ("wait_event", "training")
        waited.append(training[k][2])
    assert waited == [d for d in done if d in waited] and set(waited) <= set(done)


# -- on CUDA ---------------------------------------------------------------------------------------------


class BlockingSeam(root_transfer.CudaSeam):
    """The real streams replaced by blocking copies on the training stream (the reference)."""

    def new_stream(self, device):
        return torch.cuda.current_stream(device)

    def copy(self, dst, src, stream):
        torch.cuda.synchronize()
        dst.copy_(src)
        torch.cuda.synchronize()


def _recording(select, made: list):
    """``select`` that keeps what it made in ``made``."""

    def recording(root_device, device):
        made.append(select(root_device, device))
        return made[-1]

    return recording


def _cuda_run(kw: dict, steps: int = 14) -> dict:
    torch.manual_seed(0)
    model = golden_runs.Tiny().cuda()
    opt = shampoo.Shampoo(model.named_parameters(), **{**golden_runs.BASE, **kw})
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(20, 8, 8, generator=g).cuda(), torch.randn(20, 8, 3, generator=g).cuda()
    for t in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[t]), Y[t]).backward()
        opt.step()
    torch.cuda.synchronize()
    return golden_runs.flatten_result(model, opt.state_dict())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the host path's real streams)")
def test_cuda_async_roots_against_sync(monkeypatch) -> None:
    soap = {"preconditioner": "soap", "precondition_frequency": 3, "start_preconditioning_step": 3}
    k1 = {"root_schedule": "async", "max_root_delay": 1, "root_threads": 1}
    same = {"implementation": shampoo.ShampooImplementation(root_device="same")}
    host = {"implementation": shampoo.ShampooImplementation(root_device="host")}
    side = {"implementation": shampoo.ShampooImplementation(root_device="device")}
    # solved where the factors live (the worker's default stream, or a side stream), SOAP at delay 1
    # is the synchronous SOAP bit for bit (docs/design.md §6: the same inputs, the same kernels)
    want = _cuda_run(soap)
    pending = [k for k in want if k.endswith("basis_pending")]
    for where in (same, side):
        got = _cuda_run({**soap, **k1, **where})
        assert_same(
            {k: v for k, v in got.items() if k not in pending},
            {k: v for k, v in want.items() if k not in pending},
        )
    assert_same(
        _cuda_run({**k1, "max_root_delay": 2, **side}), _cuda_run({**k1, "max_root_delay": 2, **same})
    )
    # the host path on real streams is the host path with blocking copies, bit for bit
    real = root_transfer.select_transfer
    for kw in ({**soap, **k1, **host}, {**k1, "max_root_delay": 2, **host}):
        made: list = []
        with monkeypatch.context() as m:
            m.setattr(root_transfer, "select_transfer", _recording(real, made))
            streams = _cuda_run(kw)
        assert made and all(isinstance(t, CudaHost) for t in made)
        buffers = [
            b for t in made for pool in (t.inputs, t.outputs) for bs in pool._free.values() for b, _ in bs
        ]
        assert buffers and all(b.is_pinned() for b in buffers)
        with monkeypatch.context() as m:
            m.setattr(root_transfer, "select_transfer", lambda rd, dev: CudaHost(BlockingSeam()))
            blocking = _cuda_run(kw)
        assert_same(streams, blocking)
    # and it computes the roots of the device path to rounding (CPU against CUDA kernels)
    a, b = _cuda_run({**k1, **host}), _cuda_run({**k1, **same})
    for k, v in a.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and "param" in k:
            torch.testing.assert_close(v, b[k], rtol=1e-3, atol=1e-5)
