"""Batched solve vs a loop over the blocks: does a stack cost less than its blocks solved one by one?

Issue 15, item 3. A Shampoo root round solves all blocks of one size as one stacked call; before the
active-set change, batched coupled Newton multiplied the whole stack every step until its slowest block
converged, and a stack of 32 x 128 with mixed spectra took 1.22-1.29x *longer* than the loop. Now
converged blocks leave the active set (:func:`matroots.solvers.newton_loop.coupled_newton_iterate`),
so the batch executes exactly the products of its blocks alone (``products`` column: the lockstep
count max_i(iters) * b against the executed sum_i iters, in Newton steps) and saves the per-call costs
(validation, spectral estimates, Python per step).

Cases: stacks of ``32 x 128`` and ``8 x 256`` (``--shapes``), SPD blocks Q diag(lambda) Q^T with Haar Q
and a geometric spectrum scaled by a power of two to max|A| in [1, 2); ``uniform``: every block kappa = 10^4; ``mixed``: kappa
log-spaced over [10, 10^6] (fp32; ``--kappa-max``), block order shuffled. Methods: ``eigh`` (one
batched LAPACK call vs one per block), ``coupled_newton`` (default scaling) and ``coupled_newton``
with ``scaling="frobenius"`` (the issue's measurement). Inverse 4th root (Shampoo's p), fp32 (``--dtype``).

Timing: process CPU time (``time.process_time``) with ``torch.set_num_threads(1)``, so other load on
the machine does not count (``--threads N`` > 1 switches to the wall clock, which CPU time cannot
show); batch, loop and the kernel floor are interleaved (the order alternates every repeat) after one
untimed warm-up each; the table shows the median and the minimum over ``--repeats`` and the speedup
loop / batch of the medians (> 1: the batch is faster). The load average is printed before and after.

``floor`` is the part of the loop that a batch has to execute too, timed on its own: for eigh one
syevd per matrix plus the root's GEMM W W^T; for coupled Newton the products the iterations executed
(``info["newton_matmuls"]``, the same for batch and loop) as 2-D GEMMs on one matrix's (cache-hot)
buffers, the three passes over M per step (T, M - I, its norm) and, for the default scaling, the
Lanczos estimate in its batched form. Batched kernels cost the same per matrix as 2-D ones (the
``one p = 4 Newton step`` line), so ``max`` = loop / floor bounds what batching can gain.

Measured (2026-12-01, this 2-core CPU shared with ~6 engineers, torch 2.13 CPU with MKL, one thread,
fp32, p = 4, ``--repeats 7``; ``before`` = the same benchmark on commit f0c60a2, run just before in
a git worktree at load 6.3-7.9; ``after`` at load 7.9-10.2): CPU seconds per stack (median),
speedup = loop / batch.

    stack   spectrum method        batch   loop   speedup  before   floor   max   steps lockstep/exec
    32x128  uniform  eigh          0.021  0.034    1.63     1.61    0.019  1.81
    32x128  uniform  newton        0.067  0.131    1.95     1.76    0.050  2.61    384/384
    32x128  uniform  newton_frob   0.057  0.074    1.31     1.14    0.044  1.70    448/448
    32x128  mixed    eigh          0.020  0.033    1.65     1.55    0.019  1.76
    32x128  mixed    newton        0.066  0.127    1.94     1.81    0.048  2.65    544/359
    32x128  mixed    newton_frob   0.054  0.072    1.34     1.12    0.042  1.73    608/414
    8x256   uniform  eigh          0.023  0.027    1.16     1.14    0.022  1.26
    8x256   uniform  newton        0.103  0.115    1.12     1.02    0.082  1.40     96/96
    8x256   uniform  newton_frob   0.107  0.107    1.00     0.99    0.088  1.22    112/112
    8x256   mixed    eigh          0.024  0.029    1.19     1.14    0.022  1.32
    8x256   mixed    newton        0.102  0.110    1.08     1.02    0.078  1.42    136/90
    8x256   mixed    newton_frob   0.115  0.107    0.93     0.96    0.081  1.31    152/107
    one p = 4 Newton step: 32x128 batched 4.46 ms vs 4.63 ms as 32 single steps; 8x256 7.82 vs 7.68 ms

fp64 (``--dtype fp64 --repeats 5``, load 10-12, before / after), speedup loop / batch:

    stack   spectrum   eigh          newton        newton_frob   (after: floor max eigh / newton / frob)
    32x128  uniform    1.44 / 1.47   1.07 / 1.37   0.87 / 1.03   1.77 / 2.11 / 1.43
    32x128  mixed      1.40 / 1.45   1.30 / 1.47   0.94 / 1.00   1.72 / 2.09 / 1.50
    8x256   uniform    1.08 / 1.09   0.97 / 1.03   0.89 / 0.95   1.23 / 1.21 / 1.14
    8x256   mixed      1.11 / 1.09   0.94 / 0.97   0.89 / 0.98   1.19 / 1.21 / 1.16

Batch and loop roots are bitwise equal in every case (``max diff`` 0). What changed (issue 15): the
coupled Newton work buffers are reused across calls (:mod:`matroots.solvers.workspace`): a batched
solve of 32 x 128 or 8 x 256 fp32 paid 4000-4800 page faults per call (fresh 2 MiB buffers, which
glibc hands back to the kernel on free; 3-5 ms), the loop over its blocks ~150 in all; departures fill
their row from the end of the active set (one move each); the roots are scaled as elements leave.
That put 32 x 128 Frobenius at 1.31-1.34 (was 1.12-1.14). The >= 1.3x target is met for every
32 x 128 case in fp32 (fp64: eigh and default Newton, not Frobenius, 1.00-1.03 with max 1.43-1.50),
and **cannot be met at 8 x 256**: 70-88% of the loop there is syevd or GEMM work that a batch executes
too at the same cost per matrix (``max`` 1.22-1.32 for eigh and Frobenius, 1.40-1.42 for default
Newton in fp32, 1.14-1.23 in fp64); only the rest (validation, the spectral estimate, the per-step
scalars) can be saved. ``max`` is optimistic (cache-hot 2-D kernels): the batch's own products stream
b matrices through the cache and run a few % slower than the loop's (fp32 8 x 256: ~195 vs ~180 us per
GEMM in cProfile), which is what keeps Frobenius there at 0.93-1.00.

    python experiments/bench_batching.py                    # all cases, 7 repeats (~2 min)
    python experiments/bench_batching.py --dtype fp64
    python experiments/bench_batching.py --repeats 3 --shapes 32x128
    python experiments/bench_batching.py --json runs/bench_batching.json
    python experiments/bench_batching.py --threads 2     # wall clock
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matroots

DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
METHODS = {
    "eigh": ("eigh", {}),
    "newton": ("coupled_newton", {}),
    "newton_frob": ("coupled_newton", {"scaling": "frobenius"}),
}


def spd_stack(b: int, n: int, kappas: np.ndarray, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """(b, n, n) SPD blocks with Haar eigenvectors and geometric spectra of the given kappas."""
    rng = np.random.default_rng(seed)
    out = np.empty((b, n, n))
    for i, kappa in enumerate(kappas):
        Q, R = np.linalg.qr(rng.standard_normal((n, n)))
        Q *= np.sign(np.diag(R))
        lam = np.logspace(-np.log10(kappa), 0.0, n)
        A = (Q * lam) @ Q.T
        A = 0.5 * (A + A.T)
        # max|A| in [1, 2) by an exact power of two: the API pre-scales a whole call by one power of two
        # outside [1/4, 4], and per-call factors would make the loop's roots differ from the batch's in
        # the last bits for a reason unrelated to batching (the ``max diff`` column then shows 0)
        out[i] = A * 2.0 ** -np.floor(np.log2(np.abs(A).max()))
    return torch.from_numpy(out).to(dtype)


def kappas_for(spectrum: str, b: int, kappa_max: float, seed: int) -> np.ndarray:
    if spectrum == "uniform":
        return np.full(b, 1e4)
    k = np.logspace(1.0, np.log10(kappa_max), b)
    np.random.default_rng(seed).shuffle(k)
    return k


CLOCK = time.process_time  # process CPU time (one thread); wall clock with --threads > 1


def cpu_time(fn) -> float:
    t = CLOCK()
    fn()
    return CLOCK() - t


def kernel_floor(A: torch.Tensor, method: str, opts: dict, res_l: list) -> tuple:
    """(floor, label): the per-matrix kernels of the loop that a batch executes too, as a timed callable.

    eigh: one syevd per matrix plus the root's GEMM W W^T (a batched call runs the same syevd per
    matrix). Coupled Newton: the products its iterations executed (``info["newton_matmuls"]``, exactly
    those of the batch) as 2-D GEMMs, and per executed step the three passes over M (T = coef - M/p,
    M - I, its norm) on one matrix's buffers; with the default scaling also the spectral estimate,
    timed in its batched form (24 Lanczos steps, cheaper than per matrix). Batched kernels cost the
    same per matrix (the step line below), so a batch cannot beat loop / floor.
    """
    from matroots.core.spectral import lanczos_extremes

    n = A.shape[-1]
    if method == "eigh":
        mats = [A[i].clone() for i in range(A.shape[0])]

        def floor():
            for a in mats:
                _, Q = torch.linalg.eigh(a)
                torch.matmul(Q, Q.mT)

        return floor, "syevd + W W^T"
    count = round(sum(float(one.info["newton_matmuls"][0]) for one in res_l))
    steps = sum(int(one.iterations) for one in res_l)
    x, y, z, r = (torch.randn(n, n, dtype=A.dtype) for _ in range(4))
    eye = torch.eye(n, dtype=A.dtype)
    lanczos = opts.get("scaling", "auto") in ("auto", "optimal", "dynamic")

    def floor():
        for _ in range(count):
            torch.matmul(x, y, out=z)
        for _ in range(steps):
            torch.add(eye, x, alpha=-0.25, out=z)
            torch.sub(x, eye, out=r)
            torch.linalg.matrix_norm(r).tolist()
        if lanczos:
            lanczos_extremes(A, 24)

    return floor, f"{count} GEMMs, {steps} steps" + (", Lanczos" if lanczos else "")


def run_case(A: torch.Tensor, method: str, opts: dict, p: int, repeats: int) -> dict:
    def batch():
        return matroots.inverse_root(A, p, method=method, **opts)

    def loop():
        return [matroots.inverse_root(A[i], p, method=method, **opts) for i in range(A.shape[0])]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        res_b, res_l = batch(), loop()  # warm-up, and the results compared below
        floor, floor_label = kernel_floor(A, method, opts, res_l)
        floor()
        tb, tl, tf = [], [], []
        for r in range(repeats):  # interleaved, the order alternating
            order = [(tb, batch), (tl, loop), (tf, floor)]
            for times, fn in order if r % 2 == 0 else order[::-1]:
                times.append(cpu_time(fn))
    row = {
        "batch_med_s": statistics.median(tb),
        "loop_med_s": statistics.median(tl),
        "batch_min_s": min(tb),
        "loop_min_s": min(tl),
        "floor_med_s": statistics.median(tf),
        "floor": floor_label,
        "converged": f"{int(torch.as_tensor(res_b.converged).sum())}/{A.shape[0]}",
        "max_diff": max(
            float((res_b.root[i] - one.root).abs().max() / one.root.abs().max())
            for i, one in enumerate(res_l)
        ),
    }
    row["speedup"] = row["loop_med_s"] / row["batch_med_s"]
    row["speedup_min"] = row["loop_min_s"] / row["batch_min_s"]
    row["max_speedup"] = row["loop_med_s"] / row["floor_med_s"]  # loop / kernels a batch must run too
    if method == "coupled_newton":
        its = [int(k) for k in res_b.iterations.tolist()]
        assert its == [one.iterations for one in res_l]
        row["iters"] = f"{min(its)}-{max(its)}"
        row["lockstep_steps"] = max(its) * len(its)
        row["executed_steps"] = sum(its)
        row["matmuls_batch_x_b"] = res_b.matmuls * len(its)
        row["matmuls_loop_sum"] = sum(one.matmuls for one in res_l)
    return row


def step_microbench(b: int, n: int, dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """CPU seconds of one inverse p = 4 Newton step (T = 5/4 I - M/4, X T, T^2, T^4, T^4 M, ||M - I||)
    on a (b, n, n) stack as one batched step vs b steps on 2-D matrices (median of ``repeats``)."""
    eye = torch.eye(n, dtype=dtype)
    coef = eye * 1.25
    bufs = [torch.randn(b, n, n, dtype=dtype) * 0.01 + eye for _ in range(8)]

    def step(X, M, T, Xn, Mn, P1, P2, R):
        torch.add(coef, M, alpha=-0.25, out=T)
        torch.matmul(X, T, out=Xn)
        torch.matmul(T, T, out=P1)
        torch.matmul(P1, P1, out=P2)
        torch.matmul(P2, M, out=Mn)
        torch.sub(Mn, eye, out=R)
        torch.linalg.matrix_norm(R).tolist()

    def batched():
        step(*bufs)

    def looped():
        for i in range(b):
            step(*(x[i] for x in bufs))

    tb, tl = [], []
    for _ in range(repeats):
        tb.append(cpu_time(batched))
        tl.append(cpu_time(looped))
    return statistics.median(tb), statistics.median(tl)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="32x128,8x256", help="comma-separated BxN stacks")
    ap.add_argument("--spectra", default="uniform,mixed")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--kappa-max", type=float, default=1e6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["fp32", "fp64"], default="fp32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (> 1: timed by the wall clock)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    global CLOCK
    torch.set_num_threads(args.threads)
    CLOCK = time.process_time if args.threads == 1 else time.perf_counter
    load0 = os.getloadavg()
    rows = []
    header = (
        f"{'shape':>7} {'spectrum':>8} {'method':>11} {'batch s':>8} {'loop s':>8} {'speedup':>7} "
        f"{'(min)':>6} {'floor s':>8} {'max':>5} {'iters':>6} {'steps lockstep/exec':>19} {'conv':>6} "
        f"{'max diff':>8}"
    )
    clock = "process CPU time" if args.threads == 1 else "wall clock"
    print(
        f"load average before: {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}; torch {torch.__version__}, "
        f"{args.threads} thread(s), {clock}, {args.dtype}, p = {args.p}, {args.repeats} repeats"
    )
    print(header)
    for shape in args.shapes.split(","):
        b, n = (int(x) for x in shape.lower().split("x"))
        for spectrum in args.spectra.split(","):
            A = spd_stack(
                b, n, kappas_for(spectrum, b, args.kappa_max, args.seed), args.seed, DTYPES[args.dtype]
            )
            for key in args.methods.split(","):
                method, opts = METHODS[key]
                row = {
                    "shape": shape,
                    "spectrum": spectrum,
                    "method": key,
                    **run_case(A, method, opts, args.p, args.repeats),
                }
                rows.append(row)
                steps = f"{row['lockstep_steps']}/{row['executed_steps']}" if "iters" in row else "-"
                print(
                    f"{shape:>7} {spectrum:>8} {key:>11} {row['batch_med_s']:8.3f} {row['loop_med_s']:8.3f} "
                    f"{row['speedup']:7.2f} {row['speedup_min']:6.2f} {row['floor_med_s']:8.3f} "
                    f"{row['max_speedup']:5.2f} {row.get('iters', '-'):>6} {steps:>19} "
                    f"{row['converged']:>6} {row['max_diff']:8.1e}",
                    flush=True,
                )
    for shape in args.shapes.split(","):
        b, n = (int(x) for x in shape.lower().split("x"))
        sb, sl = step_microbench(b, n, DTYPES[args.dtype], 5 * args.repeats)
        rows.append({"shape": shape, "method": "one_newton_step", "batch_med_s": sb, "loop_med_s": sl})
        print(
            f"one p = 4 Newton step on {shape}: batched {1e3 * sb:.2f} ms, as {b} single steps {1e3 * sl:.2f} ms"
        )
    load1 = os.getloadavg()
    print(
        "floor: the loop's per-matrix kernels that a batch runs too (eigh: syevd + W W^T; Newton: its executed "
        "products as 2-D GEMMs, 3 passes over M per step, Lanczos); max = loop / floor, the best speedup possible"
    )
    print(f"load average after: {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "torch": torch.__version__,
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "load_before": load0,
            "load_after": load1,
            "args": {k: str(v) for k, v in vars(args).items()},
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
