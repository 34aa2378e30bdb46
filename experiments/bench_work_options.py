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

* ``w1``: the step of workload W1 (docs/design.md §7; 4-layer encoder, d_model 256, blocks 256,
  precondition_frequency 10, Adam grafting, eigh) per Shampoo option setting against AdamW, whole
  training step (zero_grad + forward + backward + optimizer step) and the optimizer step alone.

    nice -n 5 .venv/bin/python experiments/bench_work_options.py gemm --repeats 7
    nice -n 5 .venv/bin/python experiments/bench_work_options.py w1 --rounds 6 --steps 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable

import torch
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


def bench_gemm(sizes: list[int], blocks: int, repeats: int, budget: float) -> None:
    print(f"# G G^T update of {blocks} blocks (n x n), fp32 factor, CPU time per call, 1 thread")
    print(
        f"# load average {os.getloadavg()[0]:.2f}; median of {repeats} interleaved rounds; ratio = t / baddbmm"
    )
    names = list(kernels(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4), 0.9))
    print(f"{'n':>5} " + " ".join(f"{k:>18}" for k in names))
    torch.manual_seed(0)
    for n in sizes:
        F = torch.zeros(blocks, n, n)
        G = torch.randn(blocks, n, n)
        ks = kernels(F, G, 0.999)
        flops = 2.0 * blocks * n**3
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
        print(f"{n:>5} {cells}", flush=True)


# ----------------------------------------------------------------------------------------------------
# W1

VOCAB, D_MODEL, HEADS, FF, LAYERS, SEQ, BATCH = 512, 256, 4, 1024, 4, 128, 16


class W1(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(SEQ, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos))


W1_OPTIONS: dict[str, dict[str, object]] = {
    "shampoo": {},
    "statfreq2": {"statistics_frequency": 2},
    "statfreq5": {"statistics_frequency": 5},
    "statfreq10": {"statistics_frequency": 10},
    "bf16stats": {"statistics_dtype": torch.bfloat16},
}


def bench_w1(rounds: int, steps: int, configs: list[str]) -> None:
    torch.manual_seed(0)
    base = W1()
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1)) for _ in range(8)]
    runs: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {}
    for name in ["adamw", *configs]:
        model = W1()
        model.load_state_dict(base.state_dict())
        if name == "adamw":
            opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        else:
            opt = shampoo.Shampoo(
                model.named_parameters(), lr=1e-3, max_preconditioner_dim=256, precondition_frequency=10,
                grafting="adam", root_solver="eigh", **W1_OPTIONS[name],  # type: ignore[arg-type]
            )  # fmt: skip
        runs[name] = (model, opt)
    total: dict[str, list[float]] = {k: [] for k in runs}
    optim: dict[str, list[float]] = {k: [] for k in runs}
    counter = 0

    def one(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[float, float]:
        nonlocal counter
        batch = data[counter % len(data)]
        counter += 1
        t0 = time.process_time()
        opt.zero_grad(set_to_none=True)
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        t1 = time.process_time()
        opt.step()
        t2 = time.process_time()
        return t2 - t0, t2 - t1

    for model, opt in runs.values():  # warm-up: 10 steps (first roots, allocator)
        for _ in range(10):
            one(model, opt)
    loads = []
    for _ in range(rounds):
        loads.append(os.getloadavg()[0])
        for name, (model, opt) in runs.items():
            t_tot = t_opt = 0.0
            for _ in range(steps):
                a, b = one(model, opt)
                t_tot, t_opt = t_tot + a, t_opt + b
            total[name].append(t_tot / steps)
            optim[name].append(t_opt / steps)
    print("# W1 (blocks 256, precondition_frequency 10, Adam grafting, eigh), 1 thread, CPU time per step")
    print(
        f"# {rounds} interleaved rounds x {steps} steps (a multiple of 10: roots at their true rate); medians"
    )
    print(f"# load average per round: {' '.join(f'{x:.1f}' for x in loads)}")
    t_adam = statistics.median(total["adamw"])
    t_sh = statistics.median(total[configs[0]]) if configs else float("nan")
    o_sh = statistics.median(optim[configs[0]]) if configs else float("nan")
    print(
        f"{'config':>12} {'step ms':>9} {'x AdamW':>8} {'optim ms':>9} {'saved/step ms':>14} {'saved %step':>12}"
    )
    for name in runs:
        t, o = statistics.median(total[name]), statistics.median(optim[name])
        print(
            f"{name:>12} {t * 1e3:9.2f} {t / t_adam:8.3f} {o * 1e3:9.2f} {(o_sh - o) * 1e3:14.2f} "
            f"{(t_sh - t) / t_sh * 100:11.1f}%"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    g.add_argument("--blocks", type=int, default=8)
    g.add_argument("--repeats", type=int, default=7)
    g.add_argument("--budget", type=float, default=0.05, help="CPU seconds per timing (approx.)")
    w = sub.add_parser("w1")
    w.add_argument("--rounds", type=int, default=6)
    w.add_argument("--steps", type=int, default=20)
    w.add_argument("--configs", nargs="+", default=list(W1_OPTIONS))
    args = ap.parse_args(argv)
    with _one_thread():
        if args.what == "gemm":
            bench_gemm(args.sizes, args.blocks, args.repeats, args.budget)
        else:
            bench_w1(args.rounds, args.steps, args.configs)


if __name__ == "__main__":
    main()
