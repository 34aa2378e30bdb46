"""Typed errors raised by matroots.

Every error is a :class:`MatrootsError`, itself a :class:`ValueError`, so callers that already catch
``ValueError`` keep working. Messages say what was wrong and what to do about it.
"""

from __future__ import annotations


class MatrootsError(ValueError):
    """Base class of every error raised for bad input or failed computation in matroots."""


class NotSquareError(MatrootsError):
    """The input is not a (batch of) square matrices of shape (..., n, n)."""


class EmptyMatrixError(MatrootsError):
    """The input has a zero-sized dimension."""


class NonFiniteInputError(MatrootsError):
    """The input contains NaN or Inf (before or after rounding to the working dtype)."""


class NotSymmetricError(MatrootsError):
    """An SPD-only method was given a matrix whose symmetry defect exceeds the tolerance."""


class NotPositiveDefiniteError(MatrootsError):
    """The (regularised) matrix has a non-positive eigenvalue where the method needs SPD input."""


class NegativeRealEigenvalueError(MatrootsError):
    """A general matrix has an eigenvalue on the closed negative real axis: no principal root exists."""


class UnsupportedExponentError(MatrootsError):
    """The exponent p is not supported by the method (p <= 0, or non-integer p for a Newton method)."""


class UnsupportedDtypeError(MatrootsError):
    """The dtype is not one of float64, float32, bfloat16, float16 (integer and complex are refused)."""


class ConvergenceError(MatrootsError):
    """An iterative method did not converge and ``strict=True`` was asked for.

    The partial :class:`~matroots.result.RootResult` is attached as ``.result``.
    """

    def __init__(self, message: str, result: object | None = None) -> None:
        super().__init__(message)
        self.result = result


class ConvergenceWarning(UserWarning):
    """Warning issued when an iterative method stops without meeting its tolerance."""


__all__ = [
    "ConvergenceError",
    "ConvergenceWarning",
    "EmptyMatrixError",
    "MatrootsError",
    "NegativeRealEigenvalueError",
    "NonFiniteInputError",
    "NotPositiveDefiniteError",
    "NotSquareError",
    "NotSymmetricError",
    "UnsupportedDtypeError",
    "UnsupportedExponentError",
]
