"""Minimax polynomial (Polar Express) iterations for A^{-1/p} of SPD matrices, and A^{1/2}, matmul-only.

Amsel, Persson, Musco & Gower, "The Polar Express: optimal matrix sign methods and their application to
the Muon algorithm" (2025), which names Shampoo's square and quarter roots as targets; Chen & Chow,
"A stable scaling of Newton-Schulz for improving the sign function computation of a Hermitian matrix"
(2014), the per-step scaled cubic case; Nakatsukasa & Freund (2016, SIAM Review 58), Zolotarev's
optimal rational sign approximants composed step by step. Those papers compute sign/polar factors;
here the same greedy minimax construction is applied to the coupled root iteration (Guo & Higham 2006,
eq. (3.9), with the Newton polynomial replaced by a per-step minimax one):

    X_0 = I,  M_0 = A/c,  P_k = q_k(M_k),  X_{k+1} = X_k P_k,  M_{k+1} = P_k^p M_k,

with c >= lambda_max (:mod:`~matroots.solvers.spd_start`). M_k = X_k^p A/c holds as an identity (all
are polynomials in A), so ||M_k - I|| is coupled_newton's residual and the same stopping contract
applies (:mod:`~matroots.solvers.coupled_loop`); X_k -> (A/c)^{-1/p}, unscaled by c^{-1/p} (float64).
For an eigenvalue lambda of A the normalised variable x = (lambda/c)^{1/p} x_k-scaled follows
x <- h_k(x) = x q_k(x^p), and h_k is the best approximation of 1 on the current interval [l_k, u_k]
among sum_{j<=d} c_j x^{1+jp} (:mod:`~matroots.solvers.minimax`: Remez, greedy intervals, the
highest-contact tail of order d + 1, coefficients cached per (interval, p, degree, dtype)). For p = 2 this
is exactly Polar Express on the singular values sqrt(lambda/c) of the sign iteration for
[[0, A], [I, 0]] (Higham 2008, §6.7); for p = 4 the interval is [(lambda_min/c)^{1/4}, 1], so the
quarter root needs no square roots first. d = 1 is Chen & Chow's scaled Newton-Schulz (p = 2) and a
minimax-scaled coupled Newton step (any p).

The start interval: l_0 = (lambda_min_est / (4 c))^{1/p}, rounded down to the grid 2^(-k/4), where
lambda_min_est is the smallest Lanczos Ritz value (an upper estimate of lambda_min; the factor 4 keeps
l_0 below the true end in the usual case). An eigenvalue below l_0 still grows (h'(0) = c_0 > 1 at every
step) and only lags; convergence is decided by the residual, never by the schedule. Safety
(bf16-safe variant, the paper's §4.4): each polynomial is designed on [l_k, s u_k]; s = ``safety``, by
default 1.01 in 16-bit compute formats (the paper's value for bf16) and 1.001 otherwise.

Forward root: p = 2 only, through the sign form Y_{k+1} = Y_k P_k, Z_{k+1} = P_k Z_k, M_k = Z_k Y_k
(Y_0 = A/c, Z_0 = I), the same polynomials; Y -> (A/c)^{1/2}. Other forward roots raise
UnsupportedExponentError (use newton_schulz for p = 2^k).

Domain: SPD (non-symmetric input: NotSymmetricError); integer 1 <= p <= ``MAX_P``. Cost per iteration:
(d - 1) GEMMs for q_k(M) by Horner, 1 for X P, the binary powering of P^p, 1 for P^p M: 5 at p = 4,
d = 2; 4 at p = 2 (also the sign form). Warm start: none (X_0 must be a function of A). Odd p: a converged root is
certified positive definite by a float64 Cholesky (not counted in ``matmuls``;
:func:`~matroots.solvers.spd_start.require_positive_root`). The returned
root is symmetrised.

``info``: ``degree``, ``safety``, ``l0`` (per element), ``schedule_steps`` (minimax steps before the tail,
per element), ``c`` (user units), ``tol``, ``stop_reason``, ``eps_abs`` and the Lanczos estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import arguments, precision
from ..errors import InvalidArgumentError, UnsupportedExponentError
from ..inputs import Problem
from .base import Capabilities, RawResult, SolverConfig, matmul_count_power, matrix_power
from .coupled_loop import check_resolvable, default_tol, run_coupled
from .minimax import Step, grid_floor, schedule
from .newton_core import _start_matrix
from .newton_schulz_sign import product_floor, scalar_powers, symmetrise, unscale
from .registry import register
from .spd_start import not_positive_definite, require_positive_root, spd_start

MAX_P = 16
"""Largest p: the basis x^{1 + jp} becomes too ill-conditioned for the float64 Remez beyond it."""
MIN_L0 = 1e-10


def _polynomial(M: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """q(M) = sum_j C[:, j] M^j by Horner (d - 1 GEMMs); C is (b, d + 1) float64."""
    I = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    cm = C.to(M.dtype)[:, :, None, None]
    d = C.shape[1] - 1
    P = cm[:, d] * M + cm[:, d - 1] * I
    for j in range(d - 2, -1, -1):
        P = P @ M + cm[:, j] * I
    return P


def _coefficients(scheds: list[tuple[Step, ...]], k: int, rows: torch.Tensor) -> torch.Tensor:
    """(r, d + 1): step k of each active row's schedule (the tail step after its end)."""
    return torch.tensor(
        [scheds[i][min(k, len(scheds[i]) - 1)].coeffs for i in rows.tolist()], dtype=torch.float64
    )


@register
@dataclass(frozen=True, kw_only=True)
class PolarExpressConfig(SolverConfig):
    """Minimax polynomial coupled iteration (Polar Express) for A^{-1/p}, SPD input.

    Args:
        degree: d, the degree of q_k in M (the step polynomial has degree 1 + d p in x); 2 is the
            paper's quintic for p = 2.
        safety: interval widening s >= 1 of each design (None: 1.01 in 16-bit formats, else 1.001).
        lanczos_steps: Lanczos steps for the spectral estimates.
        stagnation_accept: a stagnated run counts as converged at this many times ``tol``.
        symmetry_tol: tolerance of the symmetry test (non-symmetric input is refused).
    """

    name = "polar_express"
    capabilities = Capabilities(forward_root=True, integer_p=True)
    degree: int = 2
    safety: float | None = None
    lanczos_steps: int = 24
    stagnation_accept: float = 16.0
    symmetry_tol: float | None = None

    def __post_init__(self) -> None:
        arguments.store(
            self,
            degree=arguments.integer("degree", self.degree, minimum=1),
            safety=arguments.real("safety", self.safety, minimum=1.0, maximum=1.5, allow_none=True),
            lanczos_steps=arguments.integer("lanczos_steps", self.lanczos_steps, minimum=2),
            stagnation_accept=arguments.real(
                "stagnation_accept", self.stagnation_accept, minimum=1.0, what="a multiple of tol"
            ),
            symmetry_tol=arguments.real("symmetry_tol", self.symmetry_tol, minimum=0.0, allow_none=True),
        )

        if self.degree > 4:
            raise InvalidArgumentError(
                f"degree must be 1, 2, 3 or 4 (the degree of q_k in M), got {self.degree}"
            )

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        p = int(prob.p)
        if p > MAX_P or (not inverse and p != 2):
            raise UnsupportedExponentError(
                f"{self.name} computes A^(-1/p) for integer 1 <= p <= {MAX_P} and A^(1/2); got p = {p} "
                f"({'inverse' if inverse else 'forward'} root); use method='newton_schulz' (p = 2^k) or "
                "'coupled_newton'"
            )
        cdt = prob.compute_dtype
        n, b = prob.n, prob.A.shape[0]
        d = self.degree
        check_resolvable(p, cdt, n, self.name)
        st = spd_start(prob, self.name, self.lanczos_steps, self.symmetry_tol)
        info = dict(st.info)
        sixteen = cdt not in (torch.float32, torch.float64)
        safety = self.safety if self.safety is not None else (1.01 if sixteen else 1.001)
        tol = prob.tol if prob.tol is not None else default_tol(cdt, n, p)
        max_iter = prob.max_iter if prob.max_iter is not None else 100
        c = st.lmax
        ratio = (st.lmin / (4.0 * c)).clamp(min=MIN_L0**p, max=1.0).tolist()
        l0 = [max(grid_floor(r ** (1.0 / p)), MIN_L0) for r in ratio]
        scheds = [schedule(lo, p, d, safety) for lo in l0]
        info.update(
            degree=d,
            safety=safety,
            l0=torch.tensor(l0, dtype=torch.float64),
            schedule_steps=torch.tensor([len(s) - 1 for s in scheds]),
            c=c / prob.prescale,
            tol=tol,
        )
        M0 = _start_matrix(st.A, c, st.shift, cdt)
        I = torch.eye(n, dtype=cdt).expand(b, n, n).clone()
        if inverse:

            def step(k: int, rows: torch.Tensor, state, M: torch.Tensor):
                P = _polynomial(M, _coefficients(scheds, k, rows))
                return (state[0] @ P,), matrix_power(P, p) @ M

            per_iter = d + 1 + matmul_count_power(p)
            out = run_coupled(
                (I,), M0, step, tol=tol, max_iter=max_iter, accept=self.stagnation_accept * tol,
                per_iter=per_iter, record_history=prob.record_history,
            )  # fmt: skip
            X = out.state[0]
        else:

            def step(k: int, rows: torch.Tensor, state, M: torch.Tensor):
                Y, Z = state
                P = _polynomial(M, _coefficients(scheds, k, rows))
                Y_new, Z_new = Y @ P, P @ Z
                return (Y_new, Z_new), Z_new @ Y_new

            out = run_coupled(
                (M0, I), M0, step, tol=tol, max_iter=max_iter, accept=self.stagnation_accept * tol,
                per_iter=d + 2, record_history=prob.record_history, floor_scale=product_floor,
            )  # fmt: skip
            X = out.state[0]
        if "divergence" in out.reason:
            not_positive_definite(self.name, prob, st.A, st.shift)
        require_positive_root(self.name, prob, X, out.converged, p)
        root = symmetrise(unscale(X, scalar_powers(c, (-1.0 if inverse else 1.0) / p)))
        info["stop_reason"] = out.reason
        if sixteen:
            info["compute_dtype_note"] = (
                f"products in {precision.info(cdt).name}; residual norms and the final scaling in fp32"
            )
        return RawResult(
            root=root,
            converged=out.converged,
            iterations=out.iterations,
            residual=out.residual,
            matmuls=st.matmuls + float(out.matmuls_each.mean()),
            history=out.history,
            info=info,
        )
