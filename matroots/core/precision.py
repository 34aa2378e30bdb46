"""Floating-point formats: unit roundoff, range, parsing, rounding, and kernel availability.

Unit roundoff u = 2^-t for a format with t significand bits (including the implicit bit):
fp64 2^-53, fp32 2^-24, tf32/fp16 2^-11, bf16 2^-8 (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., Table 2.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .errors import UnsupportedDtypeError


@dataclass(frozen=True)
class FormatInfo:
    """Facts about one floating-point format."""

    name: str
    dtype: torch.dtype
    unit_roundoff: float
    max: float
    tiny: float  # smallest positive normal number


FORMATS: dict[torch.dtype, FormatInfo] = {
    torch.float64: FormatInfo(
        "fp64",
        torch.float64,
        2.0**-53,
        float(torch.finfo(torch.float64).max),
        float(torch.finfo(torch.float64).tiny),
    ),
    torch.float32: FormatInfo(
        "fp32",
        torch.float32,
        2.0**-24,
        float(torch.finfo(torch.float32).max),
        float(torch.finfo(torch.float32).tiny),
    ),
    torch.bfloat16: FormatInfo(
        "bf16",
        torch.bfloat16,
        2.0**-8,
        float(torch.finfo(torch.bfloat16).max),
        float(torch.finfo(torch.bfloat16).tiny),
    ),
    torch.float16: FormatInfo(
        "fp16",
        torch.float16,
        2.0**-11,
        float(torch.finfo(torch.float16).max),
        float(torch.finfo(torch.float16).tiny),
    ),
}

_ALIASES: dict[str, torch.dtype] = {
    "fp64": torch.float64,
    "float64": torch.float64,
    "double": torch.float64,
    "f64": torch.float64,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "single": torch.float32,
    "f32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "f16": torch.float16,
}

# dtypes for which LAPACK (and so torch.linalg.eigh / scipy.linalg.schur) has kernels.
LAPACK_DTYPES = (torch.float64, torch.float32)


def as_dtype(dtype: object) -> torch.dtype:
    """Parse a dtype given as a torch dtype, a numpy dtype or a name ("fp32", "bfloat16", ...).

    Raises:
        UnsupportedDtypeError: for integer, complex, or unknown formats.
    """
    if isinstance(dtype, torch.dtype):
        if dtype in FORMATS:
            return dtype
        raise UnsupportedDtypeError(
            f"dtype {dtype} is not supported: use one of float64, float32, bfloat16, float16 "
            "(integer and complex inputs must be converted to a real floating format first)"
        )
    if isinstance(dtype, str):
        key = dtype.lower().replace("torch.", "")
        if key in _ALIASES:
            return _ALIASES[key]
        raise UnsupportedDtypeError(f"unknown dtype name {dtype!r}: use one of {sorted(set(_ALIASES))}")
    try:
        npd = np.dtype(dtype)  # type: ignore[arg-type]
    except TypeError as exc:
        raise UnsupportedDtypeError(f"cannot interpret {dtype!r} as a dtype") from exc
    mapping = {
        np.dtype(np.float64): torch.float64,
        np.dtype(np.float32): torch.float32,
        np.dtype(np.float16): torch.float16,
    }
    if npd in mapping:
        return mapping[npd]
    raise UnsupportedDtypeError(
        f"dtype {npd} is not supported: use one of float64, float32, bfloat16, float16"
    )


def info(dtype: object) -> FormatInfo:
    """The :class:`FormatInfo` of a dtype (any form accepted by :func:`as_dtype`)."""
    return FORMATS[as_dtype(dtype)]


def unit_roundoff(dtype: object) -> float:
    """Unit roundoff u of the format: fp64 1.1e-16, fp32 6.0e-8, fp16 4.9e-4, bf16 3.9e-3."""
    return info(dtype).unit_roundoff


def lapack_dtype(dtype: torch.dtype) -> torch.dtype:
    """The nearest format at least as wide as ``dtype`` that LAPACK has kernels for."""
    return dtype if dtype in LAPACK_DTYPES else torch.float32


def default_tol(dtype: torch.dtype, n: int, p: int | float = 1) -> float:
    """Default stopping tolerance on ``||M_k - I||_F`` for a Newton iteration.

    Rounding a product of near-identity matrices perturbs each diagonal entry by about u, so the
    Frobenius residual floors near sqrt(n) u; we stop at 4 max(p, 1) sqrt(n) u and rely on the
    stagnation test when rounding keeps the residual above it.
    """
    return 4.0 * max(float(p), 1.0) * float(np.sqrt(n)) * unit_roundoff(dtype)


__all__ = [
    "FORMATS",
    "LAPACK_DTYPES",
    "FormatInfo",
    "as_dtype",
    "default_tol",
    "info",
    "lapack_dtype",
    "unit_roundoff",
]
