"""The warm start of coupled_newton (:mod:`matroots.solvers.coupled_newton`, module docstring: warm
start): the previous root in this problem's units, the spectral interval it gives (Lanczos, Golub &
Van Loan §10.1; c^p from Guo & Higham 2006, eq. (3.11)) and the Cholesky test of its lower end.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.errors import InvalidArgumentError, NonFiniteInputError
from ..core.inputs import Problem
from ..core.result import RootResult
from ..core.spectral import SpectrumEstimate, lanczos_extremes
from .newton_core import capped_start, forward_top, optimal_c_power
from .newton_loop import materialise
from .spd_start import shifted_estimate

WARM_LMIN_FACTOR = 4.0
"""A warm start's lower end lambda_min must be within this factor of the true one (module docstring)."""
WARM_CHECK_MATMULS = 1.0 / 6.0
"""The Cholesky test of a warm start's lower end, in matrix products (n^3/3 flops against 2 n^3)."""


def warm_root(warm_start: object, A: torch.Tensor, p: int, prob: Problem, inverse: bool) -> torch.Tensor:
    """The previous root as a (b, n, n) tensor in A's dtype and pre-scaled units.

    Raises InvalidArgumentError for a wrong shape and NonFiniteInputError for NaN/Inf entries."""
    Z = warm_start.root if isinstance(warm_start, RootResult) else warm_start
    if not isinstance(Z, torch.Tensor):
        Z = torch.as_tensor(np.asarray(Z))
    if Z.shape[-2:] != A.shape[-2:] or Z.numel() != A.numel():
        raise InvalidArgumentError(
            f"warm_start root has shape {tuple(Z.shape)}, but the input is {A.shape[0]} matrices of "
            f"size {A.shape[-1]}; pass the previous result for the same (batch of) matrices"
        )
    Z = Z.detach().reshape(A.shape).to(torch.float64)
    bad = ~torch.isfinite(Z).flatten(1).all(-1)
    if bool(bad.any()):
        raise NonFiniteInputError(
            f"warm_start has NaN or Inf entries (batch elements {bad.nonzero().flatten().tolist()}); "
            "pass a finite previous root, or warm_start=None for a cold start"
        )
    if prob.prescale != 1.0:
        # the root of (sA) is s^{-1/p} Z (inverse) or s^{1/p} Z (forward root).
        Z = Z * prob.prescale ** ((-1.0 if inverse else 1.0) / p)
    return (0.5 * (Z + Z.mT)).to(A.dtype)


def warm_scaling(
    A: torch.Tensor, shift: torch.Tensor, p: int, Z: torch.Tensor, inverse: bool, lanczos_steps: int
) -> tuple[torch.Tensor, tuple[np.ndarray, np.ndarray], np.ndarray, int, SpectrumEstimate]:
    """c^p, the dynamic-scaling interval and its lower end lambda_min (in A + shift I's units) from
    Lanczos on A + shift I and the previous root's extremes.

    The top Ritz value plus its residual bound is an upper bound of lambda_max. The lower end is the
    previous root's estimate where it is below the smallest Ritz value (itself an upper bound of
    lambda_min): a guess, checked by :func:`lower_end_holds`. Forward roots start with
    c^p = lambda_max / beta_p (M_0's spectrum in (0, beta_p], see newton_core).
    """
    est = shifted_estimate(lanczos_extremes(A, lanczos_steps), shift)
    zest = lanczos_extremes(Z, lanczos_steps)
    lmax = (est.lmax_upper * (1 + 1e-6)).numpy()
    ritz_min = np.clip(est.lmin.numpy(), 0.0, None)
    if inverse:  # Z ~ A^{-1/p}: lambda_min ~ zmax^{-p}; the upper estimate of zmax keeps it low
        from_z = zest.lmax_upper.clamp_min(1e-300).numpy() ** (-p)
    else:  # Z ~ A^{1/p}: lambda_min ~ zmin^p
        from_z = np.clip(zest.lmin.numpy(), 0.0, None) ** p
    lmin = np.minimum(np.minimum(ritz_min, from_z), lmax)
    lmin = np.maximum(lmin, lmax * 1e-300)
    cpn = lmax / forward_top(p) if capped_start(p, inverse) else optimal_c_power(lmin, lmax, p)
    return torch.as_tensor(cpn), (lmin / cpn, lmax / cpn), lmin, est.matvecs + zest.matvecs, est


def lower_end_holds(A: torch.Tensor, shift: torch.Tensor, lmin: np.ndarray) -> torch.Tensor:
    """(b,) bool: lambda_min(A + shift I) < WARM_LMIN_FACTOR * lmin, shown by a failing Cholesky
    factorisation of A + (shift - WARM_LMIN_FACTOR lmin) I in float64 (module docstring, warm start).

    A success proves the opposite up to Cholesky's backward error (~n u_64 ||A||): the previous root
    belongs to a matrix whose smallest eigenvalue is far below this one's, and the interval would
    make the dynamic scaling push the whole true spectrum towards p + 1 (rounding errors amplified
    by the interval's kappa instead of A's). Cost: one Cholesky per element (1/6 of a GEMM).
    """
    Ad = materialise(A, shift, torch.float64)
    d = torch.diagonal(Ad, dim1=-2, dim2=-1)
    d -= torch.as_tensor(WARM_LMIN_FACTOR * np.asarray(lmin, dtype=float), dtype=torch.float64)[:, None]
    _, fail = torch.linalg.cholesky_ex(Ad)
    return fail > 0


__all__ = ["WARM_CHECK_MATMULS", "WARM_LMIN_FACTOR", "lower_end_holds", "warm_root", "warm_scaling"]
