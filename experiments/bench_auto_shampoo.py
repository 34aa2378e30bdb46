"""Shampoo with root_solver="auto" vs fixed eigh on the validation tasks: root time share, loss, choices.

    .venv/bin/python experiments/bench_auto_shampoo.py --tasks digits lsq --steps 200 --frequency 10 \
        --repeats 3 --targets 0.01

For each task and solver: the same seed (same initial weights and data order), ``--steps`` steps of
Shampoo (Adam grafting, blocks <= 256, preconditioning from step ``--frequency`` every ``--frequency``
steps), one torch thread. Prints the validation loss (and the task's metric), the root-computation
share of the optimizer step time (wall, ``opt.timing``) and the process CPU seconds of the run, root
failures, and the configurations "auto" chose per factor (``opt.diagnostics()``) with the table cell
reasons of the last round. Timing on a shared machine is noisy: the runs of a task are interleaved
(auto, eigh, auto, eigh, ...) ``--repeats`` times and the median share reported.

Measured 2026-12-01 on the shared 2-core CPU machine (load ~15-30, nice 5), shipped CPU table:

    digits  auto (1e-1)  val_loss 0.04302  root share 55.6%   every factor eigh (n=10: outside the table)
    digits  eigh         val_loss 0.04302  root share 54.6%
    digits  auto@1e-2    val_loss 0.04304  root share 77.1%   coupled Newton for 3 of 6 factors (kappa 2e4..1e6)
    lsq     auto (1e-1)  val_loss 0.3406   root share 60.3%   eigh
    lsq     eigh         val_loss 0.3406   root share 47.6%
    lsq     auto@1e-2    val_loss 0.3406   root share 75.0%   coupled Newton for the n=60 factor (kappa 2e4)
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

import shampoo
from matroots import EighConfig
from matroots.solvers.auto import AutoConfig
from matroots.study.validation.tasks import get_task


def train(task_name: str, solver: object, steps: int, frequency: int, seed: int = 0) -> dict:
    task = get_task(task_name)
    model = task.build_model(seed)
    opt = shampoo.Shampoo(
        model.parameters(),
        lr=1e-2 if task_name == "digits" else 3e-3,
        grafting="adam",
        max_preconditioner_dim=256,
        precondition_frequency=frequency,
        start_preconditioning_step=frequency,
        root_solver=solver,
    )
    c0 = time.process_time()
    batches = task.batches(seed)
    for _ in range(steps):
        batch = next(batches)
        opt.zero_grad()
        task.loss(model, batch).backward()
        opt.step()
    cpu = time.process_time() - c0
    ev = task.evaluate(model)
    diag = opt.diagnostics()
    factors = [f for b in diag for f in b.factors]
    return {
        "eval": ev,
        "root_share": opt.timing.root_share,
        "root_seconds": opt.timing.root_seconds,
        "step_seconds": opt.timing.step_seconds,
        "cpu_seconds": cpu,
        "failures": sum(f.failures for f in factors),
        "primary_failures": sum(f.primary_failures for f in factors),
        "solvers": collections.Counter(f"n={f.n}:{f.solver}" for f in factors),
        "kappa": [f"{f.kappa:.2g}" for f in factors],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["digits", "lsq"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--frequency", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--targets",
        nargs="+",
        type=float,
        default=[],
        help='also run root_solver=AutoConfig(target=T) for each T ("auto" is shampoo.config.AUTO_TARGET)',
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    for task in args.tasks:
        solvers: dict[str, object] = {"auto": "auto", "eigh": "eigh"}
        for t in args.targets:
            solvers[f"auto@{t:g}"] = AutoConfig(target=t, fallback=EighConfig(), warn=False)
        runs: dict[str, list[dict]] = {name: [] for name in solvers}
        for _ in range(args.repeats):
            for name, solver in solvers.items():
                runs[name].append(train(task, solver, args.steps, args.frequency))
        for solver, rs in runs.items():
            r = rs[-1]
            share = statistics.median(x["root_share"] for x in rs)
            cpu = statistics.median(x["cpu_seconds"] for x in rs)
            ev = ", ".join(f"{k} {v:.4g}" for k, v in r["eval"].items())
            print(
                f"{task:7s} {solver:9s} {ev}; root share {share:.1%} (median of {len(rs)}), "
                f"run CPU {cpu:.2f} s, failures {r['failures']} (primary {r['primary_failures']})"
            )
            print(f"        chosen per factor: {dict(r['solvers'])}; last kappa {r['kappa']}")


if __name__ == "__main__":
    main()
