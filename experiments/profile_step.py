"""Where Shampoo's W1 step and one root round spend their CPU time, by phase.

Workload W1 (docs/design.md §8: 4-layer transformer encoder, d_model 256, 4 heads, ff 1024, seq 128,
batch 16, vocab 512); Shampoo with blocks 256, precondition_frequency 10, Adam grafting, eigh roots,
as in ``experiments/bench_step.py``, but on **one thread** and timed in **process CPU time**
(``time.process_time``), so that a shared machine's load inflates the numbers less.

Phases are measured by wrapping the functions that implement them (exclusive time: a phase's own
time, without the wrapped functions it calls), so the numbers add up to the wrapped total:

* the optimizer step: gradient gather, statistics update, root round, directions (preconditioning
  and grafting), scatter (with the update added straight from the buckets, the update's adds),
  the directions' finiteness, parameter update, the rest (``step`` bookkeeping);
* the root round (``shampoo.roots.compute_roots``): factor inputs (mirror, bias correction), input
  validation (solve options, ``prepare``, the symmetry test), the psd policy, the solve itself
  (eigh and the root's eigenvalue function and GEMM), result checks (``_finalise``), the kappa
  diagnostic, write-back of the roots, and bookkeeping (everything else in the round).

The root round is measured on the live optimizer state: after the training steps, the round's
``compute_roots`` call is replayed ``--replays`` times on the same jobs (it is idempotent for a
cold-start solver such as eigh: same factors, same roots). The same script runs against another
checkout with ``PYTHONPATH=/path/to/checkout`` (phases whose functions a checkout lacks read 0), so
before/after numbers come from the same code::

    nice -n 5 .venv/bin/python experiments/profile_step.py                 # breakdown
    nice -n 5 .venv/bin/python experiments/profile_step.py --size 512      # another W1-family size
    nice -n 5 .venv/bin/python experiments/profile_step.py --chunk-mib 0   # the round as one batch
    nice -n 5 .venv/bin/python experiments/profile_step.py --cprofile 25   # + top functions of a round
    nice -n 5 .venv/bin/python experiments/profile_step.py --torch-profiler 20
    PYTHONPATH=/tmp/wt_before nice -n 5 .venv/bin/python experiments/profile_step.py --out before.json
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import importlib
import io
import json
import os
import pstats
import resource
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from bench_models import SIZES, EncoderLM, make_batches
from torch import nn

import shampoo

# (module, attribute path, phase). The step phases first, then the root round's. A missing
# attribute (a checkout without that function) is skipped; its phase reads 0.
STEP_PHASES = [
    ("shampoo.optimizer", "Shampoo.step", "step: other"),
    ("shampoo.engine", "GroupEngine.gather", "step: gather gradients"),
    ("shampoo.preconditioner", "BlockBucket.update_statistics", "step: statistics update"),
    ("shampoo.engine", "compute_roots", "root round"),
    ("shampoo.preconditioner", "BlockBucket.directions", "step: directions (precondition, graft)"),
    ("shampoo.engine", "GroupEngine.scatter", "step: scatter directions"),
    ("shampoo.update", "apply_directions", "step: parameter update"),
    # the update straight from the buckets: weight decay here, the adds in "scatter directions"
    ("shampoo.update", "apply_from_buckets", "step: parameter update"),
    ("shampoo.engine", "GroupEngine.finite_directions", "step: direction finiteness"),
]
ROOT_PHASES = [
    ("shampoo.roots", "compute_roots", "round: bookkeeping"),
    ("shampoo.root_solve", "solve_batch", "round: bookkeeping"),
    ("shampoo.root_batches", "factor_inputs", "round: factor inputs (mirror, bias corr.)"),
    ("shampoo.root_solve", "finite_rows", "round: finiteness of factors/roots"),
    ("shampoo.refresh", "finite_rows", "round: finiteness of factors/roots"),
    ("shampoo.refresh", "record", "round: bookkeeping"),
    ("shampoo.root_batches", "previous_roots", "round: bookkeeping"),
    ("shampoo.root_solve", "_kappa", "round: kappa diagnostic"),
    ("shampoo.root_solve", "_kappa_from", "round: kappa diagnostic"),
    ("shampoo.root_batches", "write_back", "round: write-back"),
    ("matroots.solvers.base", "SolverConfig.solve", "round: validation"),
    ("matroots.core.options", "SolveOptions.__post_init__", "round: validation"),
    ("matroots.solvers.base", "prepare", "round: validation"),
    ("matroots.solvers.base", "prepare_trusted", "round: validation"),
    ("matroots.solvers.eigh", "symmetric_part", "round: validation"),
    ("matroots.solvers.eigh", "require_symmetric", "round: validation"),
    ("matroots.solvers.coupled_newton", "symmetric_part", "round: validation"),
    ("matroots.core.psd", "apply", "round: psd policy"),
    ("matroots.solvers.eigh", "EighConfig._eigh", "round: solve"),
    ("matroots.solvers.eigh", "EighConfig._run", "round: solve"),
    ("matroots.solvers.coupled_newton", "CoupledNewtonConfig._run", "round: solve"),
    ("matroots.solvers.base", "SolverConfig._finalise", "round: result checks"),
]


class PhaseTimer:
    """Exclusive process CPU time per phase, from wrapped functions (a stack of open calls)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list[Any]] = []
        self.enabled = True

    def wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return fn(*args, **kwargs)
            frame = [phase, 0.0]
            self._stack.append(frame)
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.process_time() - t0
                self._stack.pop()
                self.seconds[phase] += dt - frame[1]
                self.calls[phase] += 1
                if self._stack:
                    self._stack[-1][1] += dt

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


@contextlib.contextmanager
def instrumented(timer: PhaseTimer, table: list[tuple[str, str, str]]) -> Iterator[list[str]]:
    """Wrap every (module, attribute, phase) of ``table`` that exists; yields the phases installed."""
    saved = []
    installed = []
    for modname, attr, phase in table:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        owner: Any = mod
        *path, name = attr.split(".")
        try:
            for part in path:
                owner = getattr(owner, part)
            fn = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        except (AttributeError, KeyError):
            continue
        saved.append((owner, name, fn))
        if isinstance(fn, staticmethod | classmethod):
            setattr(owner, name, type(fn)(timer.wrap(fn.__func__, phase)))
        else:
            setattr(owner, name, timer.wrap(fn, phase))
        installed.append(f"{modname}.{attr}")
    try:
        yield installed
    finally:
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)


def make_optimizer(model: nn.Module, root_solver: str, frequency: int, **kw: object) -> shampoo.Shampoo:
    return shampoo.Shampoo(
        model.named_parameters(),
        lr=1e-3,
        betas=(0.9, 0.999),
        weight_decay=0.01,
        max_preconditioner_dim=256,
        precondition_frequency=frequency,
        start_preconditioning_step=1,
        grafting="adam",
        root_solver=root_solver,
        **kw,
    )


def train_step(model: EncoderLM, opt: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    model.loss(batch).backward()
    opt.step()


def breakdown(seconds: dict[str, float], prefix: str, total: float) -> dict[str, float]:
    return {k: v / total for k, v in sorted(seconds.items()) if k.startswith(prefix)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="timed training steps (default 30: 3 root rounds)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    ap.add_argument("--replays", type=int, default=8, help="extra replays of one root round (default 8)")
    ap.add_argument("--frequency", type=int, default=10)
    ap.add_argument("--root-solver", default="eigh")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--size", choices=list(SIZES), default="256", help="d_model of the W1 family (default 256: W1)"
    )
    ap.add_argument(
        "--cprofile", type=int, default=0, metavar="N", help="print the top N functions of a round"
    )
    ap.add_argument(
        "--torch-profiler", type=int, default=0, metavar="N", help="print the top N ops of a step"
    )
    ap.add_argument(
        "--chunk-mib",
        type=float,
        default=None,
        help="ShampooImplementation.round_chunk_bytes in MiB for this run (default: 8; 0: no chunks)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    impl = {}
    if args.chunk_mib is not None:
        chunk = int(args.chunk_mib * 2**20) if args.chunk_mib > 0 else None
        impl["implementation"] = shampoo.ShampooImplementation(round_chunk_bytes=chunk)
    size = SIZES[args.size]
    model = EncoderLM(size)
    opt = make_optimizer(model, args.root_solver, args.frequency, **impl)
    batches = make_batches(size, args.seed)
    for i in range(args.warmup):
        train_step(model, opt, batches[i % len(batches)])

    timer = PhaseTimer()
    captured: list[tuple[Any, ...]] = []
    import shampoo.engine as engine_mod
    import shampoo.roots as roots_mod

    real_compute = engine_mod.compute_roots

    def capture(*a: Any, **k: Any) -> Any:
        captured[:] = [a]
        return roots_mod.compute_roots(*a, **k)  # looked up now: the instrumented one

    engine_mod.compute_roots = capture
    step_cpu = []
    load = [os.getloadavg()[0]]
    try:
        with instrumented(timer, STEP_PHASES + ROOT_PHASES) as installed:
            for i in range(args.steps):
                b = batches[(args.warmup + i) % len(batches)]
                opt.zero_grad(set_to_none=True)
                model.loss(b).backward()
                t0 = time.process_time()
                opt.step()
                step_cpu.append(time.process_time() - t0)
            step_seconds = dict(timer.seconds)
            rounds_in_steps = timer.calls.get("root round", 0)
            # replays of the last root round on the live state (idempotent for a cold solver)
            timer.reset()
            round_cpu = []
            assert captured, "no root round ran: raise --steps"
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(args.replays):
                t0 = time.process_time()
                roots_mod.compute_roots(*captured[0])
                round_cpu.append(time.process_time() - t0)
            round_faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / args.replays
            round_seconds = dict(timer.seconds)
    finally:
        engine_mod.compute_roots = real_compute
    load.append(os.getloadavg()[0])

    opt_total = sum(step_cpu)
    print(
        f"W1 family d_model {args.size}: Shampoo ({args.root_solver}, frequency {args.frequency}), "
        "1 thread, process CPU time"
    )
    print(
        f"checkout: {Path(shampoo.__file__).resolve().parent.parent}; load average {load[0]:.2f}-{load[1]:.2f}"
    )
    print(f"wrapped: {len(installed)} functions")
    print(
        f"\noptimizer step: {1e3 * opt_total / args.steps:.1f} ms/step CPU (mean over {args.steps} steps, "
        f"{rounds_in_steps} root rounds, median step {1e3 * statistics.median(step_cpu):.1f} ms)"
    )
    for k, v in sorted(step_seconds.items(), key=lambda kv: -kv[1]):
        if k.startswith("round: "):
            continue
        extra = (
            sum(s for kk, s in step_seconds.items() if kk.startswith("round: ")) if k == "root round" else 0.0
        )
        print(
            f"  {k:<44}{1e3 * (v + extra) / args.steps:>8.2f} ms/step {100 * (v + extra) / opt_total:>6.1f}%"
        )
    per_round = statistics.median(round_cpu)
    total_round = sum(round_cpu)
    print(
        f"\nroot round: median {1e3 * per_round:.1f} ms CPU over {args.replays} replays "
        f"(min {1e3 * min(round_cpu):.1f}); share of the round per phase:"
    )
    shares = {k: v / total_round for k, v in round_seconds.items()}
    for k, v in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<44}{1e3 * round_seconds[k] / args.replays:>8.2f} ms  {100 * v:>6.1f}%")
    covered = sum(round_seconds.values()) / total_round
    print(f"  (wrapped phases cover {100 * covered:.1f}% of the round's CPU time)")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(f"page faults per round {round_faults:.0f}; peak resident memory of the process {peak_mib:.0f} MiB")

    results: dict[str, Any] = {
        "checkout": str(Path(shampoo.__file__).resolve().parent.parent),
        "size": args.size,
        "root_solver": args.root_solver,
        "frequency": args.frequency,
        "threads": 1,
        "load_average_1min": load,
        "optimizer_step_ms": 1e3 * opt_total / args.steps,
        "step_phase_ms": {k: 1e3 * v / args.steps for k, v in step_seconds.items()},
        "root_round_ms_median": 1e3 * per_round,
        "root_round_ms_all": [1e3 * r for r in round_cpu],
        "root_round_share": shares,
        "root_round_page_faults": round_faults,
        "peak_rss_mib": peak_mib,
    }
    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        real_compute(*captured[0])
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.cprofile)
        print("\ncProfile of one root round (tottime):")
        print("\n".join(buf.getvalue().splitlines()[: args.cprofile + 12]))
    if args.torch_profiler:
        from torch.profiler import ProfilerActivity, profile

        b = batches[0]
        steps_to_round = args.frequency - (opt._global_step - 1) % args.frequency
        for _ in range(steps_to_round - 1):
            train_step(model, opt, b)
        opt.zero_grad(set_to_none=True)
        model(b[:, :-1]).sum().backward()
        with profile(activities=[ProfilerActivity.CPU]) as prof_t:
            opt.step()  # a step with a root round
        print("\ntorch.profiler, one optimizer step with a root round (self CPU time):")
        print(prof_t.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.torch_profiler))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
