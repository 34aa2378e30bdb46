"""The start shared by the matmul root iterations for SPD input (newton_schulz_sign, polar_express,
halley): the symmetric working matrix, the eps shift, and Lanczos estimates of its extreme eigenvalues.

Symmetric input only: a matrix whose symmetry defect exceeds the tolerance of
:meth:`matroots.inputs.Problem.symmetry_tol` is refused with NotSymmetricError (these iterations are
analysed, and their scalings derived, for a real positive spectrum with orthogonal eigenvectors; general
input goes to coupled_newton or schur_newton). The eps shift and the relative eps's lambda_max are those of
coupled_newton (:mod:`matroots.regularize`): the top Lanczos Ritz value certified to 1e-12 relative by its
residual bound. ``lmax`` is the top Ritz value plus its residual bound (times 1 + 1e-6), an upper bound
of lambda_max to rounding, so A/lmax has its spectrum in (0, 1]; ``lmin`` is the smallest Ritz value, an
*upper* estimate of lambda_min (Ritz values lie inside the spectrum), used only to choose how fast to
start, never for convergence. A Ritz value that proves a negative eigenvalue raises
NotPositiveDefiniteError, and so does a failed float64 Cholesky factorisation of A + shift I (the matrix
actually solved, exactly): the certificate that it has a principal root. Without it a 16-bit run can
"converge" on an indefinite rounded matrix (its residual cannot resolve a negative eigenvalue of
relative size u), and for odd p the iteration can reach the real root of a negative eigenvalue.

The Lanczos matrix-vector products are counted in ``matmuls`` (n of them = one GEMM), the Cholesky
factorisation as 1/6 GEMM (n^3/3 flops).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import arguments, precision
from ..errors import FormatRangeError, NotPositiveDefiniteError, NotSymmetricError
from ..inputs import Problem, symmetric_input
from ..regularize import working_shift
from .base import SolverConfig
from .coupled_newton import _lanczos_lambda_max, _shifted


@dataclass(frozen=True, kw_only=True)
class SpdIterationConfig(SolverConfig):
    """The options every SPD matmul iteration shares (newton_schulz, polar_express, halley).

    Args:
        lanczos_steps: Lanczos steps for the spectral bounds.
        stagnation_accept: a stagnated run counts as converged at this many times ``tol``.
        symmetry_tol: tolerance of the symmetry test (non-symmetric input is refused).
    """

    lanczos_steps: int = 24
    stagnation_accept: float = 16.0
    symmetry_tol: float | None = None

    def _spd_options(self) -> dict[str, object]:
        """The shared fields, validated, for the subclass's ``arguments.store`` call."""
        return {
            "lanczos_steps": arguments.integer("lanczos_steps", self.lanczos_steps, minimum=2),
            "stagnation_accept": arguments.real(
                "stagnation_accept", self.stagnation_accept, minimum=1.0, what="a multiple of tol"
            ),
            "symmetry_tol": arguments.real("symmetry_tol", self.symmetry_tol, minimum=0.0, allow_none=True),
        }


@dataclass
class SpdStart:
    """The symmetric working matrix (b, n, n) (fp32/fp64), its shift and its spectral bounds (float64)."""

    A: torch.Tensor
    shift: torch.Tensor  # (b,) added to the diagonal before the iteration (pre-scaled units)
    lmax: torch.Tensor  # (b,) upper bound of lambda_max(A + shift I)
    lmin: torch.Tensor  # (b,) smallest Ritz value of A + shift I (an upper estimate of lambda_min)
    matmuls: float
    info: dict


def spd_start(prob: Problem, method: str, lanczos_steps: int, symmetry_tol: float | None) -> SpdStart:
    """Validate symmetry, compute the eps shift and the Lanczos bounds of A + shift I (see module doc)."""
    A, defect = symmetric_input(prob)
    tol = prob.symmetry_tol(symmetry_tol)
    if not bool((defect <= tol).all()):
        worst = float(defect.max())
        raise NotSymmetricError(
            f"{method} needs symmetric (SPD) input: the relative symmetry defect is {worst:.3e} > {tol:.3e}; "
            "use method='coupled_newton' or 'schur_newton' for general matrices"
        )
    if A.dtype not in (torch.float32, torch.float64):
        A = A.float()
    b, n = A.shape[0], A.shape[-1]
    relative = prob.eps > 0 and prob.eps_mode == "relative"
    est = _lanczos_lambda_max(A, lanczos_steps, 1e-12 if relative else None)
    info: dict = {"symmetric": True}
    shift = torch.zeros(b, dtype=torch.float64)
    if prob.eps > 0:
        lam = est.lmax if relative else torch.zeros(b, dtype=torch.float64)
        if relative:
            info["eps_lambda_max"] = lam / prob.prescale
        shift = working_shift(prob.eps, prob.eps_mode, lam, prob.prescale)
        if not bool(torch.isfinite(shift).all()):
            raise FormatRangeError(
                f"{method}: the eps shift {float(shift.max()) / prob.prescale:.3e} overflows float64 at the "
                "working scale; use a smaller eps"
            )
    info["eps_abs"] = shift / prob.prescale
    est = _shifted(est, shift)
    thresh = -100.0 * n * 2.0**-53 * est.lmax.abs()
    bad = est.lmin < thresh
    if bool(bad.any()) or not bool((est.lmax_upper > 0).all()):
        worst = float(est.lmin.min()) / prob.prescale
        raise NotPositiveDefiniteError(
            f"{method}: the matrix is not positive definite after regularisation: Lanczos proves an "
            f"eigenvalue <= {worst:.3e} (dtype {precision.info(prob.dtype).name}); increase eps, or use "
            "psd='shift', or method='eigh' with rank_policy='clamp' or 'pseudo_inverse'"
        )
    Ad = A.double().clone()
    Ad.diagonal(dim1=-2, dim2=-1).add_(shift[:, None])
    _, chol_info = torch.linalg.cholesky_ex(Ad)
    if bool((chol_info > 0).any()):
        raise NotPositiveDefiniteError(
            f"{method}: the matrix solved (the input rounded to {precision.info(prob.dtype).name}, plus "
            "eps) is not positive definite: Cholesky fails; increase eps, or use psd='shift', or "
            "method='eigh' with rank_policy='clamp' or 'pseudo_inverse'"
        )
    lmax = est.lmax_upper * (1 + 1e-6)
    lmin = torch.minimum(est.lmin.clamp_min(0.0), lmax)
    info.update(lambda_min_est=lmin / prob.prescale, lambda_max_est=est.lmax / prob.prescale)
    # the Cholesky certificate costs n^3/3 flops: 1/6 of a GEMM
    return SpdStart(A=A, shift=shift, lmax=lmax, lmin=lmin, matmuls=est.matvecs / n + 1 / 6, info=info)


def not_positive_definite(method: str, prob: Problem, A: torch.Tensor, shift: torch.Tensor) -> None:
    """After a diverged run: NotPositiveDefiniteError when Cholesky of A + shift I (float64) fails."""
    Ad = A.double().clone()
    Ad.diagonal(dim1=-2, dim2=-1).add_(shift[:, None])
    _, chol_info = torch.linalg.cholesky_ex(Ad)
    if bool((chol_info > 0).any()):
        raise NotPositiveDefiniteError(
            f"{method} diverged and the (regularised, rounded) matrix is not positive definite: Cholesky "
            f"fails (dtype {precision.info(prob.dtype).name}); increase eps, or use psd='shift'"
        )


def require_positive_root(
    method: str, prob: Problem, X: torch.Tensor, converged: torch.Tensor, p: int
) -> None:
    """For odd p: NotPositiveDefiniteError when a converged root is not positive definite (Cholesky,
    float64).

    A negative eigenvalue lambda of the matrix solved has the real p-th root -|lambda|^{1/p} for odd p,
    which the coupled iterations can converge to (m_k = x_k^p lambda -> 1 with x_k < 0): a real, non-
    principal "root" that passes the residual test. For even p no real x has x^p lambda = 1 and the run
    stops unconverged. The root of an SPD matrix is SPD, so Cholesky decides.
    """
    if p % 2 == 0 or not bool(converged.any()):
        return
    rows = converged.nonzero().flatten()
    _, chol_info = torch.linalg.cholesky_ex(X.index_select(0, rows).double())
    if bool((chol_info > 0).any()):
        raise NotPositiveDefiniteError(
            f"{method}: the matrix solved (rounded to {precision.info(prob.dtype).name}, plus eps) is not "
            f"positive definite: the iteration converged to a real non-principal root (odd p = {p}); "
            "increase eps, or use psd='shift'"
        )
