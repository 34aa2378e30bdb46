"""Rank-deficiency policies: what every solver does with a positive *semi*definite input.

Shampoo's Kronecker factors L = sum_t G_t G_t^T are PSD and, early in training, rank deficient
(a 64 x 2 layer gives rank 2 after one step). Rounded to fp32 their null-space eigenvalues come out as
rounding noise of either sign, |lambda| ~ sqrt(n) u ||A||. The inverse root of such a matrix does not
exist; a policy says which nearby matrix is solved instead. The policy is applied **before** the
method runs, by one definition for every method, so eigh, coupled Newton and Schur-Newton solve the
same matrix (and the requested eps is added on top, by :mod:`matroots.core.regularize`):

* ``"none"`` (matroots' default): nothing is done. A matrix that is not positive definite after the
  eps shift makes the SPD methods raise :class:`~matroots.core.errors.NotPositiveDefiniteError` (eigh's own
  ``rank_policy`` still applies to eigh).
* ``"shift"`` (Shampoo's default): a certified shift to an eigenvalue floor. With the floor

      f = n * u * ||A||_F,   u = unit roundoff of the coarser of the input's own format and the
                                 working format (an fp32 factor solved in fp64 carries fp32 noise),

  the shift is the smallest s in {0, f, 2f, 4f, ...} for which the Cholesky factorisation of
  A + (s - f) I succeeds in the compute format (LAPACK's: fp32 for the 16-bit formats). The matrix
  solved is A + s I (+ eps), whose smallest eigenvalue is therefore >= f up to Cholesky's backward
  error (~sqrt(n) u ||A|| << f): its condition number is at most ~||A||_2 / f <= 1/(n u), which every
  method can handle in the working precision. A matrix whose smallest eigenvalue is already >= f is
  not touched (s = 0); a rank-deficient one gets s in [f, 2f] plus its rounding-negative part. The
  doubling stops at the Gershgorin bound s_G = f - min_i(a_ii - sum_{j != i} |a_ij|), which makes
  A + (s_G - f) I diagonally dominant, so the search always ends (at most ~log2(s_G / f) Choleskys).
  Cost: one Cholesky (~1/6 of a GEMM's flops, ~2 GEMMs of time at n = 256 on one CPU thread) for
  a factor that needs no shift.
  Methods that work on eigenvalues (eigh: "shift" in its ``psd_on_eigenvalues``) decide the same
  rule on their own computed spectrum instead of by Cholesky: with w_min the smallest computed eigenvalue
  of A, s is the smallest of {0, f, 2f, 4f, ...} with w_min + s - f > 0 (the exact-arithmetic
  condition for the Cholesky test to succeed), capped at the same Gershgorin bound, and is added
  to the computed eigenvalues (as eps is). The certificate is as strong: the computed eigenvalues
  of a symmetric matrix are within ~sqrt(n) u ||A||_2 of the exact ones (backward stability and
  Weyl's inequality), the order of Cholesky's backward error, both << f. So the matrix solved is
  again A + s I with lambda_min >= f; only a factor whose lambda_min(A) - f lies within that
  rounding of 0 may get the neighbouring s (f instead of 0, or 2f instead of f). Cost: nothing
  beyond ||A||_F (measured, Shampoo at d_model 512: the Cholesky searches were 14% of a root round).
* ``"meta"``: the rule of Meta's DistributedShampoo (``PerturbationConfig``, the default
  ``perturb_before_computation=True``, in ``matrix_functions.py``): with lambda_min the smallest
  computed eigenvalue of A, the matrix solved is A + max(0, -lambda_min) I + eps I, i.e. the
  eigenvalues are shifted by -lambda_min + eps when lambda_min(A + eps I) < eps. There is no floor:
  with eps = 1e-12 a rank-deficient fp32 factor is solved with kappa ~ lambda_max / 1e-12. Methods
  that work on eigenvalues (eigh and eigh_warm: "meta" in their ``psd_on_eigenvalues``) apply the
  shift to their own computed eigenvalues exactly as Meta does; the others get lambda_min from
  ``torch.linalg.eigvalsh`` in the compute format and the shift on the diagonal.

What was applied is reported in ``res.info``: ``psd_policy``, ``psd_shift`` (absolute shift s per
matrix, in the user's units), ``psd_floor`` (f; NaN under "meta"), ``psd_cholesky_calls``,
``psd_certificate`` ("shift": "cholesky" or "computed eigenvalues"), and
``regularisation_abs`` = psd_shift + eps_abs, the whole absolute shift of the matrix actually solved.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from . import precision
from .errors import InvalidArgumentError
from .regularize import add_to_diagonal
from .result import info_per_element

PSD_POLICIES = ("none", "shift", "meta")
_DEFER_KEY = "psd_deferred_to_eigenvalues"


def check_policy(value: object) -> str:
    """The policy name ``value`` stands for; raises InvalidArgumentError for anything else."""
    if isinstance(value, str) and value.lower() in PSD_POLICIES:
        return value.lower()
    raise InvalidArgumentError(
        f"psd policy must be one of {PSD_POLICIES} (see matroots.core.psd), got {value!r}"
    )


def floor_level(A: torch.Tensor, source_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The eigenvalue floor f = n u ||A||_F per batch element (float64, A's units), see the module doc."""
    u = precision.unit_roundoff(A.dtype)
    if source_dtype is not None:
        u = max(u, precision.unit_roundoff(source_dtype))
    work = A if A.dtype in (torch.float32, torch.float64) else A.float()
    return A.shape[-1] * u * torch.linalg.matrix_norm(work).double()


def _gershgorin_lower(W: torch.Tensor) -> torch.Tensor:
    """min_i (a_ii - sum_{j != i} |a_ij|) per batch element (float64): a lower bound of lambda_min."""
    d = torch.diagonal(W, dim1=-2, dim2=-1).double()
    # row sums of |W| in cache-sized chunks of the batch (per row the same reduction, so the same
    # bits as one batched call, without a full-size |W| temporary)
    step = max(1, 65536 // (W.shape[-1] * W.shape[-1]))
    absrow = torch.cat([W[i : i + step].abs().sum(-1) for i in range(0, W.shape[0], step)])
    r = absrow.double() - d.abs()
    return (d - r).min(-1).values


def _candidate_search(
    f: torch.Tensor,
    s_g: torch.Tensor,
    todo: torch.Tensor,
    passes: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The "shift" policy's search (float64, per batch element; 0 outside ``todo``): for the elements
    ``todo``, the smallest s in {0, f, 2f, 4f, ...} with ``passes(rows, s)`` (a (k,) bool tensor for
    the candidates s of the elements rows); past the Gershgorin bound s_G, s_G itself (diagonally
    dominant, hence positive definite in exact arithmetic; a little margin for rounding)."""
    shift = torch.zeros_like(f)
    cand = torch.zeros_like(f)
    while todo.numel():
        ok = passes(todo, cand[todo])
        done = todo[ok]
        shift[done] = cand[done]
        todo = todo[~ok]
        if not todo.numel():
            break
        nxt = torch.where(cand[todo] > 0, 2.0 * cand[todo], f[todo])  # 0 -> f -> 2f -> ...
        over = nxt >= s_g[todo]
        if bool(over.any()):
            last = todo[over]
            shift[last] = s_g[last] * (1.0 + 1e-3) + f[last] * 1e-3
            todo, nxt = todo[~over], nxt[~over]
        cand[todo] = nxt
    return shift


def certified_shift(
    A: torch.Tensor, floor: torch.Tensor, compute_dtype: torch.dtype
) -> tuple[torch.Tensor, int]:
    """The "shift" policy's s per batch element (float64) and the number of batched Cholesky calls.

    ``A`` is (b, n, n) in the working format, ``floor`` the (b,) floor f in A's units. A candidate
    passes when the Cholesky factorisation of A + (s - f) I succeeds in the compute format.
    """
    W = A.to(precision.lapack_dtype(compute_dtype))
    b = W.shape[0]
    f = floor.double().cpu()
    todo = torch.nonzero(f > 0).flatten()  # a zero matrix has no floor: the eps (or the solver) decides
    if todo.numel() == 0:
        return torch.zeros(b, dtype=torch.float64), 0
    s_g = (f - _gershgorin_lower(W).cpu()).clamp_min(0.0)
    calls = 0

    def cholesky_passes(rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        # the matrices still searching, shifted (a fresh buffer; the whole batch needs no gather)
        sub = W if rows.numel() == b else W.index_select(0, rows.to(W.device))
        _, info = torch.linalg.cholesky_ex(add_to_diagonal(sub, (cand - f[rows]).to(W.device)))
        calls += 1
        return (info == 0).cpu()

    return _candidate_search(f, s_g, todo, cholesky_passes), calls


def meta_shift(eigenvalues_min: torch.Tensor) -> torch.Tensor:
    """Meta's DistributedShampoo shift max(0, -lambda_min) per batch element (float64)."""
    return (-eigenvalues_min.double()).clamp_min(0.0)


def apply(prob: Any, policy: str, *, on_eigenvalues: bool = False) -> None:
    """Apply ``policy`` to a prepared :class:`matroots.core.inputs.Problem` in place (``prob.A`` is replaced
    by the shifted matrix, never written to) and record what was done in ``prob.info``.

    ``on_eigenvalues``: the method decides and applies this policy's shift on its own computed
    eigenvalues (see :func:`eigenvalue_shift`; "meta", and "shift" for eigh); the matrix is then left
    as it is here and only the floor is computed.
    """
    policy = check_policy(policy)
    info = prob.info
    info["psd_policy"] = policy
    if policy == "none":
        return
    A = prob.A
    b = A.shape[0]
    s = prob.prescale
    if policy == "shift":
        f = floor_level(A, prob.source_dtype)
        info["psd_floor"] = f / s
        if on_eigenvalues:
            info[_DEFER_KEY] = ("shift", f)
            info["psd_cholesky_calls"] = 0
            info["psd_certificate"] = "computed eigenvalues"
            info["psd_shift"] = torch.zeros(b, dtype=torch.float64)
            return
        shift, calls = certified_shift(A, f, prob.compute_dtype)
        info["psd_cholesky_calls"] = calls
        info["psd_certificate"] = "cholesky"
    else:
        info["psd_floor"] = torch.full((b,), math.nan, dtype=torch.float64)
        info["psd_cholesky_calls"] = 0
        if on_eigenvalues:
            info[_DEFER_KEY] = ("meta", None)
            info["psd_shift"] = torch.zeros(b, dtype=torch.float64)
            return
        W = A.to(precision.lapack_dtype(prob.compute_dtype))
        W = 0.5 * (W + W.mT)
        lmin = torch.linalg.eigvalsh(W)[..., 0].cpu()
        info["psd_eigvalsh_calls"] = 1
        shift = meta_shift(lmin)
    if bool((shift > 0).any()):
        if prob.private:  # a buffer of this solve: shift it in place (same values)
            torch.diagonal(A, dim1=-2, dim2=-1).add_(shift.to(device=A.device, dtype=A.dtype).unsqueeze(-1))
        else:
            prob.A = add_to_diagonal(A, shift.to(A.device))
    info["psd_shift"] = shift / s


def eigenvalue_shift(prob: Any, w: torch.Tensor) -> torch.Tensor | None:
    """For a method with ``psd_on_eigenvalues``: the (b,) shift (float64, prescaled units) to add to
    its computed eigenvalues ``w`` of ``prob.A`` (ascending, prescaled units) under the "meta" or
    "shift" policy, recorded in ``prob.info``; None when the policy deferred nothing."""
    deferred = prob.info.pop(_DEFER_KEY, None)
    if deferred is None:
        return None
    policy, floor = deferred
    if policy == "meta":
        shift = meta_shift(w[..., 0])
    else:
        shift = eigenvalue_certified_shift(prob.A, w[..., 0], floor)
    prob.info["psd_shift"] = shift / prob.prescale
    return shift


def eigenvalue_certified_shift(A: torch.Tensor, w_min: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """The "shift" policy's s per batch element (float64) decided on computed eigenvalues.

    The search of :func:`certified_shift` (the same candidates and Gershgorin cap) with its Cholesky
    test of A + (s - f) I replaced by the exact-arithmetic condition w_min + s - f > 0. ``A`` (b, n, n)
    is read only for the Gershgorin bound of the elements that need a shift.
    """
    lo = w_min.double().cpu()
    f = floor.double().cpu()
    todo = ((f > 0) & (lo - f <= 0)).nonzero().flatten()  # s = 0 fails; a zero matrix has no floor
    if todo.numel() == 0:
        return torch.zeros_like(f)
    W = A.index_select(0, todo.to(A.device))
    if W.dtype not in (torch.float32, torch.float64):
        W = W.float()
    s_g = torch.full_like(f, math.inf)
    s_g[todo] = (f[todo] - _gershgorin_lower(W).cpu()).clamp_min(0.0)
    return _candidate_search(f, s_g, todo, lambda rows, cand: lo[rows] + cand - f[rows] > 0)


def report(info: dict[str, Any], b: int) -> None:
    """Add ``regularisation_abs`` = psd_shift + eps_abs (per element, user units) to ``info``."""
    psd, eps = info.get("psd_shift"), info.get("eps_abs")
    if psd is None and eps is None:
        return
    if psd is None and isinstance(eps, torch.Tensor) and eps.dtype == torch.float64 and eps.numel() == b:
        # no psd shift (policy "none"): the sum below is eps_abs + 0, i.e. eps_abs itself (a fresh
        # (b,) float64 CPU tensor, the same values), in one operation instead of seven
        if eps.device.type == "cpu" and eps.shape == (b,) and not eps.requires_grad:
            info["regularisation_abs"] = eps.clone()  # already one: a copy is all it takes
        else:
            info["regularisation_abs"] = eps.detach().to("cpu", copy=True).reshape(b)
        return
    info["regularisation_abs"] = torch.tensor(info_per_element(psd, b), dtype=torch.float64) + torch.tensor(
        info_per_element(eps, b), dtype=torch.float64
    )


__all__ = [
    "PSD_POLICIES",
    "apply",
    "certified_shift",
    "check_policy",
    "eigenvalue_shift",
    "floor_level",
    "meta_shift",
    "report",
]
