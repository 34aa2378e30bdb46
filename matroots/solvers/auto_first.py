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
path estimates kappa as before.

Before decomposing, one Cholesky of A - c I (:func:`likely_certain`, c from ||A||_F and the lowest
band edge whose solve cannot reuse the decomposition, :func:`eigh_limit`) tells whether the
eigenvalues are likely to prove such a band; where it fails (kappa likely at or above that edge, or
lambda_min within the error bound) auto estimates kappa first, as it does without a decomposing band,
and no decomposition is wasted. The test decides the cost only: either path returns what the solver
it runs returns.

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
from typing import Any

import numpy as np
import torch
from scipy.linalg import lapack as lapack_routines

from ..core import precision
from .auto_plan import Decision, Plan
from .auto_result import Estimate
from .eigh import EighConfig
from .kappa_estimate import EXACT_MAX_WORK

SOURCE = "eigenvalues of the matrix solved (eigh, decomposed first: no separate estimate)"
#: the source when the eigenvalues proved a band whose decision is another solve (then run as usual)
SOURCE_ELSEWHERE = (
    "eigenvalues of the lowest band's eigh (decomposed first; the band they prove chose another solve)"
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


def spectrum_estimate(plan: Plan, info: dict[str, Any], n: int, lapack: Any) -> Estimate | None:
    """kappa(A + eps_abs I) per element from an eigh run's ``lambda_min``, ``lambda_max`` and
    ``eps_abs`` (float64, user units), when each element's band is certain (the module docstring's
    bound, ``lapack``: the format eigh ran in); None when some element's is not."""
    u = precision.unit_roundoff(lapack)
    lows, highs, shifts = (info[k].tolist() for k in ("lambda_min", "lambda_max", "eps_abs"))  # (b,) each
    kappa = []
    for lo_, hi_, s in zip(lows, highs, shifts, strict=True):
        lo, hi = lo_ + s, hi_ + s  # float64, as the usual path's estimate forms them
        delta = 2.0 * (n + 2) * u * abs(hi)
        if not (math.isfinite(hi) and lo - delta > 0):
            return None
        k_lo = max(1.0, (hi - delta) / (lo + delta))
        if plan.band(k_lo) != plan.band((hi + delta) / (lo - delta)):
            return None
        kappa.append(hi / lo)
    return Estimate(kappa, SOURCE, 0.0, True)


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


def eigh_limit(plan: Plan, first: Decision) -> float:
    """The lowest kappa band edge from which the table decides a solve that cannot reuse ``first``'s
    decomposition (:func:`reuses`); inf when none does. Memoised on the plan."""
    hit = plan.limits.get(first.label)
    if hit is None:
        hit = math.inf
        for edge in plan.edges.tolist():
            if edge > 1.0 and not reuses(plan.decision(edge), first):  # kappa = edge: the band above it
                hit = float(edge)
                break
        plan.limits[first.label] = hit
    return hit


def likely_certain(det: torch.Tensor, limit: float, lapack: torch.dtype) -> bool:
    """The cheap test before decomposing first (performance only: either path returns what the
    chosen solver returns): whether A - c I is positive definite for every element (one Cholesky),
    c = ||A||_F (1 / limit + 4 (n + 2) u). Passing means (up to the Cholesky's own rounding)
    lambda_min > lambda_max / limit + 2 delta (||A||_F >= lambda_max; delta: the band test's bound),
    so the eigenvalues will likely prove a band below ``limit``, one whose solve reuses the
    decomposition; failing, auto estimates kappa first as it does without a decomposing band."""
    n = det.shape[-1]
    det = det if det.dtype == lapack else det.to(lapack)  # fp16 / bf16: the format eigh runs in
    scale = 1.0 / limit + 4.0 * (n + 2) * precision.unit_roundoff(lapack)
    if det.device.type != "cpu" or det.dtype not in _POTRF:
        c = torch.linalg.matrix_norm(det) * scale
        M = det.clone()
        M.diagonal(dim1=-2, dim2=-1).sub_(c.unsqueeze(-1))
        return not bool(torch.linalg.cholesky_ex(M).info.any())
    # on the CPU, LAPACK's potrf itself (a third of torch's cholesky_ex at n = 128 in fp32), per element
    potrf = getattr(lapack_routines, _POTRF[det.dtype])
    for a in det.numpy():
        m = np.array(a.T, order="F")  # A^T = A (exactly symmetric): a plain copy, column-major
        # the diagonal through a strided view of the buffer (m.T is row-major: reshape is a view), and
        # ||A||_F as np.linalg.norm forms it (sqrt of the flat dot product): the same numbers as
        # m.flat[:: n + 1] -= np.linalg.norm(a) * scale, without the flat iterator's per-element
        # indexing and norm's dispatch (~70 us of a ~140 us test at n = 128 after an eigh)
        flat = a.reshape(-1)
        m.T.reshape(-1)[:: n + 1] -= float(np.sqrt(flat.dot(flat))) * scale
        if potrf(m, lower=1, clean=0, overwrite_a=1)[1] != 0:
            return False
    return True


_POTRF = {torch.float32: "spotrf", torch.float64: "dpotrf"}


def same_solve(d: Decision, first: Decision) -> bool:
    """Whether decision ``d`` solves as ``first`` does (configuration, its solve options, status)."""
    return (
        d.label == first.label
        and d.status == first.status
        and d.config == first.config
        and d.solve_options == first.solve_options
    )


__all__ = [
    "SOURCE",
    "SOURCE_ELSEWHERE",
    "eigh_limit",
    "first_decision",
    "likely_certain",
    "reuses",
    "same_solve",
    "spectrum_estimate",
]
