"""Benchmark of matroots.truth.reference: time of one reference A^{-1/p} per size and backend.

    python experiments/bench_reference.py                 # n in 32 64 128 256, both backends
    python experiments/bench_reference.py --quick         # n in 32 64 (CI-sized)
    python experiments/bench_reference.py --sizes 64 128 --mpmath-max-n 64

The matrix is a symmetric randsvd (mode 3, geometric spectrum) with kappa = --kappa, p = --p, default
digits (the documented rule), cache off. mpmath is pure Python and O(n^3) with large constants (about
a minute at n = 128, several at n = 256, each run being two eigendecompositions for the cross-check),
so sizes above --mpmath-max-n (default 128) are skipped for it and reported as such. The flint/mpmath
ratio is taken from the same run. Target (issue 3): n = 128 in at most 3 s with flint.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

from matroots.study import matrices
from matroots.truth import reference


def time_one(A: np.ndarray, p: int, backend: str, repeats: int) -> tuple[float, reference.Reference]:
    best = float("inf")
    ref = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        ref = reference.inverse_root(A, p, backend=backend, cache=False)
        best = min(best, time.perf_counter() - t0)
    assert ref is not None
    return best, ref


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--quick", action="store_true", help="sizes 32 and 64 only")
    ap.add_argument("--kappa", type=float, default=1e12)
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--mpmath-max-n", type=int, default=128, help="skip mpmath above this n (it is slow)")
    ap.add_argument("--repeats", type=int, default=1, help="best of this many runs (flint)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sizes = [32, 64] if args.quick else args.sizes
    backends = ["flint", "mpmath"] if reference.flint_available() else ["mpmath"]
    print(
        f"# reference benchmark: randsvd mode 3, kappa={args.kappa:.0e}, p={args.p}, default digits; "
        f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus"
    )
    print(f"{'n':>5} {'backend':>8} {'seconds':>9} {'digits':>6} {'error_bound':>11}  notes")
    rows = []
    for n in sizes:
        A, _ = matrices.generate("randsvd", n, args.kappa, np.random.default_rng(args.seed))
        times: dict[str, float] = {}
        roots: dict[str, np.ndarray] = {}
        for backend in backends:
            if backend == "mpmath" and n > args.mpmath_max_n:
                print(f"{n:>5} {backend:>8} {'skipped':>9}  (n > --mpmath-max-n {args.mpmath_max_n})")
                continue
            reps = args.repeats if backend == "flint" else 1
            sec, ref = time_one(A, args.p, backend, reps)
            times[backend], roots[backend] = sec, ref.root
            note = ref.method_notes.split(":")[0][:60]
            print(f"{n:>5} {backend:>8} {sec:>9.3f} {ref.digits:>6} {ref.error_bound:>11.1e}  {note}")
            sys.stdout.flush()
        if len(times) == 2:
            agree = np.linalg.norm(roots["flint"] - roots["mpmath"]) / np.linalg.norm(roots["mpmath"])
            ratio = times["flint"] / times["mpmath"]
            print(
                f"{n:>5} {'ratio':>8} flint/mpmath = {ratio:.4f} ({1 / ratio:.0f}x faster); roots agree to {agree:.1e}"
            )
            rows.append((n, ratio))
    if 128 in sizes and "flint" in backends:
        print("# target: flint at n = 128 <= 3 s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
