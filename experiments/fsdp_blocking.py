"""Does shard-shaped blocking (FSDP2's local-shard strategy) cost convergence? One process, no ranks.

``Shampoo(row_shards=W)`` is exactly the optimizer each of W ``fully_shard`` ranks runs
(tests/test_fsdp.py), so the comparison needs no processes: the digits MLP of experiments/train.py
(64-128-64-10, blocks of ``--block``), every seed with row_shards 1 (standard blocking) and each W
given, the same data order; reported: the validation-free training loss averaged over the last 20
steps and the first step whose 20-step mean loss is below ``--target``.

    python experiments/fsdp_blocking.py                       # row_shards 1, 2, 4; 3 seeds, 300 steps
    python experiments/fsdp_blocking.py --block 32 --seeds 5  # blocks smaller than a shard's rows
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train import build, digits_data

import shampoo


def run(seed: int, row_shards: int, args: argparse.Namespace) -> list[float]:
    model = build("digits", seed)
    opt = shampoo.Shampoo(
        model.parameters(),
        lr=args.lr,
        betas=(0.9, 0.999),
        max_preconditioner_dim=args.block,
        precondition_frequency=10,
        start_preconditioning_step=10,
        grafting="adam",
        row_shards=row_shards,
    )
    X, Y = digits_data()
    losses = []
    for step in range(args.steps):
        idx = torch.randint(0, X.shape[0], (64,), generator=torch.Generator().manual_seed(1000 * seed + step))
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(X[idx]), Y[idx])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def steps_to(losses: list[float], target: float, window: int = 20) -> int | None:
    for t in range(window, len(losses) + 1):
        if statistics.fmean(losses[t - window : t]) < target:
            return t
    return None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row-shards", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--target", type=float, default=0.2)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = {}
    print(f"digits MLP, blocks {args.block}, {args.steps} steps, target 20-step mean loss {args.target}")
    print("row_shards  final loss (mean of last 20) per seed        steps to target per seed")
    for r in args.row_shards:
        curves = [run(s, r, args) for s in range(args.seeds)]
        finals = [statistics.fmean(c[-20:]) for c in curves]
        hits = [steps_to(c, args.target) for c in curves]
        out[r] = {"final": finals, "steps_to_target": hits}
        print(f"{r:10d}  {' '.join(f'{f:.4f}' for f in finals):40s}  {hits}")
    return out


if __name__ == "__main__":
    main()
