"""``method="auto"`` decomposing first: where the selection table's lowest kappa band names an
eigendecomposition, auto runs that eigh before it knows kappa and reads kappa off the eigenvalues
eigh computed, instead of estimating kappa with a float64 ``eigvalsh`` and then decomposing again.

When every element's kappa is certain to lie in a band whose decision is that same configuration,
or an eigh differing from it in the rank policy alone (:func:`reuses`: the decomposition phase,
:meth:`EighConfig._decompose`, reads none of it), the chosen configuration's second phase
(:meth:`EighConfig._from_decomposition`) runs on that decomposition and the result is finalised and
returned: bitwise what the chosen configuration's own solve returns for the input and options (the
same template steps on the same input). Otherwise the
eigenvalues still give the kappa of every element whose band they decide, and the usual path
(decisions, group solves) runs on them; where some band is uncertain, or the eigh raised, the usual
path estimates kappa as before, and where that estimate (exact, float64) decides a solve that reuses
the decomposition, it solves from it (:func:`reusing`), instead of decomposing the matrix again.

Where another rank policy of the same eigh decides some band (:func:`spectrum_first`; fp64 in the
shipped table: eigh[clamp] decomposes, eigh[perturb] solves from kappa 1e2), the band test reads only
the ends of the computed spectrum (:func:`decomposed_ends`) and only the chosen configuration's root
spectrum is computed; until 2026-12-03 the lowest band's was computed first and dropped there (fp64
n = 128 kappa 300: auto / chosen 1.14 -> 1.05, 17 operations beyond the chosen solve's -> 5).
Elsewhere (fp32) the lowest band's spectrum is computed with the decomposition and reused, as before. Where Weyl's bound below leaves a band open, the eigenpairs' certificate
(:mod:`matroots.solvers.auto_certificate`: Rayleigh quotients, Kato-Temple, one float64 Cholesky)
tries to close it before the float64 estimate is taken (fp32 n = 128 kappa ~7.6e3-1.45e4 around the
1e4 edge).

Nothing is tested before decomposing. Until 2026-12-03 one Cholesky of A - c I (c from ||A||_F and
the lowest band edge whose solve cannot reuse the decomposition) decided whether to decompose first or
to estimate first; it decided the cost only (either path returns what the solver it runs returns),
and it cost more than it saved. n = 128, p = 4, randsvd, auto / chosen CPU time, interleaved
(``OMP_NUM_THREADS=1 python experiments/bench_auto_first.py --kappas ...``, load 4-5; the numbers are
in docs/design.md §7): the test took 150-300 us after the previous call's eigh (potrf ~60-95 us, its
numpy conversions, copy and norm the rest: an eigh leaves the caches cold), 6-11% of an eigh solve,
on every call whose kappa is below the edge; with ||A||_F for lambda_max and its rounding term it also
failed on fp32 matrices of kappa ~3e3 (the band goes to 1e4), which then paid the float64 estimate and
the eigh (1.57x). What it saved above the edge is the eigh less the float64 ``eigvalsh`` it replaces
(whose kappa the eigenvalues give where they prove the band): ~0.5 ms (fp32) to ~1.5 ms (fp64), a few
percent of the matmul solve the table names there (7-9x an eigh's cost in the shipped table).
No guarantee rested on the test: what certifies a decision is the band test on the computed
eigenvalues below (:func:`spectrum_estimate`), and where it cannot, the float64 estimate decides.

Applies only where the usual path's estimate is exact too (one float64 ``eigvalsh``:
``b n^3 <= EXACT_MAX_WORK``), to exactly symmetric input solved in its own format with no psd
policy: there both paths read the eigenvalues of the same matrix A + eps_abs I, so they choose the same
band (the error bound below) and the same configuration.

Error bound (the band test): the computed eigenvalues of a symmetric matrix are exact for a matrix
within n u ||A||_2 of it (backward stability of LAPACK's eigensolver, Weyl's inequality; u: the
format eigh ran in), the input's conversion to that format adds at most sqrt(n) u ||A||_2, and
adding eps_abs (from the computed lambda_max when relative) a few u of the shifted eigenvalue. So each
eigenvalue of A + eps_abs I is within delta = 2 (n + 2) u lambda_max of the computed one plus eps_abs
(a factor 2 to spare), and kappa lies in [(hi - delta) / (lo + delta), (hi + delta) / (lo - delta)];
a band is certain when both ends of that interval fall in it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core import precision
from .auto_plan import Decision, Plan, group_decisions
from .auto_result import Estimate
from .eigh import EighConfig, _ends
from .kappa_estimate import EXACT_MAX_WORK

SOURCE = "eigenvalues of the matrix solved (eigh, decomposed first: no separate estimate)"
#: the most open elements the certificate is tried on (it runs per element, ~0.1-0.2 ms each at
#: n = 128; the float64 estimate runs on the whole batch at once)
MAX_CERTIFIED = 8
#: the source when Weyl's bound left some band open and the eigenpairs' certificate closed it
SOURCE_CERTIFIED = (
    "eigenpairs of the matrix solved (eigh, decomposed first; the band certified by Rayleigh quotients, "
    "Kato-Temple or a float64 Cholesky: no separate estimate)"
)
#: the source when the eigenvalues proved a band whose decision is another solve (then run as usual)
SOURCE_ELSEWHERE = (
    "eigenvalues of the lowest band's eigh (decomposed first; the band they prove chose another solve)"
)
#: the same where the eigenpairs' certificate proved some band (the source of :data:`SOURCE_CERTIFIED`)
SOURCE_ELSEWHERE_CERTIFIED = (
    "eigenpairs of the lowest band's eigh (decomposed first; certified by Rayleigh quotients, "
    "Kato-Temple or a float64 Cholesky; the band they prove chose another solve)"
)


def first_decision(
    plan: Plan, b: int, n: int, psd: str, exact_symmetric: bool, rounded: bool
) -> Decision | None:
    """The decision of the lowest kappa band when auto can decompose first (module docstring), else
    None. ``psd``: the rank-deficiency policy the solve would apply; ``rounded``: the input is rounded
    to another working format."""
    if not exact_symmetric or rounded or psd != "none" or b * n**3 > EXACT_MAX_WORK:
        return None
    if plan.kappa_free or not len(plan.edges):
        return None
    d = plan.decision(1.0)  # kappa >= 1: the lowest band
    if type(d.config) is not EighConfig or d.config.psd != "none":
        return None
    return d


def decomposed_ends(prob: Any, w: Any) -> dict[str, list[float]]:
    """``lambda_min``, ``lambda_max`` and ``eps_abs`` per element (float64, user units) of a
    decomposition's ascending eigenvalues ``w``, the numbers :meth:`EighConfig._root_spectrum`
    records (no psd policy here: :func:`first_decision`), from one strided copy read in one
    ``tolist``: the band is decided before any configuration's spectrum is computed, so only the
    chosen one's is (the lowest band's eigh[clamp] at fp64 computed one that eigh[perturb] dropped)."""
    s = prob.prescale  # a power of two: the divisions are exact, as the tensor path's
    if w.device.type == "cpu":  # numpy views: no torch dispatch (the float64 values of _ends(w))
        wn = w.detach().numpy()
        pairs = zip(wn[:, 0].astype(np.float64).tolist(), wn[:, -1].astype(np.float64).tolist(), strict=True)
    else:
        pairs = _ends(w).tolist()
    lows, highs, shifts = [], [], []
    for lo, hi in pairs:
        eps_abs = 0.0
        if prob.eps > 0:  # regularize.working_shift / s, on the same float64 roundings
            eps_abs = float(prob.eps) * abs(hi) / s if prob.eps_mode == "relative" else float(prob.eps)
        lows.append(lo / s)
        highs.append(hi / s)
        shifts.append(eps_abs)
    return {"lambda_min": lows, "lambda_max": highs, "eps_abs": shifts}


def spectrum_estimate(
    plan: Plan,
    info: dict[str, Any],
    n: int,
    lapack: Any,
    certify: Callable[[list[int]], list[float | None]] | None = None,
) -> Estimate | None:
    """kappa(A + eps_abs I) per element from an eigh run's ``lambda_min``, ``lambda_max`` and
    ``eps_abs`` (float64, user units; tensors or lists), when each element's band is certain (the
    module docstring's bound, ``lapack``: the format eigh ran in); None when some element's is not.
    ``certify``: for the elements that bound leaves open, their kappa where a sharper certificate
    proves the band, else None (:func:`matroots.solvers.auto_certificate.certified_kappa`)."""
    u = precision.unit_roundoff(lapack)
    lows, highs, shifts = (_floats(info[k]) for k in ("lambda_min", "lambda_max", "eps_abs"))  # (b,) each
    kappa: list[float] = []
    open_rows = []
    for i, (lo_, hi_, s) in enumerate(zip(lows, highs, shifts, strict=True)):
        lo, hi = lo_ + s, hi_ + s  # float64, as the usual path's estimate forms them
        delta = 2.0 * (n + 2) * u * abs(hi)
        if math.isfinite(hi) and lo - delta > 0:
            k_lo = max(1.0, (hi - delta) / (lo + delta))
            if plan.band(k_lo) == plan.band((hi + delta) / (lo - delta)):
                kappa.append(hi / lo)
                continue
        if certify is None:
            return None
        kappa.append(math.nan)
        open_rows.append(i)
    if not open_rows:
        return Estimate(kappa, SOURCE, 0.0, True)
    if len(open_rows) > MAX_CERTIFIED:  # one element at a time: past a few, the batched estimate is cheaper
        return None
    for i, k in zip(open_rows, certify(open_rows), strict=True):
        if k is None:
            return None
        kappa[i] = k
    return Estimate(kappa, SOURCE_CERTIFIED, 0.0, True)


def _floats(v: Any) -> list[float]:
    return v.tolist() if hasattr(v, "tolist") else list(v)


def reuses(d: Decision, first: Decision) -> bool:
    """Whether decision ``d`` solves from ``first``'s decomposition: an EighConfig equal to ``first``'s
    but for the rank policy (``rank_policy``, ``atol``, ``rtol``: read only after the decomposition,
    :meth:`matroots.solvers.eigh.EighConfig._decompose`), with the same solve options -- so the same
    problem, working matrix and eigh as its own solve, bit for bit."""
    a, f = d.config, first.config
    if type(a) is not EighConfig or type(f) is not EighConfig or d.solve_options != first.solve_options:
        return False
    return a == f or all(
        getattr(a, x.name) == getattr(f, x.name) for x in dataclasses.fields(a) if x.name not in _RANK_FIELDS
    )


_RANK_FIELDS = frozenset({"rank_policy", "atol", "rtol"})


def reusing(plan: Plan, kappa: list[float], first: Decision) -> tuple | None:
    """The one group of decisions for ``kappa`` (exact, per element) when it solves from ``first``'s
    decomposition (:func:`reuses`), as :func:`~matroots.solvers.auto_plan.group_decisions` gives it;
    else None (several groups, or a solve that cannot reuse it)."""
    decided = group_decisions(plan, kappa)
    return decided[0] if len(decided) == 1 and reuses(decided[0][0], first) else None


@dataclass(slots=True)
class Decomposed:
    """What decomposing first computed, kept for the solve that reuses it: the lowest band's
    decision, the chosen template's problem, the decomposition, the group's options, the start
    time of the solve, and (where :func:`spectrum_first`) the decomposition's notes before
    ``first``'s spectrum and that spectrum (else None: no configuration's spectrum yet)."""

    first: Decision
    prob: Any
    dec: Any
    group: Any
    t1: float
    notes: dict | None = None
    spectrum: Any = None


def spectrum_first(plan: Plan, first: Decision, n: int, lapack: Any) -> bool:
    """Whether ``first``'s own root spectrum is computed with the decomposition (as its solve does),
    before the band is known: where no band below kappa ``limit`` decides another rank policy of the
    same eigh, the solves that reuse the decomposition there are ``first``'s, and the band test reads
    that spectrum's notes (fp32 in the shipped table). Else the band is read off the ends of the
    eigenvalues (:func:`decomposed_ends`) and only the chosen configuration's spectrum is computed
    (fp64: eigh[clamp] below kappa 1e2, eigh[perturb] above). ``limit`` = 1 / (2 (n + 2) u),
    ``lapack`` the format eigh runs in: past it the computed eigenvalues prove no band (lambda_min
    within delta), and a band up there (fp32: the best effort eigh[clamp] from 1e10) rarely reuses
    the decomposition. Memoised on the plan (one n, one format)."""
    if plan.first_spectrum is None:
        limit = 1.0 / (2.0 * (n + 2) * precision.unit_roundoff(lapack))
        below = [1.0, *(k for k in plan.edges.tolist() if k < limit)]
        plan.first_spectrum = not any(
            d.config != first.config and reuses(d, first) for d in map(plan.decision, below)
        )
    return plan.first_spectrum


def same_solve(d: Decision, first: Decision) -> bool:
    """Whether decision ``d`` solves as ``first`` does (configuration, its solve options, status)."""
    return (
        d.label == first.label
        and d.status == first.status
        and d.config == first.config
        and d.solve_options == first.solve_options
    )


__all__ = [
    "MAX_CERTIFIED",
    "SOURCE",
    "SOURCE_CERTIFIED",
    "SOURCE_ELSEWHERE",
    "SOURCE_ELSEWHERE_CERTIFIED",
    "Decomposed",
    "decomposed_ends",
    "first_decision",
    "reuses",
    "reusing",
    "same_solve",
    "spectrum_estimate",
    "spectrum_first",
]
