"""Every root solver on the shipped real Shampoo factors (family "shampoo"): accuracy and cost.

For each factor of ``matroots/data/shampoo_factors`` (fp32 statistics of real training runs, see
``experiments/dump_factors.py``), each solver and each working dtype, the inverse root A^{-1/p} is
computed as Shampoo computes it (``psd="shift"``, ``eps=1e-12`` absolute) and compared with a
high-precision reference (``matroots.truth.reference``) of the matrix actually solved: the factor rounded to
the working format, plus the psd shift added in that format, plus eps. Reported per (solver, dtype):
failure rate (raised a numerical error, or converged=False, or a non-finite root), median / max
relative forward error, median / max of the error over the SPD bound (kappa/p) u of the matrix solved,
matrix products per root (``res.matmuls``) and GEMM-equivalents per root (process CPU time of the solve
over that of one n x n GEMM in the same dtype, one thread).

    python experiments/real_factor_study.py                # all 66 factors, p = 4 (table to stdout)
    python experiments/real_factor_study.py --p 2 --out runs/real_factors.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matroots
from matroots import MatrootsNumericalError
from matroots.study.matrices import SHAMPOO_DATA, load_shampoo_factors
from matroots.truth import reference

DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def gemm_seconds(n: int, dtype: torch.dtype, reps: int = 20) -> float:
    a = torch.randn(n, n, dtype=dtype)
    a @ a
    t = time.process_time()
    for _ in range(reps):
        a @ a
    return max((time.process_time() - t) / reps, 1e-7)


def solved_matrix(A: np.ndarray, dtype: torch.dtype, shift: float) -> np.ndarray:
    W = torch.from_numpy(A).to(dtype)
    W.diagonal().add_(torch.tensor(shift, dtype=torch.float64).to(dtype))
    return W.double().numpy()


def study(p: int, eps: float, solvers: list[str]) -> list[dict]:
    rows = []
    factors = load_shampoo_factors(SHAMPOO_DATA)
    gemm = {}
    for A, meta in factors:
        n = A.shape[0]
        for dname, dtype in DTYPES.items():
            gemm.setdefault((n, dname), gemm_seconds(n, dtype))
            for s in solvers:
                cfg = matroots.resolve_method(s)
                row = {"solver": s, "dtype": dname, "task": meta["task"], "stage": meta["stage"], "n": n}
                row["param"], row["dim"] = meta["param"], meta["dim"]
                t = time.process_time()
                try:
                    res = cfg.solve(A, p, eps=eps, dtype=dtype, psd="shift", quiet=True)
                except MatrootsNumericalError as exc:
                    rows.append({**row, "failed": True, "error": type(exc).__name__})
                    continue
                cpu = time.process_time() - t
                X = res.root.double().numpy()
                ok = bool(res.converged) and bool(np.isfinite(X).all())
                shift = float(res.info["psd_shift"][0])
                M = solved_matrix(A, dtype, shift)
                lam = reference.eigvalsh(M) + eps
                kappa = float(lam[-1] / lam[0]) if lam[0] > 0 else float("inf")
                ref = reference.inverse_root(M, p, eps=eps)
                err = float(np.linalg.norm(X - ref.root) / np.linalg.norm(ref.root))
                bound = kappa / p * matroots.core.precision.unit_roundoff(dtype)
                rows.append(
                    {
                        **row,
                        "failed": not ok,
                        "error": "" if ok else "not converged / non-finite",
                        "forward_error": err,
                        "kappa_solved": kappa,
                        "err_over_bound": err / bound,
                        "psd_shift_rel": shift / float(lam[-1]),
                        "matmuls": res.matmuls,
                        "gemm_equivalents": cpu / gemm[(n, dname)],
                    }
                )
    return rows


def table(rows: list[dict]) -> str:
    import pandas as pd

    df = pd.DataFrame(rows)
    out = []
    for (s, d), g in df.groupby(["solver", "dtype"], sort=True):
        ok = g[~g["failed"]]
        out.append(
            {
                "solver": s,
                "dtype": d,
                "roots": len(g),
                "failure_rate": float(g["failed"].mean()),
                "median_fwd_err": float(ok["forward_error"].median()),
                "max_fwd_err": float(ok["forward_error"].max()),
                "median_err/bound": float(ok["err_over_bound"].median()),
                "max_err/bound": float(ok["err_over_bound"].max()),
                "matmuls/root": float(ok["matmuls"].median()),
                "gemm_eq/root (median)": float(ok["gemm_equivalents"].median()),
            }
        )
    return pd.DataFrame(out).to_string(index=False, float_format=lambda v: f"{v:.3g}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--p", type=int, default=4)
    ap.add_argument("--eps", type=float, default=1e-12)
    ap.add_argument("--solvers", nargs="+", default=[s for s in matroots.solvers.available() if s != "auto"])
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as CSV")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = study(args.p, args.eps, args.solvers)
    print(table(rows))
    if args.out is not None:
        import pandas as pd

        args.out.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
