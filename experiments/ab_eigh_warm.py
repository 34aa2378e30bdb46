"""eigh_warm before/after: the module at a git commit against the working tree, interleaved in one process.

Issue 15, item 1 (cost per update). ``git show <commit>:matroots/solvers/eigh_warm.py`` is loaded as a
separate module (relative imports made absolute, not registered), so both versions run on the same
factors, with the same eigh/psd/input code, interleaved (the order alternates), each timed as the
minimum process CPU time of ``--repeats`` runs with one thread and divided by one batched GEMM of the
same shape timed alongside. Factors: the digits-MLP Shampoo factors of :mod:`bench_eigh_warm`
(``--models`` MLPs, a root round every ``--every`` steps from step 600). The roots of both versions
are compared (``max root diff``, relative) and their accepted / refined / fallback paths must agree.

    python experiments/ab_eigh_warm.py --before f0c60a2             # fp32 and fp64, n = 64/128/256
    python experiments/ab_eigh_warm.py --before f0c60a2 --dtypes fp32 --rounds 8
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from bench_eigh_warm import factor_sequence  # noqa: E402

from matroots.solvers import EighConfig, EighWarmConfig  # noqa: E402


def load_before(commit: str):
    src = subprocess.run(
        ["git", "show", f"{commit}:matroots/solvers/eigh_warm.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    src = re.sub(r"^from \.\. import", "from matroots import", src, flags=re.M)
    src = re.sub(r"^from \.\.(\w+) import", r"from matroots.\1 import", src, flags=re.M)
    src = re.sub(r"^from \.(\w+) import", r"from matroots.solvers.\1 import", src, flags=re.M)
    src = re.sub(r"^@register\n", "", src, flags=re.M).replace(
        'name = "eigh_warm"', 'name = "eigh_warm_before"'
    )
    path = Path(tempfile.mkdtemp()) / "eigh_warm_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("eigh_warm_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["eigh_warm_before"] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod.EighWarmConfig


def time_round(
    cfgs: dict, prev: dict, cold, seq: torch.Tensor, G: torch.Tensor, t: int, repeats: int
) -> dict:
    """Minimum CPU seconds of the round-t update (both versions), the cold eigh and one batched GEMM."""
    fns = {
        "before": lambda: cfgs["before"].solve(seq[t], 4, warm_start=prev["before"][t]),
        "after": lambda: cfgs["after"].solve(seq[t], 4, warm_start=prev["after"][t]),
        "eigh": lambda: cold.solve(seq[t], 4),
        "gemm": lambda: torch.bmm(G, G),
    }
    best = dict.fromkeys(fns, float("inf"))
    for r in range(repeats):
        for k in fns if r % 2 else list(fns)[::-1]:
            t0 = time.process_time()
            fns[k]()
            best[k] = min(best[k], time.process_time() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git commit of the 'before' eigh_warm.py")
    ap.add_argument("--dtypes", default="fp32,fp64")
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    Before = load_before(args.before)
    per_model = [
        factor_sequence(600 + args.every * (args.rounds - 1), args.every, 600, seed=m)
        for m in range(args.models)
    ]
    seqs = {n: torch.cat([s[n] for s in per_model], dim=1) for n in per_model[0]}
    print(
        f"# eigh_warm {args.before} (before) vs working tree (after), GEMM-equivalents per update, 1 thread"
    )
    for dname in args.dtypes.split(","):
        dt = {"fp32": torch.float32, "fp64": torch.float64}[dname]
        for n in sorted(seqs):
            seq = seqs[n].to(dt)
            if dt == torch.float64:
                seq = 0.5 * (seq + seq.mT)
            b = seq.shape[1]
            cfgs = {"before": Before(rank_policy="clamp"), "after": EighWarmConfig(rank_policy="clamp")}
            cold = EighConfig(rank_policy="clamp")
            prev = {k: [None] for k in cfgs}
            for t in range(seq.shape[0]):
                for k, cfg in cfgs.items():
                    prev[k].append(cfg.solve(seq[t], 4, warm_start=prev[k][-1]))
            G = torch.randn(b, n, n, dtype=dt)
            ge = {"before": [], "after": [], "eigh": []}
            diff, paths = 0.0, {}
            for t in range(1, seq.shape[0]):
                best = time_round(cfgs, prev, cold, seq, G, t, args.repeats)
                for k in ge:
                    ge[k].append(best[k] / best["gemm"])
                ra, rb = prev["after"][t + 1], prev["before"][t + 1]
                assert ra.info["warm"] == rb.info["warm"], (ra.info["warm"], rb.info["warm"])
                diff = max(
                    diff,
                    float((ra.root.double() - rb.root.double()).abs().max() / rb.root.double().abs().max()),
                )
                for k, v in ra.info["warm_counts"].items():
                    paths[k] = paths.get(k, 0) + v
            med = {k: statistics.median(v) for k, v in ge.items()}
            print(
                f"{dname} n={n:3d} b={b}: before {med['before']:6.1f}  after {med['after']:6.1f}  eigh {med['eigh']:5.1f}"
                f"  max root diff {diff:.1e}  paths {dict((k, v) for k, v in paths.items() if v)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
