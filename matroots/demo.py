"""A small comparison of the solvers, run by ``make demo`` until the sweep engine lands.

Prints relative forward error, iterations and matmuls of each solver on SPD matrices with geometric
spectra (kappa 1e2..1e10) in fp64 and fp32, against an fp64 eigendecomposition of the exactly known
spectral factors (the matrices are built as Q diag(lambda) Q^T).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from . import inverse_root
from .errors import MatrootsError


def _spd(n: int, kappa: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    lam = np.logspace(0, -np.log10(kappa), n)
    A = (Q * lam) @ Q.T
    return 0.5 * (A + A.T), Q, lam


def main() -> None:
    n, p = 64, 4
    rows = []
    for kappa in (1e2, 1e6, 1e10):
        A, Q, lam = _spd(n, kappa, seed=0)
        ref = (Q * lam ** (-1.0 / p)) @ Q.T
        for dtype in (torch.float64, torch.float32):
            for method in ("eigh", "coupled_newton", "schur_newton"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        r = inverse_root(A, p, method, dtype=dtype)
                        err = np.linalg.norm(r.root.double().numpy() - ref) / np.linalg.norm(ref)
                        rows.append(
                            (
                                f"{kappa:.0e}",
                                str(dtype)[6:],
                                method,
                                f"{err:.2e}",
                                r.iterations,
                                f"{r.matmuls:.1f}",
                                r.converged,
                            )
                        )
                    except MatrootsError as exc:
                        rows.append(
                            (f"{kappa:.0e}", str(dtype)[6:], method, type(exc).__name__, "-", "-", False)
                        )
    head = ("kappa", "dtype", "method", "rel.fwd.err", "iters", "matmuls", "converged")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    print(f"inverse 4th root, n={n}, SPD geometric spectra")
    for r in (head, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
