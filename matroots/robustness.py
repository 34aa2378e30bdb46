"""Robustness harness: hard random problems, and each solve classified against the matrix actually solved.

Every call a user can make ends in exactly one of these outcomes (:data:`OUTCOMES`):

* ``refused_input`` -- a :class:`~matroots.errors.MatrootsInputError` (bad argument, non-symmetric
  input for an SPD-only method, ...);
* ``refused_numerical`` -- a :class:`~matroots.errors.MatrootsNumericalError` (not positive
  definite after rounding and eps, a format that cannot hold a value, ...);
* ``flagged`` -- a result with ``converged=False`` for some matrix of the batch (and a warning);
* ``correct`` -- ``converged=True`` and every matrix's root within the conditioning bound below (or
  the problem is ill-posed in the working format, ``detail=ILL_POSED``: the bound is >= 1, so no
  correct digit can be promised and the first-order bound no longer describes the error -- e.g. a
  PSD matrix whose eps is far below u ||A||, where a backward-stable root may be off by 1e15 -- or an
  eigenvalue <= 0 lies within the format's backward error of a positive one);
* ``silent_wrong`` -- ``converged=True`` but some root outside the bound, or no principal root exists;
* ``crash`` -- any other exception (a raw ``TypeError``, ``RuntimeError``, ``OverflowError``, ...);
* ``mutated`` -- the call wrote into the caller's tensor or array.

The yardstick (``bound``) is the conditioning of the root that was asked for, at the matrix that was
actually solved:

    ||X - X_ref||_F / ||X_ref||_F <= C_BOUND * n * (1 + cond(f, A_s)) * u,

where u is the working format's unit roundoff, A_s is the input rounded to the working format (after
the exact power-of-two prescale the solver reports in ``info["prescale"]``), symmetrised when the
solver treated it as symmetric, plus the absolute shift it reports (``info["regularisation_abs"]``,
else ``info["eps_abs"]``); X_ref = f(A_s) is computed by mpmath at ``REF_DPS`` digits from that exact
matrix (``mpmath.eigsy`` / ``mpmath.eig``), and cond(f, A) = ||L_f(A)|| ||A||_F / ||f(A)||_F is the
relative condition number of f(x) = x^{-1/p} (inverse) or x^{1/p} (Higham, *Functions of Matrices*,
2008, eq. (3.2)), from the same eigen-decomposition: max |f[lambda_i, lambda_j]| over divided
differences for symmetric A_s (Higham 2008, Cor. 3.16), the 2-norm of the Kronecker form
(V^{-T} kron V) diag(vec D) (V^T kron V^{-1}) otherwise (Higham 2008, eq. (3.17)). Both are invariant
under scaling A, so they are evaluated on A_s / max|lambda| (no overflow at any scale). A real
eigenvalue <= 0 of A_s (no principal root) makes any ``converged=True`` a silent wrong.

:func:`random_case` draws problems with random shape, batch, working dtype (fp64/fp32/bf16/fp16), input
layout (contiguous, transposed view, strided view, numpy), scale 10^-300 .. 10^300, spectra (SPD
geometric, clustered, rank-deficient, indefinite, diagonal, fp32 Gram matrices built by ``baddbmm``,
nearly symmetric, non-symmetric with real, complex or negative eigenvalues), eps (none, absolute,
relative), p and forward/inverse roots; :func:`classify` runs one solver on one case.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import mpmath
import numpy as np
import torch

from . import precision
from .api import inverse_root, root
from .errors import MatrootsInputError, MatrootsNumericalError
from .result import info_per_element

OUTCOMES = ("refused_input", "refused_numerical", "flagged", "correct", "silent_wrong", "crash", "mutated")
KINDS = (
    "spd",
    "clustered",
    "psd",
    "indefinite",
    "diagonal",
    "gram_fp32",
    "nearly_symmetric",
    "nonsym_real",
    "nonsym_complex",
    "nonsym_negative",
)
DTYPES = ("fp64", "fp32", "bf16", "fp16")
LAYOUTS = ("contiguous", "transposed", "strided", "numpy")
METHODS = ("eigh", "coupled_newton", "schur_newton")
C_BOUND = 10.0
ILL_POSED = "ill-posed at working precision"
REF_DPS = 60


@dataclass(frozen=True)
class Case:
    """One fuzz problem. ``eps`` is in the user's units for ``eps_mode="absolute"``."""

    kind: str
    n: int
    batch: tuple[int, ...]
    log10_kappa: float
    log10_scale: float
    dtype: str
    input_dtype: str  # "fp64" or "working" (the caller passes a tensor already in the working dtype)
    layout: str
    eps: float
    eps_mode: str
    p: int | Fraction
    inverse: bool
    seed: int


@dataclass
class Outcome:
    """The classification of one solve: ``outcome`` in :data:`OUTCOMES`, with the evidence."""

    outcome: str
    method: str
    detail: str = ""
    error: float = math.nan  # worst relative error over converged batch elements
    bound: float = math.nan  # the bound at that element
    cond: float = math.nan
    exception: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# --- problem construction ------------------------------------------------------------------------


def _haar(n: int, rng: np.random.Generator) -> np.ndarray:
    Z = rng.standard_normal((n, n))
    Q, R = np.linalg.qr(Z)
    return Q * np.sign(np.diag(R))


def _spectrum(kind: str, n: int, log10_kappa: float, rng: np.random.Generator) -> np.ndarray:
    lo = -log10_kappa
    if kind == "clustered":
        base = rng.choice([10.0**lo, 1.0])
        lam = base * (1 + 10.0 ** rng.uniform(-16, -2) * rng.standard_normal(n))
        lam[rng.integers(n)] = 1.0 if base != 1.0 else 10.0**lo
        return np.abs(lam)
    lam = 10.0 ** np.concatenate([[lo, 0.0], rng.uniform(lo, 0.0, max(n - 2, 0))])[:n]
    if n == 1:
        lam = np.array([10.0 ** rng.uniform(lo, 0.0)])
    if kind == "psd":
        lam[: max(1, n // 3)] = 0.0
    if kind == "indefinite":
        lam[0] = -(10.0 ** rng.uniform(lo, 0.0))
    return lam


def build_matrices(case: Case) -> np.ndarray:
    """The float64 matrices of the case, shape (*batch, n, n), before the working-format rounding."""
    rng = np.random.default_rng(case.seed)
    count = int(np.prod(case.batch)) if case.batch else 1
    n = case.n
    out = np.empty((count, n, n))
    scale = 10.0**case.log10_scale
    for b in range(count):
        kind = case.kind
        if kind == "gram_fp32":  # a rank-deficient fp32 Kronecker factor, as Shampoo accumulates it
            G = torch.from_numpy(rng.standard_normal((1, n, max(1, n // 2)))).float()
            M = torch.baddbmm(torch.zeros(1, n, n), G, G.mT).double()[0].numpy()
            out[b] = M * scale
            continue
        if kind.startswith("nonsym"):
            V = np.eye(n) + 0.3 * rng.standard_normal((n, n)) / math.sqrt(n)
            B = np.diag(_spectrum("spd", n, case.log10_kappa, rng))
            if kind == "nonsym_complex":
                j = 0
                while j + 1 < n:
                    r, t = 10.0 ** rng.uniform(-case.log10_kappa, 0.0), rng.uniform(0.1, 3.0)
                    B[j : j + 2, j : j + 2] = r * np.array(
                        [[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]]
                    )
                    j += 2
            if kind == "nonsym_negative":
                B[0, 0] = -B[0, 0]
            out[b] = (V @ B @ np.linalg.inv(V)) * scale
            continue
        lam = _spectrum(kind, n, case.log10_kappa, rng)
        if kind == "diagonal":
            out[b] = np.diag(lam) * scale
            continue
        Q = _haar(n, rng)
        S = (Q * lam) @ Q.T
        S = 0.5 * (S + S.T)
        if kind == "nearly_symmetric":
            S = S + 10.0 ** rng.uniform(-18, -3) * rng.standard_normal((n, n)) * np.abs(S).max()
        out[b] = S * scale
    return out.reshape(*case.batch, n, n)


def make_input(case: Case, A64: np.ndarray) -> tuple[object, object]:
    """(the object passed to the solver, a bitwise snapshot to detect writes into it)."""
    dt = torch.float64 if case.input_dtype == "fp64" else precision.as_dtype(case.dtype)
    t = torch.from_numpy(np.ascontiguousarray(A64)).to(dt)
    if case.layout == "transposed":  # the caller holds B and passes B^T, a non-contiguous view
        obj: object = t.mT.contiguous().mT  # same values, transposed storage (as B.T of a contiguous B)
    elif case.layout == "strided":  # every other row/column of a larger matrix
        big = torch.zeros(*t.shape[:-2], 2 * case.n, 2 * case.n, dtype=dt)
        big[..., ::2, ::2] = t
        obj = big[..., ::2, ::2]
    elif case.layout == "numpy" and dt in (torch.float64, torch.float32, torch.float16):
        obj = t.numpy().copy()
    else:
        obj = t
    return obj, _snapshot(obj)


def _snapshot(obj: object) -> object:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    return np.array(obj, copy=True)


def _unchanged(obj: object, snap: object) -> bool:
    if isinstance(obj, torch.Tensor):
        a, b = obj.detach().contiguous(), snap.contiguous()  # type: ignore[union-attr]
        return bool(torch.equal(a.view(_int_of(a)), b.view(_int_of(b))))  # bitwise (-0.0 != 0.0)
    return bool(np.array_equal(np.asarray(obj).view(np.uint8), np.asarray(snap).view(np.uint8)))


def _int_of(t: torch.Tensor) -> torch.dtype:
    return {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.dtype.itemsize]


def random_case(rng: np.random.Generator) -> Case:
    """A random case for the fixed-seed fuzz run of ``experiments/robustness.py``."""
    kind = str(rng.choice(KINDS))
    dtype = str(rng.choice(DTYPES))
    mode = str(rng.choice(["none", "absolute", "relative", "absolute_raw"]))
    log10_scale = float(rng.choice([0.0, rng.uniform(-300, 300), rng.uniform(-40, 40)]))
    eps, eps_mode = _draw_eps(mode, log10_scale, rng.uniform(-16, 1), rng.uniform(-4, 0))
    p: int | Fraction = int(rng.choice([1, 2, 3, 4, 5, 8]))
    if rng.uniform() < 0.1:
        p = Fraction(int(rng.integers(1, 7)), int(rng.integers(2, 4)))
    return Case(
        kind=kind,
        n=int(rng.integers(1, 7)),
        batch=[(), (), (2,), (2, 1)][int(rng.integers(4))],
        log10_kappa=float(rng.uniform(0, 18)),
        log10_scale=log10_scale,
        dtype=dtype,
        input_dtype=str(rng.choice(["fp64", "working"])),
        layout=str(rng.choice(LAYOUTS)),
        eps=eps,
        eps_mode=eps_mode,
        p=p,
        inverse=bool(rng.uniform() < 0.7),
        seed=int(rng.integers(2**31)),
    )


def _draw_eps(mode: str, log10_scale: float, rel_exp: float, raw_exp: float) -> tuple[float, str]:
    if mode == "none":
        return 0.0, "absolute"
    if mode == "relative":
        return 10.0**rel_exp, "relative"
    if mode == "absolute_raw":  # a fixed eps in the user's units, whatever the scale (e.g. eps=0.01)
        return 10.0**raw_exp, "absolute"
    return 10.0 ** (rel_exp + log10_scale), "absolute"


# --- reference and bound -------------------------------------------------------------------------


def _exact_mp(A: np.ndarray, k: int) -> mpmath.matrix:
    """The float64 matrix A times 2^-k, exactly, in mpmath."""
    n = A.shape[0]
    M = mpmath.matrix(n, n)
    for i in range(n):
        for j in range(n):
            M[i, j] = mpmath.ldexp(mpmath.mpf(float(A[i, j])), -k)
    return M


def _is_real(z: Any, tol: float) -> bool:
    """Real to the reference's precision (relative: the scale of z may be anything, e.g. 1e-224)."""
    return abs(mpmath.im(z)) <= tol * abs(z)


def _power(z: Any, e: Fraction) -> Any:
    return mpmath.power(z, mpmath.mpf(e.numerator) / e.denominator)


def reference_root(
    A_s: np.ndarray, k: int, shift: float, e: Fraction, symmetric: bool, u: float = 0.0
) -> dict[str, Any]:
    """f(A_s 2^-k + shift I) in mpmath, its condition number and whether the principal root exists.

    When no principal root exists (a real eigenvalue lambda <= 0), ``ill_posed`` says whether that
    eigenvalue is within the working format's backward error of a positive one,
    |lambda| <= C_BOUND n u cond(V) max|lambda_i| (cond(V) = 1 for symmetric input): then no method in
    that format can tell the matrix from one that has a root, and the problem is ill-posed there.
    """
    n = A_s.shape[0]
    with mpmath.workdps(REF_DPS):
        M = _exact_mp(A_s, k)
        if symmetric:
            M = (M + M.T) / 2
        c = mpmath.mpf(shift)
        tol = mpmath.mpf(10) ** (-(REF_DPS - 15))
        if symmetric:
            E, Q = mpmath.eigsy(M)
            lam = [E[i] + c for i in range(n)]
            if min(lam) <= 0:
                lmin, lmax = min(lam), max(abs(x) for x in lam)
                ill = abs(lmin) <= C_BOUND * n * u * lmax
                return {"exists": False, "min_eig": float(lmin), "ill_posed": bool(ill)}
            fl = [_power(x, e) for x in lam]
            X = Q * mpmath.diag(fl) * Q.T
            V = Vinv = None
        else:
            E, V = mpmath.eig(M)
            Vinv = mpmath.inverse(V)
            lam = [E[i] + c for i in range(n)]
            for x in lam:
                if _is_real(x, tol) and mpmath.re(x) <= 0:
                    lmax = max(abs(y) for y in lam)
                    cond_v = float(
                        np.linalg.cond(np.array([[complex(V[i, j]) for j in range(n)] for i in range(n)]))
                    )
                    ill = abs(x) <= C_BOUND * n * u * cond_v * lmax
                    return {"exists": False, "min_eig": float(mpmath.re(x)), "ill_posed": bool(ill)}
            fl = [_power(x, e) for x in lam]
            X = V * mpmath.diag(fl) * Vinv
        cond = _condition(lam, fl, e, V, Vinv)
    return {"exists": True, "X": X, "cond": cond}


def _condition(lam: list, fl: list, e: Fraction, V: Any, Vinv: Any) -> float:
    """cond(f, A) from the eigen-decomposition, evaluated on A / max|lambda| (scale-invariant)."""
    n = len(lam)
    s = max(abs(x) for x in lam)
    ef = mpmath.mpf(e.numerator) / e.denominator
    lam_n = [x / s for x in lam]
    f_n = [_power(x, e) for x in lam_n]
    D = np.zeros((n, n), dtype=complex)
    for i in range(n):
        for j in range(n):
            d = lam_n[i] - lam_n[j]
            if abs(d) <= mpmath.mpf(10) ** (-20) * abs(lam_n[i]):
                v = ef * _power(lam_n[i], e - 1)
            else:
                v = (f_n[i] - f_n[j]) / d
            D[i, j] = complex(v)
    if V is None:  # symmetric: ||L|| = max |D_ij|; Frobenius norms from the eigenvalues
        num = float(np.abs(D).max()) * math.sqrt(sum(float(abs(x)) ** 2 for x in lam_n))
        den = math.sqrt(sum(float(abs(x)) ** 2 for x in f_n))
        return num / den
    Vc = np.array([[complex(V[i, j]) for j in range(n)] for i in range(n)])
    Vi = np.array([[complex(Vinv[i, j]) for j in range(n)] for i in range(n)])
    K = np.kron(Vi.T, Vc) @ np.diag(D.flatten(order="F")) @ np.kron(Vc.T, Vi)
    A_n = Vc @ np.diag(np.array([complex(x) for x in lam_n])) @ Vi
    F_n = Vc @ np.diag(np.array([complex(x) for x in f_n])) @ Vi
    return float(np.linalg.norm(K, 2) * np.linalg.norm(A_n) / np.linalg.norm(F_n))


def _rel_error(X: np.ndarray, Xref: Any) -> float:
    n = X.shape[0]
    with mpmath.workdps(REF_DPS):
        num = mpmath.mpf(0)
        den = mpmath.mpf(0)
        for i in range(n):
            for j in range(n):
                r = mpmath.re(Xref[i, j])
                num += (mpmath.mpf(float(X[i, j])) - r) ** 2
                den += r**2
        return float(mpmath.sqrt(num / den)) if den > 0 else math.inf


def _symmetric_flags(method: str, info: dict, b: int) -> list[bool]:
    if method == "eigh":
        return [True] * b
    flag = info.get("symmetric", False)
    if isinstance(flag, list | tuple):
        return [bool(x) for x in flag]
    return [bool(flag)] * b


def _matrix_solved(A_in: object, dtype: torch.dtype) -> np.ndarray:
    """The caller's matrices as the solver receives them (before prescale), flattened, float64."""
    t = torch.as_tensor(np.asarray(A_in)) if not isinstance(A_in, torch.Tensor) else A_in
    return t.detach().double().reshape(-1, t.shape[-2], t.shape[-1]).numpy()


# --- classification ------------------------------------------------------------------------------


def classify(case: Case, method: str) -> Outcome:
    """Run ``method`` on ``case`` and classify the outcome (see the module docstring)."""
    A64 = build_matrices(case)
    A_in, snap = make_input(case, A64)
    fn = inverse_root if case.inverse else root
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = fn(A_in, case.p, method=method, eps=case.eps, eps_mode=case.eps_mode, dtype=case.dtype)
    except MatrootsInputError as exc:
        out = Outcome("refused_input", method, exception=f"{type(exc).__name__}: {exc}")
    except MatrootsNumericalError as exc:
        out = Outcome("refused_numerical", method, exception=f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        out = Outcome("crash", method, exception=f"{type(exc).__name__}: {exc}")
    else:
        out = _judge(case, method, A_in, res)
    if not _unchanged(A_in, snap):
        return Outcome(
            "mutated", method, detail="the solver wrote into the caller's input", exception=out.exception
        )
    return out


def _judge(case: Case, method: str, A_in: object, res: Any) -> Outcome:
    wdtype = precision.as_dtype(case.dtype)
    flat = _matrix_solved(A_in, wdtype)
    b = flat.shape[0]
    conv = (
        res.converged.reshape(-1).tolist()
        if isinstance(res.converged, torch.Tensor)
        else [bool(res.converged)]
    )
    info = res.info
    prescale = float(info.get("prescale", 1.0))
    k = round(math.log2(prescale))  # the working matrix is 2^k A, rounded
    shifts = info_per_element(info.get("regularisation_abs", info.get("eps_abs")), b)
    sym = _symmetric_flags(method, info, b)
    X = res.root.detach().double().reshape(b, case.n, case.n).numpy()
    u = precision.unit_roundoff(wdtype)
    e = (Fraction(-1) if case.inverse else Fraction(1)) / Fraction(case.p)
    worst = Outcome("correct", method)
    worst_ratio = -1.0
    for i in range(b):
        if not conv[i]:
            if worst.outcome == "correct":
                worst = Outcome("flagged", method, detail=f"element {i}: {info.get('stop_reason', '')}")
            continue
        # the working matrix: round(prescale * A) in the working dtype; in user units times 2^k
        work = (torch.from_numpy(flat[i]) * prescale).to(wdtype).double().numpy()
        ref = reference_root(work, k, shifts[i], e, sym[i], u)
        if not ref["exists"] and ref["ill_posed"]:
            if worst.outcome == "correct" and worst_ratio < 0:
                worst = Outcome("correct", method, detail=ILL_POSED, cond=math.inf)
            continue
        if not ref["exists"]:
            return Outcome(
                "silent_wrong",
                method,
                detail=f"element {i}: converged=True but the matrix solved has the real eigenvalue "
                f"{ref['min_eig']:.3e} <= 0 (no principal root)",
                error=math.inf,
            )
        err = _rel_error(X[i], ref["X"])
        bound = C_BOUND * case.n * (1.0 + ref["cond"]) * u
        if bound >= 1.0:  # no correct digit can be promised: the first-order bound says nothing
            if worst.outcome == "correct" and worst_ratio < 0:
                worst = Outcome("correct", method, detail=ILL_POSED, error=err, bound=bound, cond=ref["cond"])
            continue
        ratio = err / bound
        if ratio > 1.0 or not math.isfinite(err):
            return Outcome(
                "silent_wrong",
                method,
                detail=f"element {i}: error {err:.3e} > bound {bound:.3e} (cond {ref['cond']:.3e})",
                error=err,
                bound=bound,
                cond=ref["cond"],
            )
        if ratio > worst_ratio and worst.outcome == "correct":
            worst_ratio = ratio
            worst = Outcome("correct", method, error=err, bound=bound, cond=ref["cond"])
    return worst


def check_all(case: Case, methods: tuple[str, ...] = METHODS) -> list[Outcome]:
    """:func:`classify` for each method."""
    return [classify(case, m) for m in methods]


__all__ = [
    "C_BOUND",
    "DTYPES",
    "ILL_POSED",
    "KINDS",
    "LAYOUTS",
    "METHODS",
    "OUTCOMES",
    "Case",
    "Outcome",
    "build_matrices",
    "check_all",
    "classify",
    "make_input",
    "random_case",
    "reference_root",
]
