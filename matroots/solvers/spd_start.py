"""The start shared by the matmul root iterations for SPD input (newton_schulz_sign, polar_express,
halley): the symmetric working matrix, the eps shift, and Lanczos estimates of its extreme eigenvalues.

Symmetric input only: a matrix whose symmetry defect exceeds the tolerance of
:meth:`matroots.core.inputs.Problem.symmetry_tol` is refused with NotSymmetricError (these iterations are
analysed, and their scalings derived, for a real positive spectrum with orthogonal eigenvectors; general
input goes to coupled_newton or schur_newton). The eps shift and the relative eps's lambda_max are those of
coupled_newton (:mod:`matroots.core.regularize`): the top Lanczos Ritz value certified to 1e-12 relative by its
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

import math
from dataclasses import dataclass, field, replace

import torch

from ..core import arguments, precision
from ..core.errors import FormatRangeError, NotPositiveDefiniteError, NotSymmetricError
from ..core.inputs import Problem, symmetric_input
from ..core.regularize import working_shift
from ..core.spectral import SpectrumEstimate, lanczos_extremes
from .base import SolverConfig


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
    undetermined: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))  # (b,)


def domain_margin(n: int, dtype: torch.dtype, compute_dtype: torch.dtype, lmax: torch.Tensor) -> torch.Tensor:
    """delta = u lambda_max (b,): below it the matrix is singular to working precision and its inverse
    root is not determined (u: the coarser of the working and compute formats' unit roundoffs).

    lambda_min < u ||A||_2 is the classical numerical singularity (kappa_2(A) > 1/u; Golub & Van Loan
    2013, §5.4.1, the numerical rank at tolerance u ||A||), and then cond(A^{-1/p}) u >= kappa u / p > 1/p
    (Higham 2008, Thm. 3.11, the SPD divided difference f'(lambda_min)): not one digit of the root is
    promised for p = 1, at most log10(p) for p > 1. The worst-case tolerance n u ||A|| (and the
    probabilistic sqrt(n) u ||A||, Higham & Mary 2019) flag roots these iterations compute to ~cond u:
    Shampoo's fp32 factors with a 1e-6 relative shift (n = 64), bf16 at kappa 100 (n = 32). Shampoo's
    psd floor f = n u ||A||_F keeps its factors n times clear of delta.
    """
    u = max(precision.unit_roundoff(dtype), precision.unit_roundoff(compute_dtype))
    return u * lmax.to(torch.float64)


def cholesky_fails(A: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """(b,) bool: the float64 Cholesky factorisation of A + shift I fails (a non-positive pivot).

    The sum is exact up to one rounding in float64 for fp32 A; Cholesky's backward error there is
    ~n u_64 ||A||, far below any fp32 margin (for fp64 A it is of the order of the fp64 margin itself,
    so an eigenvalue within ~sqrt(n) u_64 ||A|| of delta may be decided either way)."""
    Ad = A.to(torch.float64, copy=True)
    Ad.diagonal(dim1=-2, dim2=-1).add_(shift.to(torch.float64)[:, None])
    _, info = torch.linalg.cholesky_ex(Ad)
    return info > 0


def domain_test(
    method: str, prob: Problem, A: torch.Tensor, shift: torch.Tensor, lmax: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """The computable domain of an SPD inverse root, per element of ``rows`` ((b,) bool): the matrix
    solved, A + shift I, must pass the float64 Cholesky test shifted down by :func:`domain_margin`.
    For fp32 and 16-bit input the test is exact to far below delta (float64 Cholesky's backward error
    ~sqrt(n) u_64 ||A||); for fp64 input it is of delta's order, so a lambda_min within a few
    sqrt(n) u_64 lambda_max of delta may go either way (both outcomes are within rounding of kappa = 1/u).

    Returns (b,) bool, the elements whose shifted test fails while A + shift I itself factors
    (positive definite, but lambda_min < delta: the root is not determined, flagged not converged by
    :func:`flag_undetermined`). Raises NotPositiveDefiniteError where A + shift I does not factor.
    One Cholesky per element of ``rows`` (a second only where the first fails).
    """
    b, n = A.shape[0], A.shape[-1]
    out = torch.zeros(b, dtype=torch.bool)
    idx = rows.nonzero().flatten()
    if idx.numel() == 0:
        return out
    delta = domain_margin(n, prob.dtype, prob.compute_dtype, lmax.index_select(0, idx))
    A_r, s_r = A.index_select(0, idx), shift.index_select(0, idx).to(torch.float64)
    low = cholesky_fails(A_r, s_r - delta)
    if not bool(low.any()):
        return out
    sub = low.nonzero().flatten()
    not_pd = cholesky_fails(A_r.index_select(0, sub), s_r.index_select(0, sub))
    if bool(not_pd.any()):
        bad = idx.index_select(0, sub[not_pd]).tolist()
        raise NotPositiveDefiniteError(
            f"{method}: the matrix solved (the input rounded to {precision.info(prob.dtype).name}, plus eps) "
            f"is not positive definite: Cholesky fails (batch elements {bad}); increase eps, or use "
            "psd='shift', or method='eigh' with rank_policy='clamp' or 'pseudo_inverse'"
        )
    out[idx.index_select(0, sub)] = True
    return out


def flag_undetermined(
    undetermined: torch.Tensor,
    converged: torch.Tensor,
    reason: list[str],
    info: dict,
    prob: Problem,
    lmax: torch.Tensor,
) -> None:
    """Mark the ``undetermined`` elements (from :func:`domain_test`) not converged, stop reason
    ``"not_determined"``; ``info["domain_margin"]`` is delta in user units."""
    if not bool(undetermined.any()):
        return
    for i in undetermined.nonzero().flatten().tolist():
        converged[i] = False
        reason[i] = "not_determined"
    delta = domain_margin(prob.n, prob.dtype, prob.compute_dtype, lmax)
    info["domain_margin"] = delta / prob.prescale
    info["hint"] = (
        "the matrix solved has lambda_min < u lambda_max (info['domain_margin']): its inverse root "
        "is not determined in this format; increase eps, use psd='shift', or a wider dtype"
    )


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
    est = lanczos_lambda_max(A, lanczos_steps, 1e-12 if relative else None)
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
    est = shifted_estimate(est, shift)
    thresh = -100.0 * n * 2.0**-53 * est.lmax.abs()
    bad = est.lmin < thresh
    if bool(bad.any()) or not bool((est.lmax_upper > 0).all()):
        worst = float(est.lmin.min()) / prob.prescale
        raise NotPositiveDefiniteError(
            f"{method}: the matrix is not positive definite after regularisation: Lanczos proves an "
            f"eigenvalue <= {worst:.3e} (dtype {precision.info(prob.dtype).name}); increase eps, or use "
            "psd='shift', or method='eigh' with rank_policy='clamp' or 'pseudo_inverse'"
        )
    lmax = est.lmax_upper * (1 + 1e-6)
    lmin = torch.minimum(est.lmin.clamp_min(0.0), lmax)
    info.update(lambda_min_est=lmin / prob.prescale, lambda_max_est=est.lmax / prob.prescale)
    # the certificate: Cholesky of A + (shift - delta) I (n^3/3 flops: 1/6 of a GEMM), see domain_test
    undetermined = domain_test(method, prob, A, shift, lmax, torch.ones(b, dtype=torch.bool))
    return SpdStart(
        A=A,
        shift=shift,
        lmax=lmax,
        lmin=lmin,
        matmuls=est.matvecs / n + 1 / 6,
        info=info,
        undetermined=undetermined,
    )


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


def lanczos_lambda_max(A: torch.Tensor, steps: int, rtol: float | None) -> SpectrumEstimate:
    """Lanczos extremes of A; with ``rtol``, the elements whose top Ritz value's residual bound is above
    rtol |lambda_max| are rerun with 4x the steps (up to n, where the Ritz values are the eigenvalues)
    until it is not.

    The residual |beta_k s_k| bounds the distance of the top Ritz value to an eigenvalue; 24 steps on an
    arithmetic spectrum (randsvd mode 4, n = 512) leave it 2e-3 below lambda_max. Only the uncertified
    elements are rerun, so every element of a batch gets the estimate (and the cost) of its solve alone
    (up to the BLAS's batch rounding, :func:`matroots.core.spectral._matvec`); ``ritz``/``weights`` rows of elements that
    stopped earlier are padded with NaN/0, and ``matvecs`` is the mean over the batch.
    """
    n = A.shape[-1]
    est = lanczos_extremes(A, steps)
    if rtol is None:
        return est
    b = A.shape[0]
    lmin, lmax, upper = est.lmin.clone(), est.lmax.clone(), est.lmax_upper.clone()
    ritz, weights = list(est.ritz.unbind(0)), list(est.weights.unbind(0))
    used = [est.matvecs] * b
    todo = list(range(b))
    while steps < n:
        ok = ((upper[todo] - lmax[todo]).abs() <= rtol * lmax[todo].abs()).tolist()
        todo = [i for i, good in zip(todo, ok, strict=True) if not good]
        if not todo:
            break
        steps = min(n, 4 * steps)
        sub = lanczos_extremes(A[todo], steps)
        for j, i in enumerate(todo):
            lmin[i], lmax[i], upper[i] = sub.lmin[j], sub.lmax[j], sub.lmax_upper[j]
            ritz[i], weights[i] = sub.ritz[j], sub.weights[j]
            used[i] += sub.matvecs
    k = max(r.shape[0] for r in ritz)
    ritz_pad = torch.full((b, k), math.nan, dtype=est.ritz.dtype)
    weights_pad = torch.zeros((b, k), dtype=est.weights.dtype)
    for i in range(b):
        ritz_pad[i, : ritz[i].shape[0]] = ritz[i]
        weights_pad[i, : weights[i].shape[0]] = weights[i]
    return SpectrumEstimate(
        lmin=lmin,
        lmax=lmax,
        lmax_upper=upper,
        matvecs=sum(used) / b,
        ritz=ritz_pad,
        weights=weights_pad,
    )


def shifted_estimate(est: SpectrumEstimate, shift: torch.Tensor) -> SpectrumEstimate:
    """The estimate for A + shift I from that of A (every Ritz value moves by the shift)."""
    if not bool((shift != 0).any()):
        return est
    s = shift.to(est.lmax.dtype)
    return replace(
        est,
        lmin=est.lmin + s,
        lmax=est.lmax + s,
        lmax_upper=est.lmax_upper + s,
        ritz=None if est.ritz is None else est.ritz + s[:, None],
    )
