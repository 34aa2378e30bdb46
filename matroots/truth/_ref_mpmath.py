"""mpmath backend of :mod:`matroots.truth.reference`: eigendecomposition at ``dps`` decimal digits.

Symmetric input: ``mpmath.eigsy`` (Householder tridiagonalisation + implicit QL), then
A^q = Q diag(lambda^q) Q^T. General input: ``mpmath.eig`` (Hessenberg + shifted QR) for eigenvalues
and right eigenvectors R, then A^q = R diag(lambda^q) R^{-1} (principal branch: lambda^q =
exp(q log lambda) with the principal logarithm). mpmath's ``powm``/``sqrtm`` are deliberately not
used: they are slow and fail to converge at large kappa.

The input converts exactly (a binary float is an exact mpf) and A + eps I is formed exactly
(``mpmath.fadd(..., exact=True)``). Results are returned as mpf/mpc matrices (lists of rows) so that two
precisions can be compared before anything is rounded to float64.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction

import mpmath
import numpy as np
from mpmath import mp

logger = logging.getLogger(__name__)


class BadSpectrum(Exception):
    """An eigenvalue lies on the closed negative real axis (or is non-positive for symmetric input).

    Internal to the reference backends (both raise it); :mod:`matroots.truth.reference` turns it into a
    typed :class:`~matroots.core.errors.NegativeRealEigenvalueError`.
    """

    def __init__(self, value: complex | float, message: str) -> None:
        super().__init__(message)
        self.value = value


@dataclass
class HPResult:
    """A high-precision matrix (rows of mpf) with its eigenvalues, at ``dps`` digits."""

    rows: list[list[mpmath.mpf]]
    eigenvalues: list[mpmath.mpf] | list[mpmath.mpc]
    dps: int


def exact_matrix(A: np.ndarray, eps: float) -> mpmath.matrix:
    """A + eps I as an mpmath matrix with exact entries."""
    n = A.shape[0]
    M = mp.matrix(n, n)
    e = mp.mpf(float(eps))
    for i in range(n):
        for j in range(n):
            M[i, j] = mp.mpf(float(A[i, j]))
        if eps:
            M[i, i] = mpmath.fadd(M[i, i], e, exact=True)
    return M


def _power(lam: mpmath.mpf | mpmath.mpc, q: Fraction) -> mpmath.mpf | mpmath.mpc:
    """lam^q on the principal branch, exp(q log lam)."""
    return mp.exp(mp.mpf(q.numerator) / q.denominator * mp.log(lam))


def symmetric_power(A: np.ndarray, eps: float, q: Fraction, dps: int) -> HPResult:
    """(A + eps I)^q for symmetric positive definite input at ``dps`` digits (mpmath.eigsy)."""
    with mp.workdps(dps):
        M = exact_matrix(A, eps)
        E, Q = mp.eigsy(M)
        lam = [E[i] for i in range(E.rows)]
        lmin = min(lam)
        if lmin <= 0:
            raise BadSpectrum(
                float(lmin), f"A + eps I has a non-positive eigenvalue, about {float(lmin):.6e}"
            )
        f = [_power(x, q) for x in lam]
        Qr = Q.tolist()
        n = len(lam)
        scaled = [[Qr[i][k] * f[k] for k in range(n)] for i in range(n)]
        rows = [[mp.mpf(0)] * n for _ in range(n)]
        for i in range(n):
            for j in range(i, n):
                v = mp.fdot(scaled[i], Qr[j])
                rows[i][j] = v
                rows[j][i] = v
        return HPResult(rows, sorted(lam), dps)


def symmetric_eigenvalues(A: np.ndarray, eps: float, dps: int) -> list[mpmath.mpf]:
    """Ascending eigenvalues of symmetric A + eps I at ``dps`` digits."""
    with mp.workdps(dps):
        E = mp.eigsy(exact_matrix(A, eps), eigvals_only=True)
        return sorted(E[i] for i in range(E.rows))


def general_power(A: np.ndarray, eps: float, q: Fraction, dps: int) -> HPResult:
    """(A + eps I)^q for general input at ``dps`` digits (mpmath.eig, principal branch).

    An eigenvalue counts as on the closed negative real axis when its real part is <= 0 and its
    imaginary part is below 10^(-dps/2) ||A||_F (a real eigenvalue of a real matrix computed in complex
    arithmetic carries a tiny imaginary part).
    """
    with mp.workdps(dps):
        M = exact_matrix(A, eps)
        E, R = mp.eig(M, left=False, right=True)
        n = M.rows
        scale = mp.mnorm(M, "f")
        tol = scale * mp.mpf(10) ** (-(dps // 2))
        lam = [mp.mpc(E[i]) for i in range(n)]
        for x in lam:
            if x.real <= 0 and abs(x.imag) <= tol:
                v = complex(x)
                raise BadSpectrum(
                    v, f"A + eps I has an eigenvalue on the closed negative real axis, about {v}"
                )
        f = [_power(x, q) for x in lam]
        Rinv = mp.inverse(R).tolist()
        Rr = R.tolist()
        scaled = [[Rr[i][k] * f[k] for k in range(n)] for i in range(n)]
        cols = [[Rinv[k][j] for k in range(n)] for j in range(n)]
        rows = [[mp.re(mp.fdot(scaled[i], cols[j])) for j in range(n)] for i in range(n)]
        return HPResult(rows, lam, dps)


def relative_difference(a: HPResult, b: HPResult) -> float:
    """||a - b||_F / ||b||_F, formed at the higher of the two precisions."""
    with mp.workdps(max(a.dps, b.dps)):
        num = mp.fsum(
            (x - y) ** 2 for ra, rb in zip(a.rows, b.rows, strict=True) for x, y in zip(ra, rb, strict=True)
        )
        den = mp.fsum(y**2 for rb in b.rows for y in rb)
        return float(mp.sqrt(num / den)) if den else float("inf")


def to_numpy(rows: list[list[mpmath.mpf]]) -> np.ndarray:
    """Round a high-precision matrix to float64 (each entry correctly rounded)."""
    return np.array([[float(x) for x in row] for row in rows], dtype=np.float64)


__all__ = [
    "BadSpectrum",
    "HPResult",
    "exact_matrix",
    "general_power",
    "relative_difference",
    "symmetric_eigenvalues",
    "symmetric_power",
    "to_numpy",
]
