"""The sweep engine: run every (case, solver) pair of a grid and write tidy rows to parquet.

* Work is split into units (:class:`matroots.grid.Unit`: a matrix, p and eps). A unit's reference
  is computed once (and cached on disk by :mod:`matroots.reference`); every (solver, dtype) pair then
  runs on it and gives one row.
* Units run in worker processes (default: one per core), each pinned to one torch thread.
* Each finished unit is written atomically as ``parts/<unit key>.parquet`` (temp file + rename), so
  an interrupted sweep (Ctrl-C, kill -9 of the parent or of a worker) resumes by skipping the units
  whose part exists: no row is lost and none is written twice. A worker that dies is replaced and its
  unit retried; a unit that takes a worker down three times is recorded with failure "WorkerCrashed".
* ``results.parquet`` (and optionally ``results.csv``) holds all rows once the sweep completes;
  ``provenance.json`` holds versions, machine, the config and its hash.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import grid as gridmod
from . import metrics, precision, provenance
from .errors import MatrootsError

log = logging.getLogger("matroots.sweep")

PARTS = "parts"
RUNNING = ".started"
MAX_CRASHES = 3


class SweepError(RuntimeError):
    """A sweep cannot start or continue (e.g. the output folder holds another config's run)."""


def _atomic_write_parquet(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".parquet")
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _lambda_max(A: np.ndarray, meta: dict[str, Any]) -> float:
    ev = meta.get("eigenvalues")
    if ev is not None:
        return float(np.max(np.abs(np.asarray(ev))))
    if np.allclose(A, A.T, rtol=0, atol=1e-14 * np.abs(A).max()):
        return float(np.linalg.eigvalsh(A)[-1])
    return float(np.max(np.abs(np.linalg.eigvals(A))))


def run_unit(grid: gridmod.GridSpec, unit: gridmod.Unit) -> list[dict[str, Any]]:
    """Run every (solver, dtype) pair of one unit; return its rows (never raises on solver failure)."""
    import torch

    from . import api, matrices, reference
    from .tuning.cost import gemm_seconds, timed

    torch.set_num_threads(1)
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
    # Metrics of the matrix (once per unit) and of the format (once per dtype); per row only the root's.
    kappa = float(base["kappa_actual"]) if np.isfinite(base["kappa_actual"]) else unit.kappa
    if ref is not None:
        base["reference_backend"] = ref.backend
        base["reference_digits"] = ref.digits
        base.update(metrics.matrix_metrics(A, unit.p, ref=ref, eps=eps_abs, ref0=ref0))
        kappa = base["condition_number"]
    rows = []
    for dtype in grid.dtypes:
        u = precision.unit_roundoff(dtype)
        fmt = metrics.dtype_metrics(A, unit.p, kappa, dtype)
        # Cost unit measured here, in this process: CPU seconds of one n x n GEMM in this dtype.
        gemm = gemm_seconds(unit.n, dtype)
        for spec in grid.solvers:
            row = dict(
                base,
                dtype=precision.info(dtype).name,
                solver=spec.label,
                method=spec.name,
                options=json.dumps(spec.options, sort_keys=True),
                unit_roundoff=u,
                failure="",
                device="cpu",
                gemm_seconds=gemm,
                **fmt,
            )
            cfg = api.resolve_method(spec.name, **spec.config_options)
            solve_kw = dict(eps=unit.eps, eps_mode=unit.eps_mode, dtype=dtype, **spec.solve_options)
            t1 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res, cpu = timed(lambda cfg=cfg, kw=solve_kw: cfg.solve(A, unit.p, **kw))
            except MatrootsError as exc:
                row.update(
                    failure=type(exc).__name__,
                    converged=False,
                    seconds=time.perf_counter() - t1,
                    failure_message=str(exc)[:300],
                )
                rows.append(row)
                continue
            X = res.root.double().numpy()
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
            if not np.isfinite(X).all():
                row["failure"] = "NonFiniteRoot"
            elif not res.converged:
                row["failure"] = "NotConverged"
            if ref is not None and np.isfinite(X).all():
                row.update(metrics.root_metrics(X, A, unit.p, ref=ref, eps=eps_abs))
                if ref0 is not None:
                    row["forward_error_total"] = metrics.relative_forward_error(X, ref0.root)
            rows.append(row)
    return rows


def _fault_injection(unit: gridmod.Unit) -> None:
    """Test hook: with MATROOTS_SWEEP_CRASH_DIR set, the first worker to run each unit whose key starts
    with MATROOTS_SWEEP_CRASH_PREFIX dies with os._exit (a simulated kill -9 of a worker)."""
    crash_dir = os.environ.get("MATROOTS_SWEEP_CRASH_DIR")
    if not crash_dir or not unit.key.startswith(os.environ.get("MATROOTS_SWEEP_CRASH_PREFIX", "")):
        return
    marker = Path(crash_dir) / unit.key
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os._exit(137)


def _unit_job(grid_dict: dict[str, Any], unit: gridmod.Unit, out_dir: str) -> str:
    marker = Path(out_dir) / RUNNING / unit.key
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    _fault_injection(unit)
    grid = gridmod.from_dict(grid_dict)
    rows = run_unit(grid, unit)
    _atomic_write_parquet(pd.DataFrame(rows), Path(out_dir) / PARTS / f"{unit.key}.parquet")
    return unit.key


def _crash_rows(grid: gridmod.GridSpec, unit: gridmod.Unit) -> pd.DataFrame:
    rows = [
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
    return pd.DataFrame(rows)


def done_units(out_dir: Path) -> set[str]:
    """Keys of units whose rows are on disk."""
    parts = out_dir / PARTS
    return {p.stem for p in parts.glob("*.parquet")} if parts.exists() else set()


def prepare_out_dir(grid: gridmod.GridSpec, out_dir: Path, *, resume: bool) -> None:
    """Create the run folder and its provenance; refuse to mix two configs in one folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prov_path = out_dir / "provenance.json"
    if prov_path.exists():
        old = json.loads(prov_path.read_text())
        if old.get("config_hash") != grid.config_hash():
            raise SweepError(
                f"{out_dir} holds a run of another config ({old.get('config_hash')}); use another --out"
            )
        if done_units(out_dir) and not resume:
            raise SweepError(f"{out_dir} already holds rows of this sweep; pass --resume to continue it")
    prov = {
        "config_hash": grid.config_hash(),
        "config": grid.to_dict(),
        "versions": provenance.versions(),
        "machine": provenance.machine(),
        "seeds": list(grid.seeds),
    }
    tmp = prov_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(prov, indent=2, default=str))
    os.replace(tmp, prov_path)


def run_sweep(
    grid: gridmod.GridSpec,
    out_dir: str | Path,
    *,
    workers: int | None = None,
    resume: bool = False,
    progress: bool = True,
    csv: bool = False,
) -> pd.DataFrame:
    """Run (or resume) a sweep into ``out_dir`` and return all its rows."""
    out = Path(out_dir)
    prepare_out_dir(grid, out, resume=resume)
    shutil.rmtree(out / RUNNING, ignore_errors=True)  # start markers of an earlier, interrupted run
    todo = [u for u in gridmod.units(grid) if u.key not in done_units(out)]
    workers = workers or os.cpu_count() or 1
    log.info(
        "sweep %s: %d units to run (%d rows each), %d workers",
        grid.name,
        len(todo),
        len(grid.dtypes) * len(grid.solvers),
        workers,
    )
    if todo:
        _run_pool(grid, todo, out, workers, progress)
    return collect(out, csv=csv)


def _run_batch(grid: gridmod.GridSpec, units: list[gridmod.Unit], out: Path, workers: int, bar: Any) -> bool:
    """Run units in one process pool; return True when a worker died (the pool broke)."""
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=min(workers, len(units)), mp_context=ctx) as pool:
        futs = {pool.submit(_unit_job, grid.to_dict(), u, str(out)): u for u in units}
        try:
            for fut in cf.as_completed(futs):
                fut.result()
                bar.update(1)
        except cf.process.BrokenProcessPool:
            return True
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return False


def _run_pool(
    grid: gridmod.GridSpec, todo: list[gridmod.Unit], out: Path, workers: int, progress: bool
) -> None:
    """Run units, replacing dead workers. After a worker dies, the units that had started (the
    suspects) are rerun one at a time, so a crash is charged only to the unit that caused it."""
    from tqdm.auto import tqdm

    crashes: dict[str, int] = {}
    started = out / RUNNING
    bar = tqdm(total=len(todo), desc=f"sweep {grid.name}", unit="unit", disable=not progress)
    suspects: list[gridmod.Unit] = []
    try:
        while True:
            finished = done_units(out)
            pending = [u for u in todo if u.key not in finished]
            bar.n = len(todo) - len(pending)
            bar.refresh()
            if not pending:
                break
            if suspects:
                u = suspects.pop(0)
                if u.key in finished:
                    continue
                if _run_batch(grid, [u], out, 1, bar):
                    crashes[u.key] = crashes.get(u.key, 0) + 1
                    log.warning("unit %s killed its worker (%d)", u, crashes[u.key])
                    if crashes[u.key] >= MAX_CRASHES:
                        log.error(
                            "unit %s crashed its worker %d times; recorded as WorkerCrashed", u, MAX_CRASHES
                        )
                        _atomic_write_parquet(_crash_rows(grid, u), out / PARTS / f"{u.key}.parquet")
                    else:
                        suspects.append(u)
                continue
            if _run_batch(grid, pending, out, workers, bar):
                finished = done_units(out)
                suspects = [u for u in pending if (started / u.key).exists() and u.key not in finished]
                log.warning("a worker died; rerunning %d started units one at a time", len(suspects))
    except KeyboardInterrupt:
        log.error("sweep interrupted: finished units are saved; rerun with --resume to continue")
        raise
    finally:
        bar.close()


def _read_parts(out: Path) -> pd.DataFrame:
    parts = sorted((out / PARTS).glob("*.parquet")) if (out / PARTS).exists() else []
    if not parts:
        return pd.DataFrame()
    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    order = [
        c for c in ("family", "n", "kappa", "seed", "p", "eps_mode", "eps", "dtype", "solver") if c in df
    ]
    return df.sort_values(order, kind="stable").reset_index(drop=True)


def collect(out_dir: str | Path, *, csv: bool = False) -> pd.DataFrame:
    """All rows of a run folder, in a stable order; (re)writes results.parquet (and .csv)."""
    out = Path(out_dir)
    df = _read_parts(out)
    if df.empty:
        return df
    _atomic_write_parquet(df, out / "results.parquet")
    if csv:
        df.to_csv(out / "results.csv", index=False)
    shutil.rmtree(out / RUNNING, ignore_errors=True)
    return df


def load(run_dir: str | Path) -> pd.DataFrame:
    """Rows of a run folder (all its parts so far, complete or not); writes nothing."""
    run = Path(run_dir)
    if not run.exists():
        raise FileNotFoundError(f"no run folder {run}")
    return _read_parts(run)


def estimate_cost(grid: gridmod.GridSpec) -> dict[str, float]:
    """Case count and a rough cost estimate in seconds, from one timed GEMM per n on this machine.

    Model: each solver run ~ 60 GEMMs of its n (Newton iterations) and each reference ~ (digits/16)^2 x
    2000 GEMM-equivalents in mpmath (much less with flint); a rough guide, not a promise.
    """
    import torch

    us = gridmod.units(grid)
    rows = gridmod.case_count(grid)
    secs = 0.0
    for n in set(grid.n):
        a = torch.randn(n, n, dtype=torch.float64)
        t = time.perf_counter()
        for _ in range(5):
            a @ a
        gemm = max((time.perf_counter() - t) / 5, 1e-6)
        k = sum(1 for u in us if u.n == n)
        secs += k * len(grid.dtypes) * len(grid.solvers) * 60 * gemm + k * 2000 * gemm * n / 8
    return {"units": len(us), "rows": rows, "estimated_seconds": secs}
