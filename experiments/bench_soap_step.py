"""CPU step time of eigenvalue-corrected Shampoo (SOAP) vs Shampoo(eigh), Shampoo(eigh_warm) and AdamW.

Models: workload W1 (``get_task("w1")``: 4-layer encoder, d_model 256, ff 1024, seq 128, batch 16 by
default) and the byte LM of the validation runner (``get_task("bytes_lm")``). Every configuration
trains its own copy of the same model on the same batches; the configurations are interleaved in one
process, round by round (the order rotating each round), each round one chunk of ``--frequency``
steps per configuration (so every Shampoo/SOAP chunk contains exactly one root / basis round).
Reported: the median over rounds of the per-step **process CPU time** (one thread; immune to other
processes on a shared machine, unlike wall time) of the full training step (forward, backward,
``opt.step()``) and of ``opt.step()`` alone, each as a ratio to AdamW's in the same run, plus the load
average. Every configuration first takes ``--frequency + 1`` untimed steps (state created, a first
root / basis computed).

    nice -n 5 python experiments/bench_soap_step.py --tasks w1 bytes_lm --rounds 5

Configurations: AdamW; Shampoo (Adam grafting, blocks <= 256, ``root_solver`` eigh or eigh_warm);
SOAP (``shampoo.SOAP`` as the group's preconditioner, no grafting, ``basis_update`` eigh_warm (its
default), eigh or qr). All with precondition frequency ``--frequency`` (10) from step 1.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import shampoo
from matroots.study.validation.tasks import get_task


def configs(frequency: int, lr: float) -> dict[str, Callable[[torch.nn.Module], torch.optim.Optimizer]]:
    common = {"lr": lr, "precondition_frequency": frequency, "start_preconditioning_step": 1,
              "max_preconditioner_dim": 256}  # fmt: skip

    def sh(solver: str) -> Callable[[torch.nn.Module], torch.optim.Optimizer]:
        return lambda m: shampoo.Shampoo(m.named_parameters(), root_solver=solver, grafting="adam", **common)

    def soap(basis: str) -> Callable[[torch.nn.Module], torch.optim.Optimizer]:
        pre = shampoo.SOAP(basis_update=basis)
        return lambda m: shampoo.Shampoo(
            [{"params": list(m.named_parameters()), "preconditioner": pre}], grafting="none", **common
        )

    return {
        "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0),
        "shampoo_eigh": sh("eigh"),
        "shampoo_eigh_warm": sh("eigh_warm"),
        "soap_eigh_warm": soap("eigh_warm"),
        "soap_eigh": soap("eigh"),
        "soap_qr": soap("qr"),
    }


def run(task_name: str, rounds: int, frequency: int, lr: float, batch_size: int | None) -> dict[str, Any]:
    size = {"batch_size": batch_size} if batch_size else {}
    task = get_task(task_name, **size)
    base = task.build_model(0)
    cfgs = configs(frequency, lr)
    pairs = {}
    for name, make in cfgs.items():
        model = copy.deepcopy(base)
        pairs[name] = (model, make(model), task.batches(1))

    def step(name: str) -> tuple[float, float]:
        model, opt, batches = pairs[name]
        c0 = time.process_time()
        opt.zero_grad(set_to_none=True)
        task.loss(model, next(batches)).backward()
        c1 = time.process_time()
        opt.step()
        c2 = time.process_time()
        return c2 - c0, c2 - c1

    for name in cfgs:  # untimed warm-up: state, a first root / basis round
        for _ in range(frequency + 1):
            step(name)
    full: dict[str, list[float]] = {n: [] for n in cfgs}
    optim: dict[str, list[float]] = {n: [] for n in cfgs}
    names = list(cfgs)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            ts = [step(name) for _ in range(frequency)]
            full[name].append(sum(t[0] for t in ts) / frequency)
            optim[name].append(sum(t[1] for t in ts) / frequency)
    med = {n: statistics.median(v) for n, v in full.items()}
    med_o = {n: statistics.median(v) for n, v in optim.items()}
    soap_rows = [
        r
        for d in pairs["soap_eigh_warm"][1].diagnostics()
        for r in d.rows()
        if str(r.get("solver", "")).startswith("soap")
    ]
    warm = [str(r["warm"]).split(" (")[0] for r in soap_rows]  # verdicts without their numbers
    return {
        "task": task_name,
        "params": sum(p.numel() for p in base.parameters()),
        "rounds": rounds,
        "frequency": frequency,
        "step_cpu_s": med,
        "opt_step_cpu_s": med_o,
        "step_ratio_vs_adamw": {n: med[n] / med["adamw"] for n in cfgs},
        "opt_step_ratio_vs_adamw": {n: med_o[n] / med_o["adamw"] for n in cfgs},
        "spread": {n: [min(v) / med[n], max(v) / med[n]] for n, v in full.items()},
        "soap_eigh_warm_verdicts": {w: warm.count(w) for w in sorted(set(warm))},
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["w1", "bytes_lm"], choices=["w1", "bytes_lm"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frequency", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=None, help="default: the task's (16)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    for t in args.tasks:
        res = run(t, args.rounds, args.frequency, args.lr, args.batch_size)
        results.append(res)
        print(f"== {t} ({res['params']} parameters, {args.rounds} rounds x {args.frequency} steps, "
              f"load {res['load_average'][0]:.1f})")  # fmt: skip
        print(
            f"{'config':20s} {'step cpu s':>11s} {'x AdamW':>8s} {'opt.step s':>11s} {'x AdamW':>8s}  spread"
        )
        for n in res["step_cpu_s"]:
            lo, hi = res["spread"][n]
            print(f"{n:20s} {res['step_cpu_s'][n]:11.4f} {res['step_ratio_vs_adamw'][n]:8.3f} "
                  f"{res['opt_step_cpu_s'][n]:11.4f} {res['opt_step_ratio_vs_adamw'][n]:8.3f}  "
                  f"[{lo:.2f}, {hi:.2f}]")  # fmt: skip
        print(f"soap_eigh_warm basis verdicts at the end: {res['soap_eigh_warm_verdicts']}")
        sys.stdout.flush()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
