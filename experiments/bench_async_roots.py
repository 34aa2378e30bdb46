"""Step-time distribution of Shampoo with synchronous and asynchronous roots (issue 24), beside AdamW.

Workloads (``--cells``, each ``MODEL:SIZE:FREQUENCY``, run one after another in one process):
``w1:256:10`` is the W1 family (experiments/bench_models.py; docs/design.md §8) at d_model 256 with
precondition_frequency 10; ``bytes:-:100`` the validation's byte-level LM (``matroots validate``'s
``bytes_lm`` task: its model on windows of the standard library's sources) at frequency 100. Within a
cell each configuration trains its own copy of the model on the same batches, and the configurations
run interleaved in blocks of ``--block`` steps (default: the frequency, so every block of every
configuration holds one root round; round robin, ``--blocks`` rounds), so machine load drifts over
all of them alike. A whole training step (forward, backward, ``opt.step()``) is timed.

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
mean, the process CPU per step (all threads: the roots' too), the training thread's CPU per step
(p50, p99, mean, / AdamW's; on a loaded machine wall time is mostly waiting for a core), the
training thread's time preparing and installing rounds (``fg``) and waiting for them (``wait``).
Each cell prints the load average (``os.getloadavg``) before and after it.

``--device cuda`` trains every configuration on the GPU (models and batches moved there; each timed
step ends with ``torch.cuda.synchronize()``, so a step's time includes the GPU's work and any wait of
the training stream on a round's copies) and times the CUDA host path of Anil et al. 2020 §4 / App.
E (``async_d<k>``: ``ShampooImplementation(root_device="host")``, the roots on ``--root-threads`` host
threads; shampoo/root_transfer.py) against the synchronous step and, with ``--root-devices host
same``, the background round solved on the GPU (``async_d<k>_same``). Without CUDA it stops with a
message saying so.

    python experiments/bench_async_roots.py --cells w1:128:10 bytes:-:100 --blocks 2
    python experiments/bench_async_roots.py --preconditioner soap --cells w1:256:10 --settings a
    python experiments/bench_async_roots.py --device cuda --cells w1:512:10 --settings a --blocks 4
"""

from __future__ import annotations

import argparse
import os
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
from matroots.study.validation.tasks import ByteLMTask


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
    fg: float = 0.0  # the training thread's seconds preparing and installing rounds
    model: Any = None
    opt: Any = None


@dataclass
class Workload:
    """One cell's model family: a fresh model per configuration, its batches and its loss."""

    label: str
    build: Any  # () -> nn.Module, the same initial weights every call
    batches: list[Any]
    loss: Any  # (model, batch) -> loss


def _to(obj: Any, device: str) -> Any:
    """``obj`` with its tensors (in tuples and lists) on ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple | list):
        return type(obj)(_to(x, device) for x in obj)
    return obj


def _on(work: Workload, device: str) -> Workload:
    """``work`` training on ``device`` (the same initial weights and batches, moved)."""
    if device == "cpu":
        return work
    build = work.build
    return Workload(
        f"{work.label} on {device}", lambda: build().to(device), _to(work.batches, device), work.loss
    )


def _workload(model: str, size: str) -> Workload:
    if model == "w1":
        ms = bm.SIZES[size]

        def build() -> Any:
            torch.manual_seed(0)
            return bm.EncoderLM(ms)

        label = f"W1 family d_model {ms.d_model} ({ms.layers} layers, seq {ms.seq}, batch {ms.batch})"
        return Workload(label, build, bm.make_batches(ms, seed=1, count=8), lambda m, b: m.loss(b))
    task = ByteLMTask(max_train_bytes=1 << 20, max_val_bytes=1 << 16, val_windows=1)
    it = task.batches(1)
    a = task.arch
    label = (
        f"byte LM (validation task bytes_lm: d_model {a['d_model']}, {a['layers']} layers, seq {a['seq']})"
    )
    return Workload(label, lambda: task.build_model(0), [next(it) for _ in range(8)], task.loss)


def _build(cfg: Config, work: Workload, common: bm.Common, preconditioner: str | None = None) -> None:
    cfg.model = work.build()
    if cfg.options is None:
        cfg.opt = bm.adamw_spec(common).build(cfg.model)
    else:
        opts = dict(cfg.options)
        settings = bm._shampoo_settings(common, opts.pop("frequency"), "eigh")
        cfg.opt = shampoo.Shampoo(
            cfg.model.named_parameters(), **{**settings, **opts}, preconditioner=preconditioner
        )


def _sync(device: str) -> None:
    """Wait for the device's queued work (CUDA); on the CPU there is none."""
    if device == "cuda":
        torch.cuda.synchronize()


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


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _configs(args: argparse.Namespace, f: int) -> list[Config]:
    T, R = args.threads, args.root_threads
    cfgs: list[Config] = []
    for s in args.settings:
        t_all = T if s == "a" else T + R
        cfgs += [
            Config("adamw", s, t_all, None),
            Config("sync", s, t_all, {"frequency": f}),
            Config("floor", s, t_all, {"frequency": 10**9}),
        ]
        cfgs += [
            Config(f"async_d{d}" + ("" if rd == args.root_devices[0] else f"_{rd}"), s, T,
                   {"frequency": f, "root_schedule": "async", "max_root_delay": d, "root_threads": R,
                    "implementation": shampoo.ShampooImplementation(root_device=rd)})
            for d in args.delays
            for rd in args.root_devices
        ]  # fmt: skip
    return cfgs


def run_cell(args: argparse.Namespace, model: str, size: str, f: int) -> None:
    work, common = _on(_workload(model, size), args.device), bm.Common()
    block = args.block or f
    cfgs = _configs(args, f)
    batches, loss = work.batches, work.loss
    load0 = _load()
    for cfg in cfgs:
        _build(cfg, work, common, args.preconditioner)
        torch.set_num_threads(cfg.train_threads)
        for i in range(args.warmup):
            cfg.opt.zero_grad()
            loss(cfg.model, batches[i % len(batches)]).backward()
            cfg.opt.step()
        _sync(args.device)
        _drain(cfg.opt)
    step_of = dict.fromkeys(range(len(cfgs)), args.warmup)
    for _ in range(args.blocks):
        for ci, cfg in enumerate(cfgs):
            torch.set_num_threads(cfg.train_threads)
            c0 = time.process_time()
            pipe = getattr(cfg.opt, "_roots", None)
            w0 = pipe.wait_seconds if pipe is not None else 0.0
            f0 = pipe.foreground_seconds if pipe is not None else 0.0
            for _ in range(block):
                t0, u0 = time.perf_counter(), time.thread_time()
                cfg.opt.zero_grad()
                loss(cfg.model, batches[step_of[ci] % len(batches)]).backward()
                cfg.opt.step()
                _sync(args.device)
                cfg.times.append(time.perf_counter() - t0)
                cfg.thread_cpu.append(time.thread_time() - u0)
                step_of[ci] += 1
            drained = _drain(cfg.opt)
            cfg.times[-1] += drained
            if pipe is not None:
                cfg.wait += pipe.wait_seconds - w0 + drained
                cfg.fg += pipe.foreground_seconds - f0
            cfg.cpu += time.process_time() - c0
    T, R = args.threads, args.root_threads
    print(
        f"## {work.label}; precondition_frequency {f}; {args.blocks} x {block} timed steps per "
        f"configuration after {args.warmup} warm-up steps; torch {torch.__version__}; {_device(args)}; "
        f"{load0} before, {_load()} after"
    )
    print(f"# setting a: training on {T} thread(s), async roots on {R} more; "
          f"setting b: {T + R} thread(s) in total for every configuration (async: {T} training + {R} roots)")  # fmt: skip
    head = f"{'setting':<8}{'config':<14}{'threads':>8}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}{'mean':>8}"
    print(
        head + f"{'/adamw':>7}{'cpu/step':>9}{'train-cpu p50':>14}{'p99':>8}{'mean':>8}{'/adamw':>7}"
        f"{'fg':>6}{'wait':>7}"
    )
    for s in args.settings:
        ref = next(c for c in cfgs if c.setting == s and c.options is None)
        adamw, adamw_t = statistics.fmean(ref.times), statistics.fmean(ref.thread_cpu)
        for c in (c for c in cfgs if c.setting == s):
            ms = [1e3 * t for t in c.times]
            tc = [1e3 * t for t in c.thread_cpu]
            mean, n = statistics.fmean(c.times), len(c.times)
            threads = f"{c.train_threads}" + (f"+{R}" if c.name.startswith("async") else "")
            print(
                f"{s:<8}{c.name:<14}{threads:>8}{_pct(ms, 0.5):>8.0f}{_pct(ms, 0.9):>8.0f}{_pct(ms, 0.99):>8.0f}"
                f"{max(ms):>8.0f}{1e3 * mean:>8.0f}{mean / adamw:>7.3f}{1e3 * c.cpu / n:>9.0f}"
                f"{_pct(tc, 0.5):>14.0f}{_pct(tc, 0.99):>8.0f}{statistics.fmean(tc):>8.0f}"
                f"{statistics.fmean(c.thread_cpu) / adamw_t:>7.3f}{1e3 * c.fg / n:>6.1f}{1e3 * c.wait / n:>7.1f}"
            )
    print("# ms per step: wall p50 p90 p99 max mean, mean/AdamW's; cpu/step: the process (all threads);")
    print("# train-cpu: the training thread's CPU (with async roots it excludes the roots' thread);")
    print("# fg: the training thread preparing + installing rounds; wait: waiting for a round", flush=True)
    for c in cfgs:  # stop the root threads before the next cell
        pipe = getattr(c.opt, "_roots", None)
        if pipe is not None:
            pipe.close()


def _device(args: argparse.Namespace) -> str:
    if args.device == "cuda":
        return f"GPU {torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    return "CPU"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cells", nargs="+", default=["w1:128:10"], help="MODEL:SIZE:FREQUENCY (model w1 or bytes)"
    )
    ap.add_argument("--delays", type=int, nargs="+", default=[1])
    ap.add_argument("--threads", type=int, default=1, help="training threads (setting a)")
    ap.add_argument("--root-threads", type=int, default=1)
    ap.add_argument(
        "--block",
        type=int,
        default=None,
        help="consecutive steps of one configuration (default: the frequency)",
    )
    ap.add_argument("--blocks", type=int, default=2, help="round-robin rounds (timed)")
    ap.add_argument(
        "--warmup", type=int, default=2, help="untimed steps first (the first round is at step 1)"
    )
    ap.add_argument("--settings", nargs="+", default=["a", "b"], choices=["a", "b"])
    ap.add_argument(
        "--preconditioner",
        choices=["soap"],
        default=None,
        help="every Shampoo configuration with this per-block preconditioner (soap: its eigenbasis "
        "refreshes are the rounds; default: Kronecker roots)",
    )
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the models train (cuda: the host path of the roots against sync on the GPU)",
    )
    ap.add_argument(
        "--root-devices",
        nargs="+",
        choices=["auto", "host", "same", "device"],
        default=None,
        help="ShampooImplementation.root_device of the async configurations (default: auto; with "
        "--device cuda: host same)",
    )
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error(
            f"--device cuda needs a CUDA GPU, and torch.cuda.is_available() is False here (torch "
            f"{torch.__version__}, built for CUDA {torch.version.cuda}); run it on a machine with a GPU"
        )
    if args.root_devices is None:
        args.root_devices = ["host", "same"] if args.device == "cuda" else ["auto"]
    for cell in args.cells:
        model, size, freq = cell.split(":")
        if model not in ("w1", "bytes") or (model == "w1" and size not in bm.SIZES):
            ap.error(f"cell {cell!r}: MODEL is w1 (SIZE one of {sorted(bm.SIZES)}) or bytes")
        run_cell(args, model, size, int(freq))


if __name__ == "__main__":
    main()
