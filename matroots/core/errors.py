"""Typed errors raised by matroots.

Every error is a :class:`MatrootsError`, itself a :class:`ValueError`, so callers that already catch
``ValueError`` keep working. Messages say what was wrong and what to do about it.

The hierarchy has two branches, so callers can tell who must act:

* :class:`MatrootsInputError` -- **bad input**: the caller must change an argument (shape, dtype, p,
  an option, a non-symmetric matrix given to an SPD-only method). Retrying the same call elsewhere
  cannot help; the Shampoo optimizer lets these propagate.
* :class:`MatrootsNumericalError` -- **a computation that failed**: non-convergence with
  ``strict=True``, a matrix that is not positive definite (or has an eigenvalue on the closed negative
  real axis) *after* rounding to the working format and the eps shift, a format whose range cannot hold
  an intermediate or the answer. A wider format, a larger eps or another method may succeed; the Shampoo
  optimizer's failure policy catches exactly this branch (keep the previous root, try the fallback).
"""

from __future__ import annotations


class MatrootsError(ValueError):
    """Base class of every error raised for bad input or failed computation in matroots."""


class MatrootsInputError(MatrootsError):
    """Bad input: the caller must change an argument. Never caught by Shampoo's failure policy."""


class MatrootsNumericalError(MatrootsError):
    """A computation that failed on valid input; a wider dtype, larger eps or other method may help."""


# --- bad input ---------------------------------------------------------------------------------------


class InvalidArgumentError(MatrootsInputError):
    """An argument or config field has a wrong type or value (eps, tol, max_iter, scaling, ...)."""


class NotSquareError(MatrootsInputError):
    """The input is not a (batch of) square matrices of shape (..., n, n)."""


class EmptyMatrixError(MatrootsInputError):
    """The input has a zero-sized dimension."""


class NonFiniteInputError(MatrootsInputError):
    """The input contains NaN or Inf as given (see :class:`FormatRangeError` for overflow on rounding)."""


class NotSymmetricError(MatrootsInputError):
    """An SPD-only method was given a matrix whose symmetry defect exceeds the tolerance."""


class UnsupportedExponentError(MatrootsInputError):
    """The exponent p is not supported by the method (p <= 0, or non-integer p for a Newton method)."""


class UnsupportedDtypeError(MatrootsInputError):
    """The dtype is not one of float64, float32, bfloat16, float16 (integer and complex are refused)."""


# --- computations that failed -----------------------------------------------------------------------


class NotPositiveDefiniteError(MatrootsNumericalError):
    """The matrix actually solved (rounded to the working format, eps-shifted) has a non-positive
    eigenvalue where the method needs SPD input. Rounding alone can cause this for PSD input."""


class NegativeRealEigenvalueError(MatrootsNumericalError):
    """A general matrix (as solved, after rounding) has an eigenvalue on the closed negative real axis:
    no principal root exists."""


class FormatRangeError(MatrootsNumericalError):
    """A value overflows or underflows the working (or compute) format: the rounded input, an eps shift,
    a scaling factor, an eigenvalue ratio or the root itself cannot be represented."""


class EigensolverError(MatrootsNumericalError):
    """The eigensolver returned a non-finite spectrum for a finite matrix without raising (seen with
    MKL's threaded fp32 ssyevd), and a retry in fp64 did not help."""


class ConvergenceError(MatrootsNumericalError):
    """An iterative method did not converge and ``strict=True`` was asked for.

    The partial :class:`~matroots.core.result.RootResult` is attached as ``.result``.
    """

    def __init__(self, message: str, result: object | None = None) -> None:
        super().__init__(message)
        self.result = result


class ConvergenceWarning(UserWarning):
    """Warning issued when an iterative method stops without meeting its tolerance."""


__all__ = [
    "ConvergenceError",
    "ConvergenceWarning",
    "EigensolverError",
    "EmptyMatrixError",
    "FormatRangeError",
    "InvalidArgumentError",
    "MatrootsError",
    "MatrootsInputError",
    "MatrootsNumericalError",
    "NegativeRealEigenvalueError",
    "NonFiniteInputError",
    "NotPositiveDefiniteError",
    "NotSquareError",
    "NotSymmetricError",
    "UnsupportedDtypeError",
    "UnsupportedExponentError",
]
