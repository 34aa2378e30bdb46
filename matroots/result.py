"""The result object every solver returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RootResult:
    """Outcome of one (possibly batched) root computation.

    Attributes:
        root: the computed root, same batch shape as the input, in the working ``dtype``.
        converged: ``bool`` for a single matrix, a bool tensor of the batch shape otherwise.
        iterations: iterations spent (0 for direct methods); int or int tensor.
        residual: the method's own final error estimate (``||M_k - I||_F`` for Newton methods); NaN
            for eigh, which computes none (``info["residual_note"]`` says so; use matroots.metrics).
        history: per-iteration residuals when ``record_history=True``, else empty.
        matmuls: cost in n-by-n matrix-product equivalents (GEMMs). Matrix-vector work of the
            spectral estimates is counted as the equivalent fraction of a GEMM.
        seconds: wall time of the call.
        method: registry name of the solver.
        dtype: the working dtype.
        info: free-form diagnostics (stop reason, scaling, dtype fallbacks, eps used, ...).
    """

    root: torch.Tensor
    converged: bool | torch.Tensor
    iterations: int | torch.Tensor
    residual: float | torch.Tensor
    history: list[Any] = field(default_factory=list)
    matmuls: float = 0.0
    seconds: float = 0.0
    method: str = ""
    dtype: torch.dtype = torch.float64
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def all_converged(self) -> bool:
        """True when every batch element converged."""
        c = self.converged
        return bool(c.all()) if isinstance(c, torch.Tensor) else bool(c)
