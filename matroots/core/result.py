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
            for eigh, which computes none (``info["residual_note"]`` says so; use matroots.truth.metrics).
        history: per-iteration residuals when ``record_history=True``, else empty.
        matmuls: cost in n-by-n matrix-product equivalents (GEMMs). Matrix-vector work of the
            spectral estimates is counted as the equivalent fraction of a GEMM.
        seconds: wall time of the call.
        method: registry name of the solver.
        dtype: the working dtype.
        info: free-form diagnostics (stop reason, scaling, dtype fallbacks, eps used, ...).
        finite_checked: True when ``converged`` promises a finite root: the result went through the
            solver template's finalisation (``SolverConfig._finalise``), which marks a non-finite root
            not converged. False for a result built elsewhere (a config overriding ``solve``), whose
            caller must test the root itself.
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
    finite_checked: bool = False

    @property
    def all_converged(self) -> bool:
        """True when every batch element converged."""
        c = self.converged
        return bool(c.all()) if isinstance(c, torch.Tensor) else bool(c)


def info_per_element(value: Any, b: int, *, missing: float = 0.0) -> list[float]:
    """A per-element ``info`` value (tensor, array, list/tuple or number) as ``b`` floats.

    ``None`` gives ``missing`` for every element; a single value is broadcast; anything else must
    hold exactly ``b`` values (a ``ValueError`` otherwise: a solver reported an info entry that
    does not match its batch).
    """
    if value is None:
        return [missing] * b
    if isinstance(value, torch.Tensor):
        v = value.detach().double().reshape(-1).cpu().tolist()
    elif isinstance(value, int | float):
        v = [float(value)]
    else:
        try:
            v = [float(x) for x in value]
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"info value must be a number, tensor or sequence of numbers, got {value!r}"
            ) from exc
    if len(v) == 1:
        return v * b
    if len(v) != b:
        raise ValueError(f"info value holds {len(v)} elements for a batch of {b}")
    return v
