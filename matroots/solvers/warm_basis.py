"""The warm start of :mod:`matroots.solvers.eigh_warm`: an eigenbasis, checked before it is used.

``warm_start`` may be a previous eigh_warm :class:`~matroots.core.result.RootResult` (its
``info["eigenvectors"]`` and ``info["basis_defect"]``) or an eigenvector tensor / array of shape
(..., n, n) (one per matrix, or one for all). A basis of the wrong shape is a caller error
(InvalidArgumentError); a non-finite or non-orthonormal one (for instance a previous *root* passed by
mistake) is not used: the element falls back to the full eigh, and ``info["warm"]`` says why. A defect
that is not a number (the estimate's Q^T Q overflowed, e.g. for 1e20 Q in fp32) is not small.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..core import precision
from ..core.errors import InvalidArgumentError
from ..core.inputs import all_finite
from ..core.result import RootResult

_PROBES = 8  # random vectors of the orthogonality estimate
_MAX_DEFECT = 1e-2  # a warm basis further from orthonormal than this is refused (fallback)


def _norm2(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.matrix_norm(x).double()


def _orthogonality_defect(Q: torch.Tensor) -> torch.Tensor:
    """Randomized estimate of ||Q^T Q - I||_F per element (float64, CPU), times a safety factor of 3.

    Hutchinson's identity E ||M z||^2 = ||M||_F^2 for z ~ N(0, I) with 8 probes (two thin products,
    16/n of a GEMM); for the worst case (M of rank one) it underestimates by 3x with probability ~1e-3.
    """
    b, n = Q.shape[0], Q.shape[-1]
    g = torch.Generator(device=Q.device).manual_seed(0x5EED)
    Z = torch.randn(b, n, _PROBES, generator=g, device=Q.device, dtype=torch.float64).to(Q.dtype)
    R = Q.mT @ (Q @ Z) - Z
    est = 3.0 * _norm2(R) / math.sqrt(_PROBES)
    return torch.maximum(est.cpu(), torch.full_like(est.cpu(), n * precision.unit_roundoff(Q.dtype)))


def warm_basis(ws: object, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[str]] | None:
    """(Q, defect bound, per-element reason not to use it) from ``warm_start`` for the batch A
    (b, n, n); None for a cold call."""
    if ws is None:
        return None
    b, n = A.shape[0], A.shape[-1]
    defect = None
    if isinstance(ws, RootResult):
        info = ws.info if isinstance(ws.info, dict) else {}
        Q = info.get("eigenvectors")
        if Q is None:
            raise InvalidArgumentError(
                f"warm_start is a result of method {ws.method!r} without "
                "info['eigenvectors']; eigh_warm starts from an eigenbasis: pass a previous eigh_warm "
                "result or an eigenvector tensor of shape (..., n, n)"
            )
        defect = info.get("basis_defect")
    else:
        Q = ws
    if isinstance(Q, np.ndarray):
        Q = torch.from_numpy(Q)
    if not isinstance(Q, torch.Tensor) or Q.ndim < 2 or tuple(Q.shape[-2:]) != (n, n):
        shape = tuple(Q.shape) if isinstance(Q, torch.Tensor) else type(Q).__name__
        raise InvalidArgumentError(
            f"warm_start eigenbasis must have shape (..., {n}, {n}) like A, got {shape}"
        )
    Q = Q.detach().reshape(-1, n, n)
    if Q.shape[0] not in (1, b):
        raise InvalidArgumentError(
            f"warm_start holds {Q.shape[0]} eigenbases for a batch of {b} matrices; pass one per matrix "
            "(same batch shape as A) or a single (n, n) basis for all"
        )
    Q = Q.to(device=A.device, dtype=A.dtype).expand(b, n, n)
    finite = torch.ones(b, dtype=torch.bool) if all_finite(Q) else torch.isfinite(Q).flatten(1).all(-1).cpu()
    if defect is not None:
        dv = torch.as_tensor(defect, dtype=torch.float64).reshape(-1).cpu()
        defect = dv.expand(b).clone() if dv.numel() in (1, b) else None
    if defect is None:
        defect = _orthogonality_defect(
            torch.where(finite.to(Q.device).view(-1, 1, 1), Q, torch.zeros_like(Q))
        )
    bad = []
    for i in range(b):
        if not bool(finite[i]):
            bad.append("warm basis has non-finite entries")
        elif not float(defect[i]) <= _MAX_DEFECT:  # NaN too: Q^T Q of a scaled basis can overflow
            bad.append(
                f"warm basis is not orthonormal (||Q^T Q - I||_F ~ {float(defect[i]):.2e}, not <= "
                f"{_MAX_DEFECT:g})"
            )
        else:
            bad.append("")
    return Q, defect, bad


__all__ = ["warm_basis"]
