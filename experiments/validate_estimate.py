"""Check a sweep's dry-run cost estimate against a measured random subset of its units.

    python experiments/validate_estimate.py experiments/configs/precision_full.toml \\
        --calibrate 16 --fraction 0.05 --work /tmp/estimate-check --workers 2

1. Calibrate: time ``--calibrate`` sampled units (stratified by n, seed 0) and fit the cost model,
   exactly as ``matroots sweep CONFIG --dry-run --calibrate K`` does.
2. Measure: a ``--fraction`` of the units drawn at random within each n (proportional allocation,
   seed 1, the calibration units excluded), run through the sweep's own code path on ``--workers``
   processes with a cold reference cache.
3. Compare: predicted vs measured CPU seconds of the subset, and the full study's estimate against
   the subset's unbiased extrapolation (sum over n of measured * N_n / n_n).

Both runs are resumable folders under ``--work``; results go to ``--work/summary.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from matroots.study import grid, runner, sweep, sweep_estimate


def _measure(
    spec: grid.GridSpec, units: list[grid.Unit], out: Path, workers: int
) -> tuple[dict[str, float], float]:
    job = functools.partial(sweep.sweep_job, json.dumps(spec.to_dict(), sort_keys=True, default=str))
    t = time.perf_counter()
    runner.run_units(units, job, out, workers=workers, progress=True, desc=out.name)
    wall = time.perf_counter() - t
    df = runner.read_parts(out)
    return df.groupby("unit")["unit_cpu_seconds"].first().to_dict(), wall


def subset(units: list[grid.Unit], fraction: float, exclude: set[str], seed: int) -> list[grid.Unit]:
    rng = np.random.default_rng(seed)
    out = []
    for n in sorted({u.n for u in units}):
        pool = [u for u in units if u.n == n and u.key not in exclude]
        k = max(1, round(fraction * len(pool)))
        out += [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--calibrate", type=int, default=16)
    ap.add_argument("--fraction", type=float, default=0.05)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    spec = grid.load_config(args.config)
    units = grid.units(spec)
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["MATROOTS_CACHE_DIR"] = str(args.work / "cache")  # cold for this check, shared by both runs

    calib = sweep_estimate.sample_units(units, args.calibrate, seed=0)
    c_cpu, _ = _measure(spec, calib, args.work / "calibration", args.workers)
    cpu = np.array([c_cpu[u.key] for u in calib])
    coef, sigma = sweep_estimate.fit(
        np.stack([sweep_estimate.features(u) for u in calib]),
        np.log(cpu),
        sweep_estimate._prior_coef(spec),
        ridge=max(0.1, 4.0 / len(calib)),
    )
    full_pred = sweep_estimate.predict(spec, units, list(coef), sigma)

    sub = subset(units, args.fraction, {u.key for u in calib}, seed=1)
    s_cpu, s_wall = _measure(spec, sub, args.work / "subset", args.workers)
    measured = np.array([s_cpu[u.key] for u in sub])
    pred_sub = np.array([sweep_estimate.predict(spec, [u], list(coef), sigma) for u in sub])
    # unbiased extrapolation of the full study's CPU seconds from the stratified random subset
    extrap = 0.0
    for n in sorted({u.n for u in units}):
        N = sum(1 for u in units if u.n == n and u.key not in c_cpu)
        m = [c for u, c in zip(sub, measured, strict=True) if u.n == n]
        extrap += N * float(np.mean(m))
    extrap += float(cpu.sum())
    summary = {
        "config": str(args.config),
        "units": len(units),
        "calibration_units": len(calib),
        "calibration_cpu_seconds": float(cpu.sum()),
        "coef": [float(c) for c in coef],
        "sigma": sigma,
        "estimate_full_cpu_seconds": full_pred,
        "estimate_full_wall_hours_2cores": full_pred / 2 / 3600,
        "subset_units": len(sub),
        "subset_fraction": len(sub) / len(units),
        "subset_measured_cpu_seconds": float(measured.sum()),
        "subset_predicted_cpu_seconds": float(pred_sub.sum()),
        "subset_ratio_measured_over_predicted": float(measured.sum() / pred_sub.sum()),
        "subset_wall_seconds": s_wall,
        "subset_workers": args.workers,
        "extrapolated_full_cpu_seconds": extrap,
        "extrapolated_full_wall_hours_2cores": extrap / 2 / 3600,
        "per_n": {
            int(n): {
                "measured": float(sum(c for u, c in zip(sub, measured, strict=True) if u.n == n)),
                "predicted": float(sum(p for u, p in zip(sub, pred_sub, strict=True) if u.n == n)),
                "units": sum(1 for u in sub if u.n == n),
            }
            for n in sorted({u.n for u in sub})
        },
        "unit_log_error_sd": float(np.std(np.log(measured) - np.log(pred_sub) + sigma**2 / 2)),
        "loadavg": os.getloadavg(),
    }
    (args.work / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(
        f"full study: estimate {full_pred / 3600:.2f} CPU-h, extrapolated from the subset {extrap / 3600:.2f} CPU-h; "
        f"subset measured/predicted {summary['subset_ratio_measured_over_predicted']:.2f} "
        f"(x/÷ {math.exp(sigma):.2f} per unit)"
    )


if __name__ == "__main__":
    main()
