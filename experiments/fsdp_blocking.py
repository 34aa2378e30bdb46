"""Does shard-shaped blocking (FSDP2's local-shard strategy) cost convergence? One process, no ranks.

``Shampoo(row_shards=W)`` is exactly the optimizer each of W ``fully_shard`` ranks runs
(tests/test_fsdp.py), so the comparison needs no processes: the digits MLP of experiments/train.py
(64-128-64-10, blocks of ``--block``), every seed with row_shards 1 (standard blocking) and each W
given, the same data order; reported: the validation-free training loss averaged over the last 20
steps and the first step whose 20-step mean loss reaches the target: ``--target`` (0.2 on digits), on
W1 by default the loss every standard-blocking seed reaches (the largest of their final 20-step
means): how many steps does shard-shaped blocking need to reach what standard blocking reaches?
``--task w1`` runs workload W1 (the transformer of experiments/train.py on its Markov-chain tokens,
global batch 16, lr 1e-3) instead of the digits MLP; ``--json`` writes every curve. With ``--json``,
each finished (row_shards, seed) curve is also saved at once beside it (``<json>.curves.json``, for
the same arguments only), and a rerun with the same arguments reuses those curves: a W1 run takes
hours on 2 cores and must survive being stopped.

    python experiments/fsdp_blocking.py                       # row_shards 1, 2, 4; 3 seeds, 300 steps
    python experiments/fsdp_blocking.py --block 32 --seeds 5  # blocks smaller than a shard's rows
    python experiments/fsdp_blocking.py --task w1 --json runs/fsdp_blocking_w1.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train import build, digits_data, markov_tokens

import shampoo


def run(seed: int, row_shards: int, args: argparse.Namespace) -> list[float]:
    model = build(args.task, seed)
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
    X, Y = digits_data() if args.task == "digits" else (None, None)
    losses = []
    for step in range(args.steps):
        if args.task == "w1":
            xb, yb = markov_tokens(args.batch, step, seed)
        else:
            g = torch.Generator().manual_seed(1000 * seed + step)
            idx = torch.randint(0, X.shape[0], (args.batch,), generator=g)
            xb, yb = X[idx], Y[idx]
        opt.zero_grad(set_to_none=True)
        out = model(xb)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def steps_to(losses: list[float], target: float, window: int = 20) -> int | None:
    for t in range(window, len(losses) + 1):
        if statistics.fmean(losses[t - window : t]) <= target:
            return t
    return None


def _load_curves(cache: Path | None, sig: dict) -> dict[str, list[float]]:
    """The curves an earlier run with the same arguments (``sig``) saved in ``cache``; else none."""
    if cache is None or not cache.exists():
        return {}
    saved = json.loads(cache.read_text())
    return dict(saved["curves"]) if saved.get("args") == sig else {}


def _save_curves(cache: Path, sig: dict, curves: dict[str, list[float]]) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".tmp")
    tmp.write_text(json.dumps({"args": sig, "curves": curves}))
    tmp.replace(cache)  # atomic: a stop mid-write keeps the previous file


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=["digits", "w1"], default="digits")
    p.add_argument("--row-shards", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--batch", type=int, default=None, help="default: 64 digits, 16 w1 (as train.py)")
    p.add_argument("--lr", type=float, default=None, help="default: 3e-3 digits, 1e-3 w1 (as train.py)")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="default: 0.2 digits; w1: what every row_shards=1 seed reaches",
    )
    p.add_argument("--json", default=None, help="write the curves and the table to this file")
    args = p.parse_args(argv)
    args.batch = args.batch or (16 if args.task == "w1" else 64)
    args.lr = args.lr or (1e-3 if args.task == "w1" else 3e-3)
    torch.set_num_threads(1)
    shards = sorted(set(args.row_shards) | {1})
    cache = Path(args.json + ".curves.json") if args.json else None
    sig = {k: v for k, v in vars(args).items() if k not in ("json", "row_shards", "seeds", "target")}
    done = _load_curves(cache, sig)
    curves = {}
    for r in shards:
        curves[r] = []
        for s in range(args.seeds):
            key = f"{r}:{s}"
            if key not in done:
                done[key] = run(s, r, args)
                if cache is not None:
                    _save_curves(cache, sig, done)
            curves[r].append(done[key])
    target = args.target if args.target is not None else (0.2 if args.task == "digits" else None)
    if target is None:
        target = max(statistics.fmean(c[-20:]) for c in curves[1])
    model = "W1 transformer" if args.task == "w1" else "digits MLP"
    print(f"{model}, blocks {args.block}, {args.steps} steps, target 20-step mean loss {target:.4f}")
    print("row_shards  final loss (mean of last 20) per seed        steps to target per seed")
    out: dict = {"task": args.task, "target": target, "args": vars(args), "rows": {}}
    for r in shards:
        finals = [statistics.fmean(c[-20:]) for c in curves[r]]
        hits = [steps_to(c, target) for c in curves[r]]
        out["rows"][r] = {"final": finals, "steps_to_target": hits, "curves": curves[r]}
        print(f"{r:10d}  {' '.join(f'{f:.4f}' for f in finals):40s}  {hits}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
