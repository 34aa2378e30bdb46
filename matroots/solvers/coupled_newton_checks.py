"""The checks of coupled_newton on general input (:mod:`matroots.solvers.coupled_newton`, failure is
never silent): the eigenvalues of the matrix solved and their condition numbers (Golub & Van Loan,
*Matrix Computations*, 4th ed., §7.2.2), and after the run the principal branch (the scalar model of
each eigenvalue, and the root's own eigenvalues) and the true residual.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..core.conditioning import eigenvalue_conditions
from .newton_checks import NewtonOutcome
from .newton_core import principal_branch_ok, scalar_limits
from .newton_loop import materialise


def general_spectrum(A: torch.Tensor, info: dict) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (b, n) of general input and their condition numbers (LAPACK, working format)."""
    eigs, kappas = [], []
    for Ai in A:
        w, k = eigenvalue_conditions(Ai)
        eigs.append(w)
        kappas.append(k)
    info["eigvals_calls"] = A.shape[0]
    return np.stack(eigs), np.stack(kappas)


def check_principal(eigs: np.ndarray, p: int, cp: torch.Tensor, out: NewtonOutcome, info: dict) -> None:
    """Mark elements that converged to a non-principal root (scalar model of each eigenvalue)."""
    for i in range(eigs.shape[0]):
        if not bool(out.converged[i]):
            continue
        x = scalar_limits(eigs[i], p, float(cp[i]), int(out.iterations[i]))
        ok = principal_branch_ok(eigs[i], x, p)
        if not ok.all():
            out.converged[i] = False
            out.reason[i] = "non_principal_root"
            info["non_principal_eigenvalues"] = eigs[i][~ok]
    if "non_principal_root" in out.reason:
        info["hint"] = (
            "eigenvalues far from the positive real axis were drawn to a non-principal root; "
            "use method='schur_newton', which takes square roots first"
        )


def check_root_sector(out: NewtonOutcome, p: int, info: dict) -> None:
    """Mark converged elements whose computed root has an eigenvalue outside |arg| < pi/p.

    The principal p-th root (or inverse root) has its eigenvalues lambda^{+-1/p} in that open
    sector; any other root has one at |arg| >= pi/p. The scalar model in :func:`check_principal`
    is exact arithmetic: in a 16-bit format the matrix iteration can leave it and settle on another
    root (bf16, eigenvalues at arg ~1.9, p = 3: error 1.06, Y^p = A to 2%), which the backward error
    cannot see. One LAPACK eigenvalue computation of the root per element (float64).
    """
    for i in range(out.X.shape[0]):
        if not bool(out.converged[i]) or not bool(torch.isfinite(out.X[i]).all()):
            continue  # a non-finite root is reported by the finalisation
        mu = torch.linalg.eigvals(out.X[i].double()).numpy()
        if not (np.abs(np.angle(mu)) < np.pi / p).all():
            out.converged[i] = False
            out.reason[i] = "non_principal_root"
            info["root_eigenvalue_args"] = np.angle(mu)
            info["hint"] = (
                "the computed root has eigenvalues outside the principal sector |arg| < pi/p; "
                "use method='schur_newton', which takes square roots first"
            )


def check_true_residual(
    out: NewtonOutcome, A: torch.Tensor, shift: torch.Tensor, p: int, u: float, info: dict
) -> None:
    """General input, inverse root: mark converged elements whose true residual is far above its floor.

    R = X^p (A + shift I) - I is formed in float64 and compared with two floors; exceeding either gives
    stop reason ``"true_residual"``.

    * Product-of-norms floor: r = ||R||_2 / (||X||_2^p ||A + shift I||_2) <= 4 p sqrt(n) u. The exact
      root rounded to the compute format has r <~ p sqrt(n) u; on a non-normal matrix with eigenvalues
      far from the positive axis the coupled iteration's path has large transients (fp64, arguments up
      to 0.9 pi, p = 8: error 24 times the cond(f, A) bound while ||M_k - I|| met tol). Accurate runs
      measured r <= 1.4 p sqrt(n) u.
    * First-order floor: ||R||_F <= 4 (n + 1) u phi, phi = sum_{k<p} ||X^{k+1}||_F ||X^{p-1-k} A||_F.
      Rounding X to the format (E, ||E||_F <= u ||X||_F) moves R by sum_k X^k E X^{p-1-k} A, at most
      u phi; forming R in float64 adds at most ~n u_64 phi. For a non-normal X the product of norms
      overstates this by ||X||^p ||A|| / phi (1900 / 6 on the case below), so a drift can hide under
      the first floor: fp64, arguments up to 0.9 pi, kappa 10, p = 8: error 1.3e-12, 21 times the
      bound, with r = 0.3 of the first floor but ||R||_F = 249 u phi. Over 450 converged runs
      (nonsymmetric n = 8, kappa 1e1-1e3, both angle ranges, fp64 and fp32, p = 2-8, all within the
      bound) ||R||_F <= 12 u phi; the rounded exact root measured 0.3 u phi.
    """
    n = A.shape[-1]
    r_all, floor_all = [], []
    eye = torch.eye(n, dtype=torch.float64)
    for i in range(out.X.shape[0]):
        X = out.X[i].double()
        if not bool(torch.isfinite(X).all()):
            r_all.append(math.inf)
            floor_all.append(math.inf)
            continue
        As = materialise(A[i : i + 1], shift[i : i + 1], torch.float64)[0]
        powers = [eye]  # X^0 .. X^p
        for _ in range(p):
            powers.append(powers[-1] @ X)
        R = powers[p] @ As - eye
        scale = torch.linalg.matrix_norm(X, ord=2) ** p * torch.linalg.matrix_norm(As, ord=2)
        r = float(torch.linalg.matrix_norm(R, ord=2) / scale) if float(scale) > 0 else math.inf
        phi = sum(
            float(torch.linalg.matrix_norm(powers[k + 1]) * torch.linalg.matrix_norm(powers[p - 1 - k] @ As))
            for k in range(p)
        )
        f = float(torch.linalg.matrix_norm(R)) / (u * phi) if phi > 0 else math.inf
        r_all.append(r)
        floor_all.append(f)
        if bool(out.converged[i]) and not (r <= 4.0 * p * math.sqrt(n) * u and f <= 4.0 * (n + 1)):
            out.converged[i] = False
            out.reason[i] = "true_residual"
    info["true_residual"] = torch.tensor(r_all, dtype=torch.float64)
    info["true_residual_floor_ratio"] = torch.tensor(floor_all, dtype=torch.float64)  # ||R||_F / (u phi)


__all__ = [
    "check_principal",
    "check_root_sector",
    "check_true_residual",
    "general_spectrum",
]
