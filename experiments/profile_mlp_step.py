"""Where a Shampoo step's time goes on a newcomer's 20-64-2 MLP (issue 29 item 7), per step.

The model of ``experiments/bench_call_overhead.py --mlp`` (Linear(20, 64), Tanh, Linear(64, 2);
Shampoo at its defaults, roots every 100 steps from step 100), trained for ``--warmup`` steps, then
``--steps`` steps measured. Reported per non-root step: the exclusive process CPU time of each
phase of ``experiments/profile_step.py``'s STEP_PHASES (us), the torch operations dispatched
(counted with a TorchDispatchMode, by operation) and the Python function calls (cProfile); and the
same counts for a step with a root round. Counts are the same on every machine; times are not
(one thread, a shared machine: compare runs made one after the other, or the ratios of
``bench_call_overhead.py --mlp``). Runs against another checkout with ``PYTHONPATH``::

    OMP_NUM_THREADS=1 python experiments/profile_mlp_step.py
    OMP_NUM_THREADS=1 python experiments/profile_mlp_step.py --root-solver auto --cprofile 25
    PYTHONPATH=/tmp/before OMP_NUM_THREADS=1 python experiments/profile_mlp_step.py
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
from profile_step import STEP_PHASES, PhaseTimer, instrumented

import shampoo


class OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def mlp(root_solver: str = "eigh", seed: int = 0):  # type: ignore[no-untyped-def]
    """(optimizer, a function that sets fresh gradients) for the 20-64-2 MLP."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
    opt = shampoo.Shampoo(model.parameters(), lr=1e-3, root_solver=root_solver)
    g = torch.Generator().manual_seed(seed + 1)

    def grad() -> None:
        x, y = torch.randn(64, 20, generator=g), torch.randn(64, 2, generator=g)
        opt.zero_grad()
        (model(x) - y).square().mean().backward()

    return opt, grad


def _root_step(opt: shampoo.Shampoo) -> bool:
    """Whether the next step computes roots (the defaults: every 100 steps from step 100)."""
    return (opt._global_step + 1) % 100 == 0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root-solver", default="eigh")
    ap.add_argument(
        "--warmup", type=int, default=150, help="untimed steps first (past step 100's first roots)"
    )
    ap.add_argument("--steps", type=int, default=300, help="measured non-root steps")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N", help="also the top N functions (tottime)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    opt, grad = mlp(args.root_solver)
    for _ in range(args.warmup):
        grad()
        opt.step()
    timer, step_cpu, roots_cpu = PhaseTimer(), [], []
    with instrumented(timer, STEP_PHASES):
        n = 0
        while n < args.steps:
            grad()
            root = _root_step(opt)
            timer.enabled = not root
            t0 = time.process_time()
            opt.step()
            (roots_cpu if root else step_cpu).append(time.process_time() - t0)
            n += not root
    counts = {}
    for kind in ("non-root", "root"):
        ops, calls = [], []
        for measure in ("ops", "calls"):  # the next step of that kind, once counting each
            grad()
            while _root_step(opt) != (kind == "root"):
                opt.step()
                grad()
            if measure == "ops":
                with OpCount() as c:
                    opt.step()
                ops.append(c.ops)
            else:
                prof = cProfile.Profile()
                prof.runcall(opt.step)
                calls.append(pstats.Stats(prof).total_calls)  # type: ignore[attr-defined]
        counts[kind] = (sum(ops[0].values()), calls[0], ops[0])
    print(f"20-64-2 MLP, Shampoo (root_solver={args.root_solver!r}, defaults), 1 thread, process CPU time")
    print(
        f"checkout: {Path(shampoo.__file__).resolve().parent.parent}; load average {os.getloadavg()[0]:.2f}"
    )
    mean, med = statistics.fmean(step_cpu), statistics.median(step_cpu)
    print(f"non-root step: mean {1e6 * mean:.0f} us, median {1e6 * med:.0f} us over {len(step_cpu)} steps")
    for k, v in sorted(timer.seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<44}{1e6 * v / len(step_cpu):>8.0f} us/step {100 * v / sum(step_cpu):>6.1f}%")
    if roots_cpu:
        print(f"root step: mean {1e6 * statistics.fmean(roots_cpu):.0f} us over {len(roots_cpu)} steps")
    for kind, (ops, calls, by_op) in counts.items():
        top = ", ".join(f"{k.removeprefix('aten.')} {v}" for k, v in by_op.most_common(8))
        print(f"{kind} step: {ops} torch ops dispatched, {calls} Python calls; most: {top}")
    if args.cprofile:
        prof = cProfile.Profile()
        for _ in range(100):
            grad()
            if _root_step(opt):
                opt.step()
                continue
            prof.enable()
            opt.step()
            prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.cprofile)
        print("\ncProfile of 100 non-root steps (tottime):")
        print("\n".join(buf.getvalue().splitlines()[: args.cprofile + 12]))


if __name__ == "__main__":
    main()
