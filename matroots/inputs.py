"""Input validation and preparation shared by every solver.

Each check raises a typed :mod:`matroots.errors` error whose message says what was wrong and what to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from . import precision
from .errors import (
    EmptyMatrixError,
    FormatRangeError,
    MatrootsError,
    NonFiniteInputError,
    NotSquareError,
    NotSymmetricError,
    UnsupportedDtypeError,
    UnsupportedExponentError,
)


def parse_exponent(p: object, *, integer: bool = False, method: str = "") -> Fraction:
    """Return p as an exact Fraction; p must be a positive rational (int, float, Fraction).

    Floats are converted by ``Fraction(p).limit_denominator(10**6)`` so that ``0.5`` and ``1/3`` read
    as the rationals users mean. With ``integer=True`` (Newton methods) p must be a positive integer.
    """
    if isinstance(p, bool) or not isinstance(p, int | float | Fraction | np.integer | np.floating):
        raise UnsupportedExponentError(f"p must be a positive int, float or Fraction, got {p!r}")
    if isinstance(p, float | np.floating) and not math.isfinite(float(p)):
        raise UnsupportedExponentError(f"p must be finite, got {p!r}")
    frac = Fraction(p).limit_denominator(10**6) if isinstance(p, float | np.floating) else Fraction(p)
    if frac <= 0:
        raise UnsupportedExponentError(f"p must be > 0 for an inverse p-th root, got p={p!r}")
    if integer and frac.denominator != 1:
        raise UnsupportedExponentError(
            f"method {method!r} needs an integer p >= 1, got p={p!r}; use method='eigh' for rational p"
        )
    return frac


def to_tensor(A: object) -> torch.Tensor:
    """Convert a numpy array or torch tensor to a torch tensor without copying where possible."""
    if isinstance(A, torch.Tensor):
        t = A.detach()
    elif isinstance(A, np.ndarray):
        if A.dtype.kind in "iubc" or A.dtype == np.longdouble:
            raise UnsupportedDtypeError(
                f"input dtype {A.dtype} is not supported: convert to float64 or float32 first"
            )
        t = torch.from_numpy(np.ascontiguousarray(A))
    else:
        raise TypeError(f"A must be a torch.Tensor or numpy.ndarray, got {type(A).__name__}")
    if t.dtype not in precision.FORMATS:
        raise UnsupportedDtypeError(
            f"input dtype {t.dtype} is not supported: use float64, float32, bfloat16 or float16 "
            "(integer and complex matrices must be converted to a real floating format first)"
        )
    return t


def check_shape(t: torch.Tensor) -> None:
    """Raise unless t has shape (..., n, n) with n >= 1 and no empty batch dimension."""
    if t.ndim < 2:
        raise NotSquareError(f"expected a matrix of shape (n, n) or (..., n, n), got shape {tuple(t.shape)}")
    if t.shape[-1] != t.shape[-2]:
        raise NotSquareError(
            f"expected square matrices, got trailing shape {tuple(t.shape[-2:])}; "
            "inverse roots exist only for square matrices"
        )
    if t.numel() == 0:
        raise EmptyMatrixError(f"input has a zero-sized dimension: shape {tuple(t.shape)}")


def all_finite(t: torch.Tensor) -> bool:
    """True when every entry of t is finite.

    Fast path: a finite sum proves every entry finite (a NaN or an infinite entry makes the sum NaN or
    infinite); only a non-finite sum, from a bad entry or from overflow of the sum itself, pays for the
    entrywise test.
    """
    work = t if t.dtype in (torch.float32, torch.float64) else t.float()
    if math.isfinite(float(work.sum())):
        return True
    return bool(torch.isfinite(t).all())


def check_finite(
    t: torch.Tensor, what: str = "input", error: type[MatrootsError] = NonFiniteInputError
) -> None:
    """Raise ``error`` (NonFiniteInputError by default) when t has NaN or Inf entries, saying how many."""
    if all_finite(t):
        return
    bad = ~torch.isfinite(t)
    nn = int(torch.isnan(t).sum())
    raise error(
        f"{what} has {int(bad.sum())} non-finite entries ({nn} NaN, {int(bad.sum()) - nn} Inf); "
        "clean or clip the matrix before computing a root"
    )


def _defect_dtype(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _transposed(work: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of A^T for a batch (b, n, n).

    torch copies a 2-D transpose with a blocked kernel but a batched one element by element through
    strides (5x slower at n = 1024, where the matrix no longer fits in cache), so large matrices are
    transposed one by one.
    """
    if work.ndim != 3 or work.shape[-1] < 256 or not work.is_contiguous():
        return work.mT.contiguous()
    out = torch.empty_like(work)
    for i in range(work.shape[0]):
        out[i].copy_(work[i].mT)
    return out


def symmetry_defect(t: torch.Tensor) -> torch.Tensor:
    """Relative symmetry defect ||A - A^T||_F / ||A||_F per batch element (float64 tensor).

    Computed in t's format (float32 for the 16-bit formats): the tolerance it is compared with is a
    multiple of that format's unit roundoff, so no wider copy is needed.
    """
    return symmetric_part(t)[1]


def symmetric_part(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A + A^T)/2 and the relative symmetry defect per batch element (float64).

    The symmetric part is in t's dtype, or float32 for the 16-bit formats (no second rounding).

    One pass over A^T serves both: D = A - A^T, (A + A^T)/2 = A - D/2.
    """
    work = _defect_dtype(t)
    if work.shape[-1] < 512 and torch.equal(work, work.mT):  # exactly symmetric, small: one strided pass
        return work, torch.zeros(work.shape[:-2], dtype=torch.float64)
    D = _transposed(work).sub_(work).neg_()  # A - A^T in a single n x n buffer
    num = torch.linalg.matrix_norm(D).double()
    den = torch.linalg.matrix_norm(work).double()
    defect = num / torch.where(den > 0, den, torch.ones_like(den))
    if not bool((num > 0).any()):  # exactly symmetric (the common case): nothing to average
        return work, defect
    return work - 0.5 * D, defect


def default_symmetry_tol(t: torch.Tensor, source_dtype: torch.dtype | None = None) -> float:
    """Tolerance on the relative symmetry defect: 100 sqrt(n) u of the input's own format.

    ``source_dtype`` is the format the caller's matrix came in when ``t`` is that matrix rounded to a
    working dtype: the coarser of the two formats sets u. An fp32 factor solved in fp64 carries fp32
    rounding noise (a ``baddbmm``-accumulated fp32 factor is asymmetric at ~1e-7), so it is judged
    against fp32's u, not fp64's.
    """
    u = precision.unit_roundoff(t.dtype)
    if source_dtype is not None:
        u = max(u, precision.unit_roundoff(source_dtype))
    return 100.0 * math.sqrt(t.shape[-1]) * u


def is_symmetric(t: torch.Tensor, tol: float | None = None) -> bool:
    """True when every batch element's relative symmetry defect is within ``tol``."""
    tol = default_symmetry_tol(t) if tol is None else tol
    return bool((symmetry_defect(t) <= tol).all())


def require_symmetric(
    t: torch.Tensor, method: str, tol: float | None = None, defect: torch.Tensor | None = None
) -> None:
    """Raise NotSymmetricError with the measured defect when t is not symmetric to ``tol``."""
    tol = default_symmetry_tol(t) if tol is None else tol
    defect = symmetry_defect(t) if defect is None else defect
    worst = float(defect.max())
    if worst > tol:
        raise NotSymmetricError(
            f"method {method!r} needs symmetric input, but the relative symmetry defect "
            f"||A - A^T||_F / ||A||_F = {worst:.3e} exceeds the tolerance {tol:.3e}; symmetrise with "
            "(A + A.T)/2 if the asymmetry is rounding noise, or use method='schur_newton' for general matrices"
        )


@dataclass
class Problem:
    """A validated problem: input rounded to the working dtype and flattened to (batch, n, n)."""

    A: torch.Tensor  # (b, n, n) in the working dtype
    batch_shape: tuple[int, ...]
    p: Fraction
    dtype: torch.dtype
    compute_dtype: torch.dtype
    eps: float
    eps_mode: str
    tol: float | None
    max_iter: int | None
    strict: bool
    record_history: bool
    prescale: float = 1.0  # A was multiplied by this power of two before rounding
    info: dict[str, Any] = field(default_factory=dict)
    source_dtype: torch.dtype | None = None  # the caller's format, before rounding to ``dtype``

    @property
    def n(self) -> int:
        return self.A.shape[-1]

    def symmetry_tol(self, override: float | None = None) -> float:
        """``override`` if given, else :func:`default_symmetry_tol` judged against the input's own format."""
        return default_symmetry_tol(self.A, self.source_dtype) if override is None else override

    @property
    def batched(self) -> bool:
        return len(self.batch_shape) > 0


def prepare(
    A: object,
    p: object,
    *,
    integer_p: bool,
    method: str,
    eps: float,
    eps_mode: str,
    dtype: object,
    compute_dtype: object,
    tol: float | None,
    max_iter: int | None,
    strict: bool,
    record_history: bool,
) -> Problem:
    """Validate the input and round it to the working dtype. See :func:`matroots.inverse_root`."""
    frac = parse_exponent(p, integer=integer_p, method=method)
    t = to_tensor(A)
    check_shape(t)
    check_finite(t)
    wdtype = precision.as_dtype(dtype) if dtype is not None else t.dtype
    cdtype = precision.as_dtype(compute_dtype) if compute_dtype is not None else wdtype
    if eps_mode not in ("absolute", "relative"):
        raise ValueError(f"eps_mode must be 'absolute' or 'relative', got {eps_mode!r}")
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    if tol is not None and not (tol > 0):
        raise ValueError(f"tol must be > 0, got {tol!r}")
    if max_iter is not None and (not isinstance(max_iter, int) or max_iter < 1):
        raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")
    batch_shape = tuple(t.shape[:-2])
    n = t.shape[-1]
    flat = t.reshape(-1, n, n)
    info: dict[str, Any] = {}
    prescale = 1.0
    if wdtype == torch.float16:
        # fp16 overflows at 65504: scale by an exact power of two so max|A| is near 1 (undone on the root).
        amax = float(flat.abs().max())
        if amax > 0:
            prescale = 2.0 ** (-math.floor(math.log2(amax)))
            if prescale != 1.0:
                info["prescale"] = prescale
    work = (flat.double() * prescale if prescale != 1.0 else flat).to(wdtype)
    if work.dtype != flat.dtype or prescale != 1.0:  # rounding can overflow; otherwise checked above
        check_finite(work, what=f"input rounded to {precision.info(wdtype).name}", error=FormatRangeError)
    return Problem(
        A=work,
        batch_shape=batch_shape,
        p=frac,
        dtype=wdtype,
        compute_dtype=cdtype,
        eps=float(eps),
        eps_mode=eps_mode,
        tol=tol,
        max_iter=max_iter,
        strict=strict,
        record_history=record_history,
        prescale=prescale,
        info=info,
        source_dtype=t.dtype,
    )


__all__ = [
    "Problem",
    "all_finite",
    "check_finite",
    "check_shape",
    "default_symmetry_tol",
    "is_symmetric",
    "parse_exponent",
    "prepare",
    "require_symmetric",
    "symmetric_part",
    "symmetry_defect",
    "to_tensor",
]
