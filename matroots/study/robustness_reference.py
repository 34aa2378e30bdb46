"""The robustness harness's yardstick (:mod:`matroots.study.robustness`): the root of the matrix
actually solved in mpmath at ``REF_DPS`` digits, its relative condition number cond(f, A) (from the
eigen-decomposition, or the Frechet derivative's Kronecker form for a matrix without a usable
eigenbasis), whether the principal root exists, and the relative error of a computed root against
it. A root is correct within ``C_BOUND * n * (1 + cond(f, A_s)) * u``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np

C_BOUND = 10.0
REF_DPS = 60


def _exact_mp(A: np.ndarray, k: int) -> mpmath.matrix:
    """The float64 matrix A times 2^-k, exactly, in mpmath."""
    n = A.shape[0]
    M = mpmath.matrix(n, n)
    for i in range(n):
        for j in range(n):
            M[i, j] = mpmath.ldexp(mpmath.mpf(float(A[i, j])), -k)
    return M


def _is_real(z: Any, tol: float) -> bool:
    """Real to the reference's precision (relative: the scale of z may be anything, e.g. 1e-224)."""
    return abs(mpmath.im(z)) <= tol * abs(z)


def _defined_at(z: Any, e: Fraction) -> bool:
    """x^e is defined at a z < 0 only for an integer exponent e (p = 1/k: a power of A, e.g. the
    forward root with p = 1 is A itself). A zero eigenvalue keeps the rule for z <= 0 (no root
    promised; within any backward error of a positive one, so ill-posed, never a silent wrong)."""
    return e.denominator == 1 and z != 0


def _power(z: Any, e: Fraction) -> Any:
    if e.denominator == 1:  # an integer power: real at a negative z
        return mpmath.power(z, int(e))
    return mpmath.power(z, mpmath.mpf(e.numerator) / e.denominator)


def reference_root(
    A_s: np.ndarray, k: int, shift: float, e: Fraction, symmetric: bool, u: float = 0.0
) -> dict[str, Any]:
    """f(A_s 2^-k + shift I) in mpmath, its condition number and whether the principal root exists.

    When no principal root exists (a real eigenvalue lambda <= 0), ``ill_posed`` says whether that
    eigenvalue is within the working format's backward error of a positive one,
    |lambda| <= C_BOUND n u cond(V) max|lambda_i| (cond(V) = 1 for symmetric input): then no method in
    that format can tell the matrix from one that has a root, and the problem is ill-posed there.
    """
    n = A_s.shape[0]
    with mpmath.workdps(REF_DPS):
        M = _exact_mp(A_s, k)
        if symmetric:
            M = (M + M.T) / 2
        c = mpmath.mpf(shift)
        tol = mpmath.mpf(10) ** (-(REF_DPS - 15))
        if symmetric:
            E, Q = mpmath.eigsy(M)
            lam = [E[i] + c for i in range(n)]
            bad = [x for x in lam if x <= 0 and not _defined_at(x, e)]
            if bad:
                lmin, lmax = min(bad), max(abs(x) for x in lam)
                ill = abs(lmin) <= C_BOUND * n * u * lmax
                return {"exists": False, "min_eig": float(lmin), "ill_posed": bool(ill)}
            fl = [_power(x, e) for x in lam]
            X = Q * mpmath.diag(fl) * Q.T
            V = Vinv = None
        else:
            E, V = mpmath.eig(M)
            Vinv = _eigenvector_inverse(V)
            lam = [E[i] + c for i in range(n)]
            for x in lam:
                if _is_real(x, tol) and mpmath.re(x) <= 0 and not _defined_at(x, e):
                    lmax = max(abs(y) for y in lam)
                    cond_v = float(
                        np.linalg.cond(np.array([[complex(V[i, j]) for j in range(n)] for i in range(n)]))
                    )
                    ill = abs(x) <= C_BOUND * n * u * cond_v * lmax
                    return {"exists": False, "min_eig": float(mpmath.re(x)), "ill_posed": bool(ill)}
            if Vinv is None:  # defective or nearly so: no usable eigenbasis
                X, cond = _defective_reference(M + c * mpmath.eye(n), lam, e)
                return {"exists": True, "X": X, "cond": cond, "defective": True}
            fl = [_power(x, e) for x in lam]
            X = V * mpmath.diag(fl) * Vinv
        cond = _condition(lam, fl, e, V, Vinv)
    return {"exists": True, "X": X, "cond": cond}


# cond(V) beyond which V diag(f) V^-1 loses too many of REF_DPS digits (an eigenvalue of a Jordan-like
# block of size k is computed to ~10^(-REF_DPS/k) and V's conditioning amplifies that)
_MAX_COND_V = mpmath.mpf(10) ** (REF_DPS // 4)


def _eigenvector_inverse(V: mpmath.matrix) -> mpmath.matrix | None:
    """V^-1, or None where V is singular or so ill-conditioned (a defective or nearly defective matrix)
    that V diag(f(lambda)) V^-1 would not be a reference: for the Jordan block [[1, 1], [0, 1]] mpmath
    returns two parallel eigenvectors and the product gave I as its square root; for a 3 x 3 Jordan
    block mpmath.inverse raises ZeroDivisionError ('matrix is numerically singular')."""
    try:
        Vinv = mpmath.inverse(V)
    except ZeroDivisionError:
        return None
    if mpmath.mnorm(V, 1) * mpmath.mnorm(Vinv, 1) > _MAX_COND_V:
        return None
    return Vinv


def _powm(A: mpmath.matrix, e: Fraction) -> mpmath.matrix:
    """A^e without an eigenbasis: an integer power by products, else mpmath.powm (exp(e log A), the
    principal logarithm by inverse scaling and squaring; square roots by Denman-Beavers), valid for
    defective A with no eigenvalue on the closed negative real axis."""
    if e.denominator == 1:
        k = int(e)
        return A**k if k >= 0 else mpmath.inverse(A) ** (-k)
    return mpmath.powm(A, mpmath.mpf(e.numerator) / e.denominator)


def _defective_reference(A: mpmath.matrix, lam: list, e: Fraction) -> tuple[mpmath.matrix, float]:
    """f(A) and cond(f, A) for A without a usable eigenbasis. Both on A / max|lambda| (f(A) scaled
    back by s^e exactly as the eigen-route's, the condition number scale-invariant). cond from the
    Frechet derivative's Kronecker form, column (i, j) = vec L(A, E_ij), each the upper-right block of
    f([[A, E_ij], [0, A]]) (Higham 2008, Thm 3.6 / eq. (3.16)): 2-norm times ||A||_F / ||f(A)||_F."""
    n = A.rows
    s = max(abs(x) for x in lam)
    An = A / s
    Xn = _powm(An, e)
    X = Xn * _power(mpmath.mpf(s), e)
    K = np.zeros((n * n, n * n), dtype=complex)
    with mpmath.workdps(max(30, REF_DPS // 2)):  # a few digits of cond suffice
        for j in range(n):
            for i in range(n):
                B = mpmath.zeros(2 * n, 2 * n)
                for r in range(n):
                    for t in range(n):
                        B[r, t] = B[n + r, n + t] = An[r, t]
                B[i, n + j] = 1
                F = _powm(B, e)
                K[:, i + j * n] = [complex(F[r, n + t]) for t in range(n) for r in range(n)]
    fro = lambda Y: math.sqrt(sum(float(abs(Y[r, t])) ** 2 for r in range(n) for t in range(n)))  # noqa: E731
    return X, float(np.linalg.norm(K, 2)) * fro(An) / fro(Xn)


def _condition(lam: list, fl: list, e: Fraction, V: Any, Vinv: Any) -> float:
    """cond(f, A) from the eigen-decomposition, evaluated on A / max|lambda| (scale-invariant)."""
    n = len(lam)
    s = max(abs(x) for x in lam)
    ef = mpmath.mpf(e.numerator) / e.denominator
    lam_n = [x / s for x in lam]
    f_n = [_power(x, e) for x in lam_n]
    D = np.zeros((n, n), dtype=complex)
    for i in range(n):
        for j in range(n):
            d = lam_n[i] - lam_n[j]
            if abs(d) <= mpmath.mpf(10) ** (-20) * abs(lam_n[i]):
                v = ef * _power(lam_n[i], e - 1)
            else:
                v = (f_n[i] - f_n[j]) / d
            D[i, j] = complex(v)
    if V is None:  # symmetric: ||L|| = max |D_ij|; Frobenius norms from the eigenvalues
        num = float(np.abs(D).max()) * math.sqrt(sum(float(abs(x)) ** 2 for x in lam_n))
        den = math.sqrt(sum(float(abs(x)) ** 2 for x in f_n))
        return num / den
    Vc = np.array([[complex(V[i, j]) for j in range(n)] for i in range(n)])
    Vi = np.array([[complex(Vinv[i, j]) for j in range(n)] for i in range(n)])
    K = np.kron(Vi.T, Vc) @ np.diag(D.flatten(order="F")) @ np.kron(Vc.T, Vi)
    A_n = Vc @ np.diag(np.array([complex(x) for x in lam_n])) @ Vi
    F_n = Vc @ np.diag(np.array([complex(x) for x in f_n])) @ Vi
    return float(np.linalg.norm(K, 2) * np.linalg.norm(A_n) / np.linalg.norm(F_n))


def rel_error(X: np.ndarray, Xref: Any) -> float:
    """||X - Re X_ref||_F / ||Re X_ref||_F at ``REF_DPS`` digits (inf for a zero reference)."""
    n = X.shape[0]
    with mpmath.workdps(REF_DPS):
        num = mpmath.mpf(0)
        den = mpmath.mpf(0)
        for i in range(n):
            for j in range(n):
                r = mpmath.re(Xref[i, j])
                num += (mpmath.mpf(float(X[i, j])) - r) ** 2
                den += r**2
        return float(mpmath.sqrt(num / den)) if den > 0 else math.inf


__all__ = ["C_BOUND", "REF_DPS", "reference_root", "rel_error"]
