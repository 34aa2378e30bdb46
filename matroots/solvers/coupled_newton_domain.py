"""The domain checks of coupled Newton (:mod:`matroots.solvers.coupled_newton`; failure is never
silent): eigenvalues on or near the closed negative real axis refused, a negative eigenvalue proved by
Lanczos refused, a divergence diagnosed by Cholesky, and the SPD domain test of converged inverse roots.
"""

from __future__ import annotations

import numpy as np
import torch

from ..core import precision
from ..core.conditioning import eigenvalue_conditions
from ..core.errors import NotPositiveDefiniteError
from ..core.inputs import Problem
from ..core.spectral import SpectrumEstimate, lanczos_extremes
from .newton_checks import axis_error, negative_axis_status
from .newton_core import (
    NewtonOutcome,
    eigenvalue_backward_error,
)
from .newton_loop import materialise, shifted_fro
from .spd_start import domain_test, flag_undetermined


def refuse_negative_real(
    A: torch.Tensor, eigs: np.ndarray, kappas: np.ndarray, shift: torch.Tensor, prob: Problem, info: dict
) -> np.ndarray:
    """NegativeRealEigenvalueError when an eigenvalue of the matrix solved (after rounding and the
    eps shift) is on the closed negative real axis, or within its rounding uncertainty of it.

    Where the working format is coarser than float64 and its eigenvalues are not clear of the axis,
    those of the same rounded matrix (exact in float64) are recomputed in float64 and decide: fp32
    frank(10)'s small eigenvalues (condition numbers ~1e6) are within fp32's rounding of the axis,
    not within float64's (issue 22, class 4). They then replace the working format's (returned;
    ``info["eigvals_fp64"]`` lists the batch elements)."""
    u = precision.unit_roundoff(A.dtype)
    u64 = precision.unit_roundoff(torch.float64)
    eigs = eigs.copy()
    for i in range(eigs.shape[0]):
        Ai = materialise(A[i : i + 1], shift[i : i + 1], torch.float64)[0]
        fro = float(torch.linalg.matrix_norm(Ai))
        a = Ai.numpy()
        eta = eigenvalue_backward_error(fro, prob.n, u)
        kind, why = negative_axis_status(a, eigs[i], kappas[i], eta, prob.prescale)
        if kind != "clear" and u > u64:
            w64, k64 = eigenvalue_conditions(a)
            eta = eigenvalue_backward_error(fro, prob.n, u64)
            kind, why = negative_axis_status(a, w64, k64, eta, prob.prescale)
            eigs[i] = w64
            info.setdefault("eigvals_fp64", []).append(i)
        if kind != "clear":
            raise axis_error("coupled_newton", why, kind)
    return eigs


def refuse_indefinite(est: SpectrumEstimate, prob: Problem) -> None:
    """Raise when a Ritz value proves a negative eigenvalue (Ritz values lie inside the spectrum)."""
    thresh = -100.0 * prob.n * 2.0**-53 * est.lmax.abs()
    bad = est.lmin < thresh
    if bool(bad.any()):
        worst = float(est.lmin[bad].min()) / prob.prescale
        raise NotPositiveDefiniteError(
            f"coupled_newton: the matrix is not positive definite after regularisation: Lanczos "
            f"proves an eigenvalue <= {worst:.3e} (dtype {precision.info(prob.dtype).name}); "
            "increase eps, or use method='eigh' with rank_policy='clamp' or 'pseudo_inverse'"
        )


def diagnose_divergence(
    A: torch.Tensor, shift: torch.Tensor, out: NewtonOutcome, prob: Problem, lanczos_steps: int
) -> None:
    """After divergence on symmetric input, raise NotPositiveDefiniteError if Cholesky fails."""
    idx = [i for i, r in enumerate(out.reason) if r == "divergence"]
    Ad = materialise(A[idx], shift[idx], torch.float64)
    _, chol_info = torch.linalg.cholesky_ex(Ad)
    if bool((chol_info > 0).any()):
        est = lanczos_extremes(Ad, lanczos_steps)
        worst = float(est.lmin.min()) / prob.prescale
        raise NotPositiveDefiniteError(
            f"coupled_newton diverged and the (regularised, rounded) matrix is not positive definite: "
            f"Cholesky fails; Lanczos estimate of the smallest eigenvalue {worst:.3e} "
            f"(dtype {precision.info(prob.dtype).name}); increase eps, or use method='eigh' with "
            "rank_policy='clamp' or 'pseudo_inverse'"
        )


def check_domain(
    name: str,
    A: torch.Tensor,
    shift: torch.Tensor,
    est: SpectrumEstimate | None,
    out: NewtonOutcome,
    prob: Problem,
    info: dict,
) -> float:
    """Symmetric input, inverse root: the shared domain test (:func:`~matroots.solvers.spd_start.domain_test`)
    on the converged elements; a matrix that is not positive definite raises, one whose lambda_min is
    below u lambda_max is flagged ``"not_determined"``. Returns the matrix products spent.

    An eigenvalue at rounding level (an exactly singular PSD matrix, rounded, plus eps = 1e-16) does
    not make the iteration diverge: it is resolved in log(1/m_0)/(p log(1+1/p)) steps, within
    max_iter, and the "converged" inverse is then an arbitrary matrix of that size (issue 22, class 2).
    """
    rows = out.converged.clone()
    if not bool(rows.any()):
        return 0.0
    b = A.shape[0]
    spent = float(rows.sum()) / b / 6.0  # one Cholesky (n^3/3 flops) per tested element
    # lambda_max: the Lanczos upper bound, else (frobenius / power scaling) ||A + shift I||_F >=
    # lambda_max, which at worst makes the margin sqrt(n) u lambda_max
    lmax = est.lmax_upper * (1 + 1e-6) if est is not None else shifted_fro(A, shift)
    undetermined = domain_test(name, prob, A, shift, lmax, rows)
    flag_undetermined(undetermined, out.converged, out.reason, info, prob, lmax)
    info["domain_matmuls"] = spent
    return spent


__all__ = [
    "check_domain",
    "diagnose_divergence",
    "refuse_indefinite",
    "refuse_negative_real",
]
