"""Input validation and preparation shared by every solver.

Each check raises a typed :mod:`matroots.core.errors` error whose message says what was wrong and what to do.
"""

from __future__ import annotations

import functools
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
    InvalidArgumentError,
    MatrootsError,
    NonFiniteInputError,
    NotSquareError,
    NotSymmetricError,
    UnsupportedDtypeError,
    UnsupportedExponentError,
)
from .options import SolveOptions, check_warm_start


def parse_exponent(p: object, *, integer: bool = False, method: str = "") -> Fraction:
    """Return p as an exact Fraction; p must be a positive rational (int, float, Fraction).

    Floats are converted by ``Fraction(p).limit_denominator(10**6)`` so that ``0.5`` and ``1/3`` read
    as the rationals users mean. With ``integer=True`` (Newton methods) p must be a positive integer.
    """
    if type(p) is int and p > 0:  # the common case (p = 2, 4, ...), its Fraction built once
        return _int_exponent(p)
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


@functools.lru_cache(maxsize=64)
def _int_exponent(p: int) -> Fraction:
    return Fraction(p)  # immutable: one object serves every call with this p


_NUMPY_KINDS_REFUSED = {
    "b": "boolean",
    "i": "integer",
    "u": "unsigned integer",
    "c": "complex",
    "O": "object",
    "U": "string",
    "S": "bytes",
    "V": "structured",
    "M": "datetime",
    "m": "timedelta",
}


def to_tensor(A: object) -> torch.Tensor:
    """The input as a torch tensor, detached, without copying where possible (never written to).

    Accepts a strided torch tensor or a numpy array of float64, float32, float16 (and torch bfloat16).
    A Python list, a sparse or meta tensor, an object/integer/complex array is refused with a typed
    :class:`~matroots.core.errors.MatrootsInputError` saying how to convert it.
    """
    if isinstance(A, torch.Tensor):
        if A.layout != torch.strided:
            raise InvalidArgumentError(
                f"A must be a dense (strided) tensor, got layout {A.layout}; convert it with A.to_dense()"
            )
        if A.device.type == "meta":
            raise InvalidArgumentError(
                "A is a meta-device tensor, which has a shape but no values; pass a tensor on the CPU "
                "(or a GPU), e.g. torch.empty_like(A, device='cpu') filled with the matrix"
            )
        t = A.detach() if A.requires_grad else A  # a tensor outside autograd is used as it is
    elif isinstance(A, np.ndarray):
        kind = A.dtype.kind
        if kind in _NUMPY_KINDS_REFUSED or A.dtype == np.longdouble:
            what = _NUMPY_KINDS_REFUSED.get(kind, str(A.dtype))
            raise UnsupportedDtypeError(
                f"input numpy array has {what} dtype {A.dtype}, which is not supported: convert it to a "
                "real floating format first, e.g. np.asarray(A, dtype=np.float64)"
            )
        if not A.dtype.isnative:
            A = A.astype(A.dtype.newbyteorder("="))
        if not A.flags.writeable:  # torch cannot wrap read-only memory; copy rather than risk it
            A = np.array(A, order="C", copy=True)
        t = torch.from_numpy(np.ascontiguousarray(A))
    else:
        kind = type(A).__name__
        hint = (
            " (convert it with torch.tensor(A, dtype=torch.float64))" if isinstance(A, list | tuple) else ""
        )
        raise InvalidArgumentError(f"A must be a torch.Tensor or numpy.ndarray, got {kind}{hint}")
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
    t = t.detach() if t.requires_grad else t
    work = t if t.dtype in (torch.float32, torch.float64) else t.float()
    if math.isfinite(work.sum().tolist()):  # tolist: a Python float without a dispatched read
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
    """A contiguous copy of A^T, always in a fresh buffer (never a view of the caller's storage).

    ``work.mT.contiguous()`` would return ``work.mT`` itself when ``work`` is a transposed view of a
    contiguous tensor (its transpose is then contiguous), and the in-place subtraction that follows
    would write into the caller's matrix. torch copies a 2-D transpose with a blocked kernel but a
    batched one element by element through strides (5x slower at n = 1024, where the matrix no longer
    fits in cache), so large matrices are transposed one by one.
    """
    if work.ndim == 3 and work.shape[-1] >= 256:
        out = torch.empty(work.shape, dtype=work.dtype, device=work.device)
        for i in range(work.shape[0]):
            out[i].copy_(work[i].mT)
        return out
    return work.mT.clone(memory_format=torch.contiguous_format)


def _norm_ratio(num_mat: torch.Tensor, den_mat: torch.Tensor) -> torch.Tensor:
    """||num_mat||_F / ||den_mat||_F per batch element in float64, safe from overflow and underflow.

    The Frobenius norm squares the entries: in float64 it overflows from ~1e154 (inf/inf = NaN) and
    underflows below ~1e-154 (0/0, or a real defect read as 0). When the direct norms are not safely
    inside the range, both matrices are scaled by the power of two that brings max|den_mat| to [1, 2)
    and the norms recomputed. ``num_mat`` must be at most a small multiple of ``den_mat`` in size.
    """
    num = torch.linalg.matrix_norm(num_mat).double()
    den = torch.linalg.matrix_norm(den_mat).double()
    fi = torch.finfo(den_mat.dtype)
    safe_lo = math.sqrt(fi.tiny) / fi.eps
    safe_hi = math.sqrt(fi.max) / 4.0
    ok = torch.isfinite(num) & torch.isfinite(den) & (den >= safe_lo) & (den <= safe_hi)  # 0: underflow?
    if not bool(ok.all()):
        amax = den_mat.abs().amax(dim=(-2, -1)).double()
        _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
        k = (-e).to(torch.int64).reshape(*amax.shape, 1, 1)
        num = torch.linalg.matrix_norm(_ldexp(num_mat.double(), k))
        den = torch.linalg.matrix_norm(_ldexp(den_mat.double(), k))
    out = num / torch.where(den > 0, den, torch.ones_like(den))
    # a NaN must never read as "small enough": report it as an infinite defect
    return torch.where(torch.isnan(out), torch.full_like(out, math.inf), out)


def _ldexp(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x * 2^k exactly (float64; k an integer tensor broadcastable to x), in steps that cannot overflow
    2^k itself (``torch.ldexp`` forms 2^k first, which is inf for k > 1023)."""
    k = k.to(torch.int64)
    while True:
        step = k.clamp(-1000, 1000)
        x = x * torch.pow(2.0, step.double()).to(x.device)
        k = k - step
        if not bool((k != 0).any()):
            return x


def scale_by_power_of_two(x: torch.Tensor, log2_factor: Fraction | int) -> torch.Tensor:
    """x * 2^log2_factor for a float64 tensor x, without forming an overflowing factor.

    ``log2_factor`` is exact (a Fraction such as log2(prescale) * (-1/p)): its integer part is applied
    by :func:`_ldexp` (exact), its fractional part as one float64 multiplication (one rounding). A
    float exponent would not do: 906/5 = 181.2 carries an absolute error ~2e-14, i.e. a relative
    error ~1e-14 in 2^181.2. Differentiable in x.
    """
    fr = Fraction(log2_factor)
    k = math.floor(fr)
    frac = fr - k
    if frac:
        x = x * 2.0 ** float(frac)
    return _ldexp(x, torch.tensor(k)) if k else x


def symmetry_defect(t: torch.Tensor) -> torch.Tensor:
    """Relative symmetry defect ||A - A^T||_F / ||A||_F per batch element (float64 tensor).

    Computed in t's format (float32 for the 16-bit formats): the tolerance it is compared with is a
    multiple of that format's unit roundoff, so no wider copy is needed. Safe from overflow and
    underflow of the norms at any scale; never NaN (see :func:`symmetric_part`).
    """
    return symmetric_part(t)[1]


def _exactly_symmetric(work: torch.Tensor) -> bool:
    """True when a small ``work`` (n < 512) is exactly symmetric (one strided pass); False for a larger
    one, whose defect pass (:func:`symmetric_part`) costs about as much and tells the same."""
    return work.shape[-1] < 512 and torch.equal(work, work.mT)


def symmetric_part(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A + A^T)/2 and the relative symmetry defect per batch element (float64).

    The symmetric part is in t's dtype, or float32 for the 16-bit formats (no second rounding). It is
    ``t`` itself when t is exactly symmetric; otherwise a new tensor: ``t``'s storage is never written.

    One pass over A^T serves both: D = A - A^T, (A + A^T)/2 = A - D/2. The defect is computed
    overflow- and underflow-safely (:func:`_norm_ratio`): at ||A|| ~ 1e200 the plain norms give
    inf/inf = NaN, and below ~1e-154 they give 0, either of which would let a non-symmetric matrix pass.
    """
    work = _defect_dtype(t)
    if _exactly_symmetric(work):
        return work, torch.zeros(work.shape[:-2], dtype=torch.float64)
    D = _transposed(work).sub_(work).neg_()  # A - A^T in a fresh n x n buffer
    defect = _norm_ratio(D, work)
    if not bool((defect > 0).any()):  # exactly symmetric (the common case): nothing to average
        return work, defect
    return work - 0.5 * D, defect


#: the default symmetry tolerance in units of sqrt(n) u (:func:`default_symmetry_tol`)
SYMMETRY_TOL_FACTOR = 10.0


def default_symmetry_tol(t: torch.Tensor, source_dtype: torch.dtype | None = None) -> float:
    """Tolerance on the relative symmetry defect delta = ||A - A^T||_F / ||A||_F: 10 sqrt(n) u of the
    input's own format.

    Input within it is solved as its symmetric part (A + A^T)/2, which moves A by delta/2 relative and
    so the root by at most about cond(f, A) delta / 2: at 10 sqrt(n) u that stays inside the accuracy
    contract C sqrt(n) (cond(f, A) + 1) u (C = 5, docs/design.md), so treating rounding-noise asymmetry as
    symmetric never costs accuracy the contract promises. Asymmetry from GEMM rounding is far below it:
    ``baddbmm``-built fp32 factors (n = 48-512, k = 2-8192, and 300 accumulated steps) measured
    delta <= 0.12 sqrt(n) u; bf16 and fp16 ones (fp32 accumulation, one final rounding) measured 0.
    The former 100 sqrt(n) u let bf16 call anything symmetric (0.55 at n = 2; delta <= 2 always): a
    60%-asymmetric bf16 matrix came back as a converged root of its symmetric part, 19% off.

    ``source_dtype`` is the format the caller's matrix came in when ``t`` is that matrix rounded to a
    working dtype: the coarser of the two formats sets u. An fp32 factor solved in fp64 carries fp32
    rounding noise, so it is judged against fp32's u, not fp64's.
    """
    u = precision.unit_roundoff(t.dtype)
    if source_dtype is not None:
        u = max(u, precision.unit_roundoff(source_dtype))
    return SYMMETRY_TOL_FACTOR * math.sqrt(t.shape[-1]) * u


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
    if not worst <= tol:  # NaN (which _norm_ratio never returns) would fail here too
        raise NotSymmetricError(
            f"method {method!r} needs symmetric input, but the relative symmetry defect "
            f"||A - A^T||_F / ||A||_F = {worst:.3e} exceeds the tolerance {tol:.3e}; symmetrise with "
            "(A + A.T)/2 if the asymmetry is rounding noise, or use method='schur_newton' for general matrices"
        )


def symmetric_input(prob: Problem, *, zero_defect: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`symmetric_part` of ``prob.A``, or ``(prob.A, zero defects)`` without looking at it when
    the caller declared the input exactly symmetric (``SolveOptions.trusted``).

    For exactly symmetric input both are the same tensor and defects: :func:`symmetric_part` returns
    the matrix itself and a zero defect, so a trusted solve is bitwise the validated one.
    ``zero_defect=False``: the defect is None where it is zero by construction (trusted, or exactly
    symmetric input), for a caller that reads it only to judge a defect that may be nonzero.
    """
    if prob.options.trusted:
        A = _defect_dtype(prob.A)
        return A, torch.zeros(A.shape[:-2], dtype=torch.float64) if zero_defect else None
    if not zero_defect:
        work = _defect_dtype(prob.A)
        if _exactly_symmetric(work):
            return work, None
    return symmetric_part(prob.A)


def max_abs(t: torch.Tensor) -> float:
    """max |t| over all entries as a float (NaN or inf when an entry is not finite).

    ``torch.aminmax`` is one vectorised pass without a temporary (``vector_norm(ord=inf)`` is ~10x
    slower on the CPU, ``abs().max()`` allocates a copy); max(-min, max) is exactly max|t|.
    """
    if t.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(t.detach() if t.requires_grad else t)
    lo_f, hi_f = lo.tolist(), hi.tolist()  # Python floats, read without a dispatched operation
    if math.isnan(lo_f) or math.isnan(hi_f):
        return math.nan
    return max(-lo_f, hi_f)


@dataclass
class Problem:
    """A validated problem: input rounded to the working dtype and flattened to (batch, n, n).

    ``A`` may share storage with the caller's tensor (when no rounding, scaling or layout change was
    needed): solvers must never write into it.
    """

    A: torch.Tensor  # (b, n, n) in the working dtype, contiguous
    batch_shape: tuple[int, ...]
    p: Fraction
    dtype: torch.dtype  # the working dtype (options.dtype, or the input's)
    compute_dtype: torch.dtype
    options: SolveOptions  # validated per-call options (eps, tol, ...; read through the properties)
    prescale: float = 1.0  # A was multiplied by this power of two before rounding
    info: dict[str, Any] = field(default_factory=dict)
    source_dtype: torch.dtype | None = None  # the caller's format, before rounding to ``dtype``
    # the caller's tensor, flattened to (b, n, n), when it requires grad and grad mode is on (methods
    # with ``differentiable = True`` attach their result to it); None otherwise
    grad_source: torch.Tensor | None = None
    # ``A`` is a buffer of this solve (prescaled, rounded or made contiguous), not the caller's
    # storage: the psd policy may then shift it in place
    private: bool = False

    @property
    def n(self) -> int:
        return self.A.shape[-1]

    @property
    def eps(self) -> float:
        return self.options.eps

    @property
    def eps_mode(self) -> str:
        return self.options.eps_mode

    @property
    def tol(self) -> float | None:
        return self.options.tol

    @property
    def max_iter(self) -> int | None:
        return self.options.max_iter

    @property
    def strict(self) -> bool:
        return self.options.strict

    @property
    def record_history(self) -> bool:
        return self.options.record_history

    @property
    def trusted(self) -> bool:
        """The caller guarantees finite, exactly symmetric input (:class:`matroots.SolveOptions`)."""
        return self.options.trusted

    def symmetry_tol(self, override: float | None = None) -> float:
        """``override`` if given, else :func:`default_symmetry_tol` judged against the input's own format."""
        return default_symmetry_tol(self.A, self.source_dtype) if override is None else override

    @property
    def batched(self) -> bool:
        return len(self.batch_shape) > 0

    def root_log2_scale(self, inverse: bool = True) -> Fraction:
        """Exact log2 of the factor that returns the root of the prescaled matrix s A to the caller's
        units: (s A)^(-+1/p) = s^(-+1/p) A^(-+1/p), so the factor is s^(+-1/p) (0 when s = 1)."""
        return round(math.log2(self.prescale)) * (1 / self.p) * (1 if inverse else -1)


# Outside fp16, the working matrix is pre-scaled unless its magnitude m is already in [2^-B, 2^B]
# (B = 2). That keeps squares and norms (||A||_F, Lanczos' beta^2, the symmetry defect) in range, and
# it keeps |ln lambda| small, which accuracy needs at any scale: an exponent e = -1/p is not a binary
# float, and its rounding error (~u) is amplified by |e ln x| in x^e -- 22 u at x = 1e-60 for p = 3, in
# every method (eigh's lambda^e, the Newton methods' c = (c^p)^(1/p)). The power-of-two scaling is
# exact and is undone with an exact rational exponent (:func:`scale_by_power_of_two`).
_BAND_LOG2 = {torch.float64: 2, torch.float32: 2, torch.bfloat16: 2, torch.float16: 0}
_MIN_LOG2_SCALE, _MAX_LOG2_SCALE = -1022, 1023  # 2^k must be a normal float64


def _log2_magnitude(amax: float, n: int, eps: float, eps_mode: str) -> float | None:
    """log2 of m = max(max|A|, eps_abs) (eps_abs <= eps n max|A| when relative); None when m = 0."""
    logs = []
    if amax > 0:
        logs.append(math.log2(amax))
    if eps > 0:
        if eps_mode == "absolute":
            logs.append(math.log2(eps))
        elif amax > 0:
            logs.append(math.log2(eps) + math.log2(n) + math.log2(amax))
    return max(logs) if logs else None


def prescale_exponent(amax: float, n: int, eps: float, eps_mode: str, dtypes: tuple[torch.dtype, ...]) -> int:
    """k such that the matrix is solved as 2^k A (exact: a power of two), 0 when no scaling is needed.

    The magnitude of the matrix actually solved, m = max(max|A|, eps_abs), is what must fit the
    narrowest of ``dtypes`` (working and compute format); an absolute eps is in the user's units and
    a relative one is bounded by eps * n * max|A| (>= eps * lambda_max, Gershgorin). In fp16 (range
    6e-5 .. 65504) m is always brought to [1, 2); in the other formats only when it leaves the band
    [2^-2, 2^2] (see ``_BAND_LOG2``). Including eps matters: scaling A = 1e-300 alone to 1 and then adding an absolute
    eps = 0.01 times the same factor (2^997) overflows any format.
    """
    log2m = _log2_magnitude(amax, n, eps, eps_mode)
    if log2m is None:
        return 0
    band = min(_BAND_LOG2[d] for d in dtypes)
    if band > 0 and abs(log2m) <= band:
        return 0
    k = -math.floor(log2m)
    return min(max(k, _MIN_LOG2_SCALE), _MAX_LOG2_SCALE)


def _check_rounding_range(amax: float, source: torch.dtype, wdtype: torch.dtype) -> None:
    """Outside fp16 (which is pre-scaled), the caller's matrix must fit the working format as a whole.

    A matrix whose max|A| overflows, or falls below the smallest normal number of, the working format
    cannot be rounded to it without losing the matrix (an underflowing matrix becomes zeros and
    subnormals); entries that underflow while max|A| is normal are ordinary rounding error.
    """
    if wdtype == torch.float16 or wdtype == source or amax == 0:
        return
    fmt = precision.info(wdtype)
    if not math.isfinite(float(torch.tensor(amax, dtype=torch.float64).to(wdtype))):
        raise FormatRangeError(
            f"input rounded to {fmt.name} has non-finite entries: max|A| = {amax:.3e} overflows "
            f"{fmt.name} (max {fmt.max:.3e}); use a wider dtype or scale the matrix"
        )
    if amax < fmt.tiny:
        raise FormatRangeError(
            f"input rounded to {fmt.name} underflows: max|A| = {amax:.3e} is below {fmt.name}'s smallest "
            f"normal number {fmt.tiny:.3e}, so the matrix would become zeros and subnormals; use a wider "
            "dtype or scale the matrix"
        )


def prepare(
    A: object,
    p: object,
    *,
    integer_p: bool,
    method: str,
    options: SolveOptions,
    differentiable: bool = False,
) -> Problem:
    """Validate the input, the exponent and the warm start against it, and round the input to the
    working dtype. The scalar options were validated when ``options`` was built
    (:class:`matroots.SolveOptions`).

    See :func:`matroots.inverse_root`. Raises a :class:`~matroots.core.errors.MatrootsInputError` subclass
    for a bad argument, :class:`~matroots.core.errors.FormatRangeError` when the matrix (with its eps)
    cannot be represented in the working format.
    """
    frac = parse_exponent(p, integer=integer_p, method=method)
    t = to_tensor(A)
    check_shape(t)
    wdtype = options.dtype if options.dtype is not None else t.dtype
    cdtype = options.compute_dtype if options.compute_dtype is not None else wdtype
    eps_f, eps_mode = options.eps, options.eps_mode
    check_warm_start(options.warm_start, tuple(t.shape))
    grad_source = None
    if isinstance(A, torch.Tensor) and A.requires_grad and torch.is_grad_enabled():
        if not differentiable:
            raise InvalidArgumentError(
                f"A requires grad, but method {method!r} is not differentiable (its iteration and stopping "
                "tests are not traced); use method='eigh', which supports autograd, or pass A.detach() "
                "(or call under torch.no_grad()) to compute the root without gradients"
            )
        grad_source = A.reshape(-1, A.shape[-2], A.shape[-1])
    batch_shape = tuple(t.shape[:-2])
    n = t.shape[-1]
    flat = t.reshape(-1, n, n)
    # max|A| in one pass; it is finite exactly when every entry is (NaN and Inf propagate)
    amax = max_abs(flat)
    if not math.isfinite(amax):
        check_finite(t)
    _check_rounding_range(amax, t.dtype, wdtype)
    k = prescale_exponent(amax, n, eps_f, eps_mode, (wdtype, cdtype))
    log2m = _log2_magnitude(amax, n, eps_f, eps_mode)
    # fp16 overflows at 65504 and is normal only above 6.1e-5: the scaled magnitude must be ~1
    if torch.float16 in (wdtype, cdtype) and log2m is not None and not -14 <= log2m + k <= 15:
        raise FormatRangeError(
            f"input (max|A| = {amax:.3e}, eps = {eps_f:.3e}) cannot be pre-scaled into fp16's range by a "
            "float64 power of two; use a wider dtype"
        )
    info: dict[str, Any] = {}
    prescale = 2.0**k
    exact_scaling = False
    if k != 0:
        info["prescale"] = prescale
        if flat.dtype == wdtype and abs(k) < 100:  # one pass, exact (barring subnormals, ~2^-126 max|A|)
            work = flat * prescale
            # finite by construction: every |a| <= max|A| and 2^k max|A| < 2 (prescale_exponent)
            exact_scaling = True
        else:
            work = _ldexp(flat.double(), torch.tensor(k)).to(wdtype)
    else:
        work = flat if flat.dtype == wdtype else flat.to(wdtype)
    if (work.dtype != flat.dtype or k != 0) and not exact_scaling:  # rounding can overflow
        check_finite(work, what=f"input rounded to {precision.info(wdtype).name}", error=FormatRangeError)
    work = work.contiguous()  # a transposed or strided view is copied (solvers then never see the caller's)
    return Problem(
        A=work,
        batch_shape=batch_shape,
        p=frac,
        dtype=wdtype,
        compute_dtype=cdtype,
        options=options,
        prescale=prescale,
        info=info,
        source_dtype=t.dtype,
        grad_source=grad_source,
        private=work.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(),
    )


def check_root_range(
    root: torch.Tensor,
    dtype: torch.dtype,
    what: str = "root",
    log2_factor: Fraction | int = 0,
    amax: torch.Tensor | None = None,
) -> None:
    """Raise FormatRangeError when the batch ``root * 2^log2_factor`` (b, n, n) does not fit ``dtype``.

    Judged in the log domain before the scaling is applied (an underflow to 0 in float64 itself, e.g.
    a true root of 1e-362, would otherwise look like a legitimate zero root). Per matrix with a
    finite root: overflow (an entry beyond the format's max) or underflow (a non-zero root whose
    largest entry is below the smallest normal number, so every entry would become a subnormal or
    zero) would turn a correct root into inf or into garbage on the final rounding. Non-finite roots
    are left to the caller (reported as not converged). ``amax``: the (b,) max|root| per matrix when
    the caller has it (float64; computed here otherwise).
    """
    fmt = precision.info(dtype)
    if amax is None:
        amax = root.detach().double().abs().flatten(1).amax(-1)
    usable = torch.isfinite(amax) & (amax > 0)
    if not bool(usable.any()):
        return
    log2_amax = torch.log2(amax[usable]) + float(log2_factor)
    if bool((log2_amax > math.log2(fmt.max)).any()):
        worst = float(log2_amax.max()) * math.log10(2)
        raise FormatRangeError(
            f"the {what} has entries up to ~1e{worst:.1f}, beyond {fmt.name}'s range (max {fmt.max:.3e}): "
            "it cannot be returned in this dtype; use a wider dtype"
        )
    if bool((log2_amax < math.log2(fmt.tiny)).any()):
        worst = float(log2_amax.min()) * math.log10(2)
        raise FormatRangeError(
            f"the {what} has entries only up to ~1e{worst:.1f}, below {fmt.name}'s smallest normal number "
            f"{fmt.tiny:.3e}: it would underflow to zeros and subnormals; use a wider dtype"
        )


_NARROW_ROOTS = (torch.float32, torch.bfloat16, torch.float16)


def rescale_root(root: torch.Tensor, dtype: torch.dtype, log2_factor: Fraction | int) -> torch.Tensor:
    """The root of a prescaled problem returned to the caller's units: ``root * 2^log2_factor`` in
    ``dtype``, after :func:`check_root_range` (FormatRangeError when it does not fit ``dtype``).

    Bitwise the same as ``check_root_range(root, dtype, log2_factor=log2_factor)`` followed by
    ``scale_by_power_of_two(root.double(), log2_factor).to(dtype)``, in fewer passes: for a root in
    fp32 (or a 16-bit format) and |floor(log2_factor)| <= 800, with 2^log2_factor = 2^f 2^k
    (0 <= f < 1), the float64 product x * (2^f 2^k) is exactly round(x 2^f) 2^k, because every
    non-zero |x| >= 2^-149 keeps x 2^f and the result normal in float64 (multiplying by a power of
    two then commutes with rounding). On the CPU the float64 work and max|root| run in cache-sized
    chunks (the range check then raises after the chunks, before anything is returned). Other cases
    (float64 roots, autograd, larger factors) take the reference path.
    """
    fr = Fraction(log2_factor)
    k = math.floor(fr)
    frac = fr - k
    if root.dtype not in _NARROW_ROOTS or root.requires_grad or root.ndim != 3 or abs(k) > 800:
        check_root_range(root, dtype, log2_factor=log2_factor)
        return scale_by_power_of_two(root.double(), log2_factor).to(dtype)
    c = (2.0 ** float(frac) if frac else 1.0) * 2.0**k  # exact: a float64 in [1, 2) times 2^k
    if root.device.type != "cpu":
        check_root_range(root, dtype, log2_factor=log2_factor, amax=root.abs().amax(dim=(-2, -1)).double())
        return root.double().mul_(c).to(dtype)
    b, n = root.shape[0], root.shape[-1]
    step = max(1, 65536 // (n * n))  # ~512 KB of float64 per chunk
    out = torch.empty(root.shape, dtype=dtype, device=root.device)
    amax = torch.empty(b, dtype=torch.float64)
    buf = torch.empty((min(step, b), n, n), dtype=torch.float64, device=root.device)
    for i in range(0, b, step):
        m = min(step, b - i)
        w = buf[:m]
        w.copy_(root[i : i + m])
        amax[i : i + m] = w.abs().amax(dim=(-2, -1))  # max|x| of the unscaled root, exactly
        w.mul_(c)
        out[i : i + m].copy_(w)
    check_root_range(root, dtype, log2_factor=log2_factor, amax=amax)  # raises before returning
    return out


__all__ = [
    "Problem",
    "all_finite",
    "check_finite",
    "check_root_range",
    "check_shape",
    "check_warm_start",
    "default_symmetry_tol",
    "is_symmetric",
    "max_abs",
    "parse_exponent",
    "prepare",
    "prescale_exponent",
    "require_symmetric",
    "rescale_root",
    "scale_by_power_of_two",
    "symmetric_input",
    "symmetric_part",
    "symmetry_defect",
    "to_tensor",
]
