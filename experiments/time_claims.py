"""Measure the durations the README promises: wall and CPU time of what `make demo`, `make figures`,
`matroots validate experiments/configs/validate_demo.toml` (and its `--dry-run` estimate) and `make test`
run, each command in a child
process, CPU time from ``resource.getrusage(RUSAGE_CHILDREN)`` (user + system of the command and every
worker it started), with the machine's load average beside them (at the start, at the end, and the
mean of samples every few seconds while the command ran).

    python experiments/time_claims.py                                   # demo, figures
    python experiments/time_claims.py --only validate_demo test         # the long ones
    python experiments/time_claims.py --only validate_dry_run           # the dry run's estimate
    python experiments/time_claims.py --only figures --make             # through make itself
    python experiments/time_claims.py --only test --log suite.log       # keep what the commands print

Without ``--make`` the targets' commands run with this interpreter (no .venv set-up), into fresh
folders under ``--out`` with a cold reference cache (so nothing is resumed or reused). Each result is
merged into ``--record`` (default ``experiments/time_claims.json``, the file the README's numbers are
taken from and tests/test_readme.py checks them against), keyed by target, with the date, commit and
machine of its own measurement: measuring one target keeps the others' last results. Each result also
counts the warning lines the commands printed (:func:`warning_lines`; tests/test_quiet_output.py holds
`make demo` to one: its summary of the solves that failed).
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
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("demo", "figures", "validate_demo", "validate_dry_run", "test")
RECORD = ROOT / "experiments" / "time_claims.json"
LOAD_SAMPLE_S = 5.0


def commands(name: str, out: Path, make: bool) -> list[list[str]]:
    """What the Makefile target ``name`` runs (Makefile: demo, figures, test; validate_demo is the
    README's `matroots validate experiments/configs/validate_demo.toml`, validate_dry_run the same
    with `--dry-run`)."""
    py = sys.executable
    if name in ("validate_demo", "validate_dry_run"):
        cfg = "experiments/configs/validate_demo.toml"
        if name == "validate_dry_run":  # the estimate alone: its task and optimizer probes, nothing run
            return [[py, "-m", "matroots.cli", "validate", cfg, "--dry-run"]]
        return [
            [py, "-m", "matroots.cli", "validate", cfg, "--out", str(out / "validate_demo"), "--no-progress"]
        ]
    if make:
        return [["make", name] + ([f"DEMO_RUN={out / 'demo'}"] if name == "demo" else [])]
    if name == "demo":
        run = str(out / "demo")
        return [
            [py, "-m", "matroots.cli", "sweep", "experiments/configs/demo.toml", "--out", run, "--resume"],
            [py, "-m", "matroots.cli", "report", run],
            [py, "-m", "matroots.cli", "plot", run],
        ]
    if name == "figures":
        return [[py, "paper_figs/figures.py", "--out", str(out / "figures"), "--runs", str(out / "runs")]]
    if name == "test":  # as the Makefile: one process per core, at most 4 (TEST_JOBS)
        jobs = str(min(4, os.cpu_count() or 1))
        return [[py, "-m", "pytest", "-q", "-n", jobs, "--dist", "loadgroup", "tests"]]
    raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")


class _LoadSampler(threading.Thread):
    """The 1-minute load average every ``LOAD_SAMPLE_S`` seconds until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples = [os.getloadavg()[0]]
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(LOAD_SAMPLE_S):
            self.samples.append(os.getloadavg()[0])


#: what counts as a warning line in a target's output (issue 29: one summary line per run, no more)
WARNING_MARKS = ("warning", "did not converge")


def warning_lines(text: str) -> list[str]:
    """The lines of ``text`` (progress bars' carriage returns split) that a person reads as warnings."""
    lines = text.replace("\r", "\n").splitlines()
    return [line.strip() for line in lines if any(m in line.lower() for m in WARNING_MARKS)]


def measure(cmds: list[list[str]], cache: Path, log: Path | None = None) -> dict[str, Any]:
    """Wall and CPU time of ``cmds`` run one after the other, and the warning lines they printed
    (count and the first few); their output goes to ``log`` as it comes (appended), when given."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler = _LoadSampler()
    sampler.start()
    t0 = time.perf_counter()
    with log.open("a+b") if log else tempfile.TemporaryFile() as sink:
        start = sink.seek(0, os.SEEK_END)
        try:
            for cmd in cmds:  # with a cold reference cache, as on a fresh clone
                subprocess.run(
                    cmd,
                    cwd=ROOT,
                    check=True,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "MATROOTS_CACHE_DIR": str(cache)},
                )
        finally:
            wall = time.perf_counter() - t0
            sampler.stop.set()
            sampler.join()
        sink.seek(start)
        text = sink.read().decode(errors="replace")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    s = [*sampler.samples, os.getloadavg()[0]]
    warned = warning_lines(text)
    return {"wall_s": wall, "cpu_s": cpu, "load_start": s[0], "load_end": s[-1], "load_mean": sum(s) / len(s),
            "warning_lines": len(warned), "warnings": warned[:5]}  # fmt: skip


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip()
    except OSError:
        return ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "time_claims", help="run folders")
    ap.add_argument("--record", type=Path, default=RECORD, help="results JSON, merged per target")
    ap.add_argument("--only", nargs="+", default=["demo", "figures"], choices=TARGETS)
    ap.add_argument("--make", action="store_true", help="run `make TARGET` instead of its commands")
    ap.add_argument("--log", type=Path, help="append the commands' output here (e.g. the suite's failures)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": _cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
    record = json.loads(args.record.read_text()) if args.record.exists() else {}
    for sub in ("demo", "figures", "runs", "cache", "validate_demo"):
        shutil.rmtree(args.out / sub, ignore_errors=True)
    for name in args.only:
        r = measure(commands(name, args.out, args.make), args.out / "cache", args.log)
        r.update(
            date=time.strftime("%Y-%m-%d", time.gmtime()), commit=_commit(), machine=machine, make=args.make
        )
        record[name] = r
        print(
            f"{name:13s} wall {r['wall_s'] / 60:6.1f} min   CPU {r['cpu_s'] / 60:6.1f} min   load average "
            f"{r['load_start']:.1f} -> {r['load_end']:.1f} (mean {r['load_mean']:.1f}) on {machine['cores']} cores; "
            f"{r['warning_lines']} warning line(s)",
            flush=True,
        )
        args.record.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
