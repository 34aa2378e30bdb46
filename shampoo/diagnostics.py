"""Per-block root diagnostics, the step's timing (:class:`StepTiming`), and dumps of the factor matrices for the accuracy studies.

Factor dumps use the layout documented in :mod:`matroots.core.factor_dump` (version 1, read by
``matroots.core.factor_dump.load_shampoo_factors``): ``<dump_dir>/factors_step{step:07d}.npz`` with float64
``factor_k`` arrays (the raw statistics, before bias correction and eps) and a ``meta`` array of JSON
strings with param, block, dim, step (the optimizer's global step), beta2, eps, plus n, root_p,
eps_mode, param_step (the parameter's own step count), statistics_updates (u: the factor updates so
far, = param_step unless ``statistics_frequency`` > 1) and bias_correction (the divisor 1 - beta2^u
applied before the root).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .state import BlockState, FactorState, mirror_upper_


@dataclass(frozen=True)
class FactorDiagnostics:
    """The last root computation of one Kronecker factor.

    ``kappa`` is the condition number of the matrix actually solved, A + (psd_shift + eps_abs) I
    (finite for shifted rank-deficient factors); ``psd_shift`` / ``psd_floor`` are what the
    rank-deficiency policy applied (:mod:`matroots.core.psd`), ``eps_abs`` the absolute eps shift, and
    ``regularisation`` their sum. ``factor_resets`` counts resets of non-finite statistics.
    """

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
    psd_shift: float
    psd_floor: float
    eps_abs: float
    regularisation: float
    factor_resets: int
    error: str
    warm: str = ""  # eigenbasis solvers: the last warm start's verdict ("accepted", "refined", ...)
    warm_hits: int = 0  # rounds whose warm start was accepted or refined

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
            psd_shift=float(f.psd_shift),
            psd_floor=float(f.psd_floor),
            eps_abs=float(f.eps_abs),
            regularisation=float(f.regularisation),
            factor_resets=int(f.factor_resets),
            error=f.error,
            warm=f.warm,
            warm_hits=int(f.warm_hits),
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

    ``entries``: (param key, block index, factor, extra meta) per factor; the file is written
    atomically by :func:`matroots.core.factor_dump.save_shampoo_factors`.
    """
    from matroots.core.factor_dump import save_shampoo_factors

    out = Path(directory) / f"factors_step{global_step:07d}.npz"
    factors = []
    for key, block, f, extra in entries:
        meta = {"param": str(key), "block": block, "dim": f.dim, "n": f.n, "root_p": str(f.root_p), **extra}
        F = mirror_upper_(f.matrix.detach())  # exactly symmetric, in place
        factors.append((F.cpu().double().numpy(), meta))
    save_shampoo_factors(out, factors)
    return out


@dataclass
class StepTiming:
    """Cumulative wall time of :meth:`Shampoo.step` and of its root computations."""

    steps: int = 0
    step_seconds: float = 0.0
    root_seconds: float = 0.0
    root_rounds: int = 0
    roots_computed: int = 0
    #: ``root_schedule="async"``: of ``root_seconds``, the time the step waited for background rounds
    #: (the rest is preparing and installing them); and the rounds' own time on the background thread
    root_wait_seconds: float = 0.0
    root_background_seconds: float = 0.0

    def reset(self) -> None:
        self.steps, self.step_seconds, self.root_seconds, self.root_rounds, self.roots_computed = (
            0,
            0.0,
            0.0,
            0,
            0,
        )
        self.root_wait_seconds = self.root_background_seconds = 0.0

    @property
    def root_share(self) -> float:
        return self.root_seconds / self.step_seconds if self.step_seconds else 0.0

    def add_pipeline(self, now: tuple[float, float, float], before: tuple[float, float, float]) -> None:
        """Training-thread time on background rounds (``root_schedule="async"``) since ``before``:
        (preparing and installing, waiting, background), as :meth:`shampoo.root_pipeline.RootPipeline.seconds`
        counts them."""
        fg, wait, bg = (a - b for a, b in zip(now, before, strict=True))
        self.root_seconds += fg + wait
        self.root_wait_seconds += wait
        self.root_background_seconds += bg

    def add_round(self, seconds: float | None, factors: int) -> None:
        """One root round of ``factors`` roots; ``seconds``: its time when computed in the step
        (None: counted by :meth:`add_pipeline`)."""
        if seconds is not None:
            self.root_seconds += seconds
        self.root_rounds += 1
        self.roots_computed += factors


__all__ = [
    "BlockDiagnostics",
    "FactorDiagnostics",
    "StepTiming",
    "block_diagnostics",
    "dump_factors",
    "to_frame",
]
