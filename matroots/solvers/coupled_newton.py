"""Coupled Newton iteration for the inverse p-th root (Guo & Higham 2006; Higham 2008, eq. 7.18).

Scalings (the choice of c in X_0 = I/c, M_0 = A/c^p):

* ``"frobenius"``: c^p = 2||A||_F/(p+1). Safe for any matrix with spectral radius <= ||A||_F, as the
  spectrum of M_0 then lies in (0, (p+1)/2]; costs extra iterations.
* ``"power"``: c^p = 2 lambda_max/(p+1) with lambda_max from 20 power-iteration steps (symmetric input).
* ``"optimal"``: Guo & Higham's c^p for the spectrum [lambda_min, lambda_max] (eq. 3.11), from Lanczos
  estimates; lambda_max is the top Ritz value plus its residual bound, so M_0 stays in the convergence
  region (0, p+1) (symmetric input).
* ``"dynamic"``: the optimal start plus a per-step rescaling that tracks the spectral interval of M_k
  (see :mod:`matroots.solvers.newton_core`).
* ``"auto"`` (default): ``"optimal"`` for symmetric input, ``"frobenius"`` otherwise.

The spectral estimates' matrix-vector products are counted in ``matmuls`` (n of them = one GEMM).

Warm start (``warm_start=`` a previous RootResult or a previous root tensor): starting the coupled
iteration at X_0 = previous root is wrong, because M_k = X_k^p A holds only while X_0 commutes with A;
from a non-commuting X_0, M_k -> I while X_k converges to something other than A^{-1/p}. Instead the
warm start takes the spectral extent of the previous solve (lambda_min from the previous root's largest
eigenvalue by power iteration, lambda_max by power iteration on A, both widened by safety margins) and
runs the dynamically scaled iteration from X_0 = I/c. X_0 stays a function of A, so the answer is the
true root, and an accurate lambda_min lets the dynamic scaling skip most of the linear phase.
If the iteration diverges (an estimate was wrong), it is rerun with Frobenius scaling and ``info`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import precision
from ..errors import NotSymmetricError
from ..inputs import Problem, is_symmetric
from ..regularize import absolute_shift, add_to_diagonal
from ..result import RootResult
from ..spectral import lanczos_extremes, power_lambda_max
from .base import RawResult, SolverConfig
from .newton_core import coupled_newton_iterate, optimal_c_power
from .registry import register

SCALINGS = ("auto", "frobenius", "power", "optimal", "dynamic")


@register
@dataclass(frozen=True, kw_only=True)
class CoupledNewtonConfig(SolverConfig):
    """Coupled Newton solver for integer p >= 1.

    Args:
        scaling: one of "auto", "frobenius", "power", "optimal", "dynamic" (see the module docstring).
        lanczos_steps: Lanczos steps for the "optimal"/"dynamic" estimates (capped at n).
        power_iters: power-iteration steps for "power" and for warm starts.
        stagnation_accept: a run stopped by stagnation counts as converged when its residual is at most
            this many times ``tol``.
        symmetry_tol: tolerance of the symmetry test that selects the SPD scalings.
    """

    name = "coupled_newton"
    integer_p = True
    scaling: str = "auto"
    lanczos_steps: int = 24
    power_iters: int = 20
    stagnation_accept: float = 16.0
    symmetry_tol: float | None = None

    def __post_init__(self) -> None:
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if self.lanczos_steps < 2 or self.power_iters < 1:
            raise ValueError("lanczos_steps must be >= 2 and power_iters >= 1")

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        p = int(prob.p)
        n = prob.n
        cdt = prob.compute_dtype
        A = prob.A.to(cdt)
        sym = is_symmetric(prob.A, self.symmetry_tol)
        scaling = self.scaling
        if scaling == "auto":
            scaling = "optimal" if sym else "frobenius"
        if scaling != "frobenius" and not sym:
            raise NotSymmetricError(
                f"scaling={scaling!r} needs symmetric input (it estimates lambda_min/lambda_max); "
                "use scaling='frobenius' for general matrices"
            )
        if sym:
            A = 0.5 * (A + A.mT)
        info: dict = {"symmetric": sym}
        matmuls = 0.0
        # Regularisation: relative eps needs lambda_max; estimate it (power iteration) when asked.
        if prob.eps > 0:
            if prob.eps_mode == "relative":
                if sym:
                    lam, mv = power_lambda_max(A, self.power_iters)
                    matmuls += mv / n
                else:
                    lam = torch.linalg.matrix_norm(A.double())
            else:
                lam = torch.zeros(A.shape[0], dtype=torch.float64)
            shift = absolute_shift(prob.eps, prob.eps_mode, lam)
            A = add_to_diagonal(A, shift)
            info["eps_abs"] = shift
        interval = None
        if warm_start is not None and sym:
            cp, interval, mv = self._warm_scaling(A, p, warm_start)
            matmuls += mv / n
            info["warm_start"] = "spectral interval from previous root + dynamic scaling"
        elif scaling == "frobenius":
            cp = 2.0 * torch.linalg.matrix_norm(A.double()) / (p + 1)
        elif scaling == "power":
            lam, mv = power_lambda_max(A, self.power_iters)
            matmuls += mv / n
            cp = 2.0 * lam.clamp_min(torch.finfo(torch.float64).tiny) / (p + 1)
        else:
            est = lanczos_extremes(A, self.lanczos_steps)
            matmuls += est.matvecs / n
            lmax = (est.lmax_upper * (1 + 1e-6)).numpy()
            lmin = np.clip(est.lmin.numpy(), 0.0, None)
            cpn = optimal_c_power(lmin, lmax, p)
            cp = torch.as_tensor(cpn, dtype=torch.float64)
            info.update(lambda_min_est=est.lmin, lambda_max_est=est.lmax)
            if scaling == "dynamic":
                interval = (np.maximum(lmin, lmax * 1e-300) / cpn, lmax / cpn)
        info["scaling"] = scaling if warm_start is None or not sym else "warm"
        cp = torch.where(cp > 0, cp, torch.ones_like(cp))
        tol = prob.tol if prob.tol is not None else precision.default_tol(cdt, n)
        max_iter = prob.max_iter if prob.max_iter is not None else 100
        out = coupled_newton_iterate(
            A,
            p,
            cp,
            tol=tol,
            max_iter=max_iter,
            stagnation_accept=self.stagnation_accept * tol,
            inverse=inverse,
            interval=interval,
            record_history=prob.record_history,
        )
        matmuls += out.matmuls
        if interval is not None and "divergence" in out.reason:
            # A wrong spectral estimate: redo those problems with the always-safe Frobenius scaling.
            retry = coupled_newton_iterate(
                A,
                p,
                2.0 * torch.linalg.matrix_norm(A.double()) / (p + 1),
                tol=tol,
                max_iter=max_iter,
                stagnation_accept=self.stagnation_accept * tol,
                inverse=inverse,
                record_history=prob.record_history,
            )
            matmuls += retry.matmuls
            info["retried_frobenius"] = True
            out = retry
        info.update(stop_reason=out.reason, tol=tol, c_power=cp)
        return RawResult(
            root=out.X,
            converged=out.converged,
            iterations=out.iterations,
            residual=out.residual,
            matmuls=matmuls,
            history=out.history,
            info=info,
        )

    def _warm_scaling(
        self, A: torch.Tensor, p: int, warm_start: object
    ) -> tuple[torch.Tensor, tuple[np.ndarray, np.ndarray], int]:
        """c^p and the dynamic-scaling interval from the previous root's spectral extent."""
        Z = warm_start.root if isinstance(warm_start, RootResult) else warm_start
        if not isinstance(Z, torch.Tensor):
            Z = torch.as_tensor(np.asarray(Z))
        Z = Z.reshape(A.shape).to(A.dtype)
        zmax, mv1 = power_lambda_max(0.5 * (Z + Z.mT), self.power_iters)
        lam, mv2 = power_lambda_max(A, self.power_iters)
        # Margins: power iteration underestimates both maxima (and A has moved since Z was computed).
        lmax = lam.numpy() * 1.25
        lmin = np.minimum(zmax.clamp_min(1e-300).numpy() ** (-p) / 4.0, lmax)
        cpn = optimal_c_power(lmin, lmax, p)
        return torch.as_tensor(cpn), (lmin / cpn, lmax / cpn), mv1 + mv2
