"""What the statistics options of Shampoo save: GEMM kernels for G G^T, and the W1 step.

Two measurements, both in process CPU time on one thread (``torch.set_num_threads(1)``, BLAS pools
of numpy/scipy limited to one thread), configurations interleaved ABAB... in one process, medians:

* ``gemm``: the factor update F <- beta2 F + (1 - beta2) G G^T of a stack of b blocks (n x m) for
  n in 64..1024, by each candidate kernel:

  - ``baddbmm``: ``F.baddbmm_(G, G^T)`` in fp32, what Shampoo ships (both triangles computed);
  - ``syrk``: BLAS ``ssyrk`` (upper triangle only, in place, half the flops), one call per block
    through scipy (OpenBLAS);
  - ``tri2``: the upper block triangle of a 2 x 2 split with three half-size ``baddbmm`` (3/4 of
    the flops);
  - ``bf16``: the shipped ``statistics_dtype=torch.bfloat16`` path on CPU (G rounded to bf16,
    fp32 GEMM of the rounded values: the semantics of a bf16 GEMM with fp32 accumulation);
  - ``bf16_out``: a bf16 ``bmm`` whose output is rounded to bf16 (what CPU torch offers natively,
    AMX/oneDNN) added into the fp32 factor: *not* fp32 accumulation, shown for its speed only.

  syrk and tri2 are measured, not shipped: syrk is cheaper only with its BLAS pinned to one thread
  (as here) and gives 2-25x slower steps under OpenBLAS's default thread pool; tri2's best case is
  ~0.5% of W1's step (see shampoo.config.GroupOptions).

* ``w1``: the optimizer step of workload W1 (docs/design.md §7; 4-layer encoder, d_model 256,
  blocks 256, precondition_frequency 10, Adam grafting, eigh) per Shampoo option setting, on real W1
  gradients replayed in the same order for every configuration, against AdamW; the saving per step,
  and its share of the whole training step (forward + backward measured in the same process).

    nice -n 5 .venv/bin/python experiments/bench_work_options.py gemm --repeats 7
    nice -n 5 .venv/bin/python experiments/bench_work_options.py w1 --rounds 9 --steps 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable

import torch
from bench_models import W1 as W1_SIZE
from bench_models import EncoderLM
from torch import nn

import shampoo


def _one_thread() -> contextlib.AbstractContextManager:
    torch.set_num_threads(1)
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(1)
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn/scipy stacks
        return contextlib.nullcontext()


def _cpu(fn: Callable[[], object], reps: int) -> float:
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


# ----------------------------------------------------------------------------------------------------
# G G^T kernels


def kernels(F: torch.Tensor, G: torch.Tensor, b2: float) -> dict[str, Callable[[], object]]:
    from scipy.linalg.blas import ssyrk

    a = 1.0 - b2
    Fn = [F[i].numpy() for i in range(F.shape[0])]  # views (row-major = column-major transposed)
    Gn = [G[i].numpy() for i in range(G.shape[0])]
    n = F.shape[-1]
    h = n // 2

    def syrk() -> None:
        # numpy views of row-major F and G transposed are column-major (Fortran) arrays, which f2py
        # passes without a copy: with a = G^T (m, n) and trans=1, C = a^T a = G G^T; c = F^T, whose
        # lower triangle (lower=1) is F's upper triangle, updated in place (overwrite_c).
        for f, g in zip(Fn, Gn, strict=True):
            ssyrk(a, g.T, beta=b2, c=f.T, trans=1, lower=1, overwrite_c=1)

    def tri2() -> None:
        G1, G2 = G[:, :h], G[:, h:]
        F[:, :h, :h].baddbmm_(G1, G1.mT, beta=b2, alpha=a)
        F[:, :h, h:].baddbmm_(G1, G2.mT, beta=b2, alpha=a)
        F[:, h:, h:].baddbmm_(G2, G2.mT, beta=b2, alpha=a)

    def bf16() -> None:
        Gr = G.to(torch.bfloat16).to(torch.float32)
        F.baddbmm_(Gr, Gr.mT, beta=b2, alpha=a)

    def bf16_out() -> None:
        Gb = G.to(torch.bfloat16)
        P = torch.bmm(Gb, Gb.mT)
        F.mul_(b2).add_(P, alpha=a)

    return {
        "baddbmm": lambda: F.baddbmm_(G, G.mT, beta=b2, alpha=a),
        "syrk": syrk,
        "tri2": tri2,
        "bf16": bf16,
        "bf16_out": bf16_out,
    }


def bench_gemm(sizes: list[int], blocks: int, repeats: int, budget: float, inner: list[int]) -> None:
    shape = "n x n" if not inner else f"n x m, m in {inner}"
    print(f"# G G^T update of {blocks} blocks ({shape}), fp32 factor, CPU time per call, 1 thread")
    print(
        f"# load average {os.getloadavg()[0]:.2f}; median of {repeats} interleaved rounds; ratio = t / baddbmm"
    )
    names = list(kernels(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4), 0.9))
    print(f"{'n':>5} {'m':>5} " + " ".join(f"{k:>18}" for k in names))
    torch.manual_seed(0)
    for n, m in [(s, m) for s in sizes for m in (inner or [s])]:
        F = torch.zeros(blocks, n, n)
        G = torch.randn(blocks, n, m)
        ks = kernels(F, G, 0.999)
        flops = 2.0 * blocks * n * n * m
        reps = max(1, int(budget / (flops / 5e10)))
        times: dict[str, list[float]] = {k: [] for k in ks}
        for k in ks:  # warm-up
            ks[k]()
        for _ in range(repeats):
            for k, fn in ks.items():
                times[k].append(_cpu(fn, reps))
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med["baddbmm"]
        cells = " ".join(f"{med[k] * 1e3:9.3f}ms {med[k] / base:5.2f}x" for k in names)
        print(f"{n:>5} {m:>5} {cells}", flush=True)


# ----------------------------------------------------------------------------------------------------
# W1

VOCAB, SEQ, BATCH = W1_SIZE.vocab, W1_SIZE.seq, W1_SIZE.batch


def W1() -> EncoderLM:
    """Workload W1 (docs/design.md §8): the d_model 256 member of experiments/bench_models.py."""
    return EncoderLM(W1_SIZE)


W1_OPTIONS: dict[str, dict[str, object]] = {
    "off": {},
    "statfreq2": {"statistics_frequency": 2},
    "statfreq5": {"statistics_frequency": 5},
    "statfreq10": {"statistics_frequency": 10},
    "bf16stats": {"statistics_dtype": torch.bfloat16},
    "allon": {"statistics_frequency": 5, "statistics_dtype": torch.bfloat16},
}


def bench_w1(rounds: int, steps: int, configs: list[str]) -> None:
    """Optimizer step of each config on W1's real gradients (captured once from 10 backward passes
    and replayed in order, so every config sees the same gradients), interleaved; the forward +
    backward time (measured here too) turns the saving into a share of the whole training step."""
    torch.manual_seed(0)
    model = W1()
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1)) for _ in range(10)]
    grads, fb = [], []
    for batch in data:
        t0 = time.process_time()
        model.zero_grad(set_to_none=True)
        logits = model(batch[:, :-1])
        nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1)).backward()
        fb.append(time.process_time() - t0)
        grads.append([p.grad.clone() for p in model.parameters()])
    t_fb = statistics.median(fb)
    runs: dict[str, tuple[list[nn.Parameter], torch.optim.Optimizer]] = {}
    for name in ["adamw", *configs]:
        params = [nn.Parameter(p.detach().clone()) for p in model.parameters()]
        named = [(n, q) for (n, _), q in zip(model.named_parameters(), params, strict=True)]
        if name == "adamw":
            opt: torch.optim.Optimizer = torch.optim.AdamW(params, lr=1e-3)
        else:
            opt = shampoo.Shampoo(
                named, lr=1e-3, max_preconditioner_dim=256, precondition_frequency=10,
                grafting="adam", root_solver="eigh", **W1_OPTIONS[name],  # type: ignore[arg-type]
            )  # fmt: skip
        runs[name] = (params, opt)
    times: dict[str, list[float]] = {k: [] for k in runs}

    def window(params: list[nn.Parameter], opt: torch.optim.Optimizer) -> float:
        total = 0.0
        for i in range(steps):
            for p, g in zip(params, grads[i % len(grads)], strict=True):
                p.grad = g
            t0 = time.process_time()
            opt.step()
            total += time.process_time() - t0
        return total / steps

    for params, opt in runs.values():  # warm-up: first roots, allocator
        window(params, opt)
    loads = []
    for _ in range(rounds):
        loads.append(os.getloadavg()[0])
        for name, (params, opt) in runs.items():
            times[name].append(window(params, opt))
    print("# W1 (blocks 256, precondition_frequency 10, Adam grafting, eigh), 1 thread, process CPU time")
    print(f"# optimizer step on replayed real gradients: {rounds} interleaved rounds x {steps} steps (roots")
    print(f"# at their true rate), medians; forward+backward {t_fb * 1e3:.1f} ms (median of 10)")
    print(f"# load average per round: {' '.join(f'{x:.1f}' for x in loads)}")
    ref = statistics.median(times[configs[0]])
    t_adam = statistics.median(times["adamw"])
    print(
        f"{'config':>12} {'optim ms':>9} {'spread':>7} {'saved ms':>9} {'saved %optim':>13} {'step x AdamW':>13} {'saved %step':>12}"
    )
    for name in runs:
        v = times[name]
        o = statistics.median(v)
        spread = (max(v) - min(v)) / o
        print(
            f"{name:>12} {o * 1e3:9.2f} {spread:7.2f} {(ref - o) * 1e3:9.2f} {(ref - o) / ref * 100:12.1f}% "
            f"{(t_fb + o) / (t_fb + t_adam):13.3f} {(ref - o) / (t_fb + ref) * 100:11.1f}%"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    g.add_argument("--blocks", type=int, default=8)
    g.add_argument("--repeats", type=int, default=7)
    g.add_argument("--budget", type=float, default=0.05, help="CPU seconds per timing (approx.)")
    g.add_argument("--inner", type=int, nargs="*", default=[], help="inner dims m (default: m = n)")
    w = sub.add_parser("w1")
    w.add_argument("--rounds", type=int, default=9)
    w.add_argument("--steps", type=int, default=20, help="steps per window (a multiple of 10)")
    w.add_argument("--configs", nargs="+", default=list(W1_OPTIONS))
    args = ap.parse_args(argv)
    with _one_thread():
        if args.what == "gemm":
            bench_gemm(args.sizes, args.blocks, args.repeats, args.budget, args.inner)
        else:
            bench_w1(args.rounds, args.steps, args.configs)


if __name__ == "__main__":
    main()
