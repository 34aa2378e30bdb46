"""The cold start of coupled Newton (:mod:`matroots.solvers.coupled_newton`, module docstring: the
scalings): c^p per batch element from the Frobenius norm, power iteration or Lanczos estimates (Guo &
Higham 2006, eq. (3.11); the capped start for forward roots and p > 8, :mod:`matroots.solvers.newton_core`),
and the choice between Guo & Higham's c and Frobenius's by the scalar model.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.inputs import Problem
from ..core.spectral import SpectrumEstimate, power_lambda_max
from .newton_core import (
    forward_top,
    optimal_c_power,
    predicted_iterations,
)
from .newton_loop import shifted_fro


def cold_scaling(
    A: torch.Tensor,
    shift: torch.Tensor,
    est: SpectrumEstimate | None,
    scaling: str,
    p: int,
    capped: bool,
    tol: float,
    max_iter: int,
    info: dict,
    prob: Problem,
    power_iters: int,
) -> tuple[torch.Tensor, tuple[np.ndarray, np.ndarray] | None, float]:
    """c^p of a cold start (per element), the dynamic scaling's interval (or None) and the matrix
    products the estimates cost (module docstring: the scalings; ``est`` is Lanczos on A + shift I,
    needed by "optimal" and "dynamic")."""
    b = A.shape[0]
    fwd_fro = min((p + 1) / 2, forward_top(p)) if capped else 1.0
    if scaling == "frobenius":
        fro = shifted_fro(A, shift)
        return (fro / fwd_fro if capped else 2.0 * fro / (p + 1)), None, 0.0
    if scaling == "power":
        lam_p, mv = power_lambda_max(A, power_iters)
        lam_p = (lam_p + shift).clamp_min(torch.finfo(torch.float64).tiny)
        return (lam_p / fwd_fro if capped else 2.0 * lam_p / (p + 1)), None, mv / A.shape[-1]
    assert est is not None
    interval = None
    lmax = (est.lmax_upper * (1 + 1e-6)).numpy()
    lmin = np.clip(est.lmin.numpy(), 0.0, None)
    cpn = lmax / forward_top(p) if capped else optimal_c_power(lmin, lmax, p)
    info.update(lambda_min_est=est.lmin / prob.prescale, lambda_max_est=est.lmax / prob.prescale)
    if scaling == "dynamic":
        interval = (np.maximum(lmin, lmax * 1e-300) / cpn, lmax / cpn)
    elif not capped:
        cpn, info["c_choice"] = choose_optimal_c(A, shift, est, cpn, p, tol, max_iter)
    else:
        info["c_choice"] = ["lambda_max / beta_p (M_0's spectrum in (0, beta_p], see newton_core)"] * b
    return torch.as_tensor(cpn, dtype=torch.float64), interval, 0.0


def choose_optimal_c(
    A: torch.Tensor,
    shift: torch.Tensor,
    est: SpectrumEstimate,
    c_gh: np.ndarray,
    p: int,
    tol: float,
    max_iter: int,
) -> tuple[np.ndarray, list[str]]:
    """Guo & Higham's c, or Frobenius's c where the scalar model predicts strictly fewer iterations.

    Guo & Higham's c minimises the worst eigenvalue after the first step, which is not always the
    fewest steps in total (e.g. a geometric spectrum with kappa 100 and p = 8 takes 10 steps with it
    and 9 with Frobenius's c). Both candidates are run through the scalar model on the Ritz values
    (all eigenvalues when n <= lanczos_steps; otherwise weighted by n times the Gauss weights), at
    no matrix cost, and the faster one is taken (Guo & Higham's on ties).
    """
    n = A.shape[-1]
    c_f = (2.0 * shifted_fro(A, shift) / (p + 1)).numpy()
    theta, weights = est.ritz.numpy(), est.weights.numpy()
    out = np.array(c_gh, dtype=float, copy=True)
    choice = []
    for i in range(out.shape[0]):
        kept = np.isfinite(theta[i])  # rows of elements given fewer Ritz values are NaN-padded
        th = np.clip(theta[i][kept], 0.0, None)
        mult = np.ones_like(th) if th.shape[0] == n else n * weights[i][kept]
        k_gh = predicted_iterations(th, mult, p, float(c_gh[i]), tol, max_iter=max_iter)
        k_f = predicted_iterations(th, mult, p, float(c_f[i]), tol, max_iter=max_iter)
        if k_f < k_gh:
            out[i] = c_f[i]
            choice.append("frobenius (scalar model: fewer iterations)")
        else:
            choice.append("guo_higham")
    return out, choice


__all__ = [
    "choose_optimal_c",
    "cold_scaling",
]
