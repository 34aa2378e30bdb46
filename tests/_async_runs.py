"""What the asynchronous-roots tests share (tests/test_async_shampoo.py, tests/test_async_soap.py): one
intra-op thread, exact comparison of flattened results, the small parameters and fixed gradient
stream, the documented submission schedule, and a small model on fixed data."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import shampoo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import golden_runs


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread for the training thread (the background thread's budget is root_threads=1):
    the synchronous and background computations then run the same kernels on the same bits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    bad = [k for k in a if not equal(a[k], b[k])]
    assert not bad, bad[:5]


def make_params() -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(0)
    return [
        ("w", torch.nn.Parameter(torch.randn(6, 5))),
        ("cube", torch.nn.Parameter(torch.randn(2, 3, 4))),
        ("b", torch.nn.Parameter(torch.randn(5))),
    ]


def grad_stream(steps: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    shapes = [p.shape for _, p in make_params()]
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]


def submissions(steps: int, start: int, freq: int, delay: int) -> list[int]:
    """The documented schedule: the first submission is the first step falling due; the next is
    max(first step falling due after it, its install step)."""
    due = [t for t in range(1, steps + 1) if t >= start and (t - start) % freq == 0]
    subs = [due[0]]
    while True:
        later = [t for t in due if t > subs[-1]]
        if not later or max(later[0], subs[-1] + delay) > steps:
            return subs
        subs.append(max(later[0], subs[-1] + delay))


def model_run(opt_kw: dict, steps: range, model=None, opt=None):
    """A small model on fixed data: (model, optimizer) after ``steps`` (the step numbers, from 1)."""
    if model is None:
        torch.manual_seed(0)
        model = golden_runs.Tiny()
        opt = shampoo.Shampoo(model.named_parameters(), **{**golden_runs.BASE, **opt_kw})
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(20, 8, 8, generator=g), torch.randn(20, 8, 3, generator=g)
    for t in steps:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[t - 1]), Y[t - 1]).backward()
        opt.step()
    return model, opt
