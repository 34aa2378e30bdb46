"""Data-parallel Shampoo on 2 and 3 gloo ranks equals single-process Shampoo.

Three launch modes per world size: every rank computes the full-batch gradient ("exact", isolates the
optimizer: only the owner computes a block, the all-gather moves it), a plain loop that all-reduces
shard gradients ("plain"), and DistributedDataParallel ("ddp"); plus two param groups ("groups",
exact gradients). The reference is single-process
Shampoo on the full batch. Tolerances:

* exact, fp32 communication: 1e-6 (the same kernels on the same data, one thread everywhere; most
  cases come out bitwise equal, batched eigh over a different stack of blocks differs by ~1e-7);
* plain / ddp: 1e-4 relative, 1e-5 absolute: the averaged shard gradients differ from the full-batch
  gradient by fp32 rounding (~1e-7), which Shampoo's inverse roots amplify by up to kappa/p;
* bf16 communication: 2e-2 relative, 2e-3 absolute after K steps (each direction is rounded to bf16,
  u = 3.9e-3, before it is applied; errors add up over the K steps).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _dist import run_ranks
from torch import nn

import shampoo
from shampoo.distributed import state_bytes

STEPS = 6
BATCH = 24  # divisible by 2 and 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 6))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH, 12, generator=g), torch.randn(STEPS, BATCH, 6, generator=g)


def _opt(model: nn.Module, solver: str, distributed=None, groups: bool = False) -> shampoo.Shampoo:
    params: list = list(model.named_parameters())
    if groups:  # matrices with weight decay, vectors without: one all-gather per group
        params = [
            {"params": [(n, p) for n, p in params if p.ndim > 1]},
            {"params": [(n, p) for n, p in params if p.ndim <= 1], "weight_decay": 0.0},
        ]
    return shampoo.Shampoo(
        params,
        lr=3e-2,
        betas=(0.9, 0.99),
        eps=1e-4,
        momentum=0.5,
        weight_decay=1e-3,
        max_preconditioner_dim=6,
        precondition_frequency=2,
        start_preconditioning_step=2,
        grafting="adam",
        root_solver=solver,
        distributed=distributed,
    )


def reference(solver: str, groups: bool = False) -> tuple[dict[str, torch.Tensor], int]:
    """Single-process parameters after STEPS steps, and its block-state bytes."""
    model = _model()
    opt = _opt(model, solver, groups=groups)
    X, Y = _data()
    for t in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(X[t]), Y[t]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}, state_bytes(opt)["blocks"]


def _run(rank: int, ws: int, mode: str, solver: str, comm: str) -> dict:
    model = _model()
    net = nn.parallel.DistributedDataParallel(model) if mode == "ddp" else model
    opt = _opt(
        model, solver, shampoo.DDPConfig(communication_dtype=comm, timeout=60), groups=mode == "groups"
    )
    X, Y = _data()
    shard = slice(rank * BATCH // ws, (rank + 1) * BATCH // ws)
    for t in range(STEPS):
        opt.zero_grad()
        if mode in ("exact", "groups"):
            nn.functional.mse_loss(net(X[t]), Y[t]).backward()
        else:
            nn.functional.mse_loss(net(X[t, shard]), Y[t, shard]).backward()
        if mode == "plain":
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(ws)
        opt.step()
    return {
        "params": {k: v.detach().clone() for k, v in model.named_parameters()},
        "bytes": state_bytes(opt),
        "comm_calls": opt.sharding.comm.calls,
        "owned": len(opt.sharding.assignment.owned_by(rank)),
    }


CASES = [
    ("exact", "eigh", "fp32"),
    ("exact", "coupled_newton", "fp32"),
    ("plain", "eigh", "fp32"),
    ("ddp", "coupled_newton", "fp32"),
    ("exact", "eigh", "bf16"),
    ("groups", "eigh", "fp32"),
]
TOL = {
    "exact": (1e-6, 1e-6),
    "groups": (1e-6, 1e-6),
    "plain": (1e-4, 1e-5),
    "ddp": (1e-4, 1e-5),
    "bf16": (2e-2, 2e-3),
}


def _body(rank: int, ws: int) -> list[dict]:
    torch.manual_seed(123 + rank)  # ranks must not rely on a shared RNG state
    return [_run(rank, ws, *case) for case in CASES]


@pytest.fixture(scope="module")
def references() -> dict[tuple[str, bool], tuple[dict[str, torch.Tensor], int]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: BLAS results depend on the thread count
    try:
        return {
            (s, g): reference(s, g) for s, g in [("eigh", False), ("coupled_newton", False), ("eigh", True)]
        }
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_match_single_process(world_size, references):
    per_rank = run_ranks(_body, world_size)
    for c, (mode, solver, comm) in enumerate(CASES):
        ref, ref_bytes = references[(solver, mode == "groups")]
        rtol, atol = TOL["bf16" if comm == "bf16" else mode]
        for rank, results in enumerate(per_rank):
            res = results[c]
            # Every rank applies the same update: bitwise identical replicas.
            for k, v in res["params"].items():
                assert torch.equal(v, per_rank[0][c]["params"][k]), (mode, solver, comm, rank, k)
            for k, v in res["params"].items():
                torch.testing.assert_close(v, ref[k], rtol=rtol, atol=atol, msg=f"{mode} {solver} {comm} {k}")
            # One coalesced all-gather per step (one param group).
            assert res["comm_calls"] == STEPS * (2 if mode == "groups" else 1)
            assert res["owned"] >= 1
        # Sharded state: the ranks' block states partition the single-process block state.
        per = [r[c]["bytes"]["blocks"] for r in per_rank]
        assert sum(per) == ref_bytes and max(per) < 0.6 * ref_bytes
