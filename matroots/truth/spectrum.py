"""Eigenvalues of exactly symmetric float64 matrices, resolved to high precision where float64 cannot.

float64 LAPACK (``eigvalsh``) gives each eigenvalue with an absolute error of about n u ||A||_2
(Golub & Van Loan, *Matrix Computations*, 4th ed., §8.1.2), so the smallest is unresolved once
|lambda|_min < 1e3 n u |lambda|_max; those spectra are recomputed by
:func:`matroots.truth.reference.eigvalsh`. The truth layer's condition numbers
(:mod:`matroots.truth.metrics`) take their eigenvalues from here.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

_U64 = 2.0**-53
_SPECTRUM_CACHE: OrderedDict[str, np.ndarray] = OrderedDict()
_SPECTRUM_CACHE_SIZE = 16


def symmetric_spectrum(A: np.ndarray) -> np.ndarray:
    """Ascending eigenvalues of the exactly symmetric float64 matrix A.

    float64 LAPACK, or high precision (:func:`matroots.truth.reference.eigvalsh`) when float64 cannot resolve
    the smallest (|lambda|_min < 1e3 n u |lambda|_max). Memoised by content hash.
    """
    key = hashlib.sha256(np.ascontiguousarray(A).tobytes() + str(A.shape).encode()).hexdigest()
    if key in _SPECTRUM_CACHE:
        _SPECTRUM_CACHE.move_to_end(key)
        return _SPECTRUM_CACHE[key]
    lam = np.linalg.eigvalsh(A)
    big = float(np.abs(lam).max())
    if big > 0 and float(np.abs(lam).min()) < 1e3 * A.shape[0] * _U64 * big:
        from . import reference  # mpmath/flint load only for a spectrum float64 cannot resolve

        lam = reference.eigvalsh(A)
    _SPECTRUM_CACHE[key] = lam
    if len(_SPECTRUM_CACHE) > _SPECTRUM_CACHE_SIZE:
        _SPECTRUM_CACHE.popitem(last=False)
    return lam


__all__ = ["symmetric_spectrum"]
