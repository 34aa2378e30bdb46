"""High-precision reference roots A^{-1/p} and A^{1/p}, with error bounds and an on-disk cache.

>>> import numpy as np
>>> from matroots import reference
>>> ref = reference.inverse_root(np.diag([4.0, 16.0]), 2, cache=False)
>>> ref.root.diagonal().tolist(), ref.error_bound < 1e-20
([0.5, 0.25], True)

Backends
--------
* ``"flint"`` (python-flint, the ``matroots[flint]`` extra): **certified**. Symmetric input: LAPACK
  eigenvectors refined at high precision (Ogita & Aishima 2018, with float64 rotations of clusters),
  then a ball-arithmetic certificate of f(A) = V f(V^{-1} A V) V^{-1} that needs no eigenvalue gaps, so
  clustered and exactly repeated eigenvalues are fine (details in :mod:`matroots.truth._ref_flint`). General
  input: Arb's certified ``eig`` (needs isolated eigenvalues; otherwise it falls back to mpmath and
  says so in ``method_notes``). ``error_bound`` is a rigorous bound.
* ``"mpmath"``: ``mpmath.eigsy`` (symmetric) or ``mpmath.eig`` (general) at ``digits``, cross-checked by
  a second computation at fewer digits; ``error_bound`` is the measured disagreement of the two, an
  upper estimate of the error of the returned (more precise) one.
* ``"auto"``: flint when it is installed (with the fallback above), else mpmath.

mpmath's ``powm``/``sqrtm`` are never used (slow; they fail to converge at large kappa). The input
converts exactly (binary floats are exact in both backends) and A + eps I is formed exactly.
``eps`` is absolute; for a relative eps use ``eps * lambda_max`` (see :mod:`matroots.core.regularize`).

``error_bound`` bounds ||X_hp - X||_F / ||X||_F, with X the exact root of the float64 input and X_hp
the high-precision result *before* rounding; rounding it to the float64 ``root`` adds at most
u = 2^-53 relative to each entry.

Precision rule
--------------
``digits = TARGET_DIGITS + ceil(log10 kappa) + ceil(log10 cond(V)) + ceil(log10 n) + GUARD_DIGITS``
(20 + ... + 5), where kappa = max|lambda| / min|lambda| of A + eps I estimated in float64 (min|lambda|
floored at n u max|lambda|, where float64 cannot resolve it), cond(V) is the float64 eigenvector
condition number (1 for symmetric input) and n the order: an eigendecomposition at d digits has
backward error ~ n 10^-d ||A||, amplified by kappa/p for A^{-1/p}. The mpmath backend computes at
``digits + max(8, digits // 3)`` and cross-checks at ``digits``. When the bound misses
10^-TARGET_DIGITS (or a certificate fails), digits grow by half, or to the rule applied to the
high-precision kappa, up to ``MAX_DIGITS``.

Cache
-----
Results are stored under :func:`cache_dir` (``$MATROOTS_CACHE_DIR``, default
``$XDG_CACHE_HOME/matroots`` or ``~/.cache/matroots``), keyed by the SHA-256 of (the float64 bytes and
shape of A, p, eps, digits, backend, the kind of root, the rule version). Writes go to a temporary
file in the same folder and are published with ``os.replace`` (atomic: concurrent writers cannot
corrupt an entry, the last one wins with identical content). Each entry carries a SHA-256 checksum
of its payload; a corrupted or truncated entry is logged, deleted and recomputed.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from ..core.errors import (
    ConvergenceError,
    InvalidArgumentError,
    NegativeRealEigenvalueError,
    NotPositiveDefiniteError,
    NotSymmetricError,
    UnsupportedDtypeError,
)
from ..core.inputs import check_finite, check_shape, parse_exponent
from . import _ref_cache as _cache
from . import _ref_mpmath as mpb
from ._ref_cache import cache_dir

logger = logging.getLogger(__name__)

TARGET_DIGITS = 20
"""Relative accuracy (decimal digits) a reference aims for: 10^-20, far below float64's u = 1.1e-16."""
GUARD_DIGITS = 5
MAX_DIGITS = 600
RULE_VERSION = 1
BACKENDS = ("auto", "flint", "mpmath")
_U64 = 2.0**-53
_LOCK = threading.RLock()  # mpmath's and flint's working precisions are process-global


class SymmetricNotPositiveDefiniteError(NegativeRealEigenvalueError, NotPositiveDefiniteError):
    """A symmetric matrix (after adding eps I) has an eigenvalue <= 0: it has no principal inverse root.

    Both a :class:`NegativeRealEigenvalueError` and a :class:`NotPositiveDefiniteError`.
    """


@dataclass(frozen=True, eq=False)
class Reference:
    """A high-precision root rounded to float64, with what is known about its accuracy.

    Attributes:
        root: float64 ndarray, the root (same shape as A).
        error_bound: bound (flint: rigorous; mpmath: two-precision disagreement) on the relative
            Frobenius error of the high-precision root before rounding to float64.
        digits: decimal digits of the computation that produced ``root``.
        backend: "flint" or "mpmath" (the one actually used).
        method_notes: how it was computed (solver, iterations, fallbacks, cross-check).
        eigenvalues: eigenvalues of A + eps I at high precision, rounded (ascending for symmetric;
            complex for general input).
        symmetric: whether the symmetric eigensolver was used.
        seconds: wall time of the computation (of the original computation for a cache hit).
        cached: True when this came from the disk cache.
    """

    root: np.ndarray
    error_bound: float
    digits: int
    backend: str
    method_notes: str
    eigenvalues: np.ndarray | None = None
    symmetric: bool = True
    seconds: float = 0.0
    cached: bool = False

    @property
    def kappa(self) -> float:
        """max|lambda| / min|lambda| of A + eps I (the 2-norm condition number for symmetric A)."""
        if self.eigenvalues is None or self.eigenvalues.size == 0:
            return math.nan
        a = np.abs(self.eigenvalues).reshape(-1)
        lo = float(a.min())
        return math.inf if lo == 0 else float(a.max()) / lo


# ------------------------------------------------------------------------------------------- helpers
def flint_available() -> bool:
    """True when python-flint is importable."""
    return importlib.util.find_spec("flint") is not None


def default_digits(kappa: float, n: int, *, eigvec_cond: float = 1.0, target: int = TARGET_DIGITS) -> int:
    """The documented precision rule (module docstring): target + log10 kappa + log10 cond(V) + log10 n + guard."""

    def lg(x: float) -> int:
        return 0 if not (x > 1) else (16 if not math.isfinite(x) else math.ceil(math.log10(x)))

    return int(min(MAX_DIGITS, target + lg(kappa) + lg(eigvec_cond) + lg(max(n, 1)) + GUARD_DIGITS))


def _cross_digits(d: int) -> int:
    return d + max(8, d // 3)


def _estimate(A: np.ndarray, symmetric: bool) -> tuple[float, float]:
    """(kappa, eigenvector condition) of A in float64, the input of :func:`default_digits`."""
    n = A.shape[0]
    if symmetric:
        lam = np.abs(np.linalg.eigvalsh(A))
        vcond = 1.0
    else:
        w, V = np.linalg.eig(A)
        lam = np.abs(w)
        with np.errstate(all="ignore"):
            vcond = float(np.linalg.cond(V))
        if not math.isfinite(vcond):
            vcond = 1e16
    big = float(lam.max())
    if big == 0.0:
        return 1.0, vcond
    return big / max(float(lam.min()), n * _U64 * big), vcond


def _as_float64(A: Any) -> np.ndarray:
    """Convert the input exactly to a float64 ndarray of shape (..., n, n), validating it."""
    if isinstance(A, torch.Tensor):
        t = A.detach()
        if t.is_complex() or not t.is_floating_point():
            raise UnsupportedDtypeError(f"reference needs a real floating-point matrix, got dtype {t.dtype}")
        t = t.cpu().to(torch.float64)  # exact from every real floating format torch has
    else:
        arr = np.asarray(A)
        if arr.dtype.kind == "c":
            raise UnsupportedDtypeError("reference needs a real matrix, got a complex array")
        if arr.dtype.kind in "iub":
            f = arr.astype(np.float64)
            if not np.array_equal(f.astype(arr.dtype), arr):
                raise InvalidArgumentError("integer entries beyond 2^53 do not convert exactly to float64")
            arr = f
        elif arr.dtype.kind != "f":
            raise UnsupportedDtypeError(
                f"reference needs a real floating-point matrix, got dtype {arr.dtype}"
            )
        t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))
    check_shape(t)
    check_finite(t)
    return np.ascontiguousarray(t.numpy(), dtype=np.float64)


def _check_eps(eps: Any) -> float:
    try:
        e = float(eps)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"eps must be a real number, got {eps!r}") from exc
    if not (math.isfinite(e) and e >= 0):
        raise InvalidArgumentError(f"eps must be a finite number >= 0, got {eps!r}")
    return e


def _resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "flint" if flint_available() else "mpmath"
    if backend == "flint" and not flint_available():
        raise InvalidArgumentError(
            "backend='flint' needs python-flint: pip install 'matroots[flint]' (or use backend='mpmath')"
        )
    return backend


# --------------------------------------------------------------------------------------------- cache
def cache_key(
    A: np.ndarray, kind: str, p: Fraction, eps: float, digits: int | None, backend: str, sym: Any
) -> str:
    """SHA-256 content key of one reference computation (float64 bytes of A, p, eps, digits, backend)."""
    header = {
        "v": RULE_VERSION,
        "target": TARGET_DIGITS,
        "kind": kind,
        "p": str(p),
        "eps": float(eps).hex(),
        "digits": "auto" if digits is None else int(digits),
        "backend": f"auto:{flint_available()}" if backend == "auto" else backend,
        "symmetric": sym,
    }
    return _cache.content_key(A, header)


def _cache_load(key: str) -> Reference | None:
    hit = _cache.load(key)
    if hit is None:
        return None
    root, eig, meta = hit
    return Reference(
        root=root,
        error_bound=float(meta["error_bound"]),
        digits=int(meta["digits"]),
        backend=str(meta["backend"]),
        method_notes=str(meta["method_notes"]),
        eigenvalues=eig if eig.size else None,
        symmetric=bool(meta["symmetric"]),
        seconds=float(meta["seconds"]),
        cached=True,
    )


def _cache_store(key: str, ref: Reference) -> None:
    meta = {
        "error_bound": ref.error_bound,
        "digits": ref.digits,
        "backend": ref.backend,
        "method_notes": ref.method_notes,
        "symmetric": ref.symmetric,
        "seconds": ref.seconds,
    }
    eig = np.zeros(0) if ref.eigenvalues is None else ref.eigenvalues
    _cache.store(key, ref.root, eig, meta)


# ------------------------------------------------------------------------------------------ compute
def _bad_spectrum(exc: mpb.BadSpectrum, symmetric: bool, eps: float) -> NegativeRealEigenvalueError:
    hint = "" if eps else " (a shift eps > 0 regularises a semidefinite matrix)"
    if symmetric:
        return SymmetricNotPositiveDefiniteError(
            f"{exc}: a symmetric matrix needs all eigenvalues > 0 for a principal inverse or forward root{hint}"
        )
    return NegativeRealEigenvalueError(f"{exc}: no principal root exists{hint}")


def _compute_one(
    A: np.ndarray, q: Fraction, eps: float, digits: int | None, backend: str, symmetric: bool
) -> Reference:
    """One matrix: the precision loop of the module docstring."""
    t0 = time.perf_counter()
    n = A.shape[0]
    Aeps = A + eps * np.eye(n) if eps else A
    kappa, vcond = _estimate(Aeps, symmetric)
    auto = digits is None
    d = default_digits(kappa, n, eigvec_cond=vcond) if auto else int(digits)
    if d < 5:
        raise InvalidArgumentError(f"digits must be >= 5, got {digits!r}")
    used = _resolve_backend(backend)
    notes: list[str] = []
    near_zero_retries = 0
    while True:
        try:
            ref = _attempt(A, q, eps, d, used, symmetric, notes)
        except _FlintNotIsolated as exc:
            notes.append(f"flint could not isolate the eigenvalues ({exc}); fell back to mpmath")
            used = "mpmath"
            continue
        except _PrecisionTooLow as exc:
            if d >= MAX_DIGITS:
                raise ConvergenceError(f"reference could not be certified at {d} digits: {exc}") from exc
            notes.append(f"{d} digits too few ({exc})")
            d = min(MAX_DIGITS, math.ceil(1.5 * d))
            continue
        except mpb.BadSpectrum as exc:
            scale = (
                float(np.abs(np.linalg.eigvals(Aeps)).max())
                if not symmetric
                else float(np.abs(np.linalg.eigvalsh(Aeps)).max())
            )
            tiny = abs(exc.value) <= n * 10.0 ** (-(d - 3)) * max(scale, 1e-300)
            if tiny and near_zero_retries < 2 and d < MAX_DIGITS:
                near_zero_retries += 1
                notes.append(f"eigenvalue {exc.value} indistinguishable from 0 at {d} digits")
                d = min(MAX_DIGITS, 2 * d)
                continue
            raise _bad_spectrum(exc, symmetric, eps) from None
        if ref.error_bound <= 10.0**-TARGET_DIGITS or not auto or d >= MAX_DIGITS:
            break
        hp_kappa = ref.kappa if math.isfinite(ref.kappa) else kappa
        new = max(math.ceil(1.5 * d), default_digits(hp_kappa, n, eigvec_cond=vcond))
        notes.append(f"bound {ref.error_bound:.1e} at {d} digits above 1e-{TARGET_DIGITS}")
        d = min(MAX_DIGITS, new)
    if ref.error_bound > 10.0**-TARGET_DIGITS:
        logger.warning(
            "reference error bound %.2e exceeds the target 1e-%d (digits=%d, backend=%s)",
            ref.error_bound,
            TARGET_DIGITS,
            ref.digits,
            ref.backend,
        )
    note = "; ".join([*notes, ref.method_notes])
    return replace(ref, method_notes=note, seconds=time.perf_counter() - t0)


class _FlintNotIsolated(Exception):
    pass


class _PrecisionTooLow(Exception):
    pass


def _attempt(
    A: np.ndarray, q: Fraction, eps: float, d: int, backend: str, symmetric: bool, notes: list[str]
) -> Reference:
    if backend == "flint":
        from . import _ref_flint as fb

        bits = math.ceil(d * math.log2(10)) + 8
        try:
            with _LOCK:
                enc = (fb.symmetric_power if symmetric else fb.general_power)(A, eps, q, bits)
        except fb.NotIsolated as exc:
            raise _FlintNotIsolated(str(exc)) from exc
        except fb.PrecisionTooLow as exc:
            raise _PrecisionTooLow(str(exc)) from exc
        root = 0.5 * (enc.root + enc.root.T) if symmetric else enc.root
        kind = "symmetric refinement + ball certificate" if symmetric else "Arb eig"
        return Reference(
            root,
            enc.rel_error,
            d,
            "flint",
            f"flint {kind} at {bits} bits ({d} digits): {enc.notes}",
            enc.eigenvalues,
            symmetric,
        )
    d_hi = _cross_digits(d)
    fn = mpb.symmetric_power if symmetric else mpb.general_power
    with _LOCK:
        hi = fn(A, eps, q, d_hi)
        lo = fn(A, eps, q, d)
    rel = mpb.relative_difference(lo, hi)
    root = mpb.to_numpy(hi.rows)
    if symmetric:
        eig = np.array([float(x) for x in hi.eigenvalues])
    else:
        eig = np.array([complex(x) for x in hi.eigenvalues])
        eig = eig[np.argsort(np.abs(eig))]
    solver = "eigsy" if symmetric else "eig"
    return Reference(
        root,
        rel,
        d_hi,
        "mpmath",
        f"mpmath {solver} at {d_hi} digits, cross-checked at {d} digits (rel. diff {rel:.2e})",
        eig,
        symmetric,
    )


def _reference(
    A: Any, p: Any, eps: Any, kind: str, digits: int | None, backend: str, cache: bool, symmetric: bool | None
) -> Reference:
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"backend must be one of {BACKENDS}, got {backend!r}")
    frac = parse_exponent(p)
    e = _check_eps(eps)
    A64 = _as_float64(A)
    q = (
        Fraction(-frac.denominator, frac.numerator)
        if kind == "inverse"
        else Fraction(frac.denominator, frac.numerator)
    )
    if A64.ndim > 2:
        flat = A64.reshape(-1, *A64.shape[-2:])
        refs = [_reference(M, frac, e, kind, digits, backend, cache, symmetric) for M in flat]
        eigs = [r.eigenvalues for r in refs]
        return Reference(
            root=np.stack([r.root for r in refs]).reshape(A64.shape),
            error_bound=max(r.error_bound for r in refs),
            digits=max(r.digits for r in refs),
            backend="+".join(sorted({r.backend for r in refs})),
            method_notes=" | ".join(f"[{i}] {r.method_notes}" for i, r in enumerate(refs)),
            eigenvalues=None if any(x is None for x in eigs) else np.stack(eigs).reshape(*A64.shape[:-1]),
            symmetric=all(r.symmetric for r in refs),
            seconds=sum(r.seconds for r in refs),
            cached=all(r.cached for r in refs),
        )
    sym = bool(np.array_equal(A64, A64.T)) if symmetric is None else bool(symmetric)
    if symmetric and not np.array_equal(A64, A64.T):
        defect = float(np.linalg.norm(A64 - A64.T) / max(np.linalg.norm(A64), 1e-300))
        raise NotSymmetricError(
            f"symmetric=True but A is not exactly symmetric (relative defect {defect:.3e}); pass "
            "(A + A.T) / 2 or symmetric=None"
        )
    key = cache_key(A64, kind, frac, e, digits, backend, symmetric) if cache else ""
    if cache:
        hit = _cache_load(key)
        if hit is not None:
            return hit
    ref = _compute_one(A64, q, e, digits, backend, sym)
    if cache:
        _cache_store(key, ref)
    return ref


# ----------------------------------------------------------------------------------------- public API
def inverse_root(
    A: Any,
    p: Any,
    eps: float = 0.0,
    *,
    digits: int | None = None,
    backend: str = "auto",
    cache: bool = True,
    symmetric: bool | None = None,
) -> Reference:
    """High-precision reference (A + eps I)^{-1/p}, principal branch, rounded to float64.

    Args:
        A: numpy array or torch tensor, shape (n, n) or (..., n, n) (a batch is done matrix by matrix).
            Any real floating dtype (converted exactly to float64) or integers below 2^53.
        p: a positive int, float or Fraction (floats are read as the nearby rational, see
            :func:`matroots.core.inputs.parse_exponent`).
        eps: absolute shift, added exactly in high precision.
        digits: working precision in decimal digits; default from the rule in the module docstring
            (and then raised until the error bound meets 10^-20). With an explicit value the bound is
            reported as found.
        backend: "auto", "flint" or "mpmath" (module docstring).
        cache: read and write the disk cache (:func:`cache_dir`).
        symmetric: None detects exact symmetry (A == A^T bit for bit) and then uses the symmetric
            eigensolver; True demands it; False forces the general eigensolver.

    Raises:
        NotSquareError, EmptyMatrixError, NonFiniteInputError: malformed input.
        UnsupportedExponentError: p <= 0 or not a number.
        NegativeRealEigenvalueError: an eigenvalue of A + eps I on the closed negative real axis (for
            symmetric input the subclass :class:`SymmetricNotPositiveDefiniteError`, also a
            NotPositiveDefiniteError).
        InvalidArgumentError: bad eps/backend/digits. ConvergenceError: no certificate up to MAX_DIGITS.
    """
    return _reference(A, p, eps, "inverse", digits, backend, cache, symmetric)


def root(
    A: Any,
    p: Any,
    eps: float = 0.0,
    *,
    digits: int | None = None,
    backend: str = "auto",
    cache: bool = True,
    symmetric: bool | None = None,
) -> Reference:
    """High-precision reference (A + eps I)^{1/p}, principal branch; arguments as :func:`inverse_root`.

    The matrix must have no eigenvalue on the closed negative real axis (positive definite when
    symmetric); the semidefinite case is not supported.
    """
    return _reference(A, p, eps, "forward", digits, backend, cache, symmetric)


def eigvalsh(A: Any, eps: float = 0.0, *, digits: int | None = None, backend: str = "auto") -> np.ndarray:
    """Ascending eigenvalues of the exactly symmetric A + eps I, computed at high precision.

    Unlike the roots, any sign is allowed. Not cached. Raises NotSymmetricError for nonsymmetric A.
    """
    A64 = _as_float64(A)
    if A64.ndim != 2:
        raise InvalidArgumentError(f"eigvalsh takes one matrix, got shape {A64.shape}")
    if not np.array_equal(A64, A64.T):
        raise NotSymmetricError("eigvalsh needs an exactly symmetric matrix; pass (A + A.T) / 2")
    e = _check_eps(eps)
    n = A64.shape[0]
    Aeps = A64 + e * np.eye(n) if e else A64
    d = default_digits(_estimate(Aeps, True)[0], n) if digits is None else int(digits)
    used = _resolve_backend(backend)
    with _LOCK:
        if used == "flint":
            from . import _ref_flint as fb

            for _ in range(4):
                try:
                    return fb.symmetric_eigenvalues(A64, e, math.ceil(d * math.log2(10)) + 8)
                except fb.PrecisionTooLow:
                    d = min(MAX_DIGITS, 2 * d)
        return np.array([float(x) for x in mpb.symmetric_eigenvalues(A64, e, d)])


__all__ = [
    "BACKENDS",
    "GUARD_DIGITS",
    "MAX_DIGITS",
    "TARGET_DIGITS",
    "Reference",
    "SymmetricNotPositiveDefiniteError",
    "cache_dir",
    "cache_key",
    "default_digits",
    "eigvalsh",
    "flint_available",
    "inverse_root",
    "root",
]
