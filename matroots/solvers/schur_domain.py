"""schur_newton's domain: the Schur form of the matrix solved and whether its root is determined.

The matrix solved is the input rounded to the working format plus the eps shift (docs/design.md §3).
Its computed Schur form is exact only for a matrix within the eigensolver's backward error eta, so two
questions are kept apart (issue 22, class 4):

* **this matrix has an eigenvalue on the closed negative real axis** (no principal root): refused, with
  NegativeRealEigenvalueError (general input) or NotPositiveDefiniteError (symmetric input);
* **a matrix within eta has one** (non-normality, or a symmetric matrix singular to working precision):
  the principal root may exist and be computable, but the computed Schur form may put an eigenvalue on
  the other side of the branch cut, so no digit of the computed root is promised. The root is computed
  and flagged converged=False with stop reason ``"not_determined"``.

Where the working format is coarser than float64 and its Schur form is not clear of the axis, the same
rounded matrix (exact in float64) is decomposed again in float64 before deciding, as eigh retries a
failed fp32 eigensolve in float64: fp32 hilb(8) is SPD but fp32's eigensolver returns lambda_min =
-5.5e-10; fp32 frank(10)'s small eigenvalues (condition numbers ~1e6) are within fp32's eta of the axis,
not within float64's. The square roots are then taken on the float64 Schur factor and only the Newton
phase runs in the working format.

Symmetric inverse roots also get the SPD solvers' domain test (:func:`matroots.solvers.spd_start.domain_test`,
the float64 Cholesky of the matrix solved shifted down by u lambda_max): lambda_min < u lambda_max is
singular to working precision and flagged ``"not_determined"`` (an 8 x 8 matrix with one exactly zero
eigenvalue, rounded to fp64, had its inverse square root "converged" at entries 1.6e7 where eigh gave
2.4e7).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch

from ..core import precision
from ..core.conditioning import eigenvalue_conditions
from ..core.errors import NotPositiveDefiniteError
from ..core.inputs import Problem
from .newton_checks import axis_error, eigenvalue_backward_error, negative_axis_status
from .schur_sqrt import block_eigenvalues, diagonal_blocks
from .spd_start import cholesky_fails, domain_test

U64 = precision.unit_roundoff(torch.float64)


@dataclass
class SchurForm:
    """A = Q R Q^T of the matrix solved (before the eps shift is added to R), with R's diagonal blocks
    and eigenvalues; ``u`` is the unit roundoff of the arithmetic that computed it."""

    R: np.ndarray
    Q: np.ndarray
    blocks: list[tuple[int, int]]
    eigs: np.ndarray
    u: float


def schur_form(a: np.ndarray, sym: bool) -> SchurForm:
    """The symmetric Schur form (eigendecomposition, R diagonal) or the real Schur form of ``a``, in
    ``a``'s format."""
    u = float(np.finfo(a.dtype).eps) / 2
    if sym:
        # driver "evd" (divide and conquer): scipy's default MRRR ("evr") loses orthogonality of Q
        # (~n u instead of ~sqrt(n) u), which showed up as an error floor ~8x eigh's in fp32 at n=128.
        w, Q = scipy.linalg.eigh(0.5 * (a + a.T), driver="evd")
        return SchurForm(np.diag(w).astype(a.dtype), Q, [(j, 1) for j in range(len(w))], w.astype(complex), u)
    R, Q = scipy.linalg.schur(a, output="real")
    blocks = diagonal_blocks(R)
    return SchurForm(R, Q, blocks, block_eigenvalues(R, blocks), u)


def symmetric_sign_unresolved(form: SchurForm, shift: float, n: int) -> bool:
    """The computed lambda_min + shift is within the worst-case eigenvalue error n u ||A||_2 of 0 (or
    below it): this format cannot tell its sign (Weyl: |w_i - lambda_i| <= ||E||_2 ~ n u ||A||_2)."""
    w = form.eigs.real
    return bool(w.min() + shift <= n * form.u * float(np.abs(w).max()))


def symmetric_domain(
    method: str, prob: Problem, a: np.ndarray, form: SchurForm, shift: float, inverse: bool
) -> str | None:
    """The domain of the symmetric matrix solved, ``a + shift I`` (``form``: its eigendecomposition
    before the shift). Raises NotPositiveDefiniteError where a computed eigenvalue of it is <= 0;
    returns a sentence (the root is not determined) where the SPD domain test fails for an inverse root,
    None where the root is determined.
    """
    w = form.eigs.real + shift
    lmax = float(np.abs(w).max())
    err = prob.n * form.u * lmax  # worst-case absolute error of the computed eigenvalues
    a64 = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))[None]
    s64 = torch.tensor([shift], dtype=torch.float64)
    if w.min() <= 0:
        worst = float(w.min()) / prob.prescale
        if bool(cholesky_fails(a64, s64)[0]):
            why = "lies on the closed negative real axis (the float64 Cholesky test fails too); no principal root exists"
        else:
            why = (
                f"is within the eigensolver's error (~{err / prob.prescale:.1e}) of 0 although the float64 "
                "Cholesky test passes: the matrix solved is singular to working precision and this format "
                "cannot tell the sign of its smallest eigenvalue"
            )
        raise NotPositiveDefiniteError(
            f"{method}: eigenvalue {worst:.3e} (after eps shift {shift / prob.prescale:.3e}) {why}. Increase eps."
        )
    if not inverse:
        return None
    delta = (
        float(max(precision.unit_roundoff(prob.dtype), precision.unit_roundoff(prob.compute_dtype))) * lmax
    )
    if w.min() > delta + err:  # lambda_min >= w_min - err > delta: the Cholesky test would pass
        return None
    lmax_t = torch.tensor([lmax], dtype=torch.float64)
    if not bool(domain_test(method, prob, a64, s64, lmax_t, torch.ones(1, dtype=torch.bool))[0]):
        return None
    return (
        f"lambda_min of the matrix solved is below u lambda_max = {delta / prob.prescale:.2e} (float64 Cholesky "
        "test): it is singular to working precision and its inverse root is not determined"
    )


def general_domain(
    method: str, prob: Problem, a: np.ndarray, form: SchurForm, shift: float
) -> tuple[SchurForm, str | None]:
    """The domain of the general matrix solved, ``a + shift I``: the Schur form to root (``form``, or a
    float64 one of the same rounded matrix where the working format's was not clear of the axis) and
    None, or a sentence where only a nearby matrix has an eigenvalue on the closed negative real axis
    (the root is computed, not determined). Raises NegativeRealEigenvalueError where a computed
    eigenvalue is on the axis.
    """
    kind, why = _axis_status(form, shift, prob)
    if kind != "clear" and form.u > U64:
        form = schur_form(a.astype(np.float64), sym=False)
        kind, why = _axis_status(form, shift, prob)
    if kind == "on_axis":
        raise axis_error(method, why)
    return form, (why if kind == "near" else None)


def _axis_status(form: SchurForm, shift: float, prob: Problem) -> tuple[str, str]:
    """:func:`negative_axis_status` of the shifted Schur factor R + shift I (in R's format), whose computed
    eigenvalues are exact for a matrix within eta = 4 sqrt(n) u ||R||_F."""
    R = form.R + np.asarray(shift, dtype=form.R.dtype) * np.eye(len(form.R), dtype=form.R.dtype)
    w_c, kap = eigenvalue_conditions(R)
    eta = eigenvalue_backward_error(float(np.linalg.norm(R.astype(np.float64))), prob.n, form.u)
    return negative_axis_status(R, w_c, kap, eta, prob.prescale)


def stability_factor(X: torch.Tensor, a: np.ndarray, shift: float, p: int) -> float:
    """alpha = ||X||_F^p / ||A + shift I||_F (>= 1 up to rounding; 1 for normal A), in float64.

    Even the exactly rounded root X + E, |E| <= u |X|, leaves the residual (X + E)^p - A ~ p u ||X||^p,
    not p u ||A||: the backward error a forward root can reach is alpha times that of a normal matrix
    (Higham 2008, §6.1, eq. (6.5) for p = 2; frank(10): alpha ~ 1e6). inf where it overflows.
    """
    den = float(np.linalg.norm(a.astype(np.float64) + shift * np.eye(a.shape[0])))
    with np.errstate(over="ignore"):
        alpha = float(torch.linalg.matrix_norm(X.double())) ** p / den if den > 0 else math.inf
    return max(1.0, alpha) if not math.isnan(alpha) else math.inf
