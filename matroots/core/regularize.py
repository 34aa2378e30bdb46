"""Epsilon regularisation: A -> A + eps_abs I.

* ``eps_mode="absolute"``: eps_abs = eps.
* ``eps_mode="relative"``: eps_abs = eps * lambda_max(A), per batch element (the spectral scale, so the
  same eps means the same relative shift for factors of any magnitude, as Shampoo implementations do).
  lambda_max is that of A as rounded to the working format: its largest eigenvalue for symmetric input,
  its largest eigenvalue modulus (spectral radius) for general input; identical in every solver up to
  how it is computed (eigh and schur_newton: from their eigen/Schur decomposition; coupled_newton: the
  top Lanczos Ritz value certified to 1e-12 relative by its residual bound, or LAPACK eigenvalues for
  general input). Every solver reports the shift it
  applied in ``info["eps_abs"]`` (user units, per element); measure against A + eps_abs I
  (:func:`matroots.truth.metrics.solved_metrics`).

Where the shift is applied: in the working precision, after A has been rounded to it. For eigh the
shift is added to the computed eigenvalues (exact for A + eps I = Q (Lambda + eps) Q^T); for the
Newton methods it is added to the diagonal of the rounded matrix. A shift smaller than u * lambda_max
of the working format is therefore lost to rounding, which is the behaviour this toolkit measures.

Inputs are pre-scaled by an exact power of two ``prescale`` (always in fp16; in the other formats
only when the magnitude of A + eps_abs I leaves a safe band, see :func:`matroots.core.inputs.prescale_exponent`,
whose choice includes eps so that the shifted matrix fits the format); an absolute eps is given in the
user's units, so it is multiplied by ``prescale`` before it is added to the pre-scaled matrix
(:func:`working_shift`), and reported back in the user's units (``info["eps_abs"]``).
"""

from __future__ import annotations

import torch

from .errors import InvalidArgumentError

#: The eps modes, defined once (``matroots.core.options`` re-exports them): eps_abs = eps, or
#: eps * lambda_max(A).
EPS_MODES = ("absolute", "relative")


def absolute_shift(eps: float, eps_mode: str, lambda_max: torch.Tensor) -> torch.Tensor:
    """The absolute shift eps_abs per batch element (float64 tensor shaped like ``lambda_max``)."""
    lmax = lambda_max.double()
    if eps_mode == "absolute":
        return torch.full_like(lmax, float(eps))
    if eps_mode == "relative":
        return float(eps) * lmax.abs()
    raise InvalidArgumentError(f"eps_mode must be one of {EPS_MODES}, got {eps_mode!r}")


def working_shift(eps: float, eps_mode: str, lambda_max: torch.Tensor, prescale: float = 1.0) -> torch.Tensor:
    """The shift to add to the pre-scaled working matrix ``prescale * A`` (float64, per batch element).

    ``lambda_max`` is that of the pre-scaled matrix. The shift in the user's units is the returned
    value divided by ``prescale``.
    """
    shift = absolute_shift(eps, eps_mode, lambda_max)
    if eps_mode == "absolute" and prescale != 1.0:
        shift = shift * prescale
    return shift


def add_to_diagonal(A: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """A + diag(shift_b) I for a batch A (b, n, n) and shifts (b,), in A's dtype (a new tensor)."""
    out = A.clone()
    d = torch.diagonal(out, dim1=-2, dim2=-1)
    d += shift.to(A.dtype).unsqueeze(-1)
    return out


__all__ = ["EPS_MODES", "absolute_shift", "add_to_diagonal", "working_shift"]
