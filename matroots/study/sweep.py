"""The sweep engine: run every (case, solver) pair of a grid and write tidy rows to parquet.

* Work is split into units (:class:`matroots.study.grid.Unit`: a matrix, p and eps). A unit's reference
  is computed once (and cached on disk by :mod:`matroots.truth.reference`); every (solver, dtype) pair then
  runs on it and gives one row.
* Units run through :mod:`matroots.study.runner`: in worker processes (default: one per core, each pinned
  to one torch thread) or on a dask.distributed cluster (``scheduler=``). Each finished unit is
  written atomically as ``parts/<unit key>.parquet``, so an interrupted sweep (Ctrl-C, kill -9 of the
  parent, a worker or the dask client) resumes by skipping the units whose part exists: no row is
  lost and none is written twice. Leftover temp files are removed and corrupted parts recomputed. A
  unit that takes a fresh worker of its own down three times is recorded with failure "WorkerCrashed"
  (a worker killed from outside charges nobody), and a resume retries it.
* ``results.parquet`` (and optionally ``results.csv``) holds all rows once the sweep completes;
  ``provenance.json`` holds the config and its hash and one record per start/resume (git commit,
  command line, timestamps, versions, machine).
* ``seed_from`` (``matroots sweep CONFIG --out RUN --resume --seed-from results/NAME``) first writes the
  rows of a shipped set of the same grid back as RUN's parts (:mod:`matroots.study.seeding`), so a
  sweep whose run folder was lost resumes from what was shipped, and computes only the rest.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..core import precision
from ..core.errors import MatrootsError
from ..truth import metrics
from . import atomic, provenance, runner
from . import grid as gridmod
from .threads import one_thread
from .tuning.cost import gemm_seconds, require_device, timed

log = logging.getLogger("matroots.study.sweep")

PARTS = runner.PARTS
RUNNING = runner.RUNNING
MAX_CRASHES = runner.MAX_CRASHES
SweepError = runner.RunFolderError  # a sweep cannot start or continue in this folder


def _lambda_max(A: np.ndarray, meta: dict[str, Any]) -> float:
    ev = meta.get("eigenvalues")
    if ev is not None:
        return float(np.max(np.abs(np.asarray(ev))))
    if np.allclose(A, A.T, rtol=0, atol=1e-14 * np.abs(A).max()):
        return float(np.linalg.eigvalsh(A)[-1])
    return float(np.max(np.abs(np.linalg.eigvals(A))))


@dataclass(frozen=True)
class _Case:
    """One unit's matrix (the array and the solve's input tensor), its references and absolute eps."""

    A: np.ndarray
    A_in: torch.Tensor
    ref: Any  # the reference of A + eps_abs I, or None (its error is in the rows' reference_error)
    ref0: Any  # the reference of A itself (eps > 0 only), or None
    eps_abs: float


def run_unit(grid: gridmod.GridSpec, unit: gridmod.Unit) -> list[dict[str, Any]]:
    """Run every (solver, dtype) pair of one unit; return its rows (never raises on solver failure)."""
    one_thread()
    case, base, kappa = _unit_case(grid, unit)
    rows = []
    for dtype in grid.dtypes:
        u = precision.unit_roundoff(dtype)
        fmt = metrics.dtype_metrics(case.A, unit.p, kappa, dtype, cond=base.get("cond_rel"))
        # Cost unit measured here, in this process: CPU seconds of one n x n GEMM in this dtype.
        gemm = gemm_seconds(unit.n, dtype, device=grid.device)
        for spec in grid.solvers:
            row = dict(
                base,
                dtype=precision.info(dtype).name,
                solver=spec.label,
                method=spec.name,
                options=json.dumps(spec.options, sort_keys=True),
                unit_roundoff=u,
                failure="",
                device=grid.device,
                gemm_seconds=gemm,
                **fmt,
            )
            rows.append(_solve_row(grid, unit, case, spec, dtype, row, gemm))
    return rows


def _unit_case(grid: gridmod.GridSpec, unit: gridmod.Unit) -> tuple[_Case, dict[str, Any], float]:
    """The unit's matrix and references, the columns its rows share, and the kappa of its format metrics."""
    from . import matrices

    rng = np.random.default_rng(unit.seed)
    A, meta = matrices.generate(
        unit.family, unit.n, unit.kappa, rng, **grid.family_options.get(unit.family, {})
    )
    lmax = _lambda_max(A, meta)
    eps_abs = unit.eps * lmax if unit.eps_mode == "relative" else unit.eps
    base = {
        "family": unit.family,
        "n": unit.n,
        "kappa": unit.kappa,
        "kappa_actual": float(meta.get("kappa", np.nan)),
        "seed": unit.seed,
        "p": unit.p,
        "eps": unit.eps,
        "eps_mode": unit.eps_mode,
        "eps_abs": eps_abs,
        "unit": unit.key,
        "config_hash": grid.config_hash(),
        "versions": provenance.versions_string(),
        "machine": provenance.machine_string(),
    }
    ref, ref0 = _unit_references(grid, unit, A, eps_abs, base)
    # Metrics of the matrix (once per unit) and of the format (once per dtype); per row only the root's.
    kappa = float(base["kappa_actual"]) if np.isfinite(base["kappa_actual"]) else unit.kappa
    if ref is not None:
        base["reference_backend"] = ref.backend
        base["reference_digits"] = ref.digits
        base.update(metrics.matrix_metrics(A, unit.p, ref=ref, eps=eps_abs, ref0=ref0))
        kappa = base["condition_number"]
    # the solve's input, a tensor on the grid's device (on the CPU the same bits as the array)
    A_in = torch.as_tensor(A, device=grid.device)
    return _Case(A=A, A_in=A_in, ref=ref, ref0=ref0, eps_abs=eps_abs), base, kappa


def _unit_references(
    grid: gridmod.GridSpec, unit: gridmod.Unit, A: np.ndarray, eps_abs: float, base: dict[str, Any]
) -> tuple[Any, Any]:
    """The references of A + eps_abs I and (eps > 0) of A; records their error and time in ``base``."""
    from ..truth import reference

    t0 = time.perf_counter()
    try:
        ref = reference.inverse_root(A, unit.p, eps_abs, backend=grid.reference_backend)
    except MatrootsError as exc:
        ref = None
        base["reference_error"] = f"{type(exc).__name__}: {exc}"
    base["reference_seconds"] = time.perf_counter() - t0
    ref0 = None
    if ref is not None and eps_abs > 0:
        try:
            ref0 = reference.inverse_root(A, unit.p, 0.0, backend=grid.reference_backend)
        except MatrootsError:
            ref0 = None  # A itself has no inverse root (rank deficient): no eps bias to report
    return ref, ref0


def _solve_row(
    grid: gridmod.GridSpec,
    unit: gridmod.Unit,
    case: _Case,
    spec: gridmod.SolverSpec,
    dtype: Any,
    row: dict[str, Any],
    gemm: float,
) -> dict[str, Any]:
    """One (solver, dtype) pair: solve, then record the result and the root's errors in ``row``."""
    from ..solvers import registry

    cfg = registry.get(spec.name, **spec.config_options)
    # quiet: non-convergence is a result here (row failure "NotConverged"), not a warning line
    # per solve; run_sweep summarises it in one line per run (failure_summary)
    solve_kw = {
        "quiet": True,
        **dict(eps=unit.eps, eps_mode=unit.eps_mode, dtype=dtype, **spec.solve_options),
    }
    t1 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res, cpu = timed(lambda: cfg.solve(case.A_in, unit.p, **solve_kw), device=grid.device)
    except MatrootsError as exc:
        row.update(
            failure=type(exc).__name__,
            converged=False,
            seconds=time.perf_counter() - t1,
            failure_message=str(exc)[:300],
        )
        return row
    X = res.root.double().cpu().numpy()
    _record_result(row, res, cpu, gemm, X)
    # Measure against the matrix actually solved: A + the solver's own eps_abs (issue 9).
    ref_s, eps_s = _solved_reference(case.A, unit.p, res, case.ref, case.eps_abs, grid.reference_backend, row)
    if ref_s is not None and np.isfinite(X).all():
        row.update(metrics.root_metrics(X, case.A, unit.p, ref=ref_s, eps=eps_s))
        if case.ref0 is not None:
            row["forward_error_total"] = metrics.relative_forward_error(X, case.ref0.root)
    return row


def _record_result(row: dict[str, Any], res: Any, cpu: float, gemm: float, X: np.ndarray) -> None:
    """The solve's own account in ``row``: convergence, iterations, cost, stop reason, failure."""
    stop = res.info.get("stop_reason")
    row.update(
        converged=bool(res.converged),
        iterations=int(res.iterations),
        matmuls=float(res.matmuls),
        seconds=float(res.seconds),
        cpu_seconds=cpu,
        gemm_equivalents=cpu / gemm,
        residual_own=float(res.residual),
        stop_reason=stop[0] if isinstance(stop, list) else (stop or ""),
    )
    # Schur-Newton's square-root stage (k1 real Schur square roots before the Newton iteration)
    # is work the Newton count leaves out; iterations_total counts both.
    k1 = res.info.get("k1")
    sqrt_stages = int(k1[0] if isinstance(k1, list | tuple) else k1) if k1 is not None else 0
    row.update(sqrt_stages=sqrt_stages, iterations_total=int(res.iterations) + sqrt_stages)
    if not np.isfinite(X).all():
        row["failure"] = "NonFiniteRoot"
    elif not res.converged:
        row["failure"] = "NotConverged"


def _solved_reference(
    A: np.ndarray, p: Any, res: Any, ref: Any, eps_abs: float, backend: str, row: dict[str, Any]
) -> tuple[Any, float]:
    """The reference of A + eps_s I, eps_s the shift the solver reports (``info["eps_abs"]``), and eps_s.

    The unit's reference is reused when the shifts agree to 1e-12 (relative); a solver that estimated
    lambda_max for a relative eps differently gets the reference of its own matrix. Records
    ``eps_abs_solved`` in ``row``.
    """
    from ..truth import reference

    solved = res.info.get("eps_abs")
    eps_s = (
        eps_abs if solved is None else float(np.max(np.asarray(getattr(solved, "tolist", lambda: solved)())))
    )
    row["eps_abs_solved"] = eps_s
    if abs(eps_s - eps_abs) <= 1e-12 * max(abs(eps_abs), 1e-300):
        return ref, eps_abs
    try:
        return reference.inverse_root(A, p, eps_s, backend=backend), eps_s
    except MatrootsError:
        return None, eps_s


def sweep_job(grid_json: str, unit: gridmod.Unit) -> list[dict[str, Any]]:
    """The runner's job function for a sweep: the rows of one unit (picklable via functools.partial)."""
    return run_unit(_grid_from_json(grid_json), unit)


@functools.lru_cache(maxsize=4)
def _grid_from_json(grid_json: str) -> gridmod.GridSpec:
    return gridmod.from_dict(json.loads(grid_json))


def _crash_rows(grid: gridmod.GridSpec, unit: gridmod.Unit) -> list[dict[str, Any]]:
    return [
        {
            "family": unit.family,
            "n": unit.n,
            "kappa": unit.kappa,
            "seed": unit.seed,
            "p": unit.p,
            "eps": unit.eps,
            "eps_mode": unit.eps_mode,
            "unit": unit.key,
            "dtype": precision.info(d).name,
            "solver": s.label,
            "method": s.name,
            "failure": "WorkerCrashed",
            "converged": False,
            "config_hash": grid.config_hash(),
        }
        for d in grid.dtypes
        for s in grid.solvers
    ]


def done_units(out_dir: str | Path) -> set[str]:
    """Keys of units whose rows are on disk."""
    return runner.done_units(out_dir)


def prepare_out_dir(grid: gridmod.GridSpec, out_dir: Path, *, resume: bool) -> None:
    """Create the run folder and record this start in its provenance; refuse to mix two configs in one
    folder, or to add to a folder holding rows without ``resume``."""
    runner.open_run(
        out_dir, kind="sweep", config=grid.to_dict(), config_hash=grid.config_hash(), resume=resume
    )


def run_sweep(
    grid: gridmod.GridSpec,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    resume: bool = False,
    progress: bool = True,
    csv: bool = False,
    scheduler: Any = None,
    retry_crashed: bool = True,
    seed_from: str | Path | None = None,
    on_seeded: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Run (or resume) a sweep into ``out_dir`` and return all its rows.

    ``scheduler``: ``None`` runs units on a local process pool of ``workers`` processes (default: one
    per core); a dask scheduler address or ``distributed.Client`` runs them on that cluster.
    ``retry_crashed``: rerun the units an earlier run recorded as ``WorkerCrashed`` (default).
    ``seed_from``: a shipped set of this grid (``results/NAME``) whose units are written into
    ``out_dir`` before anything runs (:func:`matroots.study.seeding.seed`; never over a part there);
    a set of another kind, config or with tampered rows is refused before the folder is touched.
    ``on_seeded`` gets the one-line account of the seeding (:func:`matroots.study.seeding.describe`)
    before any unit runs (the command line prints it).
    """
    from . import seeding

    runner.check_scheduler(scheduler)
    require_device(grid.device)  # before any folder or worker: a CUDA grid on a CPU-only machine
    source = seeding.read_source(seed_from, grid) if seed_from is not None else None
    out = Path(out_dir)
    prepare_out_dir(grid, out, resume=resume)
    if source is not None:
        seeded = seeding.seed(out, grid, source)
        if on_seeded is not None:
            on_seeded(seeding.describe(seeded, source, out))
    log.info(
        "sweep %s: %d units (%d rows each)",
        grid.name,
        len(gridmod.units(grid)),
        len(grid.dtypes) * len(grid.solvers),
    )
    stats = runner.run_units(
        gridmod.units(grid),
        functools.partial(sweep_job, json.dumps(grid.to_dict(), sort_keys=True, default=str)),
        out,
        workers=workers,
        scheduler=scheduler,
        progress=progress,
        desc=f"sweep {grid.name}",
        crash_rows=functools.partial(_crash_rows, grid),
        retry_crashed=retry_crashed,
    )
    df = collect(out, csv=csv)
    runner.close_run(out, stats)
    summary = failure_summary(df)
    if summary:
        log.warning("%s: %s", grid.name, summary)
    return df


def failure_summary(df: pd.DataFrame) -> str:
    """One line counting the rows of a run that failed, by failure kind and (solver, dtype), most
    first; "" when none did. Non-convergence at large kappa in low precision is an expected result of
    a sweep: the rows say which (``failure``, ``stop_reason``, ``failure_message``)."""
    if df.empty or "failure" not in df.columns:
        return ""
    bad = df[df["failure"].fillna("") != ""]
    if bad.empty:
        return ""
    parts = []
    for kind, rows in bad.groupby("failure", sort=True):
        counts = rows.groupby(["solver", "dtype"]).size().sort_values(ascending=False, kind="stable")
        cells = ", ".join(f"{solver}/{dtype} {k}" for (solver, dtype), k in counts.items())
        parts.append(f"{kind} {len(rows)} ({cells})")
    return (
        f"{len(bad)} of {len(df)} solves failed: {'; '.join(parts)}; "
        "the rows' failure, stop_reason and failure_message columns say why"
    )


ORDER = ("family", "n", "kappa", "seed", "p", "eps_mode", "eps", "dtype", "solver")


def collect(out_dir: str | Path, *, csv: bool = False) -> pd.DataFrame:
    """All rows of a run folder, in a stable order; (re)writes results.parquet (and .csv)."""
    out = Path(out_dir)
    df = runner.read_parts(out, ORDER)
    if df.empty:
        return df
    runner.atomic_write_parquet(df, out / "results.parquet")
    if csv:
        atomic.write_csv(out / "results.csv", df, index=False)
    return df


def load(run_dir: str | Path) -> pd.DataFrame:
    """Rows of a run folder (all its parts so far, complete or not); writes nothing."""
    run = Path(run_dir)
    if not run.exists():
        raise FileNotFoundError(f"no run folder {run}")
    return runner.read_parts(run, ORDER)
