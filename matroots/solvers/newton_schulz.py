"""Newton-Schulz iteration for A^{-1} from a warm start (Schulz 1933; Higham 2008, eq. (7.12) with p = 1).

X_{k+1} = X_k + X_k R_k, R_k = I - A X_k. Its true residual squares exactly each step, R_{k+1} = R_k^2,
for any X_0, so from a previous inverse Z with ||I - A Z|| < 1 it converges quadratically from the first
step. Used by :mod:`matroots.solvers.coupled_newton` for warm-started p = 1.
"""

from __future__ import annotations

import torch

from .base import eye_like
from .newton_core import NewtonOutcome


def newton_schulz_inverse(
    A: torch.Tensor,
    Z: torch.Tensor,
    *,
    tol: float,
    max_iter: int,
    stagnation_accept: float,
    record_history: bool = False,
) -> NewtonOutcome | None:
    """A^{-1} by the Newton-Schulz iteration X <- X + X R, R = I - A X, from X_0 = Z (a warm start).

    R_{k+1} = R_k^2 exactly, so it converges quadratically for any Z with ||I - A Z|| < 1; None is
    returned when ||I - A Z||_F >= 1/2 for some batch element (the caller then starts cold). The
    residual is the true one, whose rounding floor is about kappa(A) sqrt(n) u, so a stagnating run is
    accepted when its residual is below ``stagnation_accept`` times kappa_F = ||A||_F ||X||_F (and < 1/2).
    """
    I = eye_like(A)
    b = A.shape[0]
    X = Z
    R = I - A @ X
    res = torch.linalg.matrix_norm(R.double() if R.dtype != torch.float64 else R)
    if bool((res >= 0.5).any()):
        return None
    kappa_f = torch.linalg.matrix_norm(A.double()) * torch.linalg.matrix_norm(Z.double())
    accept = torch.clamp(stagnation_accept * torch.clamp(kappa_f, min=1.0), max=0.5)
    matmuls = 1.0
    active = res > tol
    converged = ~active
    iters = torch.zeros(b, dtype=torch.int64)
    reason = ["tol" if bool(c) else "max_iter" for c in converged]
    history = [res.clone()] if record_history else []
    for _k in range(max_iter):
        if not bool(active.any()):
            break
        X_new = X + X @ R
        R_new = I - A @ X_new
        matmuls += 2
        res_new = torch.linalg.matrix_norm(R_new.double() if R_new.dtype != torch.float64 else R_new)
        res_new = torch.where(torch.isfinite(res_new), res_new, torch.full_like(res_new, float("inf")))
        hit_tol = active & (res_new <= tol)
        stagnated = active & ~hit_tol & (res_new > 0.5 * res)
        take = active & ~(stagnated & (res_new >= res))
        m = take[:, None, None]
        X = torch.where(m, X_new, X)
        R = torch.where(m, R_new, R)
        res = torch.where(take, res_new, res)
        iters = iters + active.long()
        if record_history:
            history.append(res.clone())
        for i in torch.nonzero(hit_tol).flatten().tolist():
            reason[i] = "tol"
        for i in torch.nonzero(stagnated).flatten().tolist():
            reason[i] = "stagnation"
        converged |= hit_tol | (stagnated & (res <= accept))
        active &= ~(hit_tol | stagnated)
    return NewtonOutcome(
        X=0.5 * (X + X.mT),
        converged=converged,
        iterations=iters,
        residual=res,
        reason=reason,
        matmuls=matmuls,
        history=history,
    )
