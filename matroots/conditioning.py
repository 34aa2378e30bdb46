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
  so ||L_f(A)||_F-induced = max |D_ij| exactly (Higham 2008, Cor. 3.16). For x^{+-1/p} on a positive
  spectrum the maximum is |f'(lambda_min)|, but the divided differences are evaluated in full.
* General diagonalisable A = V diag(lambda) V^{-1}: L_f(A, E) = V (D o (V^{-1} E V)) V^{-1}, so
  K_f(A) = (V^{-T} kron V) diag(vec D) (V^T kron V^{-1}); its 2-norm is computed exactly (SVD) for
  n <= ``kron_max_n`` and by power iteration on K^* K (Higham 2008, Alg. 3.20, with the eigenvector form
  of L and of its adjoint) above. Accurate while cond(V) u << 1; near-defective input is flagged by
  :func:`eigenvalue_conditions`.

Eigenvalue condition numbers (Golub & Van Loan, *Matrix Computations*, 4th ed., §7.2.2): for a simple
eigenvalue with unit right and left eigenvectors x, y, kappa(lambda) = 1 / |y^H x|; a backward error E
moves it by at most about kappa(lambda) ||E||_2. The Newton solvers use this to decide whether the
matrix actually solved has an eigenvalue on (or, to working precision, indistinguishable from one on)
the closed negative real axis.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.linalg
import torch

from .errors import NotSquareError, UnsupportedDtypeError
from .inputs import parse_exponent

_U64 = 2.0**-53
_SPECTRUM_CACHE: OrderedDict[str, np.ndarray] = OrderedDict()
_SPECTRUM_CACHE_SIZE = 16


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


def symmetric_spectrum(A: np.ndarray) -> np.ndarray:
    """Ascending eigenvalues of the exactly symmetric float64 matrix A.

    float64 LAPACK, or high precision (:func:`matroots.reference.eigvalsh`) when float64 cannot resolve
    the smallest (|lambda|_min < 1e3 n u |lambda|_max). Memoised by content hash.
    """
    key = hashlib.sha256(np.ascontiguousarray(A).tobytes() + str(A.shape).encode()).hexdigest()
    if key in _SPECTRUM_CACHE:
        _SPECTRUM_CACHE.move_to_end(key)
        return _SPECTRUM_CACHE[key]
    lam = np.linalg.eigvalsh(A)
    big = float(np.abs(lam).max())
    if big > 0 and float(np.abs(lam).min()) < 1e3 * A.shape[0] * _U64 * big:
        from . import reference

        lam = reference.eigvalsh(A)
    _SPECTRUM_CACHE[key] = lam
    if len(_SPECTRUM_CACHE) > _SPECTRUM_CACHE_SIZE:
        _SPECTRUM_CACHE.popitem(last=False)
    return lam


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


def _exponent(p: Any, inverse: bool) -> float:
    frac: Fraction = parse_exponent(p)
    return (-1.0 if inverse else 1.0) / float(frac)


def _on_negative_axis(w: np.ndarray) -> bool:
    scale = float(np.abs(w).max(initial=0.0))
    return bool(np.any((np.abs(np.imag(w)) <= 1e-14 * scale) & (np.real(w) <= 0)))


def _cond_symmetric(lam: np.ndarray, q: float) -> float:
    if lam[0] <= 0:
        return math.inf
    D = divided_differences(lam, q)
    num = float(np.abs(D).max()) * math.sqrt(float(np.sum(lam * lam)))
    den = math.sqrt(float(np.sum(np.exp(2 * q * np.log(lam)))))
    return num / den


def _kron_norm_general(
    w: np.ndarray, V: np.ndarray, Vinv: np.ndarray, D: np.ndarray, kron_max_n: int
) -> float:
    n = V.shape[0]
    if n <= kron_max_n:
        # vec is column-stacking: vec(V M V^{-1}) = (V^{-T} kron V) vec(M).
        K = np.kron(Vinv.T, V) @ (D.reshape(-1, order="F")[:, None] * np.kron(V.T, Vinv))
        return float(np.linalg.norm(K, 2))
    Dc = np.conj(D)
    VH, VinvH = V.conj().T, Vinv.conj().T

    def L(E: np.ndarray) -> np.ndarray:
        return V @ (D * (Vinv @ E @ V)) @ Vinv

    def Lstar(G: np.ndarray) -> np.ndarray:
        return VinvH @ (Dc * (VH @ G @ VinvH)) @ VH

    rng = np.random.default_rng(0x5EED)
    Z = rng.standard_normal((n, n)).astype(complex)
    Z /= np.linalg.norm(Z)
    est = 0.0
    for _ in range(50):
        W = Lstar(L(Z))
        new = math.sqrt(float(np.linalg.norm(W)))
        Z = W / np.linalg.norm(W)
        if abs(new - est) <= 1e-6 * new:
            est = new
            break
        est = new
    return est


def cond_root(
    A: Any,
    p: Any,
    *,
    inverse: bool = True,
    eps: float = 0.0,
    eigenvalues: np.ndarray | None = None,
    kron_max_n: int = 24,
) -> float:
    """Relative condition number cond(f, A + eps I) of f(A) = A^{-1/p} (``inverse``) or A^{1/p}.

    Frobenius norms throughout (see the module docstring for the formulas and sources). Exactly
    symmetric input uses its eigenvalues (``eigenvalues`` if given, else :func:`symmetric_spectrum`,
    high precision when float64 cannot resolve lambda_min); general input its float64 eigendecomposition
    and the Kronecker form of the Fréchet derivative. ``inf`` when A + eps I has an eigenvalue on the
    closed negative real axis (no principal root). Max over a batch.
    """
    q = _exponent(p, inverse)
    worst = 0.0
    for Ai in _batch(_f64(A)):
        Ae = Ai + float(eps) * np.eye(Ai.shape[0]) if eps else Ai
        if np.array_equal(Ae, Ae.T):
            lam = (
                np.sort(np.asarray(eigenvalues, dtype=float).reshape(-1))
                if eigenvalues is not None
                else symmetric_spectrum(Ae)
            )
            val = _cond_symmetric(lam, q)
        else:
            w, V = np.linalg.eig(Ae)
            if _on_negative_axis(w):
                return math.inf
            Vinv = np.linalg.inv(V)
            D = divided_differences(w.astype(complex), q)
            fA = np.real((V * np.exp(q * np.log(w.astype(complex)))) @ Vinv)
            kn = _kron_norm_general(w, V, Vinv, D, kron_max_n)
            val = kn * float(np.linalg.norm(Ae)) / float(np.linalg.norm(fA))
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
    "symmetric_spectrum",
]
