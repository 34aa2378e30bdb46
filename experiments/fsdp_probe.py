"""What torch's FSDP2 (``torch.distributed.fsdp.fully_shard``, DTensor) does on CPU with gloo.

Spawns ``--world`` gloo ranks (default 2) on 127.0.0.1; each runs a list of small checks on a tiny
model and reports "ok" with a detail or the first line of the exception. Rank 0 prints one line per
check. The findings are recorded in docs/design.md (§6, "FSDP2").

    python experiments/fsdp_probe.py            # 2 ranks
    python experiments/fsdp_probe.py --world 4  # 4 ranks (adds HSDP 2x2)
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 4))


def _batch(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(4 * world, 8, generator=g), torch.randn(4 * world, 4, generator=g)
    return X[4 * rank : 4 * rank + 4], Y[4 * rank : 4 * rank + 4]


def _full_grads(world: int) -> dict[str, torch.Tensor]:
    m = _model()
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(4 * world, 8, generator=g), torch.randn(4 * world, 4, generator=g)
    nn.functional.mse_loss(m(X), Y).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def check_forward_backward(rank: int, world: int, tmp: str) -> str:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    m = _model()
    for layer in (m[0], m[2]):
        fully_shard(layer)
    fully_shard(m)
    X, Y = _batch(rank, world)
    nn.functional.mse_loss(m(X), Y).backward()
    ref = _full_grads(world)
    worst = 0.0
    places = set()
    for n, p in m.named_parameters():
        assert isinstance(p, DTensor) and isinstance(p.grad, DTensor), type(p.grad)
        places.add(str(p.grad.placements))
        worst = max(worst, float((p.grad.full_tensor() - ref[n]).abs().max()))
    local = {n: tuple(p.to_local().shape) for n, p in m.named_parameters()}
    return (
        f"grads {sorted(places)} (reduce-scatter), max |grad - full-batch| {worst:.1e}, local shapes {local}"
    )


def check_reshard(rank: int, world: int, tmp: str) -> str:
    from torch.distributed.fsdp import fully_shard

    out = []
    for rar in (True, False, 1 if world > 1 else True):
        m = _model()
        try:
            for layer in (m[0], m[2]):
                fully_shard(layer, reshard_after_forward=rar)
            fully_shard(m, reshard_after_forward=rar)
            X, Y = _batch(rank, world)
            nn.functional.mse_loss(m(X), Y).backward()
            out.append(f"{rar!r}: ok")
        except Exception as err:
            out.append(f"{rar!r}: {type(err).__name__}: {str(err).splitlines()[0]}")
    return "; ".join(out)


def check_mixed_precision(rank: int, world: int, tmp: str) -> str:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    m = _model()
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in (m[0], m[2]):
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(m, mp_policy=mp_policy)
    X, Y = _batch(rank, world)
    out = m(X)
    nn.functional.mse_loss(out.float(), Y).backward()
    p = next(m.parameters())
    return f"forward in {out.dtype}, sharded params {p.dtype}, grads {p.grad.dtype}"


def check_bf16_params(rank: int, world: int, tmp: str) -> str:
    from torch.distributed.fsdp import fully_shard

    m = _model().to(torch.bfloat16)
    fully_shard(m)
    X, Y = _batch(rank, world)
    nn.functional.mse_loss(m(X.bfloat16()).float(), Y).backward()
    p = next(m.parameters())
    return f"bf16 sharded params {p.dtype}, grads {p.grad.dtype} {p.grad.placements}"


def check_dcp_adamw(rank: int, world: int, tmp: str) -> str:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    m = _model()
    fully_shard(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    X, Y = _batch(rank, world)
    nn.functional.mse_loss(m(X), Y).backward()
    opt.step()
    osd = get_optimizer_state_dict(m, opt)
    kinds = {type(v).__name__ for s in osd["state"].values() for v in s.values()}
    path = os.path.join(tmp, "dcp")
    dcp.save({"model": get_model_state_dict(m), "optim": osd}, checkpoint_id=path)
    m2 = _model()
    fully_shard(m2)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-2)
    osd2 = get_optimizer_state_dict(m2, opt2)
    dcp.load({"optim": osd2}, checkpoint_id=path)
    set_optimizer_state_dict(m2, opt2, osd2)
    same = all(
        torch.equal(opt.state[p]["exp_avg"].to_local(), opt2.state[q]["exp_avg"].to_local())
        for p, q in zip(m.parameters(), m2.parameters(), strict=True)
    )
    return f"state value types {sorted(kinds)}, keys {list(osd['state'])[:2]}..., reloaded equal {same}"


def check_hsdp(rank: int, world: int, tmp: str) -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out = []
    shapes = [(world, 1), (1, world)] + ([(2, world // 2)] if world >= 4 and world % 2 == 0 else [])
    for shape in shapes:
        try:
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
            m = _model()
            fully_shard(m, mesh=mesh)
            X, Y = _batch(rank, world)
            nn.functional.mse_loss(m(X), Y).backward()
            ref = _full_grads(world)
            worst = max(float((p.grad.full_tensor() - ref[n]).abs().max()) for n, p in m.named_parameters())
            p = next(m.parameters())
            out.append(f"{shape}: {p.grad.placements}, max |grad - full-batch| {worst:.1e}")
        except Exception as err:
            out.append(f"{shape}: {type(err).__name__}: {str(err).splitlines()[0]}")
    return "; ".join(out)


CHECKS = [
    check_forward_backward,
    check_reshard,
    check_mixed_precision,
    check_bf16_params,
    check_dcp_adamw,
    check_hsdp,
]


def _entry(rank: int, world: int, port: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    for check in CHECKS:
        try:
            msg = "ok: " + check(rank, world, tmp)
        except Exception as err:
            msg = f"FAILED: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            if os.environ.get("PROBE_TRACE"):
                traceback.print_exc()
        dist.barrier()
        if rank == 0:
            print(f"{check.__name__.removeprefix('check_')}: {msg}", flush=True)
    dist.destroy_process_group()
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, gloo, CPU, {args.world} ranks")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_entry, args=(args.world, port, tmp), nprocs=args.world, start_method="spawn")


if __name__ == "__main__":
    main()
