"""The helpers every test-matrix family shares: argument checks, the seeded generator, the metadata
record of a generated matrix and its exact spectrum. Used by :mod:`matroots.study.matrices` (the families)
and :mod:`matroots.study._shampoo_io` (the shipped real Shampoo factors).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.factor_dump import Meta


def rng_for(rng: np.random.Generator | int | None, family: str) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, int | np.integer) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise ValueError(
        f"family {family!r} is random: pass rng=np.random.default_rng(seed) (or an int seed), got {rng!r}"
    )


def check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    return int(n)


def kappa_of(lam: np.ndarray) -> float:
    a = np.abs(np.asarray(lam))
    lo = float(a.min())
    return math.inf if lo == 0.0 else float(a.max()) / lo


def make_meta(
    family: str, n: int, lam: np.ndarray | None, source: str, symmetric: bool = True, **kw: Any
) -> Meta:
    if lam is not None:
        lam = np.sort(np.asarray(lam)) if np.isrealobj(lam) else np.asarray(lam)[np.argsort(np.abs(lam))]
    meta: Meta = {
        "family": family,
        "n": n,
        "kappa": kappa_of(lam) if lam is not None else math.nan,
        "kappa_source": source,
        "eigenvalues": lam,
        "symmetric": symmetric,
    }
    meta.update(kw)
    return meta


def exact_spectrum(A: np.ndarray, *, precise: bool = True) -> np.ndarray:
    """Ascending eigenvalues of the symmetric float64 matrix ``A`` as it is stored.

    Uses float64 ``eigvalsh``, whose eigenvalues carry absolute errors ~ n u lambda_max (relative
    ~ n u kappa for the smallest); when kappa exceeds 1e3 and ``precise`` is set, recomputes them with
    the high-precision symmetric eigensolver :func:`matroots.truth.reference.eigvalsh`.
    """
    lam = np.linalg.eigvalsh(A)
    scale = float(np.abs(lam).max()) if lam.size else 0.0
    if precise and scale > 0 and float(np.abs(lam).min()) < 1e-3 * scale:
        from ..truth import reference  # local import: reference imports nothing from here

        lam = reference.eigvalsh(A)
    return lam
