"""Measure the durations the README promises: wall and CPU time of what `make demo` and `make figures`
run, each command in a child process, CPU time from ``resource.getrusage(RUSAGE_CHILDREN)`` (user +
system of the command and every worker it started), with the machine's load average beside them.

    python experiments/time_claims.py --out runs/time_claims            # demo, figures
    python experiments/time_claims.py --only figures --make             # through make itself

Without ``--make`` the targets' commands run with this interpreter (no .venv set-up), into fresh
folders under ``--out`` with a cold reference cache (so nothing is resumed or reused). Results: ``--out/time_claims.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commands(name: str, out: Path, make: bool) -> list[list[str]]:
    """What the Makefile target ``name`` runs (Makefile: demo, figures)."""
    if make:
        return [["make", name] + ([f"DEMO_RUN={out / 'demo'}"] if name == "demo" else [])]
    py = sys.executable
    if name == "demo":
        run = str(out / "demo")
        return [
            [py, "-m", "matroots.cli", "sweep", "experiments/configs/demo.toml", "--out", run, "--resume"],
            [py, "-m", "matroots.cli", "report", run],
            [py, "-m", "matroots.cli", "plot", run],
        ]
    if name == "figures":
        return [[py, "paper_figs/figures.py", "--out", str(out / "figures"), "--runs", str(out / "runs")]]
    raise ValueError(f"unknown target {name!r}")


def measure(cmds: list[list[str]], cache: Path) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    for cmd in cmds:
        subprocess.run(
            cmd,
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "MATROOTS_CACHE_DIR": str(cache)},  # cold references, as on a fresh clone
        )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "load_start": load0, "load_end": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "time_claims")
    ap.add_argument("--only", nargs="+", default=["demo", "figures"], choices=["demo", "figures"])
    ap.add_argument("--make", action="store_true", help="run `make TARGET` instead of its commands")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    results: dict[str, object] = {"machine": machine}
    for sub in ("demo", "figures", "runs", "cache"):
        shutil.rmtree(args.out / sub, ignore_errors=True)
    for name in args.only:
        r = measure(commands(name, args.out, args.make), args.out / "cache")
        results[name] = r
        print(
            f"{name:8s} wall {r['wall_s'] / 60:6.1f} min   CPU {r['cpu_s'] / 60:6.1f} min   "
            f"load average {r['load_start']:.1f} -> {r['load_end']:.1f} on {machine['cores']} cores",
            flush=True,
        )
    (args.out / "time_claims.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
