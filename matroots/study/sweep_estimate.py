"""Cost estimates of a sweep before running it: a prior model, calibrated by timing a sample of units.

A unit's cost (process CPU seconds, one torch thread) is dominated by its reference (flint/mpmath
eigendecomposition at kappa-dependent digits, about n^3 (1 + log10 kappa)), its (solver, dtype) solves
and their metrics, and per-pair overheads (repeated timing of cheap solves, a GEMM timing per dtype).
The regression model is

    log T(unit) = b0 + b1 log n + b2 (log n)^2 + b3 log10(kappa) + b4 [eps > 0] + b5 log p

* **Prior** (``calibrate=0``): coefficients fitted on a measured sample of ``precision_full.toml``
  (:data:`PRIOR`), scaled by this machine's speed (one timed fp64 GEMM at n = 64 against the fitting
  machine's) and by the number of (solver, dtype) pairs per unit. A guide, labelled as such.
* **Calibrated** (``calibrate=K``): K units sampled stratified by n (round robin over the n values,
  random within) are run here through the sweep's own code path with a cold reference cache, their
  CPU seconds fitted by least squares (ridge towards the prior when K is small), and every unit of the
  grid predicted. The residual spread of the fit gives the reported uncertainty factor.

Wall time is CPU seconds divided by the workers, assuming the pool keeps them busy: the tail of the
last units is added as one largest-unit time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import grid as gridmod

#: Prior regression coefficients (log CPU seconds per unit) and the conditions they were fitted under.
#: Fitted (ridge 0.3) on 16 units of precision_full.toml sampled by :func:`sample_units` (seed 0), timed
#: on the 2-core development machine under load, reference backend flint.
PRIOR: dict[str, Any] = {
    "coef": [-5.981, 0.825, 0.138, 0.027, 0.884, 0.181],
    "pairs": 24,  # (solver, dtype) pairs per unit in the fitting grid
    "gemm64_seconds": 6.0e-6,  # fp64 64x64 GEMM CPU seconds (one thread) on the fitting machine
    "sigma": 0.733,  # residual standard deviation of the fit (log scale)
}


@dataclass
class Estimate:
    """A sweep's size and estimated cost."""

    units: int
    rows: int
    cpu_seconds: float
    wall_seconds: float
    workers: int
    factor: float  # multiplicative uncertainty (one residual standard deviation)
    calibrated: bool
    sample: int = 0
    sample_cpu_seconds: float = 0.0
    sample_wall_seconds: float = 0.0
    per_n: dict[int, float] = field(default_factory=dict)
    coef: list[float] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:  # dict-style access kept for older callers
        return {"estimated_seconds": self.cpu_seconds}.get(key, getattr(self, key, None))


#: A unit holds several n x n float64 arrays at once (the matrix, its reference root, each solver's
#: root and residual work arrays); a grid whose largest matrix times this exceeds the machine's memory
#: cannot run here and is refused before anything is allocated.
ARRAYS_PER_UNIT = 4


def _memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def check_memory(grid: gridmod.GridSpec, memory: int | None = None) -> None:
    """Refuse (one-line ConfigError) a grid whose largest matrix cannot be held here, naming its size;
    nothing is allocated."""
    from .atomic import _size

    memory = _memory_bytes() if memory is None else memory
    n = max((int(n) for fam in grid.families for n in grid.axes(fam)["n"]), default=0)
    need = ARRAYS_PER_UNIT * 8 * n * n
    if memory and need > memory:
        raise gridmod.ConfigError(
            f"n = {n} needs {_size(8 * n * n)} per float64 matrix and about {_size(need)} per unit "
            f"({ARRAYS_PER_UNIT} such arrays), more than this machine's {_size(memory)} of memory; "
            "use smaller n (or run on a machine with more memory)"
        )


def features(unit: gridmod.Unit) -> np.ndarray:
    ln = math.log(unit.n)
    return np.array(
        [1.0, ln, ln * ln, math.log10(max(unit.kappa, 1.0)), float(unit.eps > 0), math.log(unit.p)]
    )


def _gemm64() -> float:
    """CPU seconds of one fp64 64x64 GEMM on one thread (the units run single-threaded)."""
    import torch

    from .tuning.cost import gemm_seconds

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return min(gemm_seconds(64, "fp64") for _ in range(3))
    finally:
        torch.set_num_threads(threads)


def sample_units(units: list[gridmod.Unit], k: int, seed: int = 0) -> list[gridmod.Unit]:
    """``k`` units stratified by n: round robin over the n values (largest first), random within."""
    rng = np.random.default_rng(seed)
    by_n: dict[int, list[gridmod.Unit]] = {}
    for u in units:
        by_n.setdefault(u.n, []).append(u)
    pools = {n: [us[i] for i in rng.permutation(len(us))] for n, us in by_n.items()}
    out: list[gridmod.Unit] = []
    ns = sorted(pools, reverse=True)
    while len(out) < min(k, len(units)):
        for n in ns:
            if pools[n] and len(out) < k:
                out.append(pools[n].pop())
    return out


@contextlib.contextmanager
def _cold_cache() -> Iterator[str]:
    """A fresh reference cache for the calibration run (a warm one would make the sample look cheap)."""
    old = os.environ.get("MATROOTS_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="matroots-calib-") as tmp:
        os.environ["MATROOTS_CACHE_DIR"] = str(Path(tmp) / "cache")
        try:
            yield tmp
        finally:
            if old is None:
                os.environ.pop("MATROOTS_CACHE_DIR", None)
            else:
                os.environ["MATROOTS_CACHE_DIR"] = old


def measure_units(
    grid: gridmod.GridSpec, sample: list[gridmod.Unit], *, workers: int = 1
) -> tuple[np.ndarray, float]:
    """CPU seconds of each sampled unit (run through the runner, cold cache) and the wall time."""
    import pandas as pd

    from . import runner, sweep

    with _cold_cache() as tmp:
        out = Path(tmp) / "run"
        t = time.perf_counter()
        runner.run_units(
            sample,
            functools.partial(sweep.sweep_job, json.dumps(grid.to_dict(), sort_keys=True, default=str)),
            out,
            workers=workers,
            progress=False,
            desc="calibrate",
        )
        wall = time.perf_counter() - t
        df = runner.read_parts(out)
    cpu = df.groupby("unit")["unit_cpu_seconds"].first() if not df.empty else pd.Series(dtype=float)
    return np.array([float(cpu.get(u.key, np.nan)) for u in sample]), wall


def _prior_coef(grid: gridmod.GridSpec) -> np.ndarray:
    coef = np.array(PRIOR["coef"], dtype=float)
    pairs = len(grid.dtypes) * len(grid.solvers)
    speed = min(max(_gemm64() / PRIOR["gemm64_seconds"], 0.1), 10.0)  # a wild timing must not dominate
    coef[0] += math.log(speed) + math.log(pairs / PRIOR["pairs"])
    return coef


def fit(X: np.ndarray, y_log: np.ndarray, prior: np.ndarray, ridge: float = 1.0) -> tuple[np.ndarray, float]:
    """Least squares of log cost on the features, shrunk towards ``prior`` (ridge; the intercept free)."""
    lam = np.full(X.shape[1], ridge)
    lam[0] = 0.0
    A = X.T @ X + np.diag(lam)
    b = X.T @ y_log + lam * prior
    coef = np.linalg.solve(A, b)
    resid = y_log - X @ coef
    dof = max(len(y_log) - 2, 1)
    return coef, float(np.sqrt(resid @ resid / dof))


def estimate(
    grid: gridmod.GridSpec, *, calibrate: int = 0, workers: int | None = None, seed: int = 0
) -> Estimate:
    """Estimate a sweep's cost; with ``calibrate=K``, measure K sampled units here first."""
    us = gridmod.units(grid)
    workers = workers or os.cpu_count() or 1
    X = np.stack([features(u) for u in us]) if us else np.zeros((0, 6))
    coef = _prior_coef(grid)
    sigma = float(PRIOR["sigma"])
    est = Estimate(
        units=len(us),
        rows=gridmod.case_count(grid),
        cpu_seconds=0.0,
        wall_seconds=0.0,
        workers=workers,
        factor=1.0,
        calibrated=False,
    )
    if calibrate > 0 and us:
        sample = sample_units(us, calibrate, seed)
        cpu, wall = measure_units(grid, sample, workers=1)
        ok = np.isfinite(cpu) & (cpu > 0)
        Xs = np.stack([features(u) for u in sample])[ok]
        coef, sigma = fit(Xs, np.log(cpu[ok]), coef, ridge=max(0.1, 4.0 / max(ok.sum(), 1)))
        est.calibrated = True
        est.sample = int(ok.sum())
        est.sample_cpu_seconds = float(cpu[ok].sum())
        est.sample_wall_seconds = wall
    # E[T] of a log-normal residual is exp(mu + sigma^2/2): the mean, not the median, sums honestly.
    per_unit = np.exp(X @ coef + sigma**2 / 2)
    est.coef = [float(c) for c in coef]
    est.cpu_seconds = float(per_unit.sum())
    est.wall_seconds = float(per_unit.sum() / workers + (per_unit.max() if len(per_unit) else 0.0))
    est.factor = math.exp(sigma)
    est.per_n = {int(n): float(per_unit[[u.n == n for u in us]].sum()) for n in sorted(set(grid.n))}
    return est


def predict(grid: gridmod.GridSpec, units: list[gridmod.Unit], coef: list[float], sigma: float) -> float:
    """Predicted CPU seconds of ``units`` under a fitted model."""
    X = np.stack([features(u) for u in units])
    return float(np.exp(X @ np.asarray(coef) + sigma**2 / 2).sum())


def _hms(s: float) -> str:
    h, rem = divmod(round(s), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def format_estimate(grid: gridmod.GridSpec, est: Estimate) -> str:
    """The dry-run report: sizes, CPU seconds, wall time on the workers, how it was estimated."""
    how = (
        f"calibrated on {est.sample} measured units ({est.sample_cpu_seconds:.0f} CPU s)"
        if est.calibrated
        else "prior model, uncalibrated: add --calibrate 16 to time a sample of units here"
    )
    per_n = ", ".join(f"n={n}: {_hms(s)}" for n, s in est.per_n.items())
    return (
        f"{grid.name}: {est.units} units (matrix, p, eps), {est.rows} (case, solver) rows; "
        f"estimated {est.cpu_seconds:.0f} s of compute on one core, about {_hms(est.wall_seconds)} wall on "
        f"{est.workers} workers (x/÷ {est.factor:.1f}); {how}\n  per n (one core): {per_n}"
    )
