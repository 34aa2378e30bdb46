"""Step time of two versions of Shampoo against AdamW, interleaved in one process (issue 14's
before/after measurement of the per-block transform refactor).

The "before" version is a snapshot of the ``shampoo`` package renamed ``shampoo_old`` (all its
imports are relative), e.g. made with::

    mkdir -p /tmp/old && git archive <commit> shampoo | tar -x -C /tmp/old && mv /tmp/old/shampoo /tmp/old/shampoo_old

Workloads: ``w1`` (the W1 encoder of experiments/bench_step.py: blocks 256, Adam grafting, eigh,
precondition_frequency 10) and ``bytes_lm`` (matroots.study.validation.tasks' byte-level LM with the
validation defaults: blocks 256, Adam grafting). Every configuration trains its own copy of the
model from the same weights on the same batches; configurations run in chunks of ``--chunk`` steps
(a multiple of the frequency, so each chunk holds the same root rounds), in the order ABC CBA ...
Reported per configuration: the median over chunks of the mean total step time (zero_grad + forward
+ backward + step) and of the optimizer step alone, and their ratios to AdamW; plus the 1-minute
load average per round.

    nice -n 10 python experiments/bench_step_ab.py --old /tmp/old --workload w1 --rounds 4
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import shampoo


def _w1(seed: int):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_step import BATCH, SEQ, VOCAB, W1Model

    torch.manual_seed(seed)
    init = W1Model().state_dict()

    def model() -> nn.Module:
        m = W1Model()
        m.load_state_dict(init)
        return m

    g = torch.Generator().manual_seed(seed)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(8)]

    def loss(m: nn.Module, i: int) -> torch.Tensor:
        b = data[i % len(data)]
        return nn.functional.cross_entropy(m(b[:, :-1]).reshape(-1, VOCAB), b[:, 1:].reshape(-1))

    return model, loss


def _bytes_lm(seed: int):  # type: ignore[no-untyped-def]
    from matroots.study.validation.tasks import get_task

    task = get_task("bytes_lm")
    init = task.build_model(seed).state_dict()
    it = task.batches(seed)
    data = [next(it) for _ in range(8)]

    def model() -> nn.Module:
        m = task.build_model(seed)
        m.load_state_dict(init)
        return m

    def loss(m: nn.Module, i: int) -> torch.Tensor:
        return task.loss(m, data[i % len(data)])

    return model, loss


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="directory holding the shampoo_old package")
    ap.add_argument("--workload", choices=["w1", "bytes_lm"], default="w1")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=10)
    ap.add_argument("--frequency", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--step-only",
        action="store_true",
        help="time optimizer.step() alone on fixed random gradients (no forward/backward): the part the "
        "refactor changes, at a fraction of the cost on a loaded machine",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(args.old))
    old = importlib.import_module("shampoo_old")
    build, loss_fn = (_w1 if args.workload == "w1" else _bytes_lm)(0)
    kw = dict(
        lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01, max_preconditioner_dim=256,
        precondition_frequency=args.frequency, start_preconditioning_step=1, grafting="adam", root_solver="eigh",
    )  # fmt: skip
    runs: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {}
    m = build()
    runs["adamw"] = (m, torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01))
    for name, mod in (("shampoo_before", old), ("shampoo_after", shampoo)):
        m = build()
        runs[name] = (m, mod.Shampoo(m.named_parameters(), **kw))
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    step = {k: 0 for k in runs}

    if args.step_only:
        g = torch.Generator().manual_seed(1)
        grads = [torch.randn(p.shape, generator=g) * 1e-2 for p in runs["adamw"][0].parameters()]
        for model, _ in runs.values():
            for p, gr in zip(model.parameters(), grads, strict=True):
                p.grad = gr.clone()

    def chunk(name: str, n: int) -> tuple[float, float]:
        model, opt = runs[name]
        tot = opt_t = 0.0
        for _ in range(n):
            t0 = time.perf_counter()
            if not args.step_only:
                opt.zero_grad(set_to_none=True)
                loss_fn(model, step[name]).backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            tot, opt_t, step[name] = tot + t2 - t0, opt_t + t2 - t1, step[name] + 1
        return tot / n, opt_t / n

    for name in runs:  # warm-up: one chunk each (includes the first, cold root round)
        chunk(name, args.chunk)
    loads = [os.getloadavg()[0]]
    names = list(runs)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(chunk(name, args.chunk))
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.3f}s" for k, v in times.items()), flush=True)
    base = [statistics.median(x[i] for x in times["adamw"]) for i in (0, 1)]
    print(
        f"\n{args.workload}, {args.threads} threads, {args.rounds} rounds x {args.chunk} steps, frequency "
        f"{args.frequency}; load average {min(loads):.1f}-{max(loads):.1f}"
    )
    print(f"{'config':<16}{'total s':>9}{'optim s':>9}{'total/AdamW':>13}{'optim/AdamW':>13}")
    for name, xs in times.items():
        tot, opt_t = (statistics.median(x[i] for x in xs) for i in (0, 1))
        print(f"{name:<16}{tot:>9.4f}{opt_t:>9.4f}{tot / base[0]:>12.3f}x{opt_t / base[1]:>12.2f}x")
    b = [statistics.median(x[i] for x in times["shampoo_before"]) for i in (0, 1)]
    a = [statistics.median(x[i] for x in times["shampoo_after"]) for i in (0, 1)]
    print(f"after/before: total {a[0] / b[0]:.3f}, optimizer step {a[1] / b[1]:.3f}")


if __name__ == "__main__":
    main()
