"""Cost of the root solvers in GEMMs, and their accuracy (issue 2, "Must measure").

For n in {128, 256, 512, 1024}, float32 and float64, kappa in {1e2, 1e6} (p = 4 by default), on
A = Q diag(lambda) Q^T with a Haar-orthogonal Q and a geometric spectrum from lambda_max/kappa to 1:

* each solver's wall time as a ratio to one GEMM (n x n times n x n) of the same n and dtype, measured
  in the same run; its iterations, matmuls (GEMM-equivalents the solver reports) and relative forward
  error ||X - X_ref||_F / ||X_ref||_F;
* ``eigh / (torch eigh + GEMM)``: matroots' eigh against the bare ``torch.linalg.eigh`` plus the one GEMM
  that forms Q f(Lambda) Q^T (target <= 1.05: validation and bookkeeping cost at most 5%);
* ``CN it / GEMMs``: coupled_newton's time per iteration (``info["iteration_seconds"]`` / iterations, the
  Newton loop alone) over the matmuls one iteration costs (p = 4: X T, T^2, T^4, T^4 M) in GEMMs
  (target <= 1.1); ``CN all / GEMMs`` is the same for the whole call (spectral estimates, validation
  and the setup included) against all the matmuls it reports.

Reference: X_ref = Q diag(lambda^{-1/p}) Q^T from the known construction, evaluated in float64. The
float64 matrix A is that construction rounded, so X_ref itself is off by about (kappa/p) u_64 sqrt(n):
float64 errors at that level (1e-14 at kappa 1e2, 1e-10 at kappa 1e6) are reference-limited, float32
errors are not.

Timing: torch.set_num_threads(threads) (2 by default; scipy's BLAS pool, used by schur_newton, is
limited to the same count through threadpoolctl when it is installed). Every timing is the minimum
over ``--repeats`` runs after one warm-up run, the least disturbed by other load on the machine; the
GEMM baseline is sampled between the solver runs (interleaved, so both see the same load) and its
minimum over the whole (n, dtype) block is used.

    python experiments/bench_solvers.py               # full table (a few minutes on 2 cores)
    python experiments/bench_solvers.py --quick       # n in {64, 128}, one kappa: seconds
    python experiments/bench_solvers.py --json runs/bench_solvers.json
    python experiments/bench_solvers.py --to-target  # GEMM-equivalents to reach an error target

``--to-target`` (issue 27): for fp32 (target 1e-3) and bf16 (target 1e-2), kappa in {1e2, 1e4, 1e6}
and n = 256 (``--sizes 256 1024`` for more), the GEMM-equivalents each method needs to reach the target
relative error against the root of the matrix actually solved: the geometric-spectrum matrix rounded to
the format, shifted first where rounding moved its condition number by more than 5% (bf16 at kappa >=
1e4 rounds to an indefinite matrix; the shift makes the rounded one SPD at the kappa asked, or the
closest reachable: ``solved`` column). Reference: ``matroots.reference`` (certified by flint when installed; ``--reference lapack``:
float64 eigh). Iterative methods: the fewest products over runs with max_iter = k whose error meets the
target (k doubled then bisected; multi-stage methods cap every stage at k); eigh: its wall time over
one GEMM's of the same n and format. Beside them, Meta's and pytorch-optimizer's coupled Newton (and
Meta's higher-order coupled iteration) on the same matrices, when their packages import
(``root_peers.py`` says how each is called, its defaults, and how its products are counted); the
header says which were found. The ``default`` columns are each method at its own defaults (its own
stopping rule and iteration cap): the error and the products it spends.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import root_peers
from root_peers import PEERS

import matroots
from matroots.solvers.base import matmul_count_power

DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp64": 2.0**-53}
METHODS = ("eigh", "coupled_newton", "schur_newton")


CLOCK = time.perf_counter  # or time.process_time (--clock cpu, with one thread)


def timed_runs(fn: Callable[[], object], repeats: int, between: Callable[[], None] | None = None) -> list:
    """[(wall seconds, result)] of ``repeats`` runs of ``fn`` after one warm-up run.

    ``between`` runs before every timed run (the GEMM baseline is sampled there, interleaved with the
    solver, so both see the same load).
    """
    fn()
    runs = []
    for _ in range(repeats):
        if between is not None:
            between()
        t0 = CLOCK()
        out = fn()
        runs.append((CLOCK() - t0, out))
    return runs


class GemmClock:
    """Minimum wall time of one n x n GEMM, sampled repeatedly through a benchmark block."""

    def __init__(self, n: int, dtype: torch.dtype) -> None:
        g = torch.Generator().manual_seed(n)
        self.B = torch.randn(n, n, generator=g, dtype=torch.float64).to(dtype)
        self.best = math.inf

    def sample(self, k: int = 3) -> None:
        for _ in range(k):
            t0 = CLOCK()
            self.B @ self.B
            self.best = min(self.best, CLOCK() - t0)


def build(n: int, kappa: float, p: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A = Q diag(lambda) Q^T (float64, symmetrised) and X_ref = Q diag(lambda^{-1/p}) Q^T."""
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, n))
    Q, R = np.linalg.qr(Z)
    Q = Q * np.sign(np.diag(R))
    lam = np.logspace(-math.log10(kappa), 0.0, n)
    A = (Q * lam) @ Q.T
    X = (Q * lam ** (-1.0 / p)) @ Q.T
    return 0.5 * (A + A.T), 0.5 * (X + X.T)


def run(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(args.threads)
    rows = []
    per_iter = 1 + matmul_count_power(args.p) + 1
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for n in args.sizes:
            repeats = args.repeats if n <= 256 else max(2, args.repeats - 2)
            gemm = GemmClock(n, dtype)
            gemm.sample(10)
            block = []
            for kappa in args.kappas:
                A64, X_ref = build(n, kappa, args.p, seed=n)
                A = torch.from_numpy(A64).to(dtype)
                eigh_raw = [math.inf]

                def baselines(A=A, eigh_raw=eigh_raw, gemm=gemm):  # GEMM + bare torch eigh, between runs
                    gemm.sample()
                    t0 = CLOCK()
                    torch.linalg.eigh(A)
                    eigh_raw[0] = min(eigh_raw[0], CLOCK() - t0)

                for method in args.methods:

                    def solve(A=A, method=method):
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", matroots.ConvergenceWarning)
                            return matroots.inverse_root(A, args.p, method=method)

                    runs = timed_runs(solve, repeats, baselines if method == "eigh" else gemm.sample)
                    t = min(r[0] for r in runs)
                    res = runs[-1][1]
                    err = float(np.linalg.norm(res.root.double().numpy() - X_ref) / np.linalg.norm(X_ref))
                    bound = 10.0 * (1 + kappa / args.p) * UNIT_ROUNDOFF[dname] * math.sqrt(n)
                    row = {
                        "n": n,
                        "dtype": dname,
                        "kappa": kappa,
                        "p": args.p,
                        "method": method,
                        "seconds": t,
                        "iterations": int(res.iterations),
                        "matmuls": float(res.matmuls),
                        "converged": bool(res.converged),
                        "fwd_error": err,
                        "error_over_bound": err / bound,
                    }
                    if method == "eigh":
                        row["torch_eigh_seconds"] = eigh_raw[0]
                    if method == "coupled_newton" and res.iterations:
                        key = "iteration_cpu_seconds" if CLOCK is time.process_time else "iteration_seconds"
                        row["iteration_seconds"] = min(r.info[key] / int(r.iterations) for _, r in runs)
                    block.append(row)
            gemm.sample(10)
            for row in block:  # ratios against the best GEMM time seen in the whole block
                t_gemm = gemm.best
                row["gemm_seconds"] = t_gemm
                row["time_in_gemms"] = row["seconds"] / t_gemm
                if "torch_eigh_seconds" in row:
                    row["eigh_ratio"] = row["seconds"] / (row["torch_eigh_seconds"] + t_gemm)
                if "iteration_seconds" in row:
                    row["cn_iter_ratio"] = row["iteration_seconds"] / (per_iter * t_gemm)
                    row["cn_all_ratio"] = row["seconds"] / (row["matmuls"] * t_gemm)
                rows.append(row)
                if args.verbose:
                    print(_fmt(row), flush=True)
    return rows


HEADER = (
    f"{'n':>5} {'dtype':>5} {'kappa':>6} {'method':>15} {'ms':>9} {'/GEMM':>7} {'iters':>5} "
    f"{'matmuls':>8} {'fwd err':>9} {'err/bnd':>7}  {'eigh/(eigh+GEMM)':>16} {'CN it/GEMMs':>11} "
    f"{'CN all/GEMMs':>12}"
)


def _fmt(r: dict) -> str:
    extra_e = f"{r['eigh_ratio']:16.3f}" if "eigh_ratio" in r else " " * 16
    extra_i = f"{r['cn_iter_ratio']:11.3f}" if "cn_iter_ratio" in r else " " * 11
    extra_a = f"{r['cn_all_ratio']:12.3f}" if "cn_all_ratio" in r else " " * 12
    conv = "" if r["converged"] else " (not converged)"
    return (
        f"{r['n']:5d} {r['dtype']:>5} {r['kappa']:6.0e} {r['method']:>15} {1e3 * r['seconds']:9.2f} "
        f"{r['time_in_gemms']:7.1f} {r['iterations']:5d} {r['matmuls']:8.1f} {r['fwd_error']:9.2e} "
        f"{r['error_over_bound']:7.3f}  {extra_e} {extra_i} {extra_a}{conv}"
    )


TARGETS = {"fp32": 1e-3, "bf16": 1e-2}
TARGET_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TARGET_METHODS = ("eigh", "coupled_newton", "newton_schulz", "polar_express", "halley")
TARGET_KAPPAS = (1e2, 1e4, 1e6)
K_MAX = 64


def matrix_in_format(n: int, kappa: float, dtype: torch.dtype, p: int) -> tuple[torch.Tensor, float, float]:
    """(A in ``dtype``, kappa of that rounded matrix, shift s): build(n, kappa) rounded to ``dtype``.

    Where rounding moved the condition number more than 5% (bf16 at kappa >= 1e4: the rounded matrix is
    indefinite, its eigenvalues moved by ~u ||A||), A + s I is rounded instead, s found by bisection so
    that the rounded matrix is positive definite with a condition number within 5% of ``kappa``, or the
    closest found where the format's spacing on the diagonal is coarser than lambda_min (bf16 at kappa
    1e6). Its value is reported: every error is against the root of the matrix actually solved.
    """
    A64, _ = build(n, kappa, p, seed=n)

    def rounded(s: float) -> tuple[torch.Tensor, float]:
        B = torch.from_numpy(A64 + s * np.eye(n)).to(dtype)
        w = np.linalg.eigvalsh(B.double().numpy())
        return B, (w[-1] / w[0] if w[0] > 0 else math.inf)

    B, k = rounded(0.0)
    if abs(math.log(k / kappa)) <= math.log(1.05):
        return B, k, 0.0
    lo, hi = 0.0, 1.0 / kappa + 64 * precision_u(dtype) * math.sqrt(n)
    best = (B, k, 0.0)
    for _ in range(48):
        s = 0.5 * (lo + hi)
        B, k = rounded(s)
        if abs(math.log(k / kappa)) < abs(math.log(best[1] / kappa)):
            best = (B, k, s)
        if abs(math.log(k / kappa)) <= math.log(1.05):
            break
        lo, hi = (s, hi) if k > kappa else (lo, s)
    return best


def precision_u(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


def reference_root(A: torch.Tensor, p: int, kind: str) -> np.ndarray:
    """A^{-1/p} of the matrix solved: matroots' certified reference (flint when installed) or LAPACK."""
    W = A.double().numpy()
    if kind == "certified":
        return np.asarray(matroots.reference.inverse_root(W, p).root)
    w, V = np.linalg.eigh(W)
    return (V * w ** (-1.0 / p)) @ V.T


def fewest(run_k: Callable[[int], tuple[np.ndarray | None, float]], ref: np.ndarray, target: float) -> dict:
    """Fewest GEMM-equivalents of a k-capped iteration reaching ``target`` (k doubled, then bisected).

    ``run_k(k) -> (root or None, products)``. The error of these iterations decreases with k once they
    converge; the doubling stops at K_MAX, or once an error below 0.1 no longer falls by 10% per doubling
    (k >= 8: it has reached its rounding floor above the target; in a slow linear phase errors are ~1).
    """

    def error(k: int) -> tuple[float, float]:
        X, mm = run_k(k)
        if X is None:
            return math.inf, mm
        err = float(np.linalg.norm(X - ref) / np.linalg.norm(ref))
        return (err if math.isfinite(err) else math.inf), mm

    lo, hi, prev = 0, 1, math.inf
    while True:
        err, mm = error(hi)
        if err <= target:
            best = (err, mm)
            break
        stalled = hi >= 8 and err < 0.1 and err > 0.9 * prev
        if hi >= K_MAX or stalled:
            note = "floor" if stalled else f"not reached by k = {K_MAX}"
            note = note if math.isfinite(err) else "failed"
            return {"gemms": math.inf, "error": err, "k": None, "note": note}
        prev, lo, hi = min(err, prev), hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        err, mm = error(mid)
        if err <= target:
            hi, best = mid, (err, mm)
        else:
            lo = mid
    return {"gemms": best[1], "error": best[0], "k": hi, "note": ""}


def _ours(
    A: torch.Tensor, p: int, method: str
) -> Callable[[int | None], tuple[np.ndarray | None, float, str]]:
    def run_k(k: int | None):
        try:
            res = matroots.inverse_root(A, p, method=method, max_iter=k, quiet=True)
        except matroots.MatrootsError as exc:
            return None, math.inf, type(exc).__name__
        return (
            res.root.double().numpy(),
            float(res.matmuls),
            "converged" if res.converged else "not converged",
        )

    return run_k


def _peer(peer, mod, A: torch.Tensor, p: int) -> Callable[[int | None], tuple[np.ndarray | None, float, str]]:
    def run_k(k: int | None):
        X, mm = peer.solve(mod, A, p, k)
        return (None if X is None else X.double().numpy()), mm, ("raised" if X is None else "")

    return run_k


def _write_json(path: Path, payload: dict) -> None:
    """payload as JSON at ``path``, written to a temporary in the same folder, fsynced and renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def run_to_target(
    args: argparse.Namespace, peers: dict, on_row: Callable[[list[dict]], None] | None = None
) -> list[dict]:
    """The --to-target rows; ``on_row(rows)`` after each (the JSON is rewritten as rows arrive)."""
    torch.set_num_threads(args.threads)
    rows = []
    for dname in args.target_dtypes:
        dtype, target = TARGET_DTYPES[dname], TARGETS[dname]
        for n in args.sizes:
            gemm = GemmClock(n, dtype)
            for kappa in args.target_kappas:
                A, k_solved, shift = matrix_in_format(n, kappa, dtype, args.p)
                ref = reference_root(A, args.p, args.reference)
                base = {"n": n, "dtype": dname, "target": target, "kappa": kappa, "kappa_solved": k_solved}
                base["shift"] = shift
                runners = {m: _ours(A, args.p, m) for m in args.methods}
                runners.update(
                    {pr.name: _peer(pr, peers[pr.name], A, args.p) for pr in PEERS if peers[pr.name]}
                )
                for method, run_k in runners.items():
                    X, mm_d, status = run_k(None)
                    err_d = math.inf if X is None else float(np.linalg.norm(X - ref) / np.linalg.norm(ref))
                    row = {**base, "method": method, "default_error": err_d, "default_gemms": mm_d}
                    row["default_status"] = status
                    if method == "eigh":  # not an iteration: its time in GEMMs of the same n and format
                        runs = timed_runs(lambda A=A: matroots.inverse_root(A, args.p, method="eigh"), 3)
                        gemm.sample(10)
                        t = min(r[0] for r in runs) / gemm.best
                        row.update(gemms=t if err_d <= target else math.inf, error=err_d, k=None)
                        row.update(default_gemms=t, note="time/GEMM")
                    else:
                        row.update(fewest(lambda k, run_k=run_k: run_k(k)[:2], ref, target))
                    rows.append(row)
                    print(_fmt_target(row), flush=True)
                    if on_row is not None:
                        on_row(rows)
    return rows


TARGET_HEADER = (
    f"{'n':>5} {'dtype':>5} {'target':>6} {'kappa':>6} {'solved':>8} {'method':>32} {'GEMMs':>7} {'k':>3} "
    f"{'error':>8}  {'default: error':>14} {'GEMMs':>7} status"
)


def _fmt_target(r: dict) -> str:
    g = f"{r['gemms']:7.1f}" if math.isfinite(r["gemms"]) else "      -"
    gd = f"{r['default_gemms']:7.1f}" if math.isfinite(r["default_gemms"]) else "      -"
    k = f"{r['k']:3d}" if r.get("k") else "  -"
    return (
        f"{r['n']:5d} {r['dtype']:>5} {r['target']:6.0e} {r['kappa']:6.0e} {r['kappa_solved']:8.2e} "
        f"{r['method']:>32} {g} {k} {r['error']:8.1e}  {r['default_error']:14.1e} {gd} "
        f"{r['default_status']} {r['note']}".rstrip()
    )


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n in {64, 128}, kappa 1e2 only, 2 repeats")
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "fp64"], choices=list(DTYPES))
    ap.add_argument("--kappas", type=float, nargs="+", default=[1e2, 1e6])
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: process CPU time (with --threads 1: immune to other load on the machine)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the rows and provenance here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print rows as they are measured")
    ap.add_argument("--to-target", action="store_true", help="GEMM-equivalents to an error target (n = 256)")
    ap.add_argument("--target-dtypes", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument("--target-kappas", type=float, nargs="+", default=list(TARGET_KAPPAS))
    ap.add_argument("--no-peers", action="store_true", help="--to-target: matroots' methods only")
    ap.add_argument(
        "--reference",
        choices=["certified", "lapack"],
        default="certified",
        help="--to-target reference: matroots.reference (flint-certified when installed) or float64 LAPACK eigh",
    )
    args = ap.parse_args(argv)
    if args.to_target:
        if args.sizes == [128, 256, 512, 1024]:
            args.sizes = [256]
        if args.methods == list(METHODS):
            args.methods = list(TARGET_METHODS)
        peers = {pr.name: None for pr in PEERS} if args.no_peers else root_peers.found()
        print(
            f"torch {torch.__version__}, {args.threads} threads, p={args.p}; load {_load()}; reference {args.reference}"
        )
        for pr in PEERS:
            state = (
                "found"
                if peers[pr.name]
                else ("not run (--no-peers)" if args.no_peers else f"ABSENT ({pr.install})")
            )
            print(f"peer {pr.name}: {state}; its defaults: {pr.defaults}")
        print(TARGET_HEADER)
        found = {k: v is not None for k, v in peers.items()}
        meta = {
            "argv": sys.argv,
            "peers": found,
            "torch": torch.__version__,
            "threads": args.threads,
            "machine": platform.platform(),
            "commit": _commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

        def save(rows: list[dict], done: bool = False) -> None:
            if args.json:
                _write_json(args.json, {**meta, "complete": done, "rows": rows})

        rows = run_to_target(args, peers, on_row=save)
        save(rows, done=True)
        return 0
    if args.quick:
        args.sizes, args.kappas, args.repeats = [64, 128], [1e2], 2
    global CLOCK
    if args.clock == "cpu":
        if args.threads != 1:
            ap.error("--clock cpu needs --threads 1 (CPU time adds up over threads)")
        CLOCK = time.process_time
    try:  # scipy's LAPACK (schur_newton) has its own BLAS thread pool: give it the same thread count
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    except ImportError:
        pass
    print(
        f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {_load()}; p={args.p}; time = min over {args.repeats} runs "
        f"({args.clock} clock)"
    )
    if args.verbose:
        print(HEADER)
    rows = run(args)
    if not args.verbose:
        print(HEADER)
        for r in rows:
            print(_fmt(r))
    eigh = [r["eigh_ratio"] for r in rows if "eigh_ratio" in r]
    cn = [r["cn_iter_ratio"] for r in rows if "cn_iter_ratio" in r]
    if eigh:
        print(
            f"eigh / (torch eigh + GEMM): max {max(eigh):.3f}, median {float(np.median(eigh)):.3f} (target <= 1.05)"
        )
    if cn:
        print(
            f"coupled_newton per iteration / its GEMMs: max {max(cn):.3f}, median {float(np.median(cn)):.3f} (target <= 1.1)"
        )
    print(f"load average at the end: {_load()} (other load on the CPUs inflates the ratios)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "torch": torch.__version__,
            "threads": args.threads,
            "machine": platform.platform(),
            "argv": sys.argv,
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
