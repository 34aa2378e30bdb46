"""Coupled Halley iteration for A^{-1/p}, integer p, SPD input: cubic convergence (Guo 2010, "On
Newton's method and Halley's method for the principal pth root of a matrix", Linear Algebra Appl. 432;
Iannazzo 2008, "A family of rational iterations and its application to the computation of the matrix
pth root", SIAM J. Matrix Anal. Appl. 30, the [1/1] member of the Padé family).

Halley's method for x^p = 1/lambda, written for the residual m = x^p lambda -> 1, multiplies x by the
[1/1] Padé approximant of m^{-1/p} at m = 1 (Newton's factor ((p + 1) - m)/p is its [1/0] Taylor
polynomial):

    h(m) = ((p + 1) + (p - 1) m) / ((p - 1) + (p + 1) m).

The coupled form (as Guo & Higham's eq. (3.9) for Newton; Iannazzo 2008 §4 for the Padé family):

    X_0 = I/c,  M_0 = A/c^p,  P_k = ((p - 1) I + (p + 1) M_k)^{-1} ((p + 1) I + (p - 1) M_k),
    X_{k+1} = X_k P_k,  M_{k+1} = P_k^p M_k,

with M_k = X_k^p A as an identity (all are rational functions of A), so ||M_k - I|| is coupled_newton's
residual and its stopping contract applies (:mod:`~matroots.solvers.coupled_loop`). Each eigenvalue
follows m -> f(m) = m h(m)^p; f(1) = 1, f'(1) = f''(1) = 0 (cubic convergence: f(1 + e) - 1 =
(p^2 - 1)/(12 p^2) e^3 + O(e^4), :func:`cubic_constant`), f(1/m) = 1/f(m), and f is increasing with f(m) > m below 1, so the
iteration converges for every m > 0: no convergence region to respect. Small eigenvalues grow by
((p + 1)/(p - 1))^p (9 at p = 2, 7.7 at p = 4, -> e^2) per step in the linear phase.

Scalings (c^p), from the Lanczos bounds of :mod:`~matroots.solvers.spd_start`:

* ``"centred"`` (default, ``"auto"``): c^p = sqrt(lambda_min_est lambda_max), which centres the spectrum
  of M_0 geometrically about 1; by the symmetry f(1/m) = 1/f(m) both ends then need the same number of
  steps, and the log-range to cover is halved. lambda_min_est (the smallest Ritz value) is an upper
  estimate; a lower true lambda_min only costs steps (global convergence).
* ``"lambda_max"``: c^p = lambda_max, the spectrum of M_0 in (0, 1] (the Newton-Schulz-style start).

p = 1 uses h(m) = (2 + 0 m)/(0 + 2 m) = 1/m, i.e. one exact solve: X_1 = (A/c)^{-1}; it is allowed.

Domain: SPD (non-symmetric input: NotSymmetricError); integer p >= 1 within the resolvable range of
:func:`~matroots.solvers.coupled_loop.check_resolvable`. A zero LU pivot of a denominator (the matrix solved singular to working
precision, e.g. p = 1 with lambda_min below rounding of lambda_max) is a NotPositiveDefiniteError.
Inverse roots only (a forward root Y = X^{-1}
would need the capped start of coupled_newton to keep its error at cond(A^{1/p}) u; use coupled_newton
or newton_schulz). Cost per iteration: one LU solve with n right-hand sides (counted 4/3 GEMM, as
coupled_newton counts its forward solves), 1 for X P, the binary powering of P^p, 1 for P^p M: 5.33 at
p = 4. The solve runs in fp32 for 16-bit compute formats (no 16-bit LAPACK kernel) and is rounded back.
Warm start: none (X_0 must be a function of A). Odd p: a converged root is
certified positive definite by a float64 Cholesky (not counted in ``matmuls``;
:func:`~matroots.solvers.spd_start.require_positive_root`). The returned root is symmetrised.

``info``: ``scaling``, ``c_power`` (c^p, user units), ``tol``, ``stop_reason``, ``eps_abs``, the Lanczos
estimates, ``solve_dtype`` for 16-bit formats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import arguments, precision
from ..core.errors import NotPositiveDefiniteError
from ..core.inputs import Problem
from .base import Capabilities, RawResult, matmul_count_power, matrix_power
from .coupled_loop import check_resolvable, default_tol, run_coupled
from .newton_loop import _start_matrix
from .newton_schulz_sign import scalar_powers, symmetrise, unscale
from .registry import register
from .spd_start import (
    SpdIterationConfig,
    flag_undetermined,
    not_positive_definite,
    require_positive_root,
    spd_start,
)

SCALINGS = ("auto", "centred", "lambda_max")


def halley_factor(M: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """P = ((p-1) I + (p+1) M)^{-1} ((p+1) I + (p-1) M) (the two commute), solved in fp32/fp64.

    Returns P and a (b,) bool mask of the elements whose denominator has an exactly zero LU pivot
    (``torch.linalg.solve_ex`` info > 0) or is not finite (an iterate that overflowed: LAPACK's LU of a
    NaN matrix returns invalid pivots, and MKL's getrs then raises a RuntimeError instead of reporting
    it; such an element is solved as the identity); their P is not used. For M positive definite the
    denominator is too (its eigenvalues are (p-1) + (p+1) m > 0); at p = 1 it is 2 M, singular to
    working precision when lambda_min(M) is below rounding of lambda_max(M).
    """
    I = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    W = M if M.dtype in (torch.float32, torch.float64) else M.float()
    Iw = I.to(W.dtype)
    D = torch.add(Iw * (p - 1), W, alpha=p + 1)
    N = torch.add(Iw * (p + 1), W, alpha=p - 1)
    bad = ~torch.isfinite(D.sum(dim=(-2, -1)))  # an inf or NaN entry makes the sum non-finite
    if bool(bad.any()):
        D = torch.where(bad.view(-1, 1, 1), Iw, D)
        N = torch.where(bad.view(-1, 1, 1), Iw, N)
    P, info = torch.linalg.solve_ex(D, N)
    return P.to(M.dtype), (info > 0) | bad


@register
@dataclass(frozen=True, kw_only=True)
class HalleyConfig(SpdIterationConfig):
    """Coupled Halley ([1/1] Padé) iteration for A^{-1/p}, integer p >= 1, SPD input.

    Args:
        scaling: "auto" (= "centred"), "centred" or "lambda_max" (module docstring).
        lanczos_steps, stagnation_accept, symmetry_tol: see :class:`~matroots.solvers.spd_start.SpdIterationConfig`.
    """

    name = "halley"
    capabilities = Capabilities(forward_root=False, integer_p=True)
    scaling: str = "auto"

    def __post_init__(self) -> None:
        arguments.store(
            self,
            scaling=arguments.choice("scaling", self.scaling, SCALINGS),
            **self._spd_options(),
        )

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        p = int(prob.p)
        cdt = prob.compute_dtype
        n, b = prob.n, prob.A.shape[0]
        check_resolvable(p, cdt, n, self.name)
        st = spd_start(prob, self.name, self.lanczos_steps, self.symmetry_tol)
        info = dict(st.info)
        scaling = "centred" if self.scaling == "auto" else self.scaling
        if scaling == "centred":
            floor = st.lmax * 1e-300
            cp = torch.sqrt(torch.maximum(st.lmin, floor)) * torch.sqrt(st.lmax)
        else:
            cp = st.lmax.clone()
        tol = prob.tol if prob.tol is not None else default_tol(cdt, n, p)
        max_iter = prob.max_iter if prob.max_iter is not None else 100
        M0 = _start_matrix(st.A, cp, st.shift, cdt)
        I = torch.eye(n, dtype=cdt).expand(b, n, n).clone()

        def step(k: int, rows: torch.Tensor, state, M: torch.Tensor):
            P, singular = halley_factor(M, p)
            if bool(singular.any()):
                raise NotPositiveDefiniteError(
                    f"{self.name}: the Halley denominator (p - 1) I + (p + 1) M_k is singular in "
                    f"{precision.info(cdt).name} (a zero LU pivot, or an iterate that overflowed, at step {k}, "
                    f"p = {p}): the matrix solved "
                    "(rounded, plus eps) is singular or indefinite to working precision (lambda_min below "
                    "rounding of lambda_max); increase eps (eps_mode='relative', eps >= n u), use a wider "
                    "dtype, or method='eigh' with rank_policy='clamp' or 'pseudo_inverse'"
                )
            return (state[0] @ P,), matrix_power(P, p) @ M

        per_iter = 4.0 / 3.0 + 1 + matmul_count_power(p) + 1
        out = run_coupled(
            (I,), M0, step, tol=tol, max_iter=max_iter, accept=self.stagnation_accept * tol,
            per_iter=per_iter, record_history=prob.record_history,
        )  # fmt: skip
        if "divergence" in out.reason:
            not_positive_definite(self.name, prob, st.A, st.shift)
        require_positive_root(self.name, prob, out.state[0], out.converged, p)
        flag_undetermined(st.undetermined, out.converged, out.reason, info, prob, st.lmax)
        root = symmetrise(unscale(out.state[0], scalar_powers(cp, -1.0 / p)))
        info.update(scaling=scaling, c_power=cp / prob.prescale, tol=tol, stop_reason=out.reason)
        if cdt not in (torch.float32, torch.float64):
            info["solve_dtype"] = "the solve for P_k ran in fp32 on the 16-bit M_k and was rounded back"
        return RawResult(
            root=root,
            converged=out.converged,
            iterations=out.iterations,
            residual=out.residual,
            matmuls=st.matmuls + float(out.matmuls_each.mean()),
            history=out.history,
            info=info,
        )


def cubic_constant(p: int) -> float:
    """C_p with f(1 + e) - 1 = C_p e^3 + O(e^4) for f(m) = m h(m)^p: C_p = (p^2 - 1)/(12 p^2)
    (1/16 at p = 2, 5/64 at p = 4; 0 at p = 1, where one step is exact)."""
    return (p * p - 1) / (12.0 * p * p)
