"""method="auto" decomposing first (matroots.solvers.auto_first) against estimating first (main's
path: auto's _first_decision disabled), interleaved in one process, as auto / chosen solver cost
(process CPU time, medians over rounds of --reps calls) for n = 128, p = 4:
  default  fp32, G G^T / 2n + 1e-3 I (bench_call_overhead's well-conditioned factor; eigh chosen)
  fp32-1e5 fp32 randsvd kappa 1e5 (polar_express chosen; lambda_min within fp32's bound)
  fp64-1e3 fp64 randsvd kappa 1e3 (lowest band eigh[clamp], kappa's band eigh[perturb])
Also decomposing first without the Cholesky test before it (auto_first.likely_certain).

  OMP_NUM_THREADS=1 PYTHONPATH=. python experiments/bench_auto_first.py --rounds 31
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

from matroots.solvers.auto import AutoConfig
from matroots.solvers.auto_candidates import candidate
from matroots.solvers.auto_first import first_decision
from matroots.solvers.auto_table import load_table
from matroots.study import matrices


def _cases(n: int) -> dict[str, torch.Tensor]:
    G = torch.randn(n, 2 * n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    default = (G @ G.T / (2 * n) + 1e-3 * torch.eye(n, dtype=torch.float64)).float()

    def rs(kappa: float, dtype: torch.dtype) -> torch.Tensor:
        A = torch.from_numpy(matrices.generate("randsvd", n, kappa, np.random.default_rng(1))[0]).to(dtype)
        return torch.maximum(A, A.mT)

    return {
        "default": torch.maximum(default, default.mT),
        "fp32-1e5": rs(1e5, torch.float32),
        "fp64-1e3": rs(1e3, torch.float64),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-p", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    estimate_first = AutoConfig()
    # main's path: always the float64 estimate first (the instance attribute shadows the method)
    object.__setattr__(estimate_first, "_first_decision", lambda *a: None)
    first = AutoConfig()
    untested = AutoConfig()  # decomposing first without the Cholesky test (the branch's first commit)

    def no_test(call, plan, opts):  # AutoConfig._first_decision without likely_certain
        psd = opts.psd if opts.psd is not None else untested.psd
        return first_decision(plan, call.b, call.n, psd, call.exact_sym, call.wdtype != call.t.dtype)

    object.__setattr__(untested, "_first_decision", no_test)
    for name, A in _cases(args.n).items():
        res = first.solve(A, args.p)
        label = res.info["auto"]["chosen"][0]
        ref = estimate_first.solve(A, args.p)
        cfg, sopts = candidate(load_table(), label)
        direct = cfg.solve(A, args.p, **sopts)
        assert torch.equal(res.root, direct.root) and torch.equal(ref.root, direct.root), name
        calls = {
            "chosen": lambda A=A, cfg=cfg, sopts=sopts: cfg.solve(A, args.p, **sopts),
            "estimate_first": lambda A=A: estimate_first.solve(A, args.p),
            "decompose_first": lambda A=A: first.solve(A, args.p),
            "untested": lambda A=A: untested.solve(A, args.p),
        }
        times: dict[str, list[float]] = {k: [] for k in calls}
        for f in calls.values():
            f()
        for r in range(args.rounds):
            keys = list(calls)
            keys = keys[r % len(keys) :] + keys[: r % len(keys)]  # rotate the order
            for k in keys:
                t0 = time.process_time()
                for _ in range(args.reps):
                    calls[k]()
                times[k].append((time.process_time() - t0) / args.reps)
        med = {k: float(np.median(v)) for k, v in times.items()}
        print(
            f"{name:9s} chosen {label:28s} {med['chosen'] * 1e3:7.3f} ms  auto/chosen: estimate first (main) "
            f"{med['estimate_first'] / med['chosen']:.3f}, this branch {med['decompose_first'] / med['chosen']:.3f}"
            f" (no Cholesky test {med['untested'] / med['chosen']:.3f})"
            f"  [kappa_source: {res.info['auto']['kappa_source'][:40]}]"
        )


if __name__ == "__main__":
    main()
