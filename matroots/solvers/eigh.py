"""Inverse p-th root by symmetric eigendecomposition.

A = Q diag(lambda) Q^T  =>  A^{-1/p} = Q diag(lambda^{-1/p}) Q^T for any rational p > 0
(Higham, *Functions of Matrices*, 2008, Thm. 1.12 / §1.2). Cost: one ``torch.linalg.eigh`` and one GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import precision
from .. import psd as psd_policy
from ..errors import NotPositiveDefiniteError
from ..inputs import Problem, require_symmetric, symmetric_part
from ..regularize import working_shift
from .base import RawResult, SolverConfig
from .registry import register

RANK_POLICIES = ("perturb", "clamp", "pseudo_inverse")


@register
@dataclass(frozen=True, kw_only=True)
class EighConfig(SolverConfig):
    """Eigendecomposition solver.

    Args:
        rank_policy: what to do with eigenvalues that are not safely positive after the eps shift.
            ``"perturb"`` (default): rely on eps; a non-positive eigenvalue raises
            NotPositiveDefiniteError. ``"clamp"``: floor eigenvalues at ``max(atol, rtol*lambda_max)``.
            ``"pseudo_inverse"``: eigenvalues ``<= max(atol, rtol*lambda_max)`` are dropped (their
            eigen-directions get 0 in the root).
        atol, rtol: the threshold above; ``rtol=None`` means n * u of the compute dtype.
        symmetry_tol: tolerance on ||A - A^T||_F / ||A||_F; None means 100 sqrt(n) u of the input.
    """

    name = "eigh"
    psd_on_eigenvalues = True  # the psd "meta" shift goes on the computed eigenvalues (as Meta's does)
    rank_policy: str = "perturb"
    atol: float = 0.0
    rtol: float | None = None
    symmetry_tol: float | None = None

    def __post_init__(self) -> None:
        if self.rank_policy not in RANK_POLICIES:
            raise ValueError(f"rank_policy must be one of {RANK_POLICIES}, got {self.rank_policy!r}")
        if self.atol < 0 or (self.rtol is not None and self.rtol < 0):
            raise ValueError("atol and rtol must be >= 0")

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        A_sym, defect = symmetric_part(prob.A)
        require_symmetric(prob.A, self.name, prob.symmetry_tol(self.symmetry_tol), defect=defect)
        info: dict = {}
        cdtype = precision.lapack_dtype(prob.compute_dtype)
        if cdtype != prob.compute_dtype:
            info["compute_dtype_fallback"] = (
                f"LAPACK has no {precision.info(prob.compute_dtype).name} eigensolver: "
                f"eigh ran in {precision.info(cdtype).name} on the input rounded to "
                f"{precision.info(prob.dtype).name}"
            )
        A = A_sym.to(cdtype)
        try:
            w, Q = torch.linalg.eigh(A)
        except torch.linalg.LinAlgError as exc:
            if cdtype != torch.float32:
                raise
            info["eigh_retry_fp64"] = f"fp32 eigh failed ({exc}); retried in fp64"
            w, Q = torch.linalg.eigh(A.double())
            w, Q = w.float(), Q.float()
        s = prob.prescale  # report in the user's units (fp16 inputs are pre-scaled by s)
        lmin, lmax = w[..., 0].double(), w[..., -1].double()
        psd_shift = psd_policy.eigenvalue_shift(prob, w)
        if psd_shift is not None:
            w = w + psd_shift.to(device=w.device, dtype=w.dtype).unsqueeze(-1)
        if prob.eps > 0:
            shift = working_shift(prob.eps, prob.eps_mode, lmax, s)
            wr = w + shift.to(w.dtype).unsqueeze(-1)
        else:
            shift, wr = torch.zeros_like(lmax), w
        if s != 1.0:
            lmin, lmax, shift = lmin / s, lmax / s, shift / s
        info.update(lambda_min=lmin, lambda_max=lmax, eps_abs=shift)
        e = -1.0 / float(prob.p) if inverse else 1.0 / float(prob.p)
        if self.rank_policy == "perturb":
            bad = wr[..., 0] <= 0
            if bool(bad.any()):
                worst = float(wr[..., 0].min()) / s
                raise NotPositiveDefiniteError(
                    f"matrix is not positive definite after regularisation: smallest eigenvalue "
                    f"{worst:.3e} (eps_abs={float(shift.max()):.3e}, dtype {precision.info(prob.dtype).name}); "
                    "increase eps, or use rank_policy='clamp' or 'pseudo_inverse'"
                )
            f = wr.pow(e)
        else:
            rtol = self.rtol if self.rtol is not None else prob.n * precision.unit_roundoff(cdtype)
            thresh = torch.clamp(rtol * wr[..., -1:].abs(), min=self.atol * prob.prescale)
            if self.rank_policy == "clamp" and self.atol <= 0 and bool((wr[..., -1] <= 0).any()):
                raise NotPositiveDefiniteError(
                    f"rank_policy='clamp' has nothing to clamp to: the largest eigenvalue is "
                    f"{float(wr[..., -1].min()) / prob.prescale:.3e} <= 0 and atol=0; pass atol > 0 "
                    "or use rank_policy='pseudo_inverse'"
                )
            if self.rank_policy == "clamp":
                f = torch.maximum(wr, thresh).pow(e)
                info["clamped"] = (wr < thresh).sum(-1)
            else:
                keep = wr > thresh
                f = torch.where(keep, wr.clamp_min(torch.finfo(wr.dtype).tiny).pow(e), torch.zeros_like(wr))
                info["dropped"] = (~keep).sum(-1)
                if not inverse:
                    f = torch.where(keep, wr.clamp_min(0).pow(e), torch.zeros_like(wr))
        # X = Q f(Lambda) Q^T = W W^T with W = Q f(Lambda)^{1/2} (f >= 0 here), scaling Q in place: one
        # n x n temporary fewer (at n = 1024 each fresh one costs ~4 ms of page faults). Symmetric up to
        # the GEMM's rounding (~u ||X||); not symmetrised, which would cost a strided pass over X.
        W = Q.mul_(f.sqrt().unsqueeze(-2))
        X = W @ W.mT
        b = prob.A.shape[0]
        info["eigh_calls"] = 1
        info["residual_note"] = "eigh reports no residual (NaN); use matroots.metrics for errors"
        return RawResult(
            root=X,
            converged=torch.ones(b, dtype=torch.bool),
            iterations=torch.zeros(b, dtype=torch.int64),
            residual=torch.full((b,), float("nan"), dtype=torch.float64),
            matmuls=1.0,
            info=info,
        )
