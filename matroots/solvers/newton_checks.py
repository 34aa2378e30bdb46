"""Checks shared by the Newton solvers (coupled_newton, schur_newton): exponents the iteration can
resolve, the domain (no eigenvalue on the closed negative real axis) and the a posteriori backward error
of a forward root, and the outcome record of an iteration (NewtonOutcome). Re-exported by
:mod:`matroots.solvers.newton_core`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..core.errors import NegativeRealEigenvalueError, UnsupportedExponentError
from .base import matmul_count_power, matrix_power


@dataclass
class NewtonOutcome:
    """What :func:`coupled_newton_iterate` returns for a batch of b matrices.

    ``matmuls`` is the number of n x n matrix products executed per matrix of the batch (their total
    divided by b; a forward root's solve counts 4/3): the mean of ``matmuls_each``, the products spent
    on each element, which are exactly those the element costs when solved alone (converged elements
    leave the active set, so no product is spent on them). ``compactions`` counts how often the active
    set was compacted.
    """

    X: torch.Tensor
    converged: torch.Tensor
    iterations: torch.Tensor
    residual: torch.Tensor
    reason: list[str]
    matmuls: float
    history: list[torch.Tensor] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    matmuls_each: torch.Tensor | None = None
    compactions: int = 0


def check_resolvable_exponent(p: int, dtype: torch.dtype, n: int, method: str) -> None:
    """Refuse p so large that the coupled iteration cannot work in ``dtype``.

    T_k = I + (I - M_k)/p and the rounding of T_k^p leaves M_k an error of about p u, so the stopping
    test ||M_k - I||_F <= 4 p sqrt(n) u (:func:`matroots.core.precision.default_tol`) only means something
    while that tolerance is below 1; past it M_0 itself may pass the test and X_0 = I/c would be
    returned as converged. (This also keeps p inside the range of the scalar model's arithmetic.)
    """
    from ..core import precision

    if precision.default_tol(dtype, n, p) < 1.0:
        return
    fmt = precision.info(dtype)
    limit = int(1.0 / (4.0 * math.sqrt(n) * fmt.unit_roundoff))
    raise UnsupportedExponentError(
        f"{method}: p = {p} is too large for a Newton iteration in {fmt.name} at n = {n}: the residual "
        f"||M_k - I|| cannot be resolved below 1 (its rounding floor is ~4 p sqrt(n) u; p must be below "
        f"{limit}); use method='eigh' (any rational p) or a wider compute dtype"
    )


def eigenvalue_backward_error(fro_norm: float, n: int, u: float) -> float:
    """The backward error ||E||_2 assumed for an eigensolver run in unit roundoff u: 4 sqrt(n) u ||A||_F."""
    return 4.0 * math.sqrt(n) * u * fro_norm


def negative_axis_status(
    A: np.ndarray,
    eigs: np.ndarray,
    kappas: np.ndarray,
    eta: float,
    prescale: float = 1.0,
) -> tuple[str, str]:
    """Where the matrix actually solved, ``A`` (rounded, eps-shifted), stands to the closed negative real
    axis, as (kind, sentence): ``"on_axis"`` when a computed eigenvalue lies on it, ``"near"`` when none
    does but a matrix within ``eta`` of ``A`` has an eigenvalue there, ``"clear"`` otherwise ("" then).

    ``eigs`` are its computed eigenvalues (exact for a matrix within ``eta``, the eigensolver's backward
    error) and ``kappas`` their condition numbers. Screening: an eigenvalue whose first-order disc
    (radius kappa eta) misses (-inf, 0] is safe. The others are decided by the distance to the axis,
    min_z sigma_min(A - zI) at the axis points nearest to them
    (:func:`matroots.core.conditioning.axis_distance`): "near" when it is <= eta. "near" is a property
    of non-normality, not proof that ``A`` has no principal root: the Al-Mohy-Higham triangle with
    eigenvalues ~0.3 is within 4e-16 of a singular matrix. What it does mean is that the computed
    Schur form (exact for some matrix within eta) may put eigenvalues on the other side of the branch
    cut, so a root computed from it has no promised digit (a nearly nilpotent matrix, whose computed
    eigenvalues scatter on a circle of radius ~u^{1/n}: fp32 and fp64 roots O(1) apart).
    """
    from ..core.conditioning import axis_distance

    w = np.asarray(eigs, dtype=complex)
    k = np.asarray(kappas, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        radius = np.where(np.isfinite(k), k * eta, np.inf)
        dist = np.where(w.real <= 0, np.abs(w.imag), np.abs(w))  # distance to the closed negative axis
    suspect = ~(dist > radius)
    if not suspect.any():
        return "clear", ""
    on_axis = (w.imag == 0) & (w.real <= 0)
    if on_axis.any():
        lam = w[on_axis][np.argmin(w[on_axis].real)] / prescale
        return "on_axis", f"has the eigenvalue {lam.real:.3e} on the closed negative real axis"
    sig, z = axis_distance(A, np.concatenate([[0.0], w[suspect]]))
    if sig > eta:
        return "clear", ""
    return "near", (
        f"is within {sig / prescale:.2e} (2-norm; its eigensolver's backward error is ~{eta / prescale:.2e}) "
        f"of a matrix with the eigenvalue {z / prescale:.3e} on the closed negative real axis, so in this "
        "precision it is not determined which side of the branch cut its eigenvalues are on"
    )


def refuse_near_negative_axis(
    A: np.ndarray,
    eigs: np.ndarray,
    kappas: np.ndarray,
    eta: float,
    method: str,
    prescale: float = 1.0,
) -> None:
    """NegativeRealEigenvalueError when the matrix actually solved, ``A`` (rounded, eps-shifted), has an
    eigenvalue on the closed negative real axis, or is within ``eta`` of a matrix that has one
    (:func:`negative_axis_status`)."""
    kind, why = negative_axis_status(A, eigs, kappas, eta, prescale)
    if kind != "clear":
        raise axis_error(method, why, kind)


def axis_error(method: str, why: str, kind: str = "on_axis") -> NegativeRealEigenvalueError:
    """The refusal for a matrix solved that :func:`negative_axis_status` found on (``kind`` "on_axis")
    or near ("near") the closed negative real axis. Near it a principal root may exist (the refusal
    says so): only which root the computation reaches is not determined."""
    if kind == "near":
        what = (
            "its principal root may exist but is not determined in this precision, and the iteration cannot "
            "be trusted to reach it. Use method='schur_newton' (computes it and flags it not converged), a "
            "wider dtype, or eps"
        )
    else:
        what = (
            "no principal root can be computed. Shift it with eps if the eigenvalues should be positive, or "
            "use a wider dtype"
        )
    return NegativeRealEigenvalueError(
        f"{method}: the matrix actually solved (rounded to the working format, after the eps shift) {why}; {what}"
    )


def forward_backward_check(
    root: torch.Tensor,
    A: torch.Tensor,
    shift: torch.Tensor,
    p: int,
    out: NewtonOutcome,
    threshold: float,
    info: dict,
) -> float:
    """A posteriori test of a forward root Y: eta = ||Y^p - (A + shift I)||_F / ||A + shift I||_F.

    Evaluated in float64. Y is the exact principal p-th root of A + shift I + dA with ||dA||_F = eta
    ||A + shift I||_F, so its forward error is at most about cond(A^{1/p}) eta: a run whose eta exceeds
    ``threshold`` (the solver's stagnation acceptance, 16 tol by default) is marked not converged with
    stop reason ``"backward_error"``, whatever its M_k residual said. Writes ``info["backward_error"]``
    (b,) and returns the products spent (in float64).
    """
    Y = root.double()
    As = A.double().clone()
    if bool((shift != 0).any()):
        d = torch.diagonal(As, dim1=-2, dim2=-1)
        d += shift.double()[:, None]
    P = matrix_power(Y, p)
    num = torch.linalg.matrix_norm(P - As)
    den = torch.linalg.matrix_norm(As)
    eta = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), num)
    eta = torch.where(torch.isfinite(eta), eta, torch.full_like(eta, math.inf))
    info["backward_error"] = eta
    for i in range(eta.shape[0]):
        if bool(out.converged[i]) and not float(eta[i]) <= threshold:
            out.converged[i] = False
            out.reason[i] = "backward_error"
    return float(matmul_count_power(p))
