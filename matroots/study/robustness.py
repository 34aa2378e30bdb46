"""Robustness harness: hard random problems, and each solve classified against the matrix actually solved.

Every call a user can make ends in exactly one of these outcomes (:data:`OUTCOMES`):

* ``refused_input`` -- a :class:`~matroots.core.errors.MatrootsInputError` (bad argument, non-symmetric
  input for an SPD-only method, ...);
* ``refused_numerical`` -- a :class:`~matroots.core.errors.MatrootsNumericalError` (not positive
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
eigenvalue <= 0 of A_s (no principal root) makes any ``converged=True`` a silent wrong, unless the
exponent -1/p or 1/p is an integer (p = 1/k): then f is a matrix power, defined at a negative
eigenvalue.

:func:`random_case` draws problems with random shape, batch, working dtype (fp64/fp32/bf16/fp16), input
layout (contiguous, transposed view, strided view, numpy), scale 10^-300 .. 10^300, spectra (SPD
geometric, clustered, rank-deficient, indefinite, diagonal, fp32 Gram matrices built by ``baddbmm``,
nearly symmetric, non-symmetric with real, complex or negative eigenvalues), eps (none, absolute,
relative), p and forward/inverse roots; :func:`classify` runs one solver on one case. The yardstick
(the mpmath reference root, its condition number and ``C_BOUND``) is :mod:`matroots.study.robustness_reference`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from .. import solvers
from ..core import precision
from ..core.errors import MatrootsInputError, MatrootsNumericalError
from ..core.options import EPS_MODES
from ..core.result import info_per_element
from .robustness_reference import C_BOUND, reference_root, rel_error

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
ILL_POSED = "ill-posed at working precision"


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
    mode = str(rng.choice(["none", *EPS_MODES, "absolute_raw"]))
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


def _solver_symmetric(name: str, info: dict, b: int) -> list[bool]:
    """Per element: did solver ``name`` treat its input as symmetric (and solve sym(A))?

    Its own report (``info["symmetric"]``) where it gives one; else its declared capability: a
    solver without ``general_input`` takes symmetric input only and solves its symmetric part.
    """
    flag = info.get("symmetric")
    if isinstance(flag, list | tuple):
        return [bool(x) for x in flag]
    if flag is not None:
        return [bool(flag)] * b
    return [not _capabilities(name).general_input] * b


def _capabilities(name: str) -> Any:
    """The declared :class:`~matroots.solvers.base.Capabilities` of a registered solver. A label
    such as ``"eigh[rank_policy=clamp]"`` (what ``auto`` reports it chose) names its base solver."""
    return solvers.get(name.split("[", 1)[0]).capabilities


def _element_infos(method: str, info: dict, b: int) -> list[tuple[float, float, bool]]:
    """(prescale, absolute shift, symmetric) of each element's solve.

    ``auto`` solves groups of elements with the solvers it chose (``info["auto"]``): one group is
    that solver's own ``info``; several are in ``info["group_infos"]``, each with its own prescale.
    """
    groups = info.get("group_infos")
    if method == "auto" and "auto" in info:
        chosen = info["auto"]["chosen"]
        if groups is None:  # one group: the chosen solver's info, for the whole batch
            sym = _solver_symmetric(chosen[0], info, b)
            return _zip_infos(info, b, sym)
        out: list[tuple[float, float, bool]] = [(1.0, 0.0, False)] * b
        for g, rec in zip(info["auto"]["groups"], groups, strict=True):
            idx = g["elements"]
            sub = rec["info"]
            sym = _solver_symmetric(g["config"], sub, len(idx))
            for j, e in zip(idx, _zip_infos(sub, len(idx), sym), strict=True):
                out[j] = e
        return out
    return _zip_infos(info, b, _solver_symmetric(method, info, b))


def _zip_infos(info: dict, b: int, sym: list[bool]) -> list[tuple[float, float, bool]]:
    prescale = float(info.get("prescale", 1.0))
    shifts = info_per_element(info.get("regularisation_abs", info.get("eps_abs")), b)
    return [(prescale, shifts[i], sym[i]) for i in range(b)]


def _matrix_solved(A_in: object, dtype: torch.dtype) -> np.ndarray:
    """The caller's matrices as the solver receives them (before prescale), flattened, float64."""
    t = torch.as_tensor(np.asarray(A_in)) if not isinstance(A_in, torch.Tensor) else A_in
    return t.detach().double().reshape(-1, t.shape[-2], t.shape[-1]).numpy()


# --- classification ------------------------------------------------------------------------------


def classify(case: Case, method: str, *, warm_start: object = None) -> Outcome:
    """Run ``method`` on ``case`` (from ``warm_start`` if given) and classify the outcome (see the
    module docstring). A write into the caller's input, or into ``warm_start``, is ``mutated``."""
    A64 = build_matrices(case)
    A_in, snap = make_input(case, A64)
    warm_snaps = _warm_snapshots(warm_start)
    kw = {} if warm_start is None else {"warm_start": warm_start}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = solvers.get(method).solve(
                A_in, case.p, inverse=case.inverse, eps=case.eps, eps_mode=case.eps_mode, dtype=case.dtype,
                **kw,
            )  # fmt: skip
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
    if not all(_unchanged(t, c) for t, c in warm_snaps):
        return Outcome(
            "mutated", method, detail="the solver wrote into its warm_start", exception=out.exception
        )
    out.extra["outside_capabilities"] = outside_capabilities(case, method)
    return out


def outside_capabilities(case: Case, method: str) -> str:
    """Why ``case`` lies outside what ``method`` declares it can do (its
    :class:`~matroots.solvers.base.Capabilities`), or "" when inside. There only a typed refusal
    (``refused_input``) or a result judged like any other is acceptable, never a crash."""
    cap = _capabilities(method)
    if cap.integer_p and Fraction(case.p).denominator != 1:
        return f"p = {case.p} is not an integer"
    if not cap.forward_root and not case.inverse:
        return "forward root"
    if not cap.general_input and case.kind.startswith("nonsym") and case.n > 1:
        return "non-symmetric input"
    return ""


def _warm_snapshots(warm_start: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, copy) for every tensor a warm start carries (a root, or a RootResult's root and info)."""
    if warm_start is None:
        return []
    if isinstance(warm_start, torch.Tensor):
        tensors = [warm_start]
    else:
        info = getattr(warm_start, "info", {}) or {}
        tensors = [getattr(warm_start, "root", None), *info.values()]
    return [(t, t.detach().clone()) for t in tensors if isinstance(t, torch.Tensor)]


def _judge(case: Case, method: str, A_in: object, res: Any) -> Outcome:
    wdtype = precision.as_dtype(case.dtype)
    flat = _matrix_solved(A_in, wdtype)
    b = flat.shape[0]
    conv = (
        res.converged.reshape(-1).tolist()
        if isinstance(res.converged, torch.Tensor)
        else [bool(res.converged)]
    )
    per_element = _element_infos(method, res.info, b)
    X = res.root.detach().double().reshape(b, case.n, case.n).numpy()
    u = precision.unit_roundoff(wdtype)
    e = (Fraction(-1) if case.inverse else Fraction(1)) / Fraction(case.p)
    worst = Outcome("correct", method)
    worst_ratio = -1.0
    for i in range(b):
        if not conv[i]:
            if worst.outcome == "correct":
                reason = res.info.get("stop_reason", "")
                worst = Outcome("flagged", method, detail=f"element {i}: {reason}")
            continue
        prescale, shift, sym = per_element[i]
        k = round(math.log2(prescale))  # the working matrix is 2^k A, rounded
        # the working matrix: round(prescale * A) in the working dtype; in user units times 2^k
        work = (torch.from_numpy(flat[i]) * prescale).to(wdtype).double().numpy()
        ref = reference_root(work, k, shift, e, sym, u)
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
        err = rel_error(X[i], ref["X"])
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


def solver_names() -> tuple[str, ...]:
    """Every registered solver (:func:`matroots.solvers.available`): a newly registered one joins the
    fuzz without a change here, judged against its declared capabilities."""
    return tuple(solvers.available())


def warm_solver_names() -> tuple[str, ...]:
    """The registered solvers that declare a warm start (``capabilities.warm_start`` not None)."""
    return tuple(m for m in solver_names() if _capabilities(m).warm_start is not None)


def check_all(case: Case, methods: tuple[str, ...] | None = None) -> list[Outcome]:
    """:func:`classify` for each method (default: every registered solver)."""
    return [classify(case, m) for m in (solver_names() if methods is None else methods)]


# --- warm starts ---------------------------------------------------------------------------------

WARM_CHANGES = ("conditioning", "rank", "scale")
SYMMETRIC_KINDS = ("spd", "clustered", "psd", "indefinite", "diagonal", "gram_fp32", "nearly_symmetric")
NO_PREVIOUS = "no_previous"  # the previous matrix had no root to start from (its solve raised)


@dataclass(frozen=True)
class WarmCase:
    """Solve ``previous``, then ``current`` warm-started from that result. ``change`` says how the
    previous matrix differs: another conditioning, another rank or another scale (with the same
    eigenvectors where the two cases share their seed)."""

    current: Case
    previous: Case
    change: str


def random_warm_case(rng: np.random.Generator) -> WarmCase:
    """A random :class:`WarmCase`: the current problem as :func:`random_case` draws it (one in four
    enlarged to n = 12 or 16 with a symmetric spectrum, where ``auto`` consults its table), the
    previous one of the same shape, dtype, p and direction but another conditioning (kappa 1 up to
    a little beyond 1/u of the format), rank (full <-> rank-deficient, with a relative eps where the
    case has none, as Shampoo's factors) or scale (up to 10^+-30 times), half of the time with the
    same eigenvectors (the same seed). The previous matrix is one the solver can be expected to
    solve (a root exists, its scale inside the format's range): what is fuzzed is the warm start."""
    cur = random_case(rng)
    if rng.uniform() < 0.25:
        cur = replace(cur, n=int(rng.choice([12, 16])), batch=(), kind=str(rng.choice(SYMMETRIC_KINDS)))
    change = WARM_CHANGES[int(rng.integers(len(WARM_CHANGES)))]
    seed = cur.seed if rng.uniform() < 0.5 else int(rng.integers(2**31))
    kind = {"indefinite": "spd", "nonsym_negative": "nonsym_real"}.get(cur.kind, cur.kind)
    digits = -math.log10(precision.unit_roundoff(precision.as_dtype(cur.dtype)))
    reach = _SCALE_REACH[cur.dtype]
    prev = replace(
        cur,
        kind=kind,
        seed=seed,
        log10_scale=float(np.clip(cur.log10_scale, -reach, reach)),
        log10_kappa=min(cur.log10_kappa, 1.2 * digits),
    )
    if change == "conditioning":
        prev = replace(prev, log10_kappa=float(rng.uniform(0, min(18.0, 1.2 * digits))))
    elif change == "rank":
        deficient = cur.kind in ("psd", "gram_fp32")
        prev = replace(prev, kind="spd" if deficient else str(rng.choice(["psd", "gram_fp32"])))
        if not deficient and cur.eps == 0.0:
            prev = replace(prev, eps=10.0 ** rng.uniform(-digits / 2, -1), eps_mode="relative")
    else:
        shifted = cur.log10_scale + float(rng.uniform(-30, 30))
        prev = replace(prev, log10_scale=float(np.clip(shifted, -reach, reach)))
    return WarmCase(current=cur, previous=prev, change=change)


# decades of scale a matrix of kappa <= 1/u keeps inside each format's normal range
_SCALE_REACH = {"fp64": 280.0, "fp32": 28.0, "bf16": 28.0, "fp16": 1.5}


def classify_warm(wcase: WarmCase, method: str) -> Outcome:
    """Solve the previous problem with ``method``, warm-start the current one from that result, and
    classify the current solve as :func:`classify` does (the same reference and bound: a warm start
    changes where the iteration starts, never the answer owed). ``NO_PREVIOUS`` where the previous
    solve raised (a typed refusal: nothing to start from); a crash there is a ``crash``."""
    prev_case = wcase.previous
    A_prev, _ = make_input(prev_case, build_matrices(prev_case))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prev = solvers.get(method).solve(
                A_prev,
                prev_case.p,
                inverse=prev_case.inverse,
                eps=prev_case.eps,
                eps_mode=prev_case.eps_mode,
                dtype=prev_case.dtype,
            )
    except (MatrootsInputError, MatrootsNumericalError) as exc:
        return Outcome(NO_PREVIOUS, method, exception=f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        return Outcome("crash", method, detail="previous solve", exception=f"{type(exc).__name__}: {exc}")
    out = classify(wcase.current, method, warm_start=prev)
    out.extra["previous_converged"] = bool(torch.as_tensor(prev.converged).all())
    return out


__all__ = [
    "DTYPES",
    "ILL_POSED",
    "KINDS",
    "LAYOUTS",
    "NO_PREVIOUS",
    "OUTCOMES",
    "WARM_CHANGES",
    "Case",
    "Outcome",
    "WarmCase",
    "build_matrices",
    "check_all",
    "classify",
    "classify_warm",
    "make_input",
    "random_case",
    "random_warm_case",
    "solver_names",
    "warm_solver_names",
]
