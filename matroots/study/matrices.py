"""Test-matrix families for root solvers, and the loader for Kronecker factors dumped by Shampoo.

Every generator has the signature ``gen(n, kappa=None, rng=None, **options)`` and returns
``(A, meta)``: ``A`` a float64 ndarray of shape (n, n) and ``meta`` a dict with at least

* ``"family"``: the family name (a key of :data:`FAMILIES`);
* ``"n"``: the order;
* ``"kappa"``: the 2-norm condition number (``inf`` for a singular matrix);
* ``"kappa_source"``: how ``kappa`` is known: ``"prescribed"`` (the construction in exact arithmetic
  has this spectrum), ``"closed_form"`` (a formula for this family), ``"computed"`` (eigenvalues of
  the float64 matrix, in float64 or, when float64 cannot resolve them, at high precision with
  :func:`matroots.truth.reference.eigvalsh`);
* ``"eigenvalues"``: ascending eigenvalues (complex for nonsymmetric families) where known, else None;
* ``"symmetric"``: whether ``A`` is exactly symmetric (symmetric families are symmetrised exactly).

Random families need ``rng``, a :class:`numpy.random.Generator` (an int seed is accepted too): the same
seed gives the same matrix, bit for bit. Fixed gallery matrices (Hilbert, Lehmer, ...) ignore
``kappa`` (recorded as ``meta["kappa_requested"]``) and report their own.

Rounding: a matrix Q diag(lambda) Q^T built in float64 is exactly symmetric but its exact eigenvalues
differ from the prescribed ones by up to about c n u lambda_max (Weyl's theorem, u = 2^-53). For
kappa near 1/u the smallest prescribed eigenvalues are therefore nominal: the float64 matrix may even be
indefinite. :func:`exact_spectrum` gives the true eigenvalues of the float64 matrix.

Families (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., ch. 28, and MATLAB's
``gallery``):

* ``randsvd`` (``mode`` 1-5; aliases ``randsvd1`` .. ``randsvd5``): Q diag(sigma) Q^T, Q Haar orthogonal
  (Mezzadri 2007), sigma_1 = 1, sigma_n = 1/kappa; mode 1 one large, mode 2 one small, mode 3
  geometric, mode 4 arithmetic, mode 5 log-uniform random;
* ``clustered``: ``n_clusters`` clusters of relative width ``width`` with geometric centres;
* ``correlation``: random correlation matrix (unit diagonal) with prescribed eigenvalues by the
  Bendel-Mickey algorithm in the stable form of Davies & Higham (BIT 40, 2000);
* ``hilbert``, ``lehmer``, ``kms`` (Kac-Murdock-Szego rho^|i-j|, rho solved for ``kappa``),
  ``pascal``, ``minij``, ``moler``, ``pei`` (alpha I + ones, alpha from ``kappa``), ``tridiag``
  (tridiag(-1, 2, -1), eigenvalues 4 sin^2(k pi / (2(n+1))));
* ``lowrank``: G G^T with G = Q_r diag(sqrt(lambda)), rank ``rank``, nonzero eigenvalues geometric
  in [1/kappa, 1], plus ``eps`` I (default eps = 0: singular);
* ``near_repeated``: geometric spectrum in pairs of relative gap ``gap``;
* ``nonsymmetric``: S B S^{-1} with B block diagonal of rotation-scaling blocks r [[cos t, -sin t],
  [sin t, cos t]] (eigenvalues r e^{+-it}, |t| <= ``max_angle`` < pi, off the closed negative real
  axis, as Schur-Newton needs), moduli geometric in [1/kappa, 1], cond_2(S) = ``eigvec_cond``;
* ``shampoo``: real Kronecker factors of Shampoo on real tasks, shipped with matroots
  (:func:`shampoo_factors`; ``kappa`` is the factor's own).

Shampoo factor dumps
--------------------
The .npz layout (version 1) the Shampoo optimizer writes is documented in :mod:`matroots.core.factor_dump`,
with its writer :func:`save_shampoo_factors` and reader :func:`load_shampoo_factors` (re-exported here).
The family ``"shampoo"`` (:func:`shampoo_factors`) serves the curated real factors shipped in
``matroots/data/shampoo_factors`` to sweeps: ``families = ["shampoo"]`` with ``n`` in the shipped orders
(10, 32, 64) and ``[family_options.shampoo]`` ``task`` / ``stage`` to narrow the pool; seeds draw factors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ._shampoo_io import (
    SHAMPOO_DATA,
    SHAMPOO_FORMAT_VERSION,
    load_shampoo_factors,
    save_shampoo_factors,
    shampoo_factors,
)
from .family_helpers import Meta, exact_spectrum
from .family_helpers import check_n as _check_n
from .family_helpers import make_meta as _meta
from .family_helpers import rng_for as _rng

logger = logging.getLogger(__name__)

_U64 = 2.0**-53

Generator = Callable[..., tuple[np.ndarray, Meta]]


# --------------------------------------------------------------------------------------------- helpers
def _check_kappa(kappa: float | None, default: float) -> float:
    k = default if kappa is None else float(kappa)
    if not (math.isfinite(k) and k >= 1.0):
        raise ValueError(f"kappa must be a finite number >= 1, got {kappa!r}")
    return k


def haar_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """Haar-distributed orthogonal matrix: QR of a Gaussian with the sign fix of Mezzadri (2007)."""
    Z = rng.standard_normal((n, n))
    Q, R = np.linalg.qr(Z)
    return Q * np.where(np.diag(R) < 0, -1.0, 1.0)


def _sym(A: np.ndarray) -> np.ndarray:
    """Exactly symmetric float64 copy: (A + A^T) / 2."""
    return 0.5 * (A + A.T)


def _from_spectrum(lam: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Q diag(lam) Q^T with Haar Q, symmetrised exactly."""
    Q = haar_orthogonal(lam.size, rng)
    return _sym((Q * lam) @ Q.T)


def _computed_meta(family: str, A: np.ndarray, kappa_requested: float | None, **kw: Any) -> Meta:
    lam = exact_spectrum(A)
    meta = _meta(family, A.shape[0], lam, "computed", **kw)
    if kappa_requested is not None:
        meta["kappa_requested"] = float(kappa_requested)
    return meta


# ------------------------------------------------------------------------------------------- randsvd
def randsvd_spectrum(n: int, kappa: float, mode: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Descending singular values of Higham's randsvd modes 1-5 with sigma_1 = 1, sigma_n = 1/kappa.

    Mode 1: [1, 1/kappa, ..., 1/kappa]; mode 2: [1, ..., 1, 1/kappa]; mode 3: kappa^{-(i-1)/(n-1)};
    mode 4: 1 - (i-1)/(n-1) (1 - 1/kappa); mode 5: log-uniform on [1/kappa, 1] with both ends pinned
    (so kappa is exact; MATLAB's mode 5 does not pin them).
    """
    if n == 1:
        return np.ones(1)
    i = np.arange(n, dtype=float)
    if mode == 1:
        s = np.full(n, 1.0 / kappa)
        s[0] = 1.0
    elif mode == 2:
        s = np.ones(n)
        s[-1] = 1.0 / kappa
    elif mode == 3:
        s = kappa ** (-i / (n - 1))
    elif mode == 4:
        s = 1.0 - i / (n - 1) * (1.0 - 1.0 / kappa)
        s[-1] = 1.0 / kappa
    elif mode == 5:
        if rng is None:
            raise ValueError("randsvd mode 5 needs rng")
        s = np.exp(-rng.uniform(0.0, math.log(kappa), n))
        s = -np.sort(-s)
        s[0], s[-1] = 1.0, 1.0 / kappa
    else:
        raise ValueError(f"randsvd mode must be 1..5, got {mode!r}")
    return s


def randsvd(
    n: int, kappa: float | None = 1e4, rng: np.random.Generator | int | None = None, *, mode: int = 3
) -> tuple[np.ndarray, Meta]:
    """Symmetric randsvd: Q diag(sigma) Q^T with Haar Q and sigma from :func:`randsvd_spectrum`."""
    n, k = _check_n(n), _check_kappa(kappa, 1e4)
    g = _rng(rng, "randsvd")
    s = randsvd_spectrum(n, k, mode, g)
    return _from_spectrum(s, g), _meta("randsvd", n, s, "prescribed", mode=mode)


def _randsvd_mode(mode: int) -> Generator:
    def gen(n: int, kappa: float | None = 1e4, rng: np.random.Generator | int | None = None):
        A, meta = randsvd(n, kappa, rng, mode=mode)
        meta["family"] = f"randsvd{mode}"
        return A, meta

    gen.__name__ = f"randsvd{mode}"
    gen.__doc__ = f"randsvd mode {mode}; see :func:`randsvd`."
    return gen


# --------------------------------------------------------------------------------- prescribed spectra
def clustered_spectrum(n: int, kappa: float, n_clusters: int, width: float, rng: np.random.Generator):
    """Eigenvalues in ``n_clusters`` clusters with geometric centres from 1 to 1/kappa and relative
    width ``width``; the largest is exactly 1 and the smallest exactly 1/kappa."""
    k = max(1, min(n_clusters, n))
    centres = np.geomspace(1.0, 1.0 / kappa, k)
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    lam = []
    for c, (centre, m) in enumerate(zip(centres, sizes, strict=True)):
        off = rng.uniform(-1.0, 1.0, m)
        if c == 0:
            off = -np.abs(off)
            off[0] = 0.0
        if c == k - 1 and kappa > 1:
            off = np.abs(off)
            off[-1] = 0.0
        lam.append(centre * (1.0 + width * off))
    out = np.concatenate(lam)
    if k == 1 and kappa > 1:  # one cluster: keep kappa exact by pinning the ends
        out = np.sort(out)
        out[-1], out[0] = 1.0, 1.0 / kappa
    return np.sort(out)


def clustered(
    n: int,
    kappa: float | None = 1e4,
    rng: np.random.Generator | int | None = None,
    *,
    n_clusters: int = 3,
    width: float = 1e-6,
) -> tuple[np.ndarray, Meta]:
    """Q diag(lambda) Q^T with eigenvalues in tight clusters (see :func:`clustered_spectrum`)."""
    n, k = _check_n(n), _check_kappa(kappa, 1e4)
    g = _rng(rng, "clustered")
    lam = clustered_spectrum(n, k, n_clusters, width, g)
    return _from_spectrum(lam, g), _meta(
        "clustered", n, lam, "prescribed", n_clusters=n_clusters, width=width
    )


def near_repeated(
    n: int, kappa: float | None = 1e4, rng: np.random.Generator | int | None = None, *, gap: float = 1e-10
) -> tuple[np.ndarray, Meta]:
    """Geometric spectrum in [1/kappa, 1] whose eigenvalues come in pairs lambda, lambda (1 + gap)."""
    n, k = _check_n(n), _check_kappa(kappa, 1e4)
    g = _rng(rng, "near_repeated")
    m = (n + 1) // 2
    base = np.geomspace(1.0 / k, 1.0 / (1.0 + gap) if m > 1 else 1.0, m)
    lam = np.sort(np.concatenate([base, base * (1.0 + gap)])[:n])
    if n >= 2:
        lam[0], lam[-1] = 1.0 / k, max(lam[-1], 1.0)
    return _from_spectrum(lam, g), _meta("near_repeated", n, lam, "prescribed", gap=gap)


def correlation(
    n: int,
    kappa: float | None = 1e4,
    rng: np.random.Generator | int | None = None,
    *,
    eigenvalues: np.ndarray | None = None,
) -> tuple[np.ndarray, Meta]:
    """Random correlation matrix (unit diagonal) with prescribed eigenvalues.

    The eigenvalues (geometric in [1/kappa, 1] unless given) are scaled to sum to n, then
    Q diag(lambda) Q^T is driven to unit diagonal by n - 1 Givens similarities (Bendel & Mickey 1978),
    each rotation angle computed stably as in Davies & Higham, BIT 40 (2000), eq. (3.1): in the plane
    (i, j) with (a_ii - 1)(a_jj - 1) < 0, t = (a_ii - 1) / (a_ij + sign(a_ij) sqrt(a_ij^2 -
    (a_ii - 1)(a_jj - 1))), c = 1/sqrt(1 + t^2), s = c t makes the new a_ii exactly 1.
    """
    n = _check_n(n)
    g = _rng(rng, "correlation")
    if eigenvalues is None:
        lam = np.geomspace(1.0 / _check_kappa(kappa, 1e4), 1.0, n)
    else:
        lam = np.asarray(eigenvalues, dtype=float)
        if lam.shape != (n,) or (lam < 0).any():
            raise ValueError("eigenvalues must be n non-negative numbers")
    lam = lam * (n / lam.sum())
    A = _from_spectrum(lam, g)
    for _ in range(n):
        d = np.diag(A) - 1.0
        lo, hi = np.flatnonzero(d < -1e-14), np.flatnonzero(d > 1e-14)
        if lo.size == 0 or hi.size == 0:
            break
        i, j = int(lo[0]), int(hi[0])
        aij, aii1, ajj1 = A[i, j], A[i, i] - 1.0, A[j, j] - 1.0
        root = math.sqrt(aij * aij - aii1 * ajj1)
        t = aii1 / (aij + math.copysign(root, aij) if aij != 0 else root)
        c = 1.0 / math.sqrt(1.0 + t * t)
        s = c * t
        G = np.array([[c, s], [-s, c]])
        A[:, [i, j]] = A[:, [i, j]] @ G
        A[[i, j], :] = G.T @ A[[i, j], :]
    A = _sym(A)
    np.fill_diagonal(A, 1.0)
    return A, _meta("correlation", n, lam, "prescribed")


def lowrank(
    n: int,
    kappa: float | None = 1e4,
    rng: np.random.Generator | int | None = None,
    *,
    rank: int | None = None,
    eps: float = 0.0,
) -> tuple[np.ndarray, Meta]:
    """G G^T + eps I with G = Q_r diag(sqrt(lambda)) (n x r, orthonormal Q_r from a Haar matrix).

    The r nonzero eigenvalues are geometric in [1/kappa, 1] (``kappa`` is their spread, recorded as
    ``meta["kappa_nonzero"]``); the other n - r are exactly 0 in exact arithmetic (rounding makes them
    O(u)). ``meta["kappa"]`` is that of the whole matrix: inf for eps = 0, (1 + eps)/eps otherwise.
    """
    n, k = _check_n(n), _check_kappa(kappa, 1e4)
    g = _rng(rng, "lowrank")
    r = max(1, n // 4) if rank is None else int(rank)
    if not 1 <= r <= n:
        raise ValueError(f"rank must be in 1..{n}, got {rank!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    lam_r = np.geomspace(1.0 / k, 1.0, r)
    Q = haar_orthogonal(n, g)[:, :r]
    G = Q * np.sqrt(lam_r)
    A = _sym(G @ G.T)
    if eps:
        A[np.diag_indices(n)] += eps
    lam = np.concatenate([np.zeros(n - r), lam_r]) + eps
    return A, _meta("lowrank", n, lam, "prescribed", rank=r, eps=eps, kappa_nonzero=k)


def nonsymmetric(
    n: int,
    kappa: float | None = 1e2,
    rng: np.random.Generator | int | None = None,
    *,
    max_angle: float = 0.9 * math.pi,
    eigvec_cond: float = 10.0,
) -> tuple[np.ndarray, Meta]:
    """Real nonsymmetric S B S^{-1} with a prescribed complex spectrum off the closed negative real axis.

    B is block diagonal: 2x2 blocks r [[cos t, -sin t], [sin t, cos t]] (eigenvalues r e^{+-it}) with
    t uniform in [-max_angle, max_angle], and one positive 1x1 block when n is odd; moduli r geometric in
    [1/kappa, 1]. S = U diag(sigma) V^T with Haar U, V and cond_2(S) = eigvec_cond. ``meta["kappa"]``
    is the modulus ratio max|lambda| / min|lambda|; kappa_2(A) can be up to eigvec_cond^2 times more.
    """
    n, k = _check_n(n), _check_kappa(kappa, 1e2)
    if not 0 <= max_angle < math.pi:
        raise ValueError(f"max_angle must be in [0, pi), got {max_angle!r}")
    g = _rng(rng, "nonsymmetric")
    radii = np.geomspace(1.0, 1.0 / k, (n + 1) // 2)
    B = np.zeros((n, n))
    lam: list[complex] = []
    for b, r in enumerate(radii):
        j = 2 * b
        if j + 1 < n:
            t = g.uniform(-max_angle, max_angle)
            B[j : j + 2, j : j + 2] = r * np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
            lam += [r * complex(math.cos(t), math.sin(t)), r * complex(math.cos(t), -math.sin(t))]
        else:
            B[j, j] = r
            lam.append(complex(r, 0.0))
    U, V = haar_orthogonal(n, g), haar_orthogonal(n, g)
    S = (U * np.geomspace(1.0, 1.0 / eigvec_cond, n)) @ V.T
    A = np.linalg.solve(S.T, (S @ B).T).T  # S B S^{-1}
    meta = _meta("nonsymmetric", n, np.array(lam), "prescribed", symmetric=False)
    meta.update(eigvec_cond=float(eigvec_cond), max_angle=float(max_angle))
    return A, meta


# ------------------------------------------------------------------------------------------- gallery
def tridiag(n: int, kappa: float | None = None, rng: Any = None) -> tuple[np.ndarray, Meta]:
    """tridiag(-1, 2, -1): eigenvalues 2 - 2 cos(k pi/(n+1)) = 4 sin^2(k pi / (2(n+1))), k = 1..n."""
    n = _check_n(n)
    A = 2.0 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)
    lam = 4.0 * np.sin(np.arange(1, n + 1) * math.pi / (2 * (n + 1))) ** 2
    meta = _meta("tridiag", n, lam, "closed_form")
    if kappa is not None:
        meta["kappa_requested"] = float(kappa)
    return A, meta


def minij(n: int, kappa: float | None = None, rng: Any = None) -> tuple[np.ndarray, Meta]:
    """min(i, j) (1-based): eigenvalues 1 / (4 cos^2(k pi / (2n + 1))), k = 1..n (MATLAB gallery)."""
    n = _check_n(n)
    idx = np.arange(1, n + 1, dtype=float)
    A = np.minimum.outer(idx, idx)
    lam = 0.25 / np.cos(np.arange(1, n + 1) * math.pi / (2 * n + 1)) ** 2
    meta = _meta("minij", n, lam, "closed_form")
    if kappa is not None:
        meta["kappa_requested"] = float(kappa)
    return A, meta


def pei(n: int, kappa: float | None = None, rng: Any = None, *, alpha: float | None = None):
    """Pei matrix alpha I + ones(n): eigenvalue alpha (n - 1 times) and alpha + n.

    With ``kappa`` given (and no ``alpha``), alpha = n / (kappa - 1) so that (alpha + n)/alpha = kappa.
    """
    n = _check_n(n)
    if alpha is None:
        alpha = 1.0 if kappa is None or kappa <= 1 else n / (_check_kappa(kappa, 2.0) - 1.0)
    alpha = (1.0 + alpha) - 1.0  # the shift the float64 diagonal 1 + alpha really holds (exact)
    A = np.ones((n, n)) + alpha * np.eye(n)
    lam = np.concatenate([np.full(n - 1, alpha), [alpha + n]])
    return A, _meta("pei", n, lam, "closed_form", alpha=float(alpha))


def hilbert(n: int, kappa: float | None = None, rng: Any = None) -> tuple[np.ndarray, Meta]:
    """Hilbert matrix 1/(i + j - 1) rounded to float64 (kappa ~ e^{3.5 n}; 1.7e16 at n = 12)."""
    n = _check_n(n)
    i = np.arange(1, n + 1, dtype=float)
    return 1.0 / (i[:, None] + i[None, :] - 1.0), {}


def lehmer(n: int, kappa: float | None = None, rng: Any = None) -> tuple[np.ndarray, Meta]:
    """Lehmer matrix min(i, j) / max(i, j) (SPD, kappa ~ n^2)."""
    n = _check_n(n)
    i = np.arange(1, n + 1, dtype=float)
    return np.minimum.outer(i, i) / np.maximum.outer(i, i), {}


def pascal(n: int, kappa: float | None = None, rng: Any = None) -> tuple[np.ndarray, Meta]:
    """Symmetric Pascal matrix binom(i + j, i) (0-based; exact in float64 for n <= 27)."""
    n = _check_n(n)
    A = np.array([[float(math.comb(i + j, i)) for j in range(n)] for i in range(n)])
    return A, {}


def moler(n: int, kappa: float | None = None, rng: Any = None, *, alpha: float = -1.0):
    """Moler matrix U^T U, U unit upper triangular with ``alpha`` above the diagonal (one tiny eigenvalue)."""
    n = _check_n(n)
    U = np.eye(n) + alpha * np.triu(np.ones((n, n)), 1)
    return _sym(U.T @ U), {"alpha": float(alpha)}


def kms(
    n: int, kappa: float | None = None, rng: Any = None, *, rho: float | None = None
) -> tuple[np.ndarray, Meta]:
    """Kac-Murdock-Szego Toeplitz matrix rho^|i-j| (SPD for |rho| < 1).

    With ``kappa`` given (and no ``rho``), rho in (0, 1) is found by bisection on kappa(rho), which
    increases with rho (towards ((1 + rho)/(1 - rho))^2 for large n). Default rho = 0.5.
    """
    n = _check_n(n)
    idx = np.arange(n)
    dist = np.abs(idx[:, None] - idx[None, :])

    def build(r: float) -> np.ndarray:
        return r**dist

    if rho is None and kappa is not None and kappa > 1 and n > 1:
        target = _check_kappa(kappa, 2.0)
        lo, hi = 0.0, 40.0  # bisection on t, rho = 1 - 2^-t (kappa increases with t)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            ev = np.linalg.eigvalsh(build(1.0 - 2.0**-mid))
            if ev[-1] < target * ev[0]:
                lo = mid
            else:
                hi = mid
        rho = 1.0 - 2.0**-lo
    rho = 0.5 if rho is None else float(rho)
    if not -1 < rho < 1:
        raise ValueError(f"rho must be in (-1, 1), got {rho!r}")
    return build(rho), {"rho": rho}


def _gallery(name: str, fn: Callable[..., tuple[np.ndarray, dict[str, Any]]]) -> Generator:
    """Wrap a fixed gallery construction ``fn -> (A, params)``: add its computed spectrum to the meta."""

    def gen(n: int, kappa: float | None = None, rng: Any = None, **kw: Any) -> tuple[np.ndarray, Meta]:
        A, params = fn(n, kappa, rng, **kw)
        requested = None if name == "kms" else kappa  # kms honours kappa through rho
        return A, _computed_meta(name, A, requested, **params)

    gen.__name__ = name
    gen.__doc__ = fn.__doc__
    return gen


FAMILIES: dict[str, Generator] = {
    "randsvd": randsvd,
    **{f"randsvd{m}": _randsvd_mode(m) for m in range(1, 6)},
    "clustered": clustered,
    "near_repeated": near_repeated,
    "correlation": correlation,
    "lowrank": lowrank,
    "nonsymmetric": nonsymmetric,
    "tridiag": tridiag,
    "minij": minij,
    "pei": pei,
    "hilbert": _gallery("hilbert", hilbert),
    "lehmer": _gallery("lehmer", lehmer),
    "pascal": _gallery("pascal", pascal),
    "moler": _gallery("moler", moler),
    "kms": _gallery("kms", kms),
    "shampoo": shampoo_factors,
}
"""Family name -> generator ``gen(n, kappa=None, rng=None, **options) -> (A, meta)``."""

_ALIASES = {"corr": "correlation", "randcorr": "correlation", "lowrank_eps": "lowrank", "gen": "nonsymmetric"}


def generate(
    family: str, n: int, kappa: float | None = None, rng: np.random.Generator | int | None = None, **kw: Any
) -> tuple[np.ndarray, Meta]:
    """Generate a matrix of ``family`` (a key of :data:`FAMILIES`): ``FAMILIES[family](n, kappa, rng, **kw)``."""
    key = _ALIASES.get(family, family)
    if key not in FAMILIES:
        raise ValueError(f"unknown matrix family {family!r}; available: {sorted(FAMILIES)}")
    return FAMILIES[key](n, kappa, rng, **kw)


__all__ = [
    "FAMILIES",
    "SHAMPOO_DATA",
    "SHAMPOO_FORMAT_VERSION",
    "clustered",
    "clustered_spectrum",
    "correlation",
    "exact_spectrum",
    "generate",
    "haar_orthogonal",
    "load_shampoo_factors",
    "lowrank",
    "minij",
    "near_repeated",
    "nonsymmetric",
    "pei",
    "randsvd",
    "randsvd_spectrum",
    "save_shampoo_factors",
    "shampoo_factors",
    "tridiag",
]
