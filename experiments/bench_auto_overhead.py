"""Per-call overhead of ``method="auto"``: auto against the solver it picks, and a Shampoo step with
``root_solver="auto"`` against ``"eigh"`` (issue 29 item 7).

    nice -n 10 python experiments/bench_auto_overhead.py --calls 200 --steps 300

1. Direct calls, fp32 SPD (randsvd, kappa 1e3), n in ``--n`` (default 32 and 128), one torch thread:
   ``AutoConfig()`` against the configuration it chose (same options), interleaved call by call; the
   ratio of the summed process CPU seconds, in two modes: ``cold`` (a plain call: auto estimates
   kappa with power + Cholesky inverse iteration) and ``shampoo`` (what Shampoo passes:
   ``trusted=True``, ``quiet=True``, the previous root as ``warm_start`` and the previous round's
   kappa as ``kappa_hint``: auto estimates nothing).
2. Where auto's own time goes (cold mode): cProfile of the calls, the cumulative CPU seconds per call
   of the kappa estimate, the table lookup and decision, the chosen solver's solve, and the rest.
3. Shampoo on a 20-64-2 MLP (ReLU; batch 32 of random regression data), defaults except
   ``precondition_frequency`` (``--frequency``, default 10) and ``start_preconditioning_step`` (the
   same): AdamW, Shampoo with ``root_solver="eigh"`` and ``"auto"``, each its own copy of the model
   from the same weights on the same batches, run in interleaved chunks of ``--frequency`` steps
   (each chunk holds one root round); reported: mean CPU seconds of ``opt.step()`` per step and the
   ratios.

Measured numbers go to the commit message / closing note, not into a docstring of the library.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
import warnings

import numpy as np
import torch
from torch import nn

import shampoo
from matroots.solvers.auto import AutoConfig
from matroots.solvers.auto_candidates import candidate
from matroots.solvers.auto_table import load_table
from matroots.study import matrices


def _chosen(auto: AutoConfig, A: torch.Tensor, **kw: object) -> tuple[object, dict]:
    res = auto.solve(A, 2, **kw)
    return candidate(load_table(), res.info["auto"]["chosen"][0])


def direct(n: int, calls: int) -> dict[str, float]:
    A = torch.from_numpy(matrices.generate("randsvd", n, 1e3, np.random.default_rng(1))[0]).float()
    A = 0.5 * (A + A.mT)  # exactly symmetric (trusted=True promises it)
    auto = AutoConfig()
    out = {}
    for mode in ("cold", "shampoo"):
        kw: dict = {}
        if mode == "shampoo":
            first = auto.solve(A, 2)
            kw = {"trusted": True, "quiet": True, "warm_start": first.root}
            kw["kappa_hint"] = first.info["auto"]["kappa_estimate"]
        cfg, sopts = _chosen(auto, A, **kw)
        ckw = {k: v for k, v in {**sopts, **kw}.items() if k != "kappa_hint"}
        if cfg.capabilities.warm_start != "root":
            ckw.pop("warm_start", None)
        ta = tc = 0.0
        for _ in range(calls):
            t = time.process_time()
            auto.solve(A, 2, **kw)
            ta += time.process_time() - t
            t = time.process_time()
            cfg.solve(A, 2, **ckw)
            tc += time.process_time() - t
        out[mode] = ta / tc
        print(
            f"n={n:4d} {mode:8s} chosen {cfg.name:15s} auto {ta / calls * 1e3:7.3f} ms  "
            f"chosen {tc / calls * 1e3:7.3f} ms  ratio {ta / tc:5.2f}"
        )
    return out


def profile(n: int, calls: int) -> None:
    A = torch.from_numpy(matrices.generate("randsvd", n, 1e3, np.random.default_rng(1))[0]).float()
    auto = AutoConfig()
    auto.solve(A, 2)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        auto.solve(A, 2)
    pr.disable()
    st = pstats.Stats(pr)
    cum = {}
    for (file, _, func), (_, _, _, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        cum[(file.rsplit("/", 2)[-1], func)] = ct
    total = cum.get(("auto.py", "_solve"), 0.0)
    parts = {
        "kappa estimate": cum.get(("kappa_estimate.py", "estimate_kappa"), 0.0),
        "lookup + decision": cum.get(("auto.py", "_plan"), 0.0) + cum.get(("auto.py", "decision"), 0.0),
        "chosen solver": cum.get(("auto.py", "_solve_group"), 0.0),
    }
    rest = total - sum(parts.values())
    line = ", ".join(f"{k} {v / calls * 1e3:.3f}" for k, v in parts.items())
    print(
        f"n={n:4d} profile (ms/call, under cProfile): total {total / calls * 1e3:.3f}: {line}, rest {rest / calls * 1e3:.3f}"
    )


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))


def step_ratios(steps: int, frequency: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(32, 20, generator=g), torch.randn(32, 2, generator=g)) for _ in range(16)]
    init = _mlp(0).state_dict()
    runs = {}
    for name in ("adamw", "eigh", "auto"):
        m = _mlp(0)
        m.load_state_dict(init)
        if name == "adamw":
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        else:
            opt = shampoo.Shampoo(
                m.parameters(), lr=1e-3, precondition_frequency=frequency,
                start_preconditioning_step=frequency, root_solver=name,
            )  # fmt: skip
        runs[name] = {"model": m, "opt": opt, "cpu": [], "i": 0}

    def chunk(r: dict) -> float:
        m, opt = r["model"], r["opt"]
        spent = 0.0
        for _ in range(frequency):
            x, y = data[r["i"] % len(data)]
            r["i"] += 1
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            t = time.process_time()
            opt.step()
            spent += time.process_time() - t
        return spent / frequency

    order = list(runs)
    for c in range(max(1, steps // frequency)):
        for name in order if c % 2 == 0 else order[::-1]:
            runs[name]["cpu"].append(chunk(runs[name]))
    # the first round of each run holds the one-off costs (table load, first decisions): reported apart
    mean = {k: statistics.mean(v["cpu"][1:] or v["cpu"]) for k, v in runs.items()}
    first = {k: v["cpu"][0] for k, v in runs.items()}
    print(
        f"20-64-2 MLP, frequency {frequency}, {steps} steps: opt.step() CPU per step "
        + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in mean.items())
        + f"; Shampoo/AdamW eigh {mean['eigh'] / mean['adamw']:.2f}, auto {mean['auto'] / mean['adamw']:.2f}; "
        f"auto/eigh {mean['auto'] / mean['eigh']:.2f} (first chunk: eigh {first['eigh'] * 1e6:.0f} us, "
        f"auto {first['auto'] * 1e6:.0f} us per step)"
    )
    solvers = sorted({f.solver for b in runs["auto"]["opt"].diagnostics() for f in b.factors})
    print(f"        auto chose per factor: {solvers}")
    return {"auto/eigh": mean["auto"] / mean["eigh"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--frequency", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    for n in args.n:
        direct(n, args.calls)
    for n in args.n:
        profile(n, max(20, args.calls // 4))
    step_ratios(args.steps, args.frequency)


if __name__ == "__main__":
    main()
