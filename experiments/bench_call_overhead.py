"""Per-call overhead of a matroots solve against the bare kernels it wraps, in one interleaved run.

For eigh: ``matroots.inverse_root(A, p, method="eigh")`` against bare ``torch.linalg.eigh`` plus the
one GEMM of the root (Q diag(w^{-1/p}) Q^T), on the same SPD matrix, calls interleaved round by round
so that the load of a shared machine hits both alike. Reported: the median process CPU time per call
(all threads), in GEMM-equivalents (one n x n GEMM timed in the same rounds) and as a ratio to the
bare kernels. ``--profile`` adds a cProfile of the matroots calls (where the overhead goes).

``--mlp`` adds the small-model end of the same question: the optimizer step of Shampoo at its defaults
(``root_solver="eigh"``, roots every 100 steps) against AdamW's on a newcomer's 20-64-2 MLP, the two
models trained on the same batches, their ``step()`` calls interleaved and timed in process CPU time.

    python experiments/bench_call_overhead.py --sizes 64 128 256 --dtype fp32 fp64
    python experiments/bench_call_overhead.py --sizes 128 --profile
    python experiments/bench_call_overhead.py --sizes 128 --mlp 600
    python experiments/bench_call_overhead.py --sizes 16 128 --dtype fp32 --auto
    OMP_NUM_THREADS=1 python experiments/bench_call_overhead.py --sizes 128 --auto --kappa 10 3e3 3e5
    OMP_NUM_THREADS=1 python experiments/bench_call_overhead.py --sizes 128 --dtype fp32 --mlp 600 \
        --mlp-solver eigh auto --mlp-old /tmp/old     # /tmp/old/shampoo_old: another version, interleaved

``--mlp-old DIR`` adds another version of the ``shampoo`` package (a snapshot renamed
``shampoo_old``, as for ``experiments/bench_step_ab.py``: ``git archive <commit> shampoo | tar -x -C
DIR && mv DIR/shampoo DIR/shampoo_old``), its steps interleaved with the other two on a third copy of
the model, and whether the two versions trained the same weights bit for bit. Per-step profiles
of the MLP's step (phases, torch operations, Python calls): ``experiments/profile_mlp_step.py``.

``--auto`` adds, in the same interleaved rounds, ``method="auto"`` and the configuration it chose
(called directly with the same solve options): the ratio auto / chosen is auto's own per-call cost
(its kappa estimate, lookup and report). Each ratio is reported in process CPU time and in wall
time (medians of the interleaved rounds), with the load average before and after: on a shared
machine wall time includes waiting for a core, CPU time does not.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import os
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import matroots

DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def _spd(n: int, dtype: torch.dtype, seed: int = 0, kappa: float | None = None) -> torch.Tensor:
    """G G^T / 2n + 1e-3 I (kappa ~30 at n = 128), or with ``kappa`` an exactly symmetric randsvd
    matrix of that condition number (matroots.study.matrices)."""
    if kappa is not None:
        import numpy as np

        from matroots.study import matrices

        A = torch.from_numpy(matrices.generate("randsvd", n, kappa, np.random.default_rng(seed))[0])
        return torch.maximum(A, A.mT).to(dtype)
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(n, 2 * n, generator=g, dtype=torch.float64)
    A = G @ G.T / (2 * n) + 1e-3 * torch.eye(n, dtype=torch.float64)
    A = (A + A.T) / 2
    return A.to(dtype)


def _bare(A: torch.Tensor, p: int) -> torch.Tensor:
    w, Q = torch.linalg.eigh(A)
    W = Q * w.pow(-0.5 / p).unsqueeze(-2)
    return W @ W.mT


def _per_call(fn, reps: int) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) per call of ``fn`` over ``reps`` calls."""
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps, (time.perf_counter() - w0) / reps


def _auto_pair(A: torch.Tensor, p: int) -> tuple[object, str]:
    """method="auto" on A and a callable of the configuration it chose (same solve options)."""
    from matroots.solvers.auto_candidates import candidate
    from matroots.solvers.auto_table import load_table

    label = matroots.inverse_root(A, p, method="auto").info["auto"]["chosen"][0]
    cfg, sopts = candidate(load_table(), label)
    return (lambda: cfg.solve(A, p, **sopts)), label


def measure(
    n: int, dtype: torch.dtype, p: int, rounds: int, reps: int, auto: bool = False, kappa: float | None = None
) -> dict:
    A = _spd(n, dtype, kappa=kappa)
    B = torch.randn(n, n, dtype=dtype)
    fns = {
        "gemm": lambda: A @ B,
        "bare": lambda: _bare(A, p),
        "matroots": lambda: matroots.inverse_root(A, p, method="eigh"),
    }
    label = ""
    if auto:
        fns["chosen"], label = _auto_pair(A, p)
        fns["auto"] = lambda: matroots.inverse_root(A, p, method="auto")
    for fn in fns.values():  # warm up (thread pools, first-call allocations)
        for _ in range(3):
            fn()
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]  # alternate the order: no position bias
        for k in order:
            c, w = _per_call(fns[k], reps * (20 if k == "gemm" else 1))
            cpu[k].append(c)
            wall[k].append(w)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    medw = {k: statistics.median(v) for k, v in wall.items()}
    out = {
        "gemm_us": med["gemm"] * 1e6,
        "bare_gemms": med["bare"] / med["gemm"],
        "matroots_gemms": med["matroots"] / med["gemm"],
        "ratio": med["matroots"] / med["bare"],
        "ratio_wall": medw["matroots"] / medw["bare"],
        "overhead_us": (med["matroots"] - med["bare"]) * 1e6,
    }
    if auto:
        out.update(
            chosen=label, auto_us=med["auto"] * 1e6, chosen_us=med["chosen"] * 1e6,
            auto_ratio=med["auto"] / med["chosen"], auto_ratio_wall=medw["auto"] / medw["chosen"],
        )  # fmt: skip
    return out


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def mlp_step_ratio(steps: int, root_solver: str = "eigh", old: object = None) -> dict[str, float]:
    """Mean CPU time of Shampoo's and AdamW's ``step()`` on a 20-64-2 MLP, and their ratio; with
    ``old`` (another version's ``shampoo`` module) also that version's Shampoo, interleaved step by
    step with the two (``old_us``, ``old_ratio``: its time and its ratio to AdamW)."""
    import shampoo

    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))  # noqa: E731
    models = [make(), make(), make()]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = {
        "shampoo": shampoo.Shampoo(models[0].parameters(), lr=1e-3, root_solver=root_solver),
        "adamw": torch.optim.AdamW(models[1].parameters(), lr=1e-3),
    }
    if old is not None:
        opts["old"] = old.Shampoo(models[2].parameters(), lr=1e-3, root_solver=root_solver)  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {k: [] for k in opts}
    for _ in range(steps):
        x = torch.randn(64, 20, generator=g)
        y = torch.randn(64, 2, generator=g)
        pairs = list(zip(models, opts.items(), strict=False))  # the models of the optimizers made
        for model, (k, opt) in pairs if len(times["shampoo"]) % 2 == 0 else pairs[::-1]:
            opt.zero_grad()
            (model(x) - y).square().mean().backward()
            t0 = time.process_time()
            opt.step()
            times[k].append(time.process_time() - t0)
    # the mean, not the median: the root rounds (every 100 steps) are part of Shampoo's cost
    mean = {k: statistics.fmean(v) for k, v in times.items()}
    out = {"shampoo_us": mean["shampoo"] * 1e6, "adamw_us": mean["adamw"] * 1e6,
           "ratio": mean["shampoo"] / mean["adamw"]}  # fmt: skip
    # the first root round (step 100) alone: one-time costs (auto loads its table once per process,
    # in whichever optimizer gets there first)
    rest = {k: statistics.fmean(v[:99] + v[100:]) for k, v in times.items()} if steps > 100 else mean
    if steps > 100:
        out.update(
            first_round_ms=times["shampoo"][99] * 1e3, ratio_after_first=rest["shampoo"] / rest["adamw"]
        )
    if old is not None:  # the same training, so the same weights bit for bit where numerics are kept
        same = all(
            torch.equal(a, b) for a, b in zip(models[0].parameters(), models[2].parameters(), strict=True)
        )
        out.update(old_us=mean["old"] * 1e6, old_ratio=mean["old"] / mean["adamw"], bitwise=float(same))
        out.update(
            after_before=mean["shampoo"] / mean["old"], after_before_rest=rest["shampoo"] / rest["old"]
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[128])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "fp64"], choices=sorted(DTYPES))
    ap.add_argument("-p", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: stable CPU times under load)")
    ap.add_argument("--mlp", type=int, default=0, metavar="STEPS", help="also time the MLP steps")
    ap.add_argument("--mlp-solver", nargs="+", default=["eigh"], help="Shampoo's root_solver(s) there")
    ap.add_argument(
        "--mlp-old", type=Path, default=None, metavar="DIR",
        help="also another version's Shampoo, interleaved: DIR holds it as the package shampoo_old",
    )  # fmt: skip
    ap.add_argument("--profile", action="store_true", help="cProfile the matroots calls at the first size")
    ap.add_argument("--auto", action="store_true", help="also method='auto' against the solver it picks")
    ap.add_argument(
        "--kappa", type=float, nargs="+", default=[None],
        help="randsvd matrices of these condition numbers instead of the G G^T factor",
    )  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # auto's TargetWarning at a kappa it cannot promise
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; process CPU time (wall time), "
          f"median of {args.rounds} interleaved rounds of {args.reps} calls; {_load()}")  # fmt: skip
    head = f"{'n':>5} {'dtype':>5} {'GEMM us':>8} {'bare':>7} {'matroots':>9} {'ratio':>6} {'(wall)':>6} {'overhead us':>11}"
    if args.auto:
        head += f"  {'auto/chosen':>11} {'(wall)':>6}  chosen"
    print(head)
    for dt in args.dtype:
        for n, kappa in ((n, k) for n in args.sizes for k in args.kappa):
            r = measure(n, DTYPES[dt], args.p, args.rounds, args.reps, auto=args.auto, kappa=kappa)
            line = (
                ("" if kappa is None else f"kappa {kappa:g}: ")
                + f"{n:>5} {dt:>5} {r['gemm_us']:>8.1f} {r['bare_gemms']:>7.1f} {r['matroots_gemms']:>9.1f} "
                f"{r['ratio']:>6.2f} {r['ratio_wall']:>6.2f} {r['overhead_us']:>11.0f}"
            )
            if args.auto:
                line += f"  {r['auto_ratio']:>11.2f} {r['auto_ratio_wall']:>6.2f}  {r['chosen']}"
            print(line)
    print("(bare and matroots in GEMM-equivalents: CPU time / one n x n GEMM's; ratio: matroots / bare)")
    print(_load())
    old = None
    if args.mlp and args.mlp_old is not None:
        sys.path.insert(0, str(args.mlp_old))
        old = importlib.import_module("shampoo_old")
    for solver in args.mlp_solver if args.mlp else []:
        r = mlp_step_ratio(args.mlp, solver, old)
        print(f"20-64-2 MLP, {args.mlp} steps, mean step CPU time: Shampoo ({solver}, defaults) "
              f"{r['shampoo_us']:.0f} us, AdamW {r['adamw_us']:.0f} us, ratio {r['ratio']:.2f}")  # fmt: skip
        if "first_round_ms" in r:
            print(f"  the first root round (step 100) {r['first_round_ms']:.1f} ms; "
                  f"ratio without that step {r['ratio_after_first']:.2f}")  # fmt: skip
        if old is not None:
            print(f"  {args.mlp_old}'s Shampoo, interleaved: {r['old_us']:.0f} us, ratio {r['old_ratio']:.2f}; "
                  f"after/before {r['after_before']:.2f} (without step 100: {r['after_before_rest']:.2f}); "
                  f"same weights bit for bit: {bool(r['bitwise'])}")  # fmt: skip
    if args.profile:
        A = _spd(args.sizes[0], DTYPES[args.dtype[0]])
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            matroots.inverse_root(A, args.p, method="eigh")
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
