"""Step-time distribution of Shampoo with synchronous and asynchronous roots (issue 24), beside AdamW.

The model is the W1 family (experiments/bench_models.py; docs/design.md §8) at ``--size``. Each
configuration trains its own copy of the model on the same batches; the configurations run
interleaved in blocks of ``--block`` steps (round robin, ``--blocks`` rounds), so machine load
drifts over all of them alike. A whole training step (forward, backward, ``opt.step()``) is timed.

Configurations:

* ``adamw``; ``sync``: Shampoo, roots in the step; ``async_d<k>``: roots on the background thread,
  installed k steps later; ``floor``: Shampoo whose roots are computed once (step 1) and never again
  (the non-root floor the issue's goal is stated against).
* Two thread settings, both printed: (a) every configuration trains on ``--threads`` threads and
  the asynchronous roots get ``--root-threads`` more (the paper's idle host cores); (b) the same
  total for everyone: AdamW, sync and floor train on threads + root-threads, async trains on
  ``--threads`` with ``--root-threads`` for its roots.

A round still running when a block ends is waited for (not installed: the schedule is untouched) and
that wait is added to the block's last step, so background work never leaks into the next
configuration's time. Numbers: p50 / p90 / p99 / max of the step (ms), mean step, mean / AdamW's
mean, and the process CPU seconds per step (all threads: the roots' too).

    python experiments/bench_async_roots.py --size 128 --frequency 10 --blocks 3 --block 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_models as bm

import shampoo


@dataclass
class Config:
    name: str
    setting: str
    train_threads: int
    options: dict[str, Any] | None  # Shampoo keyword arguments (None: AdamW)
    times: list[float] = field(default_factory=list)
    thread_cpu: list[float] = field(default_factory=list)  # the training thread's CPU per step
    cpu: float = 0.0
    wait: float = 0.0
    model: Any = None
    opt: Any = None


def _build(cfg: Config, size: bm.ModelSize, common: bm.Common) -> None:
    torch.manual_seed(0)
    cfg.model = bm.EncoderLM(size)
    if cfg.options is None:
        cfg.opt = bm.adamw_spec(common).build(cfg.model)
    else:
        settings = bm._shampoo_settings(common, cfg.options.pop("frequency"), "eigh")
        cfg.opt = shampoo.Shampoo(cfg.model.named_parameters(), **{**settings, **cfg.options})


def _drain(opt: Any) -> float:
    """Wait for the rounds in flight to finish computing (they stay to be installed on schedule)."""
    pipe = getattr(opt, "_roots", None)
    if pipe is None:
        return 0.0
    t0 = time.perf_counter()
    for r in pipe.in_flight():
        r.ticket._event.wait()
    return time.perf_counter() - t0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="128", choices=sorted(bm.SIZES))
    ap.add_argument("--frequency", type=int, default=10)
    ap.add_argument("--delays", type=int, nargs="+", default=[1])
    ap.add_argument("--threads", type=int, default=1, help="training threads (setting a)")
    ap.add_argument("--root-threads", type=int, default=1)
    ap.add_argument("--block", type=int, default=20, help="consecutive steps of one configuration")
    ap.add_argument("--blocks", type=int, default=3, help="round-robin rounds (timed)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default: frequency)")
    ap.add_argument("--settings", nargs="+", default=["a", "b"], choices=["a", "b"])
    args = ap.parse_args(argv)
    size, common = bm.SIZES[args.size], bm.Common()
    f, T, R = args.frequency, args.threads, args.root_threads
    cfgs: list[Config] = []
    for s in args.settings:
        t_all = T if s == "a" else T + R
        cfgs += [
            Config("adamw", s, t_all, None),
            Config("sync", s, t_all, {"frequency": f}),
            Config("floor", s, t_all, {"frequency": 10**9}),
        ]
        cfgs += [
            Config(f"async_d{d}", s, T, {"frequency": f, "root_schedule": "async", "max_root_delay": d,
                                         "root_threads": R})
            for d in args.delays
        ]  # fmt: skip
    batches = bm.make_batches(size, seed=1, count=8)
    warmup = f if args.warmup is None else args.warmup
    for cfg in cfgs:
        _build(cfg, size, common)
        torch.set_num_threads(cfg.train_threads)
        for i in range(warmup):
            cfg.opt.zero_grad()
            cfg.model.loss(batches[i % len(batches)]).backward()
            cfg.opt.step()
        _drain(cfg.opt)
    step_of = dict.fromkeys(range(len(cfgs)), warmup)
    for _ in range(args.blocks):
        for ci, cfg in enumerate(cfgs):
            torch.set_num_threads(cfg.train_threads)
            c0 = time.process_time()
            timing = getattr(cfg.opt, "timing", None)  # Shampoo's StepTiming (AdamW: None)
            w0 = timing.root_wait_seconds if timing is not None else 0.0
            for _ in range(args.block):
                t0, u0 = time.perf_counter(), time.thread_time()
                cfg.opt.zero_grad()
                cfg.model.loss(batches[step_of[ci] % len(batches)]).backward()
                cfg.opt.step()
                cfg.times.append(time.perf_counter() - t0)
                cfg.thread_cpu.append(time.thread_time() - u0)
                step_of[ci] += 1
            drained = _drain(cfg.opt)
            cfg.times[-1] += drained
            if timing is not None:
                cfg.wait += timing.root_wait_seconds - w0 + drained
            cfg.cpu += time.process_time() - c0
    print(
        f"# W1 family d_model {size.d_model} ({size.layers} layers, seq {size.seq}, batch {size.batch}); "
        f"precondition_frequency {f}; {args.blocks} x {args.block} timed steps per configuration after "
        f"{warmup} warm-up steps; torch {torch.__version__}"
    )
    print(f"# setting a: training on {T} thread(s), async roots on {R} more; "
          f"setting b: {T + R} thread(s) in total for every configuration (async: {T} training + {R} roots)")  # fmt: skip
    print("# wall ms per step: p50 p90 p99 max mean, mean/AdamW's; cpu/step: the process (all threads);")
    print("# train-cpu: the training thread's CPU ms per step (p50, p99, mean; all its work when it trains")
    print("# on 1 thread: with async roots it excludes the roots), wait: ms per step it waited for roots")
    head = f"{'setting':<8}{'config':<10}{'threads':>9}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}{'mean':>9}"
    print(
        head
        + f"{'/adamw':>8}{'cpu/step':>10}{'train-cpu p50':>15}{'p99':>8}{'mean':>8}{'/adamw':>8}{'wait':>7}"
    )
    for s in args.settings:
        ref = next(c for c in cfgs if c.setting == s and c.options is None)
        adamw, adamw_t = statistics.fmean(ref.times), statistics.fmean(ref.thread_cpu)
        for c in (c for c in cfgs if c.setting == s):
            ms = [1e3 * t for t in c.times]
            tc = [1e3 * t for t in c.thread_cpu]
            mean = statistics.fmean(c.times)
            threads = f"{c.train_threads}" + (f"+{R}" if c.name.startswith("async") else "")
            print(
                f"{s:<8}{c.name:<10}{threads:>9}{_pct(ms, 0.5):>9.1f}{_pct(ms, 0.9):>9.1f}{_pct(ms, 0.99):>9.1f}"
                f"{max(ms):>9.1f}{1e3 * mean:>9.1f}{mean / adamw:>8.3f}{1e3 * c.cpu / len(c.times):>10.1f}"
                f"{_pct(tc, 0.5):>15.1f}{_pct(tc, 0.99):>8.1f}{statistics.fmean(tc):>8.1f}"
                f"{statistics.fmean(c.thread_cpu) / adamw_t:>8.3f}{1e3 * c.wait / len(c.times):>7.1f}"
            )


if __name__ == "__main__":
    main()
