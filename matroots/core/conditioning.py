"""Condition numbers of the matrix p-th root and of its inverse, and of eigenvalues.

The relative condition number of a matrix function f at A (Higham, *Functions of Matrices*, 2008,
§3.1, eq. (3.2)-(3.4)) is

    cond(f, A) = ||L_f(A)|| ||A|| / ||f(A)||,

where L_f(A) is the Fréchet derivative (a linear map on n x n matrices) and ||L_f(A)|| its norm induced
by the Frobenius norm, i.e. the 2-norm of its Kronecker form K_f(A) (n^2 x n^2, vec L_f(A, E) =
K_f(A) vec E; Higham 2008, eq. (3.17)). Here f(z) = z^{-1/p} (``inverse=True``) or z^{1/p}, principal
branch. This is the number a stable method's forward error tracks: ``error <~ cond(f, A) u``. For the
inverse root of SPD A it is about kappa(A)/p; for the forward root it is about kappa^{1 - 1/p}/p, far
smaller, which is why kappa/p is the wrong yardstick for A^{1/p}.

* Symmetric (normal) A = Q diag(lambda) Q^T: in the eigenbasis L_f(A) is the Hadamard product with the
  matrix of first divided differences D_ij = f[lambda_i, lambda_j] (Higham 2008, Thm 3.11 / Cor. 3.12),
  so ||L_f(A)||_F-induced = max |D_ij| exactly (Higham 2008, Cor. 3.16). For z^q on a positive
  spectrum f' is monotone and every D_ij is a mean value of f', so the maximum is |f'| at lambda_min
  or lambda_max; evaluated in logarithms.
* General A = Z T Z^H (complex Schur form; the norms are unitarily invariant, so T replaces A).
  With q = +-b/a and R = T^{1/a} from Smith's triangular recurrence (SIMAX 24(4), 2003), the
  derivative of z^{1/a} solves sum_k R^k L R^{a-1-k} = E (differentiate R^a = T), so
  K_f = S_b S_a^{-1} (forward) or -(R^{-b})^T kron R^{-b} S_b S_a^{-1} (inverse), with
  S_m = sum_k (R^T)^{m-1-k} kron R^k; its 2-norm is computed exactly (SVD) for n <= ``kron_max_n``
  and by Lanczos bidiagonalisation of the operator above. No eigenvectors are used: the eigenvector
  form V (D o (V^{-1} E V)) V^{-1} (Higham 2008, Thm 3.11) is lost to cond(V) on defective and
  nearly defective matrices, which the Schur form and the recurrence handle.
* Scale invariance: cond(f, cA) = cond(f, A) (f(cA) = c^q f(A), L_f(cA) = c^{q-1} L_f(A)); A is
  divided by a power of two first, so norms of tiny or huge matrices neither under- nor overflow.

Eigenvalue condition numbers (Golub & Van Loan, *Matrix Computations*, 4th ed., §7.2.2): for a simple
eigenvalue with unit right and left eigenvectors x, y, kappa(lambda) = 1 / |y^H x|; a backward error E
moves it by at most about kappa(lambda) ||E||_2. The Newton solvers use this to decide whether the
matrix actually solved has an eigenvalue on (or, to working precision, indistinguishable from one on)
the closed negative real axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse.linalg
import torch

from .errors import NotSquareError, UnsupportedDtypeError
from .inputs import parse_exponent


def _f64(X: Any) -> np.ndarray:
    if isinstance(X, torch.Tensor):
        return X.detach().cpu().to(torch.float64).numpy()
    arr = np.asarray(X)
    if arr.dtype.kind not in "fiu":
        raise UnsupportedDtypeError(f"expected a real matrix, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def _batch(X: np.ndarray) -> np.ndarray:
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise NotSquareError(f"expected square matrices (..., n, n), got shape {X.shape}")
    return X.reshape(-1, X.shape[-1], X.shape[-1])


def _expm1(z: np.ndarray) -> np.ndarray:
    """exp(z) - 1 without cancellation for real or complex z (2 sinh(z/2) e^{z/2})."""
    if np.iscomplexobj(z):
        return 2.0 * np.sinh(z / 2) * np.exp(z / 2)
    return np.expm1(z)


def divided_differences(lam: np.ndarray, q: float) -> np.ndarray:
    """D_ij = f[lambda_i, lambda_j] for f(z) = z^q (principal branch); D_ii = f'(lambda_i).

    Evaluated without cancellation for close eigenvalues: with d = log lambda_j - log lambda_i
    (principal logarithms), f[lambda_i, lambda_j] = lambda_i^{q-1} expm1(q d) / expm1(d), whose
    limit d -> 0 is q lambda_i^{q-1}. Real positive input gives a real matrix, otherwise complex.
    """
    lam = np.asarray(lam).reshape(-1)
    real = np.isrealobj(lam) and bool((lam > 0).all())
    z = lam.astype(float if real else complex)
    with np.errstate(all="ignore"):
        lg = np.log(z)
        d = lg[None, :] - lg[:, None]
        num, den = _expm1(q * d), _expm1(d)
        small = np.abs(d) < 1e-300
        ratio = np.where(small, q, num / np.where(small, 1.0, den))
        base = np.exp((q - 1.0) * lg)[:, None]
    return base * ratio


def _exponent(p: Any, inverse: bool) -> Fraction:
    frac: Fraction = parse_exponent(p)
    return (-1 if inverse else 1) / frac


def _on_negative_axis(w: np.ndarray) -> bool:
    scale = float(np.abs(w).max(initial=0.0))
    return bool(np.any((np.abs(np.imag(w)) <= 1e-14 * scale) & (np.real(w) <= 0)))


def _logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    return top + math.log(float(np.sum(np.exp(x - top))))


def _cond_symmetric(lam: np.ndarray, q: float) -> float:
    """max_ij |f[lambda_i, lambda_j]| ||lambda||_2 / ||f(lambda)||_2 for f(z) = z^q, in logarithms.

    f' = q z^{q-1} is monotone on (0, inf), and every divided difference is a mean value of f', so
    the maximum is |f'| at lambda_min or lambda_max. Logarithms keep the value finite whenever it is
    representable: numerator and denominator overflow together for q < 0 and a tiny lambda_min.
    """
    if not lam[0] > 0:
        return math.inf
    lg = np.log(lam)
    log_num = math.log(abs(q)) + max((q - 1) * lg[0], (q - 1) * lg[-1]) + 0.5 * _logsumexp(2 * lg)
    log_den = 0.5 * _logsumexp(2 * q * lg)
    with np.errstate(over="ignore"):
        return float(np.exp(log_num - log_den))


def _scale_exponent(A: np.ndarray) -> int:
    """k with 2^-k max|A_ij| in [1/2, 1): dividing by 2^k is exact and keeps norms inside float64's range."""
    big = float(np.abs(A).max(initial=0.0))
    return math.frexp(big)[1] if big > 0 and math.isfinite(big) else 0


def _triu_root(B: np.ndarray, a: int) -> np.ndarray:
    """Principal a-th roots R (R^a = B) of a batch B (k, m, m) of complex upper triangular matrices.

    Smith's Schur recurrence (M. I. Smith, "A Schur algorithm for computing matrix pth roots", SIMAX
    24(4), 2003), run superdiagonal by superdiagonal: r_ii = b_ii^{1/a}, and with the powers R^e of an
    addition chain for a (square and multiply), the (i, j) entry of every R^e is affine in x = r_ij,
    (R^e)_ij = alpha_e x + beta_e, because it is built from entries of lower superdiagonals and from x
    alone; b_ij = alpha_a x + beta_a then gives x. alpha_a = sum_m r_ii^m r_jj^{a-1-m} is formed as
    the chain's products, without the divided difference (r_ii^a - r_jj^a)/(r_ii - r_jj), so equal
    or close eigenvalues (the defective case) need no special treatment.
    """
    k, m, _ = B.shape
    diag = np.diagonal(B, axis1=1, axis2=2) ** (1.0 / a)
    R = np.zeros_like(B)
    idx = np.arange(m)
    R[:, idx, idx] = diag
    if a == 1:
        return B.copy()
    plan: list[tuple[int, int, int]] = []  # (e, left, right): R^e = R^left R^right
    e = 1
    for bit in bin(a)[3:]:
        plan.append((2 * e, e, e))
        e *= 2
        if bit == "1":
            plan.append((e + 1, e, 1))
            e += 1
    P = {1: R}
    dg = {1: diag}
    for e, lft, rgt in plan:
        dg[e] = dg[lft] * dg[rgt]
        P[e] = np.zeros_like(B)
        P[e][:, idx, idx] = dg[e]
    for d in range(1, m):
        i = np.arange(m - d)
        j = i + d
        alpha = {1: np.ones((k, m - d), dtype=B.dtype)}
        beta = {1: np.zeros((k, m - d), dtype=B.dtype)}
        if d > 1:
            cols = i[:, None] + np.arange(1, d)[None, :]
        for e, lft, rgt in plan:
            s = 0.0
            if d > 1:
                s = np.sum(P[lft][:, i[:, None], cols] * P[rgt][:, cols, j[:, None]], axis=-1)
            alpha[e] = dg[lft][:, i] * alpha[rgt] + alpha[lft] * dg[rgt][:, j]
            beta[e] = dg[lft][:, i] * beta[rgt] + beta[lft] * dg[rgt][:, j] + s
        x = (B[:, i, j] - beta[a]) / alpha[a]
        for e, M in P.items():
            M[:, i, j] = alpha[e] * x + beta[e]
    return P[1]


def _flush(M: np.ndarray) -> np.ndarray:
    """M with entries below 1e-250 max|M| set to 0: they cannot change a norm, and subnormal entries
    (the inverse of a triangular Kronecker form decays to them) slow BLAS and LAPACK down ~1000x."""
    big = float(np.abs(M).max(initial=0.0))
    if big > 0 and math.isfinite(big):
        M[np.abs(M) < 1e-250 * big] = 0
    return M


def _geometric_kron(R: np.ndarray, m: int) -> np.ndarray:
    """S_m = sum_{k<m} (R^T)^{m-1-k} kron R^k, the Kronecker form of E -> sum_k R^k E R^{m-1-k}.

    By doubling, S_2h = (X^h + Y^h) S_h and S_2h+1 = X S_2h + Y^2h with the commuting X = R^T kron I,
    Y = I kron R: one n^2 x n^2 product per bit of m.
    """
    n = R.shape[0]
    eye = np.eye(n, dtype=R.dtype)
    if m == 1:
        return np.eye(n * n, dtype=R.dtype)
    S = np.eye(n * n, dtype=R.dtype)
    Rh = R  # R^h for the prefix h of m read so far
    for bit in bin(m)[3:]:
        S = (np.kron(Rh.T, eye) + np.kron(eye, Rh)) @ S
        Rh = Rh @ Rh
        if bit == "1":
            S = np.kron(R.T, eye) @ S + np.kron(eye, Rh)
            Rh = Rh @ R
    return S


def _root_powers(R: np.ndarray, a: int) -> list[np.ndarray]:
    out = [np.eye(R.shape[0], dtype=R.dtype)]
    for _ in range(a - 1):
        out.append(out[-1] @ R)
    return out


def _solve_root_sylvester(Rp: list[np.ndarray], E: np.ndarray) -> np.ndarray:
    """L with sum_{k<a} R^k L R^{a-1-k} = E (Rp = [R^0 .. R^{a-1}], R upper triangular), i.e.
    L = L_{z^{1/a}}(R^a, E): column j of L solves the triangular system (sum_k r_jj^{a-1-k} R^k) L_j =
    E_j - (the terms of the columns l < j), by forward substitution over the columns."""
    a, n = len(Rp), E.shape[0]
    r = np.diagonal(Rp[1]) if a > 1 else np.ones(n, dtype=E.dtype)
    L = np.zeros(E.shape, dtype=complex)
    for j in range(n):
        rhs = E[:, j].astype(complex)
        if j:
            for k in range(a):
                rhs = rhs - Rp[k] @ (L[:, :j] @ Rp[a - 1 - k][:j, j])
        P = sum(r[j] ** (a - 1 - k) * Rp[k] for k in range(a))
        L[:, j] = scipy.linalg.solve_triangular(P, rhs, check_finite=False)
    return L


def _pair_power(R: np.ndarray, Y: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(R^b, L_{z^b}(R, Y)) by binary powering of the block matrix [[R, Y], [0, R]]."""
    resR: np.ndarray | None = None
    resY = Y
    baseR, baseY = R, Y
    while True:
        if b & 1:
            if resR is None:
                resR, resY = baseR, baseY
            else:
                resR, resY = resR @ baseR, resR @ baseY + resY @ baseR
        b >>= 1
        if not b:
            break
        baseR, baseY = baseR @ baseR, baseR @ baseY + baseY @ baseR
    assert resR is not None
    return resR, resY


# Above this numerator of 1/p the derivative of z^{1/a} is taken from the root of the 2n x 2n block
# matrix (log2(a) products per entry) instead of the a-term Sylvester form.
_SYLVESTER_MAX_A = 64


def _frechet_triu(T: np.ndarray, R: np.ndarray, E: np.ndarray, q: Fraction) -> tuple[np.ndarray, np.ndarray]:
    """(f(T), L_f(T, E)) for f(z) = z^q, q = +-b/a, T complex upper triangular, R = T^{1/a}.

    L_{z^{1/a}}(T, E) solves sum_k R^k L R^{a-1-k} = E (differentiate R^a = T); for a large it is the
    (1, 2) block of the root of [[T, E], [0, T]] (Higham 2008, eq. (3.16); :func:`_triu_root`). Then
    the b-th power and, for q < 0, the inverse, L_{z^-1}(X, Z) = -X^{-1} Z X^{-1}.
    """
    m = T.shape[0]
    a, b = q.denominator, abs(q.numerator)
    if a <= _SYLVESTER_MAX_A:
        Y = _solve_root_sylvester(_root_powers(R, a), E)
    else:
        c = float(np.linalg.norm(T))
        B = np.zeros((1, 2 * m, 2 * m), dtype=complex)
        B[0, :m, :m] = B[0, m:, m:] = T
        B[0, :m, m:] = E * c  # scaled to ||T||: the derivative block, not f(T), dominates the rounding
        Y = _triu_root(B, a)[0, :m, m:] / c
    X, Z = _pair_power(R, Y, b)
    if q < 0:
        Xi = scipy.linalg.solve_triangular(X, np.eye(m, dtype=complex), check_finite=False)
        X, Z = Xi, -(Xi @ Z @ Xi)
    return X, Z


def _cond_triangular(T: np.ndarray, q: Fraction, kron_max_n: int) -> float:
    """||L_f(T)|| ||T||_F / ||f(T)||_F for the complex Schur factor T of a general matrix.

    The Frobenius norms and the norm of the Fréchet derivative are invariant under the unitary
    similarity A = Z T Z^H. With R = T^{1/a} (:func:`_triu_root`) and q = +-b/a the Kronecker form is
    K_f = S_b S_a^{-1} (forward) or -(R^{-b})^T kron R^{-b} S_b S_a^{-1} (inverse), S_m the geometric
    sums of :func:`_geometric_kron`: formed and its 2-norm taken exactly (SVD) for n <= kron_max_n,
    else the largest singular value of the operator E -> L_f(T, E) by Lanczos bidiagonalisation
    (ARPACK through ``scipy.sparse.linalg.svds``; the power method on L^* L of Higham 2008, Alg. 3.20,
    converges too slowly when the top singular values are close) with L^*(G) = L_f(T, G^H)^H
    (f has real Taylor coefficients, so L_f(T)^* = L_f(T^H); Higham 2008, §3.4).
    """
    n = T.shape[0]
    a, b = q.denominator, abs(q.numerator)
    with np.errstate(all="ignore"):
        R = _flush(_triu_root(T[None], a)[0])
        if n <= max(kron_max_n, 1):
            fT = np.linalg.matrix_power(R, b)
            M = _geometric_kron(R, b)
            if q < 0:
                fT = scipy.linalg.solve_triangular(fT, np.eye(n, dtype=complex), check_finite=False)
                M = -np.kron(fT.T, fT) @ M
            Sa = _geometric_kron(R, a)
            if not (np.isfinite(M).all() and np.isfinite(Sa).all()):
                return math.inf
            K = _flush(np.linalg.solve(Sa.T, M.T).T)
            kn = float(np.linalg.norm(K, 2)) if np.isfinite(K).all() else math.inf
        else:
            fT = _frechet_triu(T, R, np.zeros((n, n), dtype=complex), q)[0]

            def mv(v: np.ndarray) -> np.ndarray:
                E = _flush(np.asarray(v).reshape(n, n, order="F").astype(complex))
                return _frechet_triu(T, R, E, q)[1].reshape(-1, order="F")

            def rmv(v: np.ndarray) -> np.ndarray:
                G = _flush(np.asarray(v).reshape(n, n, order="F").astype(complex))
                return _frechet_triu(T, R, G.conj().T, q)[1].conj().T.reshape(-1, order="F")

            op = scipy.sparse.linalg.LinearOperator((n * n, n * n), matvec=mv, rmatvec=rmv, dtype=complex)
            v0 = np.random.default_rng(0x5EED).standard_normal(n * n).astype(complex)
            try:
                kn = float(
                    scipy.sparse.linalg.svds(op, k=1, tol=1e-10, v0=v0, return_singular_vectors=False)[0]
                )
            except (ValueError, scipy.sparse.linalg.ArpackError):
                return math.inf
        den = float(np.linalg.norm(fT))
        val = kn * float(np.linalg.norm(T)) / den if den > 0 else math.inf
    return val if math.isfinite(val) else math.inf


def cond_root(
    A: Any,
    p: Any,
    *,
    inverse: bool = True,
    eps: float = 0.0,
    eigenvalues: np.ndarray | None = None,
    spectrum: Callable[[np.ndarray], np.ndarray] | None = None,
    kron_max_n: int = 24,
) -> float:
    """Relative condition number cond(f, A + eps I) of f(A) = A^{-1/p} (``inverse``) or A^{1/p}.

    Frobenius norms throughout (see the module docstring for the formulas and sources). Scale
    invariant, as cond(f, cA) = cond(f, A) for f(z) = z^q: A is first divided by a power of two
    near max|A_ij| (exact), so neither ||A|| nor ||f(A)|| under- or overflows. Exactly symmetric
    input uses its eigenvalues: ``eigenvalues`` if given, else ``spectrum(A)`` (ascending eigenvalues of
    an exactly symmetric float64 matrix; default float64 LAPACK ``eigvalsh``, whose lambda_min carries
    an absolute error of about n u lambda_max, so cond is then accurate to a relative ~ n u kappa;
    :func:`matroots.truth.metrics.cond_root` passes the high-precision
    :func:`matroots.truth.spectrum.symmetric_spectrum`); general input its complex Schur form and the
    Fréchet derivative from the block recurrence of :func:`_frechet_triu` (no eigenvectors, so
    defective and nearly defective matrices are handled). ``inf`` when A + eps I has an eigenvalue on
    the closed negative real axis (no principal root), or when the value exceeds float64. Max over a
    batch.
    """
    q = _exponent(p, inverse)
    worst = 0.0
    for Ai in _batch(_f64(A)):
        Ae = Ai + float(eps) * np.eye(Ai.shape[0]) if eps else Ai
        if not np.isfinite(Ae).all():
            return math.inf
        k = _scale_exponent(Ae)
        As = np.ldexp(Ae, -k)
        if np.array_equal(Ae, Ae.T):
            lam = (
                np.ldexp(np.sort(np.asarray(eigenvalues, dtype=float).reshape(-1)), -k)
                if eigenvalues is not None
                else (spectrum or np.linalg.eigvalsh)(As)
            )
            val = _cond_symmetric(lam, float(q))
        else:
            T, _ = scipy.linalg.schur(As.astype(complex), output="complex")
            if _on_negative_axis(np.diag(T)):
                return math.inf
            val = _cond_triangular(T, q, kron_max_n)
        worst = max(worst, val)
    return worst


def cond_u_line(cond: float, dtype: Any) -> float:
    """cond(f, A) u(dtype): the forward error a stable method can be expected to reach."""
    from . import precision

    return float(cond) * precision.unit_roundoff(dtype)


def eigenvalue_conditions(A: Any) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues of one square matrix and their condition numbers 1/|y^H x| (unit x, y).

    Computed by LAPACK (``scipy.linalg.eig`` with left and right eigenvectors) in the matrix's own
    format (float32 input stays float32). Defective or nearly defective eigenvalues get huge (or
    infinite) condition numbers: their first-order perturbation bound is then only an indicator.
    """
    a = np.asarray(A.detach().cpu().numpy() if isinstance(A, torch.Tensor) else A)
    if a.dtype not in (np.float32, np.float64):
        a = a.astype(np.float32)
    w, vl, vr = scipy.linalg.eig(a, left=True, right=True)
    s = np.abs(np.sum(np.conj(vl) * vr, axis=0))
    norms = np.linalg.norm(vl, axis=0) * np.linalg.norm(vr, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(s > 0, norms / np.where(s > 0, s, 1.0), np.inf)
    return w.astype(complex), kappa.astype(float)


def axis_distance(A: Any, candidates: np.ndarray, iters: int = 12) -> tuple[float, float]:
    """min over the candidate points z <= 0 of sigma_min(A - z I), and the minimising z.

    sigma_min(A - z I) is the distance (2-norm) from A to the nearest matrix with the eigenvalue z, so a
    value <= eta means the eta-pseudospectrum of A meets the closed negative real axis at z (Trefethen &
    Embree, *Spectra and Pseudospectra*, 2005, §2). Computed in float64 on the complex Schur form
    A = Z T Z^H by inverse power iteration on (T - zI)^H (T - zI) (two triangular solves per step): an
    estimate from above that converges to sigma_min.
    """
    a = _f64(A)
    n = a.shape[0]
    T, _ = scipy.linalg.schur(a.astype(complex), output="complex")
    rng = np.random.default_rng(0x5EED)
    v0 = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    best, zbest = math.inf, 0.0
    for z in np.unique(np.minimum(np.real(np.asarray(candidates, dtype=complex)), 0.0)):
        M = T - z * np.eye(n)
        if np.any(np.abs(np.diag(M)) == 0):
            return 0.0, float(z)
        v = v0 / np.linalg.norm(v0)
        sig = math.inf
        with np.errstate(all="ignore"):
            for _ in range(iters):
                y = scipy.linalg.solve_triangular(M, v, check_finite=False)
                w = scipy.linalg.solve_triangular(M, y, trans="C", check_finite=False)
                nw = float(np.linalg.norm(w))
                if not math.isfinite(nw) or nw == 0:
                    break
                sig = 1.0 / math.sqrt(nw)
                v = w / nw
        if not math.isfinite(sig):
            sig = 0.0
        if sig < best:
            best, zbest = sig, float(z)
    return best, zbest


__all__ = [
    "axis_distance",
    "cond_root",
    "cond_u_line",
    "divided_differences",
    "eigenvalue_conditions",
]
