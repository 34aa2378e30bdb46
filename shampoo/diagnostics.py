"""Per-block root diagnostics, and dumps of the factor matrices for the accuracy studies.

Dump layout (one file per dump, read by ``matroots.matrices.load_shampoo_factors``)::

    <dump_dir>/factors_step{step:07d}.npz
        factor_0, factor_1, ...   float64 (n, n): the raw factor statistics (before bias correction)
        meta                      str array, one JSON object per factor, with the keys
                                  param, block, dim, step, beta2, eps (and n, root_p, eps_mode,
                                  bias_correction: the divisor 1 - beta2^t applied before the root)

``step`` in the file name is the optimizer's global step; ``step`` in ``meta`` is the parameter's own
step count (they differ only for parameters that skipped updates).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .state import BlockState, FactorState


@dataclass(frozen=True)
class FactorDiagnostics:
    """The last root computation of one Kronecker factor."""

    dim: int
    n: int
    root_p: str
    solver: str
    iterations: int
    residual: float
    converged: bool
    has_root: bool
    root_step: int
    consecutive_failures: int
    failures: int
    primary_failures: int
    fallback_uses: int
    seconds: float
    kappa: float
    error: str

    @classmethod
    def of(cls, f: FactorState) -> FactorDiagnostics:
        return cls(
            dim=f.dim,
            n=f.n,
            root_p=str(f.root_p),
            solver=f.solver,
            iterations=int(f.iterations),
            residual=float(f.residual),
            converged=bool(f.converged),
            has_root=bool(f.has_root),
            root_step=int(f.root_step),
            consecutive_failures=int(f.consecutive_failures),
            failures=int(f.failures),
            primary_failures=int(f.primary_failures),
            fallback_uses=int(f.fallback_uses),
            seconds=float(f.seconds),
            kappa=float(f.kappa),
            error=f.error,
        )


@dataclass(frozen=True)
class BlockDiagnostics:
    """Diagnostics of one block: its identity and one :class:`FactorDiagnostics` per factor."""

    param: str | int
    block: int
    kind: str
    shape: tuple[int, ...]
    step: int
    factors: tuple[FactorDiagnostics, ...]

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per factor (blocks without factors give one row with NaN root fields)."""
        head = {
            "param": self.param,
            "block": self.block,
            "kind": self.kind,
            "shape": self.shape,
            "step": self.step,
        }
        if not self.factors:
            return [head]
        return [{**head, **asdict(f)} for f in self.factors]


def block_diagnostics(key: str | int, step: int, block: BlockState) -> BlockDiagnostics:
    return BlockDiagnostics(
        param=key,
        block=block.spec.index,
        kind=block.spec.kind.value,
        shape=block.spec.shape,
        step=step,
        factors=tuple(FactorDiagnostics.of(f) for f in block.factors),
    )


def to_frame(diags: list[BlockDiagnostics]) -> Any:
    """A tidy pandas DataFrame, one row per factor."""
    import pandas as pd

    return pd.DataFrame([r for d in diags for r in d.rows()])


def dump_factors(
    directory: str | Path,
    global_step: int,
    entries: list[tuple[str | int, int, FactorState, dict[str, Any]]],
) -> Path:
    """Write the factors to ``directory/factors_step{global_step:07d}.npz`` (see the module docstring).

    ``entries``: (param key, block index, factor, extra meta) per factor.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    out = path / f"factors_step{global_step:07d}.npz"
    arrays: dict[str, np.ndarray] = {}
    meta = []
    for k, (key, block, f, extra) in enumerate(entries):
        arrays[f"factor_{k}"] = f.matrix.detach().cpu().double().numpy()
        meta.append(
            json.dumps(
                {"param": key, "block": block, "dim": f.dim, "n": f.n, "root_p": str(f.root_p), **extra},
                allow_nan=True,
            )
        )
    arrays["meta"] = np.array(meta, dtype=np.str_)
    np.savez(out, **arrays)
    return out


__all__ = ["BlockDiagnostics", "FactorDiagnostics", "block_diagnostics", "dump_factors", "to_frame"]
