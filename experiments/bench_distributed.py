"""Distributed Shampoo on workload W1: per-rank optimizer step time, communication, state memory.

Runs W1 (docs/design.md §8: 4-layer encoder, d_model 256, 4 heads, ff 1024, vocab 512, seq 128, global
batch 16; Shampoo with blocks of 256, precondition_frequency 10, Adam grafting, eigh roots) on
``world_size`` local gloo ranks with ``--threads`` intra-op threads each, for every world size given.
World size 1 is plain single-process Shampoo (no ``DDPConfig``), the baseline. With more ranks the
model is wrapped in DistributedDataParallel and each rank takes 16/world of the batch.

Measured per rank over the timed steps (a multiple of the precondition frequency, after warm-up, so
root computations enter at their true rate):

* ``opt_step``: mean wall time of ``opt.step()``; ranks are lined up with a barrier before it, so it
  does not include waiting for another rank's backward. ``cpu``: the process CPU time of the same
  calls, a check against other load on the machine (on a shared 2-core box the wall time of the
  2-rank run suffers from any other process; the CPU time much less);
* ``comm``: time inside the direction all-gather (includes waiting for the slowest rank to reach it,
  i.e. load imbalance), and its share of ``opt_step``;
* ``gather_only``: the same all-gather timed alone after a barrier (pure transfer + synchronisation);
* ``state``: optimizer-state bytes held by the rank (owned blocks + replicated momentum buffers).

    python experiments/bench_distributed.py                           # world sizes 1 and 2, 1 thread
    python experiments/bench_distributed.py --repeats 3 --comm-dtype bf16 --out runs/bench_dist.json

Measured 2026-11-30 on the 2-core dev box, torch 2.13 CPU, quiet windows (load < 0.6 at the start),
``--steps 20 --warmup 10 --repeats 2-3``. Optimizer step, slowest of 2 ranks / 1 rank (1 thread each):
fp32 0.58-0.62 wall (0.56-0.59 CPU), bf16 0.60 wall (0.57 CPU); the all-gather is 10-11% of the
2-rank step in fp32 (6.8 MB per rank, ~9 ms), 7% in bf16. Block state per rank 41.8 / 41.1 MB against
82.9 MB in one process; exchange buffers 20.8 MB (fp32) / 10.4 MB (bf16) per rank. With other jobs
on the box the 2-rank wall time is dominated by CPU contention (ratios 1.1-1.5 seen); the CPU-time
column stays at 0.56-0.66.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train import VOCAB, W1Model, markov_tokens

import shampoo
import shampoo.distributed as sd

BATCH = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, ws: int, port: int, args: argparse.Namespace, outdir: str) -> None:
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=ws,
        timeout=datetime.timedelta(seconds=600),
    )
    torch.manual_seed(0)
    model = W1Model()
    net: nn.Module = nn.parallel.DistributedDataParallel(model) if ws > 1 else model
    opt = shampoo.Shampoo(
        model.named_parameters(),
        lr=1e-3,
        max_preconditioner_dim=256,
        precondition_frequency=args.frequency,
        start_preconditioning_step=args.frequency,
        grafting="adam",
        root_solver=args.root_solver,
        distributed=shampoo.DDPConfig(communication_dtype=args.comm_dtype) if ws > 1 else None,
    )
    sharding = sd.sharding_of(opt)
    shard = slice(rank * BATCH // ws, (rank + 1) * BATCH // ws)
    opt_times, opt_cpu, comm_times, root_times, losses = [], [], [], [], []
    for step in range(args.warmup + args.steps):
        x, y = markov_tokens(BATCH, step, 0)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(net(x[shard]).reshape(-1, VOCAB), y[shard].reshape(-1))
        loss.backward()
        dist.barrier()
        c0 = sharding.comm.seconds if sharding else 0.0
        r0 = opt.timing.root_seconds
        t0, p0 = time.perf_counter(), time.process_time()
        opt.step()
        t1, p1 = time.perf_counter(), time.process_time()
        if step >= args.warmup:
            opt_times.append(t1 - t0)
            opt_cpu.append(p1 - p0)
            comm_times.append((sharding.comm.seconds if sharding else 0.0) - c0)
            root_times.append(opt.timing.root_seconds - r0)
            losses.append(float(loss.detach()))
    gather_only: list[float] = []
    exchange = None
    if sharding is not None:
        eng = next(e for e in opt._engines if e is not None)
        _, exchange, _ = sharding._plan(eng.plan)
        local = [torch.zeros(n) for n in exchange.numels[rank]]
        for _ in range(10):
            dist.barrier()
            t0 = time.perf_counter()
            exchange.gather(local)
            gather_only.append(time.perf_counter() - t0)
    rec = {
        "rank": rank,
        "world_size": ws,
        "opt_step": statistics.mean(opt_times),
        "opt_step_median": statistics.median(opt_times),
        "opt_step_cpu": statistics.mean(opt_cpu),
        "comm": statistics.mean(comm_times),
        "root": statistics.mean(root_times),
        "gather_only": statistics.median(gather_only) if gather_only else 0.0,
        "gather_bytes": sharding.comm.bytes_sent // max(sharding.comm.calls, 1) if sharding else 0,
        "state": sd.state_bytes(opt),
        "blocks_owned": len(sharding.assignment.owned_by(rank)) if sharding else None,
        "imbalance": sharding.assignment.imbalance if sharding else 1.0,
        "exchange_bytes": (exchange.world_size + 1) * exchange.bytes_per_rank if sharding else 0,
        "last_loss": losses[-1],
    }
    torch.save(rec, Path(outdir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def run_world(ws: int, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank_main, args=(ws, _free_port(), args, tmp), nprocs=ws, start_method="spawn")
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(ws)]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--steps", type=int, default=20, help="timed steps (a multiple of --frequency)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (includes the first roots)")
    p.add_argument("--frequency", type=int, default=10)
    p.add_argument("--root-solver", default="eigh")
    p.add_argument("--comm-dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--repeats", type=int, default=1, help="interleaved repeats; the best is reported")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    runs: dict[int, list[list[dict]]] = {ws: [] for ws in args.world_sizes}
    for _ in range(args.repeats):  # interleaved, so slow phases of the machine hit every world size
        for ws in args.world_sizes:
            runs[ws].append(run_world(ws, args))
    # Per world size, the repeat whose slowest rank was fastest (best-of: robust to other load).
    results = {ws: min(reps, key=lambda recs: max(r["opt_step"] for r in recs)) for ws, reps in runs.items()}
    base = max(r["opt_step"] for r in results[min(results)])
    base_cpu = max(r["opt_step_cpu"] for r in results[min(results)])
    print(
        f"W1, {args.threads} thread(s)/rank, {args.steps} timed steps, frequency {args.frequency}, "
        f"{args.root_solver}, communication {args.comm_dtype}, best of {args.repeats}"
    )
    head = "world rank  opt_step[s] ratio  cpu[s] ratio  comm[s] comm%  gather_only[s] roots[s]"
    print(head + "  state[MB] (blocks+repl)  exchange buffers[MB]  blocks owned")
    for ws, recs in results.items():
        for r in recs:
            st = r["state"]
            print(
                f"{ws:5d} {r['rank']:4d}  {r['opt_step']:11.4f} {r['opt_step'] / base:5.2f}  "
                f"{r['opt_step_cpu']:6.4f} {r['opt_step_cpu'] / base_cpu:5.2f}  {r['comm']:7.4f} "
                f"{100 * r['comm'] / r['opt_step']:4.1f}%  {r['gather_only']:14.4f} {r['root']:8.4f}  "
                f"{st['total'] / 1e6:9.2f} ({st['blocks'] / 1e6:.2f}+{st['replicated'] / 1e6:.2f})  "
                f"{r['exchange_bytes'] / 1e6:20.2f}  {r['blocks_owned']}"
            )
    summary = {
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        "loadavg_after": os.getloadavg(),
        "results": {str(k): v for k, v in results.items()},
        "all_repeats": {str(k): v for k, v in runs.items()},
        "ratio_max_rank_vs_single": {
            str(ws): max(r["opt_step"] for r in recs) / base for ws, recs in results.items()
        },
        "cpu_ratio_max_rank_vs_single": {
            str(ws): max(r["opt_step_cpu"] for r in recs) / base_cpu for ws, recs in results.items()
        },
    }
    print("optimizer step ratio, slowest rank / single process, wall:", summary["ratio_max_rank_vs_single"])
    print(
        "                                                     cpu: ", summary["cpu_ratio_max_rank_vs_single"]
    )
    print("load average after the run:", summary["loadavg_after"])
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2, default=str))
    return summary


if __name__ == "__main__":
    main()
