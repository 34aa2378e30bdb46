"""python-flint (Arb ball arithmetic) backend of :mod:`matroots.truth.reference`.

Symmetric input: certified eigendecomposition by refinement, then a certified enclosure of A^q.

1. Start from LAPACK's float64 ``eigh``. Refine the eigenvectors X at ``prec`` bits with the iteration
   of Ogita & Aishima, "Iterative refinement for symmetric eigenvalue decomposition", Japan J. Indust.
   Appl. Math. 35 (2018), Algorithm 1: R = I - X^T X, S = X^T A X, lambda_i = s_ii / (1 - r_ii),
   e_ij = (s_ij + lambda_j r_ij) / (lambda_j - lambda_i) for |lambda_i - lambda_j| > delta,
   e_ij = r_ij / 2 otherwise, delta = 2(||S - D||_2 + ||A||_2 ||R||_2), X <- X + X E. The products are
   formed at ``prec`` bits; the correction E only needs relative accuracy of the current error, so it
   is formed in float64 (each step gains about 16 digits, plus the quadratic term).
   Clusters (|lambda_i - lambda_j| <= delta, including exactly repeated eigenvalues) are resolved by
   a float64 eigendecomposition of the shifted block S_CC - mu (X^T X)_CC, applied as a rotation of
   X's cluster columns at ``prec`` bits (the idea of Ogita & Aishima's part II, 2019).
2. Certify, in ball arithmetic, with V = X (exact midpoints):
   G = I - V^T V, r >= ||G||_F; V^{-1} = (I + G + G^2 + ...) V^T, enclosed as (I + G) V^T plus a ball
   of radius r^2/(1 - r) sqrt(1 + r); B = V^{-1} A V (a ball matrix containing the exact similarity);
   D = diag(mid B_ii); F = B - D. Gershgorin's theorem on B bounds the spectrum of A by [m, M];
   kappa(V) <= sqrt((1 + r)/(1 - r)).
3. f(A) = V f(B) V^{-1} = V f(D) V^{-1} + V (f(B) - f(D)) V^{-1}. The first term is enclosed in balls.
   For the second, the Stieltjes representations x^{-s} = (sin(s pi)/pi) int_0^inf t^{-s} (t + x)^{-1}
   dt and x^{s} = (sin(s pi)/pi) int_0^inf t^{s-1} x (t + x)^{-1} dt (0 < s < 1; Higham, *Functions
   of Matrices*, 2008, eq. (11.3)-type) give, with ||(tI + B)^{-1}||_2 <= kappa(V)/(t + m),
   ||B^{-s} - D^{-s}||_2 <= kappa(V) s m^{-s-1} ||F||_2 and ||B^s - D^s||_2 <= kappa(V) s m^{s-1} ||F||_2;
   integer parts are handled by the telescoping sums B^k - D^k = sum_j B^j (B - D) D^{k-1-j}. The
   Frobenius norm of V (f(B) - f(D)) V^{-1} is then at most sqrt(n) kappa(V) of that bound.

The resulting radius is rigorous (up to bugs): exact input, outward-rounded arithmetic, no float64 step
in the certificate. General (nonsymmetric) input uses Arb's certified ``acb_mat.eig`` (van der Hoeven
& Mourrain), which needs isolated eigenvalues; A^q = R diag(lambda^q) L with L = R^{-1}.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from flint import acb_mat, arb, arb_mat, ctx, fmpq

from ._ref_mpmath import BadSpectrum

logger = logging.getLogger(__name__)


_U = 2.0**-53


class PrecisionTooLow(Exception):
    """The certificate could not be established at this precision (caller raises it and retries)."""


class NotIsolated(Exception):
    """Arb could not isolate the eigenvalues of a general matrix (clustered or repeated)."""


@contextlib.contextmanager
def working_prec(bits: int) -> Iterator[None]:
    """Set Arb's working precision for the duration of the block."""
    old = ctx.prec
    ctx.prec = int(bits)
    try:
        yield
    finally:
        ctx.prec = old


def _exact_sum(a: float, b: float) -> arb:
    """a + b as an exact arb (precision raised as needed, capped at 65536 bits)."""
    s = Fraction(a) + Fraction(b)
    bits = min(max(64, s.numerator.bit_length() + 2), 1 << 16)
    with working_prec(bits):
        return arb(fmpq(s.numerator, s.denominator))


def exact_matrix(A: np.ndarray, eps: float) -> arb_mat:
    """A + eps I as an arb matrix; entries are exact (binary floats, exact diagonal sums)."""
    M = arb_mat(A.tolist())
    if eps:
        for i in range(A.shape[0]):
            M[i, i] = _exact_sum(float(A[i, i]), float(eps))
    return M


def _identity(n: int) -> arb_mat:
    M = arb_mat(n, n)
    for i in range(n):
        M[i, i] = 1
    return M


def to_numpy(M: arb_mat) -> np.ndarray:
    """Midpoints of an arb matrix, rounded to float64."""
    return np.array([[float(x) for x in row] for row in M.tolist()], dtype=np.float64).reshape(
        M.nrows(), M.ncols()
    )


def _frob_upper(rows: list[list[arb]]) -> arb:
    """An upper bound of the Frobenius norm of a ball matrix (given as rows of arbs)."""
    s = arb(0)
    for row in rows:
        for x in row:
            u = x.abs_upper()
            s += u * u
    return s.sqrt().upper()


def _rad_frob(rows: list[list[arb]]) -> arb:
    """An upper bound of the Frobenius norm of the radius matrix."""
    s = arb(0)
    for row in rows:
        for x in row:
            r = x.rad()
            s += r * r
    return s.sqrt().upper()


def _relative_radius(err: float, mid: float) -> float:
    """err / (mid - err), the relative radius of a ball of radius err around a midpoint of norm mid
    (the true root's norm is at least mid - err); inf when that lower bound is not positive. Python
    floats throughout: a huge radius gives inf, never numpy's overflow warning."""
    low = mid - err
    return err / low if low > 0 else math.inf


def _mid_frob(rows: list[list[arb]]) -> float:
    """Frobenius norm of the midpoints (summed in arb: no float64 overflow or underflow)."""
    total = arb(0)
    for row in rows:
        for x in row:
            m = x.mid()
            total += m * m
    return float(total.sqrt())


# ------------------------------------------------------------------------------------------ refinement
def _ritz(S: arb_mat, R: arb_mat, s2: arb) -> tuple[np.ndarray, np.ndarray]:
    """Ritz values s_ii / (1 - r_ii), formed at working precision, as double-double (hi, lo) arrays.

    Eigenvalues closer than u |lambda| (e.g. a cluster near 1) are told apart only by ``lo``.
    """
    n = S.nrows()
    hi, lo = np.empty(n), np.empty(n)
    for i in range(n):
        lam = S[i, i] * s2 / (1 - R[i, i])
        hi[i] = float(lam)
        lo[i] = float(lam - hi[i])
    return hi, lo


def _numerators(S: arb_mat, R: arb_mat, hi: np.ndarray, lo: np.ndarray, s2: arb) -> np.ndarray:
    """s_ij + lambda_j r_ij at working precision, then rounded: the two terms nearly cancel once the
    eigenvectors are accurate, so forming the sum in float64 would stall the refinement."""
    lam = [arb(float(h)) + arb(float(low)) for h, low in zip(hi, lo, strict=True)]
    out = np.empty((S.nrows(), S.ncols()))
    for i, (srow, rrow) in enumerate(zip(S.tolist(), R.tolist(), strict=True)):
        out[i] = [float(sij * s2 + lj * rij) for sij, lj, rij in zip(srow, lam, rrow, strict=True)]
    return out


def _gaps(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """lambda_j - lambda_i for all (i, j), accurate to relative u of the gap (Sterbenz on hi)."""
    return (hi[None, :] - hi[:, None]) + (lo[None, :] - lo[:, None])


def _clusters(hi: np.ndarray, lo: np.ndarray, delta: float) -> list[np.ndarray]:
    order = np.lexsort((lo, hi))
    groups: list[list[int]] = [[int(order[0])]]
    for a, b in itertools.pairwise(order):
        if (hi[b] - hi[a]) + (lo[b] - lo[a]) <= delta:
            groups[-1].append(int(b))
        else:
            groups.append([int(b)])
    return [np.array(g) for g in groups if len(g) > 1]


def _orthonormalize(Q: arb_mat, tol: float, max_steps: int = 8) -> arb_mat:
    """Newton-Schulz steps Q <- Q + Q (I - Q^T Q)/2 at working precision (quadratic from a float64 Q),
    so that a rotation does not undo the orthogonality already reached (Higham, *Functions of
    Matrices*, eq. (8.20))."""
    eye = _identity(Q.nrows())
    for _ in range(max_steps):
        Rq = (eye - Q.transpose() * Q).mid()
        if float(np.linalg.norm(to_numpy(Rq))) <= tol:
            break
        Q = (Q + Q * Rq * arb(0.5)).mid()
    return Q


def _columns(X: arb_mat, idx: np.ndarray) -> arb_mat:
    rows = X.tolist()
    return arb_mat([[row[j] for j in idx] for row in rows])


def _set_columns(X: arb_mat, idx: np.ndarray, C: arb_mat) -> None:
    for i, row in enumerate(C.tolist()):
        for c, j in enumerate(idx):
            X[i, int(j)] = row[c]


def refine_symmetric(A: arb_mat, A64: np.ndarray, prec: int, max_iter: int = 40) -> tuple[arb_mat, int, str]:
    """Eigenvectors of the symmetric ``A`` refined at ``prec`` bits (see the module docstring).

    ``A64`` is a float64 approximation of ``A`` for the starting ``eigh``. Returns (X, iterations,
    notes) with X an arb matrix of exact midpoints.
    """
    n = A64.shape[0]
    lam0, X0 = np.linalg.eigh(A64)
    normA = max(float(np.abs(lam0).max()), np.finfo(float).tiny)
    # every float64 quantity below is relative to ||A||: scaled by an exact power of two in arb, so
    # matrices near the overflow or underflow thresholds refine like any other
    s2 = arb(2) ** (-round(math.log2(normA)))
    X = arb_mat(X0.tolist())
    eye = _identity(n)
    floor = 64.0 * n * 2.0**-prec
    best, since_best = math.inf, 0
    rotations = 0
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (reported in the notes)
        S, R, Sf, Rf = _sr(A, X, eye, s2)
        off = Sf - np.diag(np.diag(Sf))
        offn, rn = float(np.linalg.norm(off)), float(np.linalg.norm(Rf))
        if offn <= floor and rn <= floor:
            break
        err = max(offn, rn)
        if err < 0.5 * best:
            best, since_best = err, 0
        else:
            since_best += 1
            if since_best >= 3:
                break  # stagnation (the rounding floor of this precision): the certificate decides
        hi, lo = _ritz(S, R, s2)
        dS = np.linalg.norm(off) + np.linalg.norm(np.diag(Sf) * np.diag(Rf) / (1.0 - np.diag(Rf)))
        delta = 2.0 * (dS + float(normA * s2) * np.linalg.norm(Rf))
        groups = _clusters(hi, lo, delta)
        pending = [g for g in groups if np.linalg.norm(off[np.ix_(g, g)]) > floor]
        if pending and rn > floor:
            # Rotations assume orthonormal columns (else S_CC q = lambda G_CC q is a generalised
            # problem): orthonormalise first, at working precision.
            X = _orthonormalize(X, floor)
            S, R, Sf, Rf = _sr(A, X, eye, s2)
        rotated = False
        for g in pending:
            # T = S_CC - mu I, formed at prec bits, then rounded: its float64 eigenvectors resolve
            # the cluster to relative accuracy u of its width.
            mu = arb(float(np.mean(hi[g])))  # scaled units
            T = Sf[np.ix_(g, g)].copy()
            for a, i in enumerate(g):
                T[a, a] = float(S[int(i), int(i)] * s2 - mu)
            T = 0.5 * (T + T.T)
            scale = float(np.abs(T).max())
            if scale == 0.0 or np.linalg.norm(T - np.diag(np.diag(T))) <= 16.0 * _U * g.size * scale:
                continue  # already diagonal to float64 accuracy: a float64 rotation cannot help
            _, Q = np.linalg.eigh(T / scale)
            Qh = _orthonormalize(arb_mat(Q.tolist()), floor)
            _set_columns(X, g, (_columns(X, g) * Qh).mid())
            rotated = True
            rotations += 1
        if rotated:
            S, R, Sf, Rf = _sr(A, X, eye, s2)
            hi, lo = _ritz(S, R, s2)
        num = _numerators(S, R, hi, lo, s2)
        den = _gaps(hi, lo)
        with np.errstate(divide="ignore", invalid="ignore"):
            E = num / den
        close = np.abs(den) <= delta
        E[close] = 0.5 * Rf[close]
        E = np.nan_to_num(E, nan=0.0, posinf=0.0, neginf=0.0)
        X = (X + X * arb_mat(E.tolist())).mid()
    notes = f"Ogita-Aishima refinement: {it} iterations, {rotations} cluster rotations"
    return X, it, notes


def _sr(A: arb_mat, X: arb_mat, eye: arb_mat, s2: arb) -> tuple[arb_mat, arb_mat, np.ndarray, np.ndarray]:
    """S = X^T A X and R = I - X^T X at working precision, with float64 copies (S scaled by s2)."""
    Xt = X.transpose()
    S = (Xt * (A * X).mid()).mid()
    R = (eye - Xt * X).mid()
    return S, R, to_numpy(S * s2), to_numpy(R)


# ---------------------------------------------------------------------------------------- certificate
@dataclass
class SymEig:
    """A certified similarity B = V^{-1} A V with the data the bounds need."""

    V: arb_mat  # exact midpoints
    W: arb_mat  # ball enclosure of V^{-1}
    d: list[arb]  # exact midpoints of diag(B)
    lower: arb  # lower bound of lambda_min(A) (Gershgorin on B)
    upper: arb  # upper bound of lambda_max(A)
    kappa_v: arb  # upper bound of ||V||_2 ||V^{-1}||_2
    f_norm: arb  # upper bound of ||B - D||_2 (Frobenius)
    n: int
    highs: list[arb]  # per-index Gershgorin upper bounds (disc i of B)


def certify_symmetric(A: arb_mat, V: arb_mat) -> SymEig:
    """Ball-arithmetic certificate of the near-diagonalisation V^{-1} A V (module docstring, step 2)."""
    n = V.nrows()
    Vt = V.transpose()
    G = _identity(n) - Vt * V
    r = _frob_upper(G.tolist())
    if not r < 0.5:
        raise PrecisionTooLow(f"eigenvector matrix too far from orthogonal: ||I - V^T V||_F <= {r}")
    tail = (r * r / (1 - r) * (1 + r).sqrt()).upper()
    W = Vt + G * Vt
    if not tail.is_zero():
        W = W + arb_mat([[arb(0, tail)] * n for _ in range(n)])
    B = W * (A * V)
    rows = B.tolist()
    d: list[arb] = []
    lows: list[arb] = []
    highs: list[arb] = []
    fsq = arb(0)
    for i, row in enumerate(rows):
        di = row[i].mid()
        d.append(di)
        radius = arb(0)
        for j, x in enumerate(row):
            if j != i:
                u = x.abs_upper()
                radius += u
                fsq += u * u
        e = (row[i] - di).abs_upper()
        fsq += e * e
        lows.append((row[i].lower() - radius).lower())
        highs.append((row[i].upper() + radius).upper())
    lower, upper = lows[0], highs[0]
    for lo, hi in zip(lows, highs, strict=True):  # exact arbs: the comparisons are decisive
        lower = lo if lo < lower else lower
        upper = hi if hi > upper else upper
    kappa_v = ((1 + r) / (1 - r)).sqrt().upper()
    return SymEig(V, W, d, lower, upper, kappa_v, fsq.sqrt().upper(), n, highs)


def _perturbation_bound(q: Fraction, e: SymEig) -> arb:
    """Upper bound of ||f(B) - f(D)||_2 for f(x) = x^q (module docstring, step 3)."""
    m, M, kv, F = e.lower, e.upper, e.kappa_v, e.f_norm
    if q == 0:
        return arb(0)
    if q < 0:
        alpha = -q
        k = math.floor(alpha)
        r = arb(fmpq((alpha - k).numerator, (alpha - k).denominator))
        a = arb(fmpq(alpha.numerator, alpha.denominator))
        bound = kv * (kv * r + k) * F * m ** (-a - 1)
    else:
        k = math.floor(q)
        r = arb(fmpq((q - k).numerator, (q - k).denominator))
        term = k * M ** (k - 1 + r) if k >= 1 else arb(0)
        if not r.is_zero():
            term += r * M**k * m ** (r - 1)
        bound = kv * kv * F * term
    return bound.upper()


def _pow(x: arb, q: Fraction) -> arb:
    qa = arb(fmpq(q.numerator, q.denominator))
    return (qa * x.log()).exp()


@dataclass
class Enclosure:
    """A float64 root with a certified relative Frobenius error bound, plus eigenvalue estimates."""

    root: np.ndarray
    rel_error: float
    eigenvalues: np.ndarray
    notes: str


def symmetric_power(A64: np.ndarray, eps: float, q: Fraction, prec: int) -> Enclosure:
    """Certified A^q for symmetric positive definite A + eps I at ``prec`` bits."""
    n = A64.shape[0]
    with working_prec(prec):
        A = exact_matrix(A64, eps)
        Aeps = A64 + eps * np.eye(n) if eps else A64
        X, _, notes = refine_symmetric(A, Aeps, prec)
        e = certify_symmetric(A, X)
        lam = np.sort(np.array([float(x) for x in e.d]))
        if not e.lower > 0:
            i = min(range(n), key=lambda k: float(e.d[k]))
            dmin = float(e.d[i])
            if dmin <= 0 and not e.highs[i] > 0:
                raise BadSpectrum(dmin, f"A + eps I has a non-positive eigenvalue, about {dmin:.6e}")
            raise PrecisionTooLow(
                f"cannot certify that the smallest eigenvalue (about {dmin:.3e}) is positive"
            )
        fd = [_pow(di, q) for di in e.d]
        vrows = X.tolist()
        VF = arb_mat([[v * fd[j] for j, v in enumerate(row)] for row in vrows])
        Xb = VF * e.W
        rows = Xb.tolist()
        delta = _perturbation_bound(q, e)
        extra = arb(n).sqrt() * e.kappa_v * delta
        err = (_rad_frob(rows) + extra).upper()
        mid = _mid_frob(rows)
        rel = _relative_radius(float(err), mid)
        root = to_numpy(Xb)
    if not (0 <= rel < 1):
        raise PrecisionTooLow(f"certified relative radius {rel:.3e} is too large")
    return Enclosure(root, rel, lam, notes + f"; certified (Gershgorin lambda_min >= {float(e.lower):.6e})")


def symmetric_eigenvalues(A64: np.ndarray, eps: float, prec: int) -> np.ndarray:
    """Eigenvalues of symmetric A + eps I (any sign) from the refined, certified similarity."""
    with working_prec(prec):
        A = exact_matrix(A64, eps)
        Aeps = A64 + eps * np.eye(A64.shape[0]) if eps else A64
        X, _, _ = refine_symmetric(A, Aeps, prec)
        e = certify_symmetric(A, X)
        return np.sort(np.array([float(x) for x in e.d]))


def general_power(A64: np.ndarray, eps: float, q: Fraction, prec: int) -> Enclosure:
    """Certified A^q for general A + eps I via Arb's certified eigendecomposition (isolated eigenvalues).

    Raises NotIsolated when Arb cannot isolate the eigenvalues, BadSpectrum when an eigenvalue lies on
    the closed negative real axis, PrecisionTooLow when an eigenvalue ball touches the axis.
    """
    with working_prec(prec):
        M = acb_mat(exact_matrix(A64, eps))
        try:
            E, L, R = M.eig(left=True, right=True)
        except ValueError as exc:
            raise NotIsolated(str(exc)) from exc
        for lam in E:
            re, im = lam.real, lam.imag
            if re > 0 or im.abs_lower() > 0:
                continue
            mid = complex(float(re), float(im))
            if re.upper() <= 0 and (im.contains(0) or im.is_zero()):
                raise BadSpectrum(
                    mid, f"A + eps I has an eigenvalue on the closed negative real axis, about {mid}"
                )
            raise PrecisionTooLow(f"eigenvalue ball {lam} touches the negative real axis")
        qa = arb(fmpq(q.numerator, q.denominator))
        fE = [(qa * lam.log()).exp() for lam in E]
        RF = acb_mat([[x * fE[j] for j, x in enumerate(row)] for row in R.tolist()])
        Xc = RF * L
        Xr = Xc.real
        rows = Xr.tolist()
        err = _rad_frob(rows)
        mid = _mid_frob(rows)
        rel = _relative_radius(float(err.upper()), mid)
        root = to_numpy(Xr)
        ev = np.array([complex(float(x.real), float(x.imag)) for x in E])
    if not (0 <= rel < 1):
        raise PrecisionTooLow(f"certified relative radius {rel:.3e} is too large")
    return Enclosure(root, rel, ev, "Arb certified eig (isolated eigenvalues), A^q = R diag(lambda^q) R^{-1}")


__all__ = [
    "BadSpectrum",
    "Enclosure",
    "NotIsolated",
    "PrecisionTooLow",
    "certify_symmetric",
    "exact_matrix",
    "general_power",
    "refine_symmetric",
    "symmetric_eigenvalues",
    "symmetric_power",
    "working_prec",
]
