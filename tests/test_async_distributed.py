"""Asynchronous roots under data-parallel Shampoo (2 gloo ranks): each rank computes its own blocks'
roots on its background thread and installs them at the same global step, so the ranks apply the same
root generation at every step and together are the single process with the same schedule.

Every rank computes the full-batch gradient (the "exact" mode of test_distributed_equivalence.py), so
only the optimizer differs. Tolerance 1e-6 as there: the same kernels on the same data, one thread
everywhere; a batched solve over a different stack of blocks may round differently (~1e-7). The
schedule itself (generation, snapshot step, round in flight per block) is compared exactly.
"""

from __future__ import annotations

import pytest
import torch
from _dist import run_ranks
from torch import nn

import shampoo

K1, K2 = 7, 6  # steps before and after the checkpoint; with frequency 3, delay 2 a round is in flight at 7


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(9, 8), nn.Tanh(), nn.Linear(8, 4))


def _opt(model: nn.Module, distributed, preconditioner: str | None = None) -> shampoo.Shampoo:
    """``preconditioner="soap"``: SOAP's eigenbasis refreshes are the rounds in the background."""
    return shampoo.Shampoo(
        model.named_parameters(), lr=3e-2, betas=(0.9, 0.99), eps=1e-4, momentum=0.5,
        max_preconditioner_dim=5, precondition_frequency=3, start_preconditioning_step=3,
        root_solver="coupled_newton", root_schedule="async", max_root_delay=2, distributed=distributed,
        preconditioner=preconditioner,
    )  # fmt: skip


def _steps(model: nn.Module, opt: shampoo.Shampoo, start: int, stop: int) -> list:
    """Steps start+1..stop; the schedule after each: {(param, block): (generation, snapshot, pending)}."""
    seen = []
    for t in range(start, stop):
        g = torch.Generator().manual_seed(t)
        x, y = torch.randn(16, 9, generator=g), torch.randn(16, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()  # every rank: the full batch
        opt.step()
        seen.append(
            {(r.param, r.block): (r.generation, r.snapshot_step, r.pending) for r in opt.root_status()}
        )
    return seen


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _ranked(rank: int, ws: int, preconditioner: str | None) -> dict:
    model = _model()
    opt = _opt(model, shampoo.DDPConfig(timeout=60), preconditioner)
    seen = _steps(model, opt, 0, K1)
    ckpt = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optim": opt.state_dict()}
    seen += _steps(model, opt, K1, K1 + K2)
    return {"seen": seen, "params": _params(model), "ckpt": ckpt}


@pytest.mark.parametrize("preconditioner", [None, "soap"])
def test_two_ranks_async_equal_one_process_async_and_resume_across_world_sizes(preconditioner) -> None:
    r0, r1 = run_ranks(_ranked, 2, preconditioner)
    model = _model()
    opt = _opt(model, None, preconditioner)
    single = _steps(model, opt, 0, K1 + K2)
    # the ranks own disjoint blocks; together they follow the single process's schedule exactly
    for t, (a, b, s) in enumerate(zip(r0["seen"], r1["seen"], single, strict=True)):
        assert not a.keys() & b.keys() and {**a, **b} == s, t + 1
    assert any(p for _, _, p in single[K1 - 1].values())  # the checkpoint holds a round in flight
    for k, v in _params(model).items():
        assert torch.equal(r0["params"][k], r1["params"][k]), k  # the all-gather: the same on every rank
        torch.testing.assert_close(r0["params"][k], v, rtol=1e-5, atol=1e-6)
    # saved on 2 ranks with a round in flight, loaded on 1 process: it solves the round again from the
    # saved inputs, installs it at the saved step and continues as the uninterrupted run
    model2 = _model()
    model2.load_state_dict(r0["ckpt"]["model"])
    opt2 = _opt(model2, None, preconditioner)
    opt2.load_state_dict(r0["ckpt"]["optim"])
    assert _steps(model2, opt2, K1, K1 + K2) == single[K1:]
    for k, v in _params(model).items():
        torch.testing.assert_close(_params(model2)[k], v, rtol=1e-5, atol=1e-6)
