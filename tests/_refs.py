"""Test helpers: matrix constructions and an independent high-precision reference (mpmath).

The reference is computed from the float64 input itself (converted exactly to mpmath), never by the
code under test: ``mpmath.eigsy`` for symmetric input, ``mpmath.eig`` for general input, at
``REF_DPS`` decimal digits, enough for kappa up to 1e12 with 20+ guard digits.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import mpmath
import numpy as np

REF_DPS = 50

U = {"fp64": 2.0**-53, "fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}


def haar_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """Haar-distributed orthogonal matrix (QR of a Gaussian with the sign fix of Mezzadri 2007)."""
    Z = rng.standard_normal((n, n))
    Q, R = np.linalg.qr(Z)
    return Q * np.sign(np.diag(R))


def geometric_spectrum(n: int, kappa: float, lmax: float = 1.0) -> np.ndarray:
    """n eigenvalues from lmax/kappa to lmax in geometric progression."""
    return lmax * np.logspace(-math.log10(kappa), 0.0, n)


def spd_matrix(n: int, kappa: float, seed: int, lmax: float = 1.0) -> np.ndarray:
    """Q diag(geometric spectrum) Q^T with Haar Q, symmetrised exactly in float64."""
    rng = np.random.default_rng(seed)
    Q = haar_orthogonal(n, rng)
    A = (Q * geometric_spectrum(n, kappa, lmax)) @ Q.T
    return 0.5 * (A + A.T)


def complex_spectrum_matrix(n: int, seed: int, radius: tuple[float, float] = (0.5, 2.0), max_arg=1.2):
    """V B V^{-1} with B block diagonal of rotation-scaling blocks r [[cos t, -sin t], [sin t, cos t]]
    (eigenvalues r e^{+-it}, |t| <= max_arg < pi, so off the closed negative real axis), plus one
    positive real eigenvalue when n is odd. Returns (A, cond_2(V))."""
    rng = np.random.default_rng(seed)
    B = np.zeros((n, n))
    j = 0
    while j + 1 < n:
        r = rng.uniform(*radius)
        t = rng.uniform(0.1, max_arg)
        B[j : j + 2, j : j + 2] = r * np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
        j += 2
    if j < n:
        B[j, j] = rng.uniform(*radius)
    V = np.eye(n) + 0.3 * rng.standard_normal((n, n)) / math.sqrt(n)
    A = V @ B @ np.linalg.inv(V)
    return A, float(np.linalg.cond(V))


def _key(A: np.ndarray) -> tuple:
    return (A.shape, A.astype(np.float64).tobytes())


@functools.lru_cache(maxsize=64)
def _eigsy(key: tuple):
    shape, raw = key
    A = np.frombuffer(raw, dtype=np.float64).reshape(shape)
    with mpmath.workdps(REF_DPS):
        E, Q = mpmath.eigsy(mpmath.matrix(A.tolist()))
    return E, Q


@functools.lru_cache(maxsize=64)
def _eig(key: tuple):
    shape, raw = key
    A = np.frombuffer(raw, dtype=np.float64).reshape(shape)
    with mpmath.workdps(REF_DPS):
        E, V = mpmath.eig(mpmath.matrix(A.tolist()))
        Vinv = mpmath.inverse(V)
    return E, V, Vinv


def ref_power(
    A: np.ndarray, s: float | Fraction, eps: float = 0.0, symmetric: bool | None = None
) -> np.ndarray:
    """(A + eps I)^s for real s (e.g. -1/p) by mpmath at REF_DPS digits, rounded to float64.

    The principal branch is used for general input (mpmath's complex power). ``eps`` is added exactly
    to the mpmath eigenvalues (A + eps I has the same eigenvectors).
    """
    A = np.asarray(A, dtype=np.float64)
    sym = bool(np.array_equal(A, A.T)) if symmetric is None else symmetric
    with mpmath.workdps(REF_DPS):
        ex = mpmath.mpf(s.numerator) / s.denominator if isinstance(s, Fraction) else mpmath.mpf(s)
        epsm = mpmath.mpf(eps)
        n = A.shape[0]
        if sym:
            E, Q = _eigsy(_key(A))
            f = [(E[i] + epsm) ** ex for i in range(n)]
            X = Q * mpmath.diag(f) * Q.T
            return np.array([[float(X[i, j]) for j in range(n)] for i in range(n)])
        E, V, Vinv = _eig(_key(A))
        f = [mpmath.power(E[i] + epsm, ex) for i in range(n)]
        X = V * mpmath.diag(f) * Vinv
        return np.array([[float(mpmath.re(X[i, j])) for j in range(n)] for i in range(n)])


def ref_inverse_root(A: np.ndarray, p, eps: float = 0.0) -> np.ndarray:
    """Reference A^{-1/p} (p int, float or Fraction)."""
    return ref_power(A, -1 / Fraction(p).limit_denominator(10**6), eps)


def rel_err(X, Xref: np.ndarray) -> float:
    """Relative forward error in the Frobenius norm, in float64."""
    Xn = X.detach().double().numpy() if hasattr(X, "detach") else np.asarray(X, dtype=np.float64)
    return float(np.linalg.norm(Xn - Xref) / np.linalg.norm(Xref))


# Forward-error bound used by the accuracy tests (documented in tests/test_solvers_accuracy.py):
#     ||X - X_ref||_F / ||X_ref||_F <= C_FWD * (1 + kappa/p) * u * sqrt(n)
# kappa/p is the relative condition number of A^{-1/p} for SPD A (docs/design.md §4); the "1 +" is the
# rounding of the output itself, which dominates when kappa/p < 1. For general matrices A = V B V^{-1}
# the condition number is multiplied by cond(V)^2 (one factor into the eigenbasis, one out).
C_FWD = 10.0


def fwd_bound(kappa: float, p: float, n: int, u: float, cond_v: float = 1.0) -> float:
    """C_FWD * cond_v^2 * (1 + kappa/p) * u * sqrt(n)."""
    return C_FWD * cond_v**2 * (1.0 + kappa / float(p)) * u * math.sqrt(n)


def spectral_condition(A: np.ndarray) -> float:
    """max|lambda| / min|lambda| of A (float64 LAPACK; used only to size bounds)."""
    w = np.abs(np.linalg.eigvals(A))
    return float(w.max() / w.min())
