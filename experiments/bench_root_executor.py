"""Where a background root round should run: a thread of the training process, or another process.

Issue 24 asks for asynchronous roots on "a worker thread with its own intra-op thread budget" or "a
process pool with shared-memory tensors", measured if unsure. Shampoo's pipeline (docs/design.md §6,
``shampoo/root_pipeline.py``) uses one daemon thread. This benchmark measures the alternative it did
not build, on the same work: the factors of a real Shampoo run (the W1 family of
experiments/bench_models.py trained ``--warm-steps`` steps with eigh roots every 10 steps, then
``Shampoo.dump_factors``), solved round after round (``matroots.inverse_root``, eigh, one call per
factor shape, the optimizer's p and eps) in the background, while the training thread runs AdamW
steps on the same model (the stand-in for the step the roots should not slow down):

* ``none``: no background round (the training thread alone);
* ``thread``: the rounds on a Python thread of this process, ``torch.set_num_threads(1)`` set there
  (as the pipeline's worker does), the snapshot copied in the training thread before each round;
* ``process``: the rounds in a spawned process with one thread; per round the training thread copies
  the factors into tensors in shared memory (``share_memory_``, allocated once), sends a message on a
  pipe, and after the answer copies the roots out of shared memory (what an install would read).

The configurations run interleaved in blocks of ``--block`` training steps, ``--blocks`` times, so
machine load drifts over all of them alike. Printed per configuration: the training step's wall time
(p50, p99, mean, mean / none's), the training thread's CPU per step (``time.thread_time``; a thread
waiting for the GIL or for a core uses none), the rounds finished per second of training and the
training thread's milliseconds per round spent on the executor (copies, messages).

    python experiments/bench_root_executor.py --size 256 --blocks 6 --block 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_models as bm

import matroots
import shampoo
from matroots.core.factor_dump import load_shampoo_factors


def real_factors(size: str, warm_steps: int) -> list[tuple[torch.Tensor, tuple[float, str], int]]:
    """(fp32 factor, (eps, eps mode), p) of every block of W1 at ``size`` after ``warm_steps`` steps."""
    ms = bm.SIZES[size]
    torch.manual_seed(0)
    model = bm.EncoderLM(ms)
    opt = shampoo.Shampoo(model.parameters(), lr=1e-3, precondition_frequency=10, max_preconditioner_dim=256)
    for b in bm.make_batches(ms, seed=1, count=warm_steps):
        opt.zero_grad()
        model.loss(b).backward()
        opt.step()
    with tempfile.TemporaryDirectory() as d:
        out = []
        for A, meta in load_shampoo_factors(opt.dump_factors(d)):
            eps = (float(meta["eps"]), str(meta.get("eps_mode", "absolute")))
            out.append((torch.from_numpy(A).float(), eps, int(meta["root_p"])))
    return out


def groups(factors: list) -> dict[tuple, torch.Tensor]:
    """The factors stacked per (n, eps, p): one batched solve each, as the optimizer's buckets do."""
    by: dict[tuple, list[torch.Tensor]] = {}
    for A, eps, p in factors:
        by.setdefault((A.shape[0], eps, p), []).append(A)
    return {k: torch.stack(v) for k, v in by.items()}


def solve(stacks: dict[tuple, torch.Tensor], out: dict | None = None) -> dict:
    """One round: the inverse p-th root of every stack (written into ``out`` when given)."""
    res = {}
    for key, A in stacks.items():
        _, (eps, mode), p = key
        X = matroots.inverse_root(A, p, method="eigh", eps=eps, eps_mode=mode, quiet=True).root
        if out is not None:
            out[key].copy_(X)
        res[key] = X
    return res


def _child(conn, inputs: dict, outputs: dict) -> None:
    torch.set_num_threads(1)
    while conn.recv() == "round":
        solve(inputs, outputs)
        conn.send("done")


class ThreadExecutor:
    """Rounds on a thread of this process, one after another, each from a fresh snapshot copy."""

    def __init__(self, stacks: dict) -> None:
        self.stacks, self.rounds, self.fg = stacks, 0, 0.0
        self._go, self._done, self._stop = threading.Event(), threading.Event(), False
        self._snap: dict = {}
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        self._done.set()

    def _run(self) -> None:
        torch.set_num_threads(1)
        while True:
            self._go.wait()
            self._go.clear()
            if self._stop:
                return
            solve(self._snap)
            self._done.set()

    def poll(self) -> None:
        """Install a finished round (count it) and submit the next: called once per training step."""
        if not self._done.is_set():
            return
        t0 = time.thread_time()
        if self._snap:
            self.rounds += 1
        self._snap = {k: v.clone() for k, v in self.stacks.items()}
        self._done.clear()
        self._go.set()
        self.fg += time.thread_time() - t0

    def drain(self) -> None:
        """Wait for the round in flight to finish (it is installed at the next poll)."""
        self._done.wait()

    def close(self) -> None:
        self._done.wait()
        self._stop = True
        self._go.set()
        self._t.join()


class ProcessExecutor:
    """Rounds in a spawned process; inputs and outputs in shared memory, allocated once."""

    def __init__(self, stacks: dict) -> None:
        self.stacks, self.rounds, self.fg = stacks, 0, 0.0
        self.inputs = {k: v.clone().share_memory_() for k, v in stacks.items()}
        self.outputs = {k: torch.empty_like(v).share_memory_() for k, v in stacks.items()}
        self.roots = {k: torch.empty_like(v) for k, v in stacks.items()}
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._p = ctx.Process(target=_child, args=(child, self.inputs, self.outputs), daemon=True)
        self._p.start()
        self._busy = False

    def poll(self) -> None:
        if self._busy and not self._conn.poll():
            return
        t0 = time.thread_time()
        if self._busy:
            self._conn.recv()
            for k, v in self.outputs.items():  # the install reads the roots
                self.roots[k].copy_(v)
            self.rounds += 1
        for k, v in self.stacks.items():  # the snapshot of the next round
            self.inputs[k].copy_(v)
        self._conn.send("round")
        self._busy = True
        self.fg += time.thread_time() - t0

    def drain(self) -> None:
        if self._busy:
            self._conn.poll(None)

    def close(self) -> None:
        if self._busy:
            self._conn.recv()
        self._conn.send("stop")
        self._p.join(timeout=60)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="256", choices=sorted(bm.SIZES))
    ap.add_argument("--warm-steps", type=int, default=20)
    ap.add_argument("--block", type=int, default=20, help="training steps per configuration and block")
    ap.add_argument("--blocks", type=int, default=6)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    stacks = groups(real_factors(args.size, args.warm_steps))
    t0 = time.perf_counter()
    solve(stacks)
    one = time.perf_counter() - t0
    ms = bm.SIZES[args.size]
    torch.manual_seed(0)
    model = bm.EncoderLM(ms)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = bm.make_batches(ms, seed=2, count=8)
    execs = {"none": None, "thread": ThreadExecutor(stacks), "process": ProcessExecutor(stacks)}
    wall = {k: [] for k in execs}
    cpu = {k: [] for k in execs}
    load0 = os.getloadavg()
    step = 0
    for _ in range(args.blocks):
        for name, ex in execs.items():
            for _ in range(args.block):
                t0, c0 = time.perf_counter(), time.thread_time()
                if ex is not None:
                    ex.poll()
                opt.zero_grad()
                model.loss(batches[step % len(batches)]).backward()
                opt.step()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
                step += 1
            if ex is not None:  # no round of this block runs on into the next configuration's
                t0 = time.perf_counter()
                ex.drain()
                wall[name][-1] += time.perf_counter() - t0
    for ex in execs.values():
        if ex is not None:
            ex.close()
    n_f = sum(int(v.shape[0]) for v in stacks.values())
    shapes = ", ".join(f"{v.shape[0]} x {k[0]}" for k, v in sorted(stacks.items()))
    print(
        f"## W1 d_model {ms.d_model}: {n_f} factors ({shapes}); one round in the training thread "
        f"{1e3 * one:.0f} ms; torch {torch.__version__}; load average "
        f"{' '.join(f'{x:.1f}' for x in load0)} before, {' '.join(f'{x:.1f}' for x in os.getloadavg())} after"
    )
    base, base_cpu = statistics.fmean(wall["none"]), statistics.fmean(cpu["none"])
    print(
        f"{'executor':<10}{'p50':>8}{'p99':>8}{'mean':>8}{'/none':>7}{'cpu':>8}{'/none':>7}{'rounds/s':>10}{'fg/round':>10}"
    )
    for name, ex in execs.items():
        w = sorted(1e3 * t for t in wall[name])
        mean = statistics.fmean(wall[name])
        c = statistics.fmean(cpu[name])
        rounds = ex.rounds if ex else 0
        rate = rounds / sum(wall[name])
        fg = f"{1e3 * ex.fg / max(rounds, 1):.1f}" if ex else "-"
        print(
            f"{name:<10}{w[len(w) // 2]:>8.0f}{w[min(len(w) - 1, round(0.99 * (len(w) - 1)))]:>8.0f}"
            f"{1e3 * mean:>8.0f}{mean / base:>7.3f}{1e3 * c:>8.0f}{c / base_cpu:>7.3f}{rate:>10.2f}{fg:>10}"
        )
    print("# ms per training step (AdamW on the same model): wall p50 p99 mean, / none's; the training")
    print("# thread's CPU per step, / none's; background rounds finished per second of training; the")
    print("# training thread's ms per round on the executor (snapshot copies, messages, reading roots)")


if __name__ == "__main__":
    main()
