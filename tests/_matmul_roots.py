"""Shared checks for the SPD matmul root iterations (newton_schulz, polar_express, halley).

Bound (the solver contract, docs/design.md §3): a root flagged converged has relative Frobenius error

    ||X - X_ref||_F / ||X_ref||_F <= C (cond(f, A) + 1) u sqrt(n),   C = 10,

against the high-precision reference (matroots.truth.reference: python-flint or mpmath) of the matrix actually
solved (the input rounded to the working format, plus eps_abs I), where cond(f, A) is the relative
condition number of the root asked for (matroots.truth.metrics.cond_root, Frobenius norms). The
sqrt(n) is the rounding of the n x n output itself (as in tests/_refs.py).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

import matroots
from matroots.study import matrices
from matroots.truth import metrics, reference

C = 10.0
DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}


def solved_matrix(A: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """A rounded to ``dtype`` (as the solver sees it), in float64, exactly symmetric."""
    W = torch.from_numpy(np.asarray(A, dtype=np.float64)).to(dtype).double().numpy()
    return 0.5 * (W + W.T)


def check_accurate_or_reported(
    method: str, A: np.ndarray, p: int, dtype: torch.dtype, *, inverse: bool = True, eps: float = 0.0, **kw
) -> str:
    """Solve; a converged root must meet the bound. Returns "converged", "reported" (converged=False)
    or "refused" (a MatrootsNumericalError, e.g. the rounded matrix is not positive definite)."""
    fn = matroots.inverse_root if inverse else matroots.root
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", matroots.ConvergenceWarning)
            res = fn(torch.from_numpy(np.asarray(A)), p, method=method, dtype=dtype, eps=eps, **kw)
    except matroots.MatrootsNumericalError:
        return "refused"
    if not bool(np.all(res.converged)):
        return "reported"
    M = solved_matrix(A, dtype)
    eps_abs = float(np.asarray(res.info["eps_abs"]).reshape(-1)[0])
    ref = (reference.inverse_root if inverse else reference.root)(M, p, eps=eps_abs).root
    X = res.root.double().numpy()
    err = float(np.linalg.norm(X - ref) / np.linalg.norm(ref))
    cond = metrics.cond_root(M, p, inverse=inverse, eps=eps_abs)
    u = matroots.core.precision.unit_roundoff(dtype)
    bound = C * (cond + 1.0) * u * math.sqrt(A.shape[0])
    assert err <= bound, f"{method} p={p} {dtype}: error {err:.3e} > bound {bound:.3e} (cond {cond:.3e})"
    return "converged"


def family_matrix(family: str, n: int, kappa: float, seed: int) -> np.ndarray:
    A, _ = matrices.generate(family, n, kappa, np.random.default_rng(seed))
    return A
