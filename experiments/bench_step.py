"""Workload W1 (docs/design.md §8): step time of Shampoo against AdamW on a small transformer encoder.

W1: 4-layer ``nn.TransformerEncoder`` (d_model 256, 4 heads, feed-forward 1024, torch's default
dropout 0.1), token embedding and LM head over a vocabulary of 512, sequences of 128 tokens, batch
16, ``torch.set_num_threads(2)``. Shampoo: blocks of 256, Adam grafting, eigh roots in fp32,
precondition_frequency 10 (and 100). Every configuration trains its own copy of the model from the
same initial weights on the same batches; configurations are interleaved in chunks so that machine
noise hits them alike. Each timed window spans a multiple of every precondition frequency, so root
computations enter the mean at their true rate.

Prints, per configuration: total step time (zero_grad + forward + backward + optimizer), the
optimizer step alone, the root computations' share, and the ratios against AdamW. On a shared
machine load bursts inflate means, so the headline is a contention-robust estimate: the median over
chunks of the per-step time without root work, plus the median root round (the same 106 roots in
every Shampoo run) divided by the frequency. Minima ("best") and plain means are printed too, and the
1-minute load average each round.

    python experiments/bench_step.py                  # 10 rounds x 10 steps per configuration
    python experiments/bench_step.py --rounds 20 --out runs/bench_step.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import shampoo

VOCAB, D_MODEL, HEADS, FF, LAYERS, SEQ, BATCH = 512, 256, 4, 1024, 4, 128, 16


class W1Model(nn.Module):
    """Token + position embedding, a 4-layer encoder and an LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(SEQ, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos))


@dataclass
class Run:
    name: str
    model: nn.Module
    opt: torch.optim.Optimizer
    total: list[float] = field(default_factory=list)  # per step: zero_grad + forward + backward + step
    optim: list[float] = field(default_factory=list)  # per step: optimizer.step()
    roots: list[float] = field(default_factory=list)  # per step: root computations inside step()
    symmetrisation: str = "lazy"  # see symmetrisation()
    frequency: int | None = None  # precondition_frequency (None: AdamW)

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> None:
        with symmetrisation(self.symmetrisation):
            self._step(tokens, targets)

    def _step(self, tokens: torch.Tensor, targets: torch.Tensor) -> None:
        r0 = self.opt.timing.root_seconds if isinstance(self.opt, shampoo.Shampoo) else 0.0
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        t1 = time.perf_counter()
        self.opt.step()
        t2 = time.perf_counter()
        self.total.append(t2 - t0)
        self.optim.append(t2 - t1)
        r1 = self.opt.timing.root_seconds if isinstance(self.opt, shampoo.Shampoo) else 0.0
        self.roots.append(r1 - r0)

    def clear(self) -> None:
        self.total.clear()
        self.optim.clear()
        self.roots.clear()

    def chunks(self, chunk: int) -> list[tuple[float, float]]:
        """Per chunk of ``chunk`` steps: mean (total, optimizer) time per step without root work."""
        out = []
        for i in range(0, len(self.total) // chunk * chunk, chunk):
            sl = slice(i, i + chunk)
            r = sum(self.roots[sl])
            out.append(((sum(self.total[sl]) - r) / chunk, (sum(self.optim[sl]) - r) / chunk))
        return out


@contextlib.contextmanager
def symmetrisation(mode: str) -> Iterator[None]:
    """How factor statistics are kept symmetric during one step (``--symmetrisation compare``).

    * ``"lazy"``: as shipped: the upper triangle is accumulated and mirrored onto the lower one when a
      factor is read (each root round; :func:`shampoo.state.mirror_upper_`);
    * ``"none"``: no mirroring at all (the optimizer before symmetric statistics);
    * ``"eager"``: mirrored after every statistics update (a bitwise-symmetric factor at every step).
    """
    if mode == "lazy":
        yield
        return
    import shampoo.preconditioner as pre
    import shampoo.roots as roots_mod
    import shampoo.state as state_mod

    saved = (roots_mod.mirror_upper_, state_mod.mirror_upper_, pre.BlockBucket.update_statistics)
    if mode == "none":
        roots_mod.mirror_upper_ = state_mod.mirror_upper_ = lambda F: F
    elif mode == "eager":
        orig = saved[2]

        def update(self, sel, G, opts, steps):  # type: ignore[no-untyped-def]
            m = orig(self, sel, G, opts, steps)
            for F in self.factors:
                saved[1](F)
            return m

        pre.BlockBucket.update_statistics = update  # type: ignore[method-assign]
    else:
        raise ValueError(f"unknown symmetrisation mode {mode!r}")
    try:
        yield
    finally:
        roots_mod.mirror_upper_, state_mod.mirror_upper_, pre.BlockBucket.update_statistics = saved


def estimate(run: Run, chunk: int, frequency: int | None, rounds: list[float], pick) -> tuple[float, float]:
    """Per-step (total, optimizer) time: ``pick`` (median or min) over chunks of the time without root
    work, plus ``pick`` over all root rounds (the same work in every Shampoo run) / frequency."""
    ch = run.chunks(chunk)
    total, optim = pick([c[0] for c in ch]), pick([c[1] for c in ch])
    if frequency and rounds:
        total += pick(rounds) / frequency
        optim += pick(rounds) / frequency
    return total, optim


def make_runs(
    frequencies: list[int], root_solver: str, seed: int, modes: tuple[str, ...] = ("lazy",)
) -> list[Run]:
    torch.manual_seed(seed)
    init = W1Model().state_dict()
    runs = []

    def fresh() -> nn.Module:
        m = W1Model()
        m.load_state_dict(init)
        return m

    m = fresh()
    runs.append(Run("adamw", m, torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)))
    for f in frequencies:
        for mode in modes:
            m = fresh()
            opt = shampoo.Shampoo(
                m.named_parameters(),
                lr=1e-3,
                betas=(0.9, 0.999),
                weight_decay=0.01,
                max_preconditioner_dim=256,
                precondition_frequency=f,
                start_preconditioning_step=1,
                grafting="adam",
                root_solver=root_solver,
            )
            name = f"shampoo_f{f}" + ("" if mode == "lazy" else f"_{mode}sym")
            runs.append(Run(name, m, opt, symmetrisation=mode, frequency=f))
    return runs


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    ap.add_argument("--chunk", type=int, default=10, help="steps per configuration per round (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per configuration (default 3)")
    ap.add_argument("--frequencies", type=int, nargs="+", default=[10, 100])
    ap.add_argument(
        "--symmetrisation",
        choices=["shipped", "compare"],
        default="shipped",
        help="compare: also run, interleaved, Shampoo without symmetric statistics (nosym) and with a "
        "per-step mirror (eagersym)",
    )
    ap.add_argument("--root-solver", default="eigh")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    timed = args.rounds * args.chunk
    for f in args.frequencies:
        if timed % f:
            print(
                f"warning: {timed} timed steps is not a multiple of frequency {f}; roots enter at the wrong rate"
            )

    g = torch.Generator().manual_seed(args.seed)
    batches = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(8)]
    modes = ("none", "lazy", "eager") if args.symmetrisation == "compare" else ("lazy",)
    runs = make_runs(args.frequencies, args.root_solver, args.seed, modes)
    load = [os.getloadavg()[0]]
    for run in runs:  # warm-up (includes Shampoo's first, cold, root computation)
        for i in range(args.warmup):
            b = batches[i % len(batches)]
            run.step(b[:, :-1], b[:, 1:])
        run.clear()
        if isinstance(run.opt, shampoo.Shampoo):
            run.opt.timing.reset()
    for r in range(args.rounds):
        order = runs if r % 2 == 0 else runs[::-1]  # ABC CBA ...: neighbours share the machine's mood
        for run in order:
            for i in range(args.chunk):
                b = batches[(r * args.chunk + i) % len(batches)]
                run.step(b[:, :-1], b[:, 1:])
        load.append(os.getloadavg()[0])
        print(
            f"round {r + 1}/{args.rounds} (load {load[-1]:.1f}): "
            + ", ".join(f"{x.name} {statistics.fmean(x.total[-args.chunk :]):.3f}s" for x in runs),
            flush=True,
        )

    rounds = [r for run in runs for r in run.roots if r > 0]
    base = runs[0]
    base_mean = statistics.fmean(base.total), statistics.fmean(base.optim)
    base_rob = estimate(base, args.chunk, None, rounds, statistics.median)
    base_best = estimate(base, args.chunk, None, rounds, min)
    results = {
        "workload": "W1",
        "threads": args.threads,
        "timed_steps": timed,
        "root_solver": args.root_solver,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1min": load,
        "root_rounds_s": rounds,
        "configs": {},
    }
    print()
    print(
        f"W1, {args.threads} threads, {timed} timed steps per configuration; load average "
        f"{min(load):.1f}-{max(load):.1f}; {len(rounds)} root rounds, median {statistics.median(rounds or [0]):.3f}s"
    )
    print(
        "per step. robust: median over chunks of the time without root work + median root round / frequency; "
        "best: the same with minima; mean: all timed steps as they came"
    )
    header = (
        f"{'config':<22}{'total s':>9}{'optim s':>9}{'roots s':>9}{'root share':>11}"
        f"{'total/AdamW':>12}{'optim/AdamW':>12}{'best':>8}{'mean':>8}"
    )
    print(header)
    print("-" * len(header))
    for run in runs:
        f = run.frequency
        # compare: each variant's own root rounds (the lazy mirror runs inside them); else pooled
        own = [r for r in run.roots if r > 0] if args.symmetrisation == "compare" else rounds
        rob = estimate(run, args.chunk, f, own, statistics.median)
        best = estimate(run, args.chunk, f, own, min)
        root = statistics.median(own) / f if f and own else 0.0
        entry = {
            "total_s": rob[0],
            "optimizer_s": rob[1],
            "fwd_bwd_s": rob[0] - rob[1],
            "root_s_per_step": root,
            "root_share_of_total": root / rob[0],
            "root_share_of_optimizer": root / rob[1],
            "total_ratio": rob[0] / base_rob[0],
            "optimizer_ratio": rob[1] / base_rob[1],
            "best_total_ratio": best[0] / base_best[0],
            "best_optimizer_ratio": best[1] / base_best[1],
            "mean_total_s": statistics.fmean(run.total),
            "mean_total_ratio": statistics.fmean(run.total) / base_mean[0],
            "mean_optimizer_ratio": statistics.fmean(run.optim) / base_mean[1],
        }
        results["configs"][run.name] = entry
        print(
            f"{run.name:<22}{rob[0]:>9.4f}{rob[1]:>9.4f}{root:>9.4f}{100 * entry['root_share_of_total']:>10.1f}%"
            f"{entry['total_ratio']:>11.3f}x{entry['optimizer_ratio']:>11.2f}x"
            f"{entry['best_total_ratio']:>7.3f}x{entry['mean_total_ratio']:>7.3f}x"
        )
    for run in runs[1:]:
        e = results["configs"][run.name]
        print(
            f"{run.name}: total step {e['total_ratio']:.3f}x AdamW (best {e['best_total_ratio']:.3f}x, mean "
            f"{e['mean_total_ratio']:.3f}x); optimizer step alone {1e3 * e['optimizer_s']:.1f} ms = "
            f"{e['optimizer_ratio']:.1f}x AdamW's; root computation {1e3 * e['root_s_per_step']:.1f} ms/step = "
            f"{100 * e['root_share_of_total']:.1f}% of the step, {100 * e['root_share_of_optimizer']:.0f}% of the "
            "optimizer step"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
