"""Error metrics and bounds for computed matrix roots.

Every function accepts numpy arrays or torch tensors (any real floating dtype; converted exactly to
float64), computes in float64 unless it says otherwise, and returns a Python float. Batched input
(..., n, n) gives the worst (largest) value over the batch. Formulas, with X ~ (A + eps I)^{-1/p}:

* relative forward error  ||X - X_ref|| / ||X_ref||  (Frobenius or 2-norm), the headline accuracy
  measure (Higham, *Functions of Matrices*, 2008, sec. 3.1);
* residual  ||X^p (A + eps I) - I||_F  (for p = a/b: ||X^a (A + eps I)^b - I||_F). It is not a
  proxy for accuracy: its float64 evaluation alone floors near n u kappa;
* backward error  ||X^{-p} - A||_F / ||A||_F: the smallest relative perturbation dA with
  X = (A + dA)^{-1/p};
* condition number kappa_2(A) = sigma_max / sigma_min, and cond(f, A), the relative condition number
  of the root itself (:func:`cond_root`, from :mod:`matroots.core.conditioning`): for symmetric positive
  definite A (Higham 2008, Cor. 3.16 for normal matrices, Frobenius norm)
  max_{i,j} |f[lambda_i, lambda_j]| ||A||_F / ||f(A)||_F, which is ~ kappa/p for A^{-1/p} but only
  ~ kappa^{1-1/p}/p for A^{1/p}; for general A the 2-norm of the Kronecker form of the Fréchet
  derivative. :func:`cond_rel` is cond_root of the inverse root;
* the cond(f, A) u line (``cond_u_line``) for a dtype: the forward error a stable method can be expected
  to reach, and the older (kappa/p) u line (its SPD inverse-root special case);
* representation error ||fl(A) - A||_F / ||A||_F of rounding A to a dtype;
* symmetry defect ||X - X^T||_F / ||X||_F;
* eps bias ||(A + eps I)^{-1/p} - A^{-1/p}||_F / ||A^{-1/p}||_F: what regularisation costs.

:func:`solved_metrics` measures a :class:`~matroots.RootResult` the way it must be measured: against
the reference of the matrix actually solved, A + eps_abs I with the solver's own reported shift
(``res.info["eps_abs"]``, per batch element), with the eps bias reported separately.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from ..core import conditioning as _conditioning
from ..core import precision
from ..core.conditioning import cond_u_line
from ..core.errors import InvalidArgumentError, NegativeRealEigenvalueError
from ..core.inputs import parse_exponent
from ..core.inputs import symmetry_defect as _symmetry_defect_tensor
from ..core.options import EPS_MODES
from ..core.result import info_per_element
from .spectrum import symmetric_spectrum as _spectrum


def _f64(X: Any) -> np.ndarray:
    """Exact float64 copy of a tensor, ndarray or :class:`~matroots.truth.reference.Reference`."""
    if hasattr(X, "root") and hasattr(X, "error_bound"):
        X = X.root
    return _conditioning._f64(X)


_batch = _conditioning._batch


def _matpow(X: np.ndarray, k: int) -> np.ndarray:
    """X^k for integer k >= 0 by binary powering (batched)."""
    n = X.shape[-1]
    out = np.broadcast_to(np.eye(n), X.shape).copy()
    base = X
    while k:
        if k & 1:
            out = out @ base
        k >>= 1
        if k:
            base = base @ base
    return out


def _shift(A: np.ndarray, eps: float) -> np.ndarray:
    return A + eps * np.eye(A.shape[-1]) if eps else A


# ------------------------------------------------------------------------------------------ accuracy
def relative_forward_error(X: Any, X_ref: Any, norm: str | int = "fro") -> float:
    """||X - X_ref|| / ||X_ref|| in the Frobenius (``"fro"``) or spectral (``2``) norm.

    ``X_ref`` may be a :class:`~matroots.truth.reference.Reference`. Non-finite X gives inf (a failed root
    has no accuracy); batched input gives the maximum over the batch.
    """
    if norm not in ("fro", 2, "2"):
        raise ValueError(f"norm must be 'fro' or 2, got {norm!r}")
    Xa, R = _f64(X), _f64(X_ref)
    if Xa.shape != R.shape:
        raise InvalidArgumentError(f"shapes differ: X {Xa.shape} vs X_ref {R.shape}")
    if not np.isfinite(Xa).all():
        return math.inf
    Xb, Rb = _batch(Xa), _batch(R)
    order = "fro" if norm == "fro" else 2
    num = np.linalg.norm(Xb - Rb, ord=order, axis=(-2, -1))
    den = np.linalg.norm(Rb, ord=order, axis=(-2, -1))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
    return float(rel.max())


def residual(X: Any, A: Any, p: Any, eps: float = 0.0) -> float:
    """Absolute Frobenius residual ||X^p (A + eps I) - I||_F (for rational p = a/b:
    ||X^a (A + eps I)^b - I||_F), evaluated in float64; inf for non-finite X; max over a batch."""
    frac = parse_exponent(p)
    Xb, Ab = _batch(_f64(X)), _batch(_f64(A))
    if not np.isfinite(Xb).all():
        return math.inf
    Ae = _shift(Ab, float(eps))
    R = _matpow(Xb, frac.numerator) @ _matpow(Ae, frac.denominator) - np.eye(Xb.shape[-1])
    return float(np.linalg.norm(R, axis=(-2, -1)).max())


def backward_error(X: Any, A: Any, p: Any, *, precise: bool | None = None) -> float:
    """Normwise relative backward error ||X^{-p} - A||_F / ||A||_F of X as an inverse p-th root of A.

    X = (A + dA)^{-1/p} exactly for dA = X^{-p} - A, the unique such perturbation. For integer p,
    X^{-p} = (X^p)^{-1} is formed with python-flint ball arithmetic at 80 + p log2(cond(X)) bits when
    ``precise`` (default: when python-flint is installed and n <= 128), else by a float64 LU solve,
    whose own error is about u kappa(A) relative. For rational p, X^{-p} comes from a float64
    eigendecomposition of X. Inf for non-finite or singular X; max over a batch.
    """
    frac = parse_exponent(p)
    Xb, Ab = _batch(_f64(X)), _batch(_f64(A))
    if not np.isfinite(Xb).all():
        return math.inf
    n = Xb.shape[-1]
    if precise is None:
        from .reference import flint_available

        precise = flint_available() and n <= 128
    worst = 0.0
    for Xi, Ai in zip(Xb, Ab, strict=True):
        if frac.denominator == 1:
            Y = (
                _inverse_power_precise(Xi, frac.numerator)
                if precise
                else _inverse_power_lu(Xi, frac.numerator)
            )
        else:
            w, V = np.linalg.eig(Xi)
            if np.any(w == 0):
                return math.inf
            Y = np.real((V * w ** (-float(frac))) @ np.linalg.inv(V))
        if Y is None or not np.isfinite(Y).all():
            return math.inf
        den = float(np.linalg.norm(Ai))
        worst = max(worst, float(np.linalg.norm(Y - Ai)) / den if den > 0 else math.inf)
    return worst


def _inverse_power_lu(X: np.ndarray, k: int) -> np.ndarray | None:
    try:
        return np.linalg.solve(_matpow(X[None], k)[0], np.eye(X.shape[0]))
    except np.linalg.LinAlgError:
        return None


def _inverse_power_precise(X: np.ndarray, k: int) -> np.ndarray | None:
    from flint import arb_mat

    from ._ref_flint import to_numpy, working_prec
    from .reference import _LOCK  # flint's working precision is process-global

    with np.errstate(all="ignore"):
        c = float(np.linalg.cond(X))
    bits = int(min(2048, 80 + k * math.log2(c if math.isfinite(c) and c > 1 else 1e300)))
    with _LOCK, working_prec(bits):
        M = arb_mat(X.tolist())
        P = arb_mat(X.shape[0], X.shape[0])
        for i in range(X.shape[0]):
            P[i, i] = 1
        for _ in range(k):
            P = P * M
        try:
            Y = P.solve(_eye_arb(X.shape[0]), nonstop=True)
        except (ZeroDivisionError, ValueError):
            return None
        return to_numpy(Y)


def _eye_arb(n: int) -> Any:
    from flint import arb_mat

    E = arb_mat(n, n)
    for i in range(n):
        E[i, i] = 1
    return E


# ------------------------------------------------------------------------------------- conditioning
def _is_symmetric(A: np.ndarray) -> bool:
    return bool(np.array_equal(A, np.swapaxes(A, -1, -2)))


def condition_number(A: Any, *, eps: float = 0.0) -> float:
    """2-norm condition number kappa_2(A + eps I) = sigma_max / sigma_min (inf when singular).

    Symmetric A: max|lambda| / min|lambda| from :func:`_spectrum` (high precision when float64 cannot
    resolve lambda_min, so kappa up to 1e16 and beyond is exact). General A: float64 SVD (reliable up
    to kappa ~ 1e15). Max over a batch.
    """
    worst = 0.0
    for Ai in _batch(_f64(A)):
        Ae = _shift(Ai, float(eps))
        a = np.abs(_spectrum(Ae)) if _is_symmetric(Ae) else np.linalg.svd(Ae, compute_uv=False)
        lo = float(a.min())
        worst = max(worst, math.inf if lo == 0 else float(a.max()) / lo)
    return worst


def _divided_differences_max(lam: np.ndarray, q: float) -> float:
    """max_{i,j} |f[lambda_i, lambda_j]| for f(z) = z^q (principal branch), complex-safe."""
    lam = np.asarray(lam, dtype=complex)
    f = np.exp(q * np.log(lam))
    fp = q * f / lam
    a, b = lam[:, None], lam[None, :]
    diff = a - b
    close = np.abs(diff) <= 1e-8 * np.maximum(np.abs(a), np.abs(b))
    with np.errstate(divide="ignore", invalid="ignore"):
        dd = np.where(
            close, 0.5 * (fp[:, None] + fp[None, :]), (f[:, None] - f[None, :]) / np.where(close, 1, diff)
        )
    return float(np.abs(dd).max())


def cond_root(
    A: Any,
    p: Any,
    *,
    inverse: bool = True,
    eps: float = 0.0,
    eigenvalues: np.ndarray | None = None,
    kron_max_n: int = 24,
) -> float:
    """:func:`matroots.core.conditioning.cond_root` with the eigenvalues of symmetric input from
    :func:`_spectrum` (high precision where float64 cannot resolve lambda_min): the yardstick of the
    accuracy contract."""
    return _conditioning.cond_root(
        A, p, inverse=inverse, eps=eps, eigenvalues=eigenvalues, spectrum=_spectrum, kron_max_n=kron_max_n
    )


def cond_rel(A: Any, p: Any, *, eps: float = 0.0, eigenvalues: np.ndarray | None = None) -> float:
    """Relative condition number of (A + eps I)^{-1/p} in the Frobenius norm: ``cond_root(inverse=True)``.

    Symmetric positive definite A (Higham 2008, Thm 3.15/Cor. 3.16): exactly
    (1/p) lambda_min^{-1/p-1} ||A||_F / ||A^{-1/p}||_F  (~ kappa/p), from the divided differences of
    x^{-1/p}. General A: the 2-norm of the Kronecker form of the Fréchet derivative (see
    :mod:`matroots.core.conditioning`). ``eigenvalues`` (of A + eps I, e.g. a reference's) skip the
    eigensolver for symmetric A. Inf when A + eps I has a non-positive (or negative real) eigenvalue.
    """
    return cond_root(A, p, inverse=True, eps=eps, eigenvalues=eigenvalues)


def kappa_u_line(kappa: float, p: Any, dtype: Any) -> float:
    """(kappa / p) u(dtype): the forward error expected of a stable method (cond_rel ~ kappa/p)."""
    return float(kappa) / float(parse_exponent(p)) * precision.unit_roundoff(dtype)


def representation_error(A: Any, dtype: Any, *, scale_fp16: bool = True) -> float:
    """||fl(A) - A||_F / ||A||_F for round-to-nearest into ``dtype`` (a cast).

    With ``scale_fp16`` (as the solvers do, see :func:`matroots.core.inputs.prepare`), fp16 input is first
    scaled by the power of two that brings max|A| near 1, so the figure measures rounding rather than
    overflow; without it, entries beyond 65504 give inf. Max over a batch.
    """
    dt = precision.as_dtype(dtype)
    worst = 0.0
    for Ai in _batch(_f64(A)):
        t = torch.from_numpy(np.ascontiguousarray(Ai))
        scale = 1.0
        amax = float(t.abs().max())
        if dt == torch.float16 and scale_fp16 and amax > 0:
            scale = 2.0 ** (-math.floor(math.log2(amax)))
        r = ((t * scale).to(dt).to(torch.float64) / scale).numpy()
        den = float(np.linalg.norm(Ai))
        if not np.isfinite(r).all():
            return math.inf
        worst = max(worst, float(np.linalg.norm(r - Ai)) / den if den > 0 else 0.0)
    return worst


def symmetry_defect(A: Any) -> float:
    """Relative symmetry defect ||A - A^T||_F / ||A||_F (0 for the zero matrix); max over a batch."""
    t = torch.from_numpy(np.ascontiguousarray(_batch(_f64(A))))
    return float(_symmetry_defect_tensor(t).max())


def eps_bias(
    A: Any, p: Any, eps: float, eps_mode: str = "absolute", *, eigenvalues: np.ndarray | None = None
) -> float:
    """Relative cost of regularisation ||(A + eps I)^{-1/p} - A^{-1/p}||_F / ||A^{-1/p}||_F.

    eps_abs = eps ("absolute") or eps lambda_max(A) ("relative", as :mod:`matroots.core.regularize`).
    Symmetric A = Q diag(lambda) Q^T: the closed form (Q cancels)
    sqrt(sum_i (lambda_i^{-1/p} expm1(-log1p(eps/lambda_i)/p))^2) / sqrt(sum_i lambda_i^{-2/p}), from the
    eigenvalues of A (``eigenvalues`` if given, else :func:`_spectrum`, high precision when needed).
    General A: two references (:func:`matroots.truth.reference.inverse_root`). NaN when A itself has no
    inverse root (a non-positive / negative real eigenvalue). Max over a batch.
    """
    _check_eps_mode(eps_mode)
    frac = parse_exponent(p)
    worst = 0.0
    for Ai in _batch(_f64(A)):
        sym = _is_symmetric(Ai)
        if sym:
            lam = (
                np.sort(np.asarray(eigenvalues, dtype=float).reshape(-1))
                if eigenvalues is not None
                else _spectrum(Ai)
            )
            lmax = float(np.abs(lam).max())
        else:
            lmax = float(np.abs(np.linalg.eigvals(Ai)).max())
        e = float(eps) * lmax if eps_mode == "relative" else float(eps)
        if e == 0:
            continue
        if sym:
            if lam[0] <= 0:
                return math.nan
            base = lam ** (-1.0 / float(frac))
            d = base * np.expm1(-np.log1p(e / lam) / float(frac))
            val = float(np.linalg.norm(d) / np.linalg.norm(base))
        else:
            from . import reference

            try:
                r_e = reference.inverse_root(Ai, frac, e)
                r_0 = reference.inverse_root(Ai, frac, 0.0)
            except NegativeRealEigenvalueError:
                return math.nan
            val = relative_forward_error(r_e.root, r_0.root)
        worst = max(worst, val)
    return worst


def _check_eps_mode(eps_mode: str) -> None:
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode must be {' or '.join(map(repr, EPS_MODES))}, got {eps_mode!r}")


def _absolute_eps(A: np.ndarray, ref: Any, eps: float, eps_mode: str) -> float:
    _check_eps_mode(eps_mode)
    if eps_mode == "absolute":
        return float(eps)
    eig = getattr(ref, "eigenvalues", None)
    if eig is not None:  # eigenvalues of A + eps_abs I: lambda_max(A + e I) = (1 + eps) lambda_max(A)
        return float(eps) * float(np.abs(eig).max()) / (1.0 + float(eps))
    return float(eps) * float(np.abs(np.linalg.eigvals(_batch(A))).max())


def _symmetric_eigenvalues(A: np.ndarray, ref: Any) -> np.ndarray | None:
    eig = getattr(ref, "eigenvalues", None)
    ok = eig is not None and _is_symmetric(A) and np.isrealobj(eig) and A.ndim == 2
    return eig if ok else None


def matrix_metrics(
    A: Any, p: Any, *, ref: Any, eps: float = 0.0, eps_mode: str = "absolute", ref0: Any = None
) -> dict[str, float]:
    """The metrics of the problem itself (independent of any computed root): condition_number (kappa_2
    of A + eps I), cond_rel (cond(f, A) of the inverse root, :func:`cond_root`), input_symmetry_defect, eps_bias (from ``ref0``, the eps = 0 reference, when
    given, else the closed form) and reference_error_bound. Compute once per matrix, not per solver."""
    Aa = _f64(A)
    frac: Fraction = parse_exponent(p)
    e = _absolute_eps(Aa, ref, eps, eps_mode)
    Ae = _shift(Aa, e)
    sym_eig = _symmetric_eigenvalues(Aa, ref)
    if sym_eig is not None:
        a = np.abs(sym_eig)
        kappa = math.inf if a.min() == 0 else float(a.max() / a.min())
    else:
        kappa = condition_number(Ae)
    if ref0 is not None:
        bias = relative_forward_error(getattr(ref, "root", ref), getattr(ref0, "root", ref0))
    elif e == 0:
        bias = 0.0
    else:
        bias = eps_bias(Aa, frac, e, "absolute")
    return {
        "condition_number": kappa,
        "cond_rel": cond_rel(Ae, frac, eigenvalues=sym_eig),
        "input_symmetry_defect": symmetry_defect(Aa),
        "eps_bias": bias,
        "reference_error_bound": float(getattr(ref, "error_bound", math.nan)),
    }


def dtype_metrics(A: Any, p: Any, kappa: float, dtype: Any, *, cond: float | None = None) -> dict[str, float]:
    """The metrics of the working format: kappa_u_line ((kappa/p) u), representation_error of A and,
    when ``cond`` (cond(f, A), e.g. ``matrix_metrics(...)["cond_rel"]``) is given, cond_u_line = cond u."""
    out = {
        "kappa_u_line": kappa_u_line(kappa, parse_exponent(p), dtype),
        "representation_error": representation_error(_f64(A), dtype),
    }
    if cond is not None:
        out["cond_u_line"] = cond_u_line(cond, dtype)
    return out


def root_metrics(
    X: Any, A: Any, p: Any, *, ref: Any, eps: float = 0.0, eps_mode: str = "absolute"
) -> dict[str, float]:
    """The metrics of a computed X ~ (A + eps I)^{-1/p}: relative_forward_error (Frobenius),
    relative_forward_error_2, residual, backward_error (of X for A + eps I), symmetry_defect (of X)."""
    Aa = _f64(A)
    frac: Fraction = parse_exponent(p)
    e = _absolute_eps(Aa, ref, eps, eps_mode)
    return {
        "relative_forward_error": relative_forward_error(X, ref, "fro"),
        "relative_forward_error_2": relative_forward_error(X, ref, 2),
        "residual": residual(X, Aa, frac, e),
        "backward_error": backward_error(X, _shift(Aa, e), frac),
        "symmetry_defect": symmetry_defect(X),
    }


def all_metrics(
    X: Any,
    A: Any,
    p: Any,
    *,
    ref: Any,
    eps: float = 0.0,
    eps_mode: str = "absolute",
    dtype: Any = None,
    ref0: Any = None,
) -> dict[str, float]:
    """Every metric of this module for a computed X ~ (A + eps I)^{-1/p}, in one dict: the union of
    :func:`root_metrics`, :func:`matrix_metrics` and :func:`dtype_metrics`.

    ``ref`` is the :class:`~matroots.truth.reference.Reference` of the same (A, p, eps) that X approximates;
    ``ref0`` (optional) that of eps = 0, used for the eps bias instead of the closed form. ``dtype``
    (default: X's dtype for a tensor, else float64) sets the unit roundoff of ``kappa_u_line`` and
    ``representation_error``. Callers with many roots of one matrix (the sweep) should call the three
    parts separately, so the matrix metrics are computed once.
    """
    if dtype is None:
        dtype = X.dtype if isinstance(X, torch.Tensor) else torch.float64
    mat = matrix_metrics(A, p, ref=ref, eps=eps, eps_mode=eps_mode, ref0=ref0)
    return {
        **root_metrics(X, A, p, ref=ref, eps=eps, eps_mode=eps_mode),
        **mat,
        **dtype_metrics(A, p, mat["condition_number"], dtype, cond=mat["cond_rel"]),
    }


def solved_metrics(
    res: Any, A: Any, p: Any, *, inverse: bool = True, backend: str = "auto", cache: bool = True
) -> dict[str, float]:
    """Accuracy of a :class:`~matroots.RootResult` against the reference of the matrix it actually solved.

    Every solver reports the absolute shift it applied, ``res.info["eps_abs"]`` (per batch element, in the
    user's units). The root is compared with the high-precision reference of **A + eps_abs I** (so an
    estimated lambda_max behind a relative eps is not mistaken for inaccuracy), and the cost of the shift
    is reported separately, against the reference of A itself. ``A`` is the caller's matrix (..., n, n),
    ``inverse`` says which root ``res`` holds. Returns the worst value over the batch of:

    * ``forward_error``: ||X - (A + eps_abs I)^{-+1/p}||_F / ||.||_F, the solver's accuracy;
    * ``eps_abs``: the shift applied; ``eps_bias``: ||f(A + eps_abs I) - f(A)||_F / ||f(A)||_F (NaN when A
      itself has no principal root); ``forward_error_total``: the error against f(A) (NaN likewise);
    * ``cond_root``: cond(f, A + eps_abs I) (:func:`cond_root`) and ``cond_u_line`` = cond_root u(res.dtype),
      the error a stable method can be expected to reach;
    * ``reference_error_bound``: the reference's own error bound.
    """
    from ..core.errors import NotPositiveDefiniteError
    from . import reference

    fn = reference.inverse_root if inverse else reference.root
    Ab, Xb = _batch(_f64(A)), _batch(_f64(res.root))
    if Ab.shape != Xb.shape:
        raise InvalidArgumentError(f"shapes differ: root {Xb.shape} vs A {Ab.shape}")
    eps_abs = np.asarray(info_per_element(res.info.get("eps_abs"), Ab.shape[0]))
    out = dict.fromkeys(
        ("forward_error", "eps_abs", "eps_bias", "forward_error_total", "cond_root", "reference_error_bound"),
        0.0,
    )
    for Ai, Xi, e in zip(Ab, Xb, eps_abs, strict=True):
        r_e = fn(Ai, p, float(e), backend=backend, cache=cache)
        eig = r_e.eigenvalues if r_e.symmetric and np.isrealobj(r_e.eigenvalues) else None
        vals = {
            "forward_error": relative_forward_error(Xi, r_e.root),
            "eps_abs": float(e),
            "cond_root": cond_root(Ai, p, inverse=inverse, eps=float(e), eigenvalues=eig),
            "reference_error_bound": float(r_e.error_bound),
            "eps_bias": 0.0,
            "forward_error_total": math.nan,
        }
        if e > 0:
            try:
                r_0 = fn(Ai, p, 0.0, backend=backend, cache=cache)
                vals["eps_bias"] = relative_forward_error(r_e.root, r_0.root)
                vals["forward_error_total"] = relative_forward_error(Xi, r_0.root)
            except (NegativeRealEigenvalueError, NotPositiveDefiniteError):
                vals["eps_bias"] = math.nan
        else:
            vals["forward_error_total"] = vals["forward_error"]
        for k, v in vals.items():  # the worst element; NaN (undefined for some element) wins
            out[k] = math.nan if math.isnan(v) or math.isnan(out[k]) else max(out[k], v)
    out["cond_u_line"] = cond_u_line(out["cond_root"], res.dtype)
    return out


__all__ = [
    "all_metrics",
    "backward_error",
    "cond_rel",
    "cond_root",
    "cond_u_line",
    "condition_number",
    "dtype_metrics",
    "eps_bias",
    "kappa_u_line",
    "matrix_metrics",
    "relative_forward_error",
    "representation_error",
    "residual",
    "root_metrics",
    "solved_metrics",
    "symmetry_defect",
]
