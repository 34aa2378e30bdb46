"""``matroots validate``: run a validation grid, estimate its cost, or report on a finished run.

    matroots validate experiments/configs/validate_demo.toml --out runs/validate_demo
    matroots validate experiments/configs/validate_full.toml --dry-run
    matroots validate --report runs/validate_demo
    matroots validate experiments/configs/validate_full.toml --out runs/validate_full --resume \
        --seed-from results/validation

Also ``python -m matroots.study.validation ...`` with the same arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ...core.errors import InvalidArgumentError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config", type=Path, nargs="?", help="validation TOML config (experiments/configs/validate_*.toml)"
    )
    p.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<config name>)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: number of cores)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS", help="dask.distributed scheduler address")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    p.add_argument(
        "--seed-from",
        type=Path,
        default=None,
        metavar="RESULTS",
        help="first write the units of the shipped set RESULTS (results/validation, of this config) into "
        "--out as finished parts, never over a part there; then run the rest (for a lost run folder)",
    )
    p.add_argument(
        "--no-retry-crashed",
        action="store_true",
        help="with --resume: keep the units an earlier run recorded as WorkerCrashed (default: rerun them)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config, time a short probe of each distinct (task, optimizer) on this machine "
        "and print the unit count and estimated cost; run nothing",
    )
    p.add_argument("--cores", type=int, default=2, help="cores the --dry-run wall-time estimate assumes (2)")
    p.add_argument("--report", type=Path, default=None, metavar="RUN", help="write tables and figures of RUN")
    p.add_argument("--csv", action="store_true", help="also write CSV copies of the tables")
    p.add_argument(
        "--ship",
        type=Path,
        default=None,
        metavar="DEST",
        help="write the compact, provenance-checked results of the protocol run in --out into DEST "
        "(results/validation); runs nothing",
    )
    p.add_argument("--partial", action="store_true", help="with --ship: ship a run that is not finished")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def register(sub: Any) -> None:
    """Add the ``validate`` subcommand to the ``matroots`` command line."""
    p = sub.add_parser(
        "validate",
        help="train real tasks with AdamW, SGD and Shampoo (every root solver, dtype, eps) and compare",
        description="Run the grid of CONFIG (task x optimizer x lr x seed; Shampoo x root solver x "
        "root dtype x eps x precondition frequency) into --out, resumably; or --report RUN.",
    )
    add_arguments(p)
    p.set_defaults(func=run)


def report_run(run_dir: Path) -> int:
    from . import figures, report
    from . import run as vrun

    if not run_dir.is_dir():
        raise InvalidArgumentError(
            f"no run folder {run_dir}; run `matroots validate CONFIG --out {run_dir}` first"
        )
    if not vrun.is_validation_run(run_dir):
        raise InvalidArgumentError(
            f"{run_dir} is not a validation run (no provenance.json of kind 'validation')"
        )
    tables = vrun.collect(run_dir)
    if tables["runs"].empty:
        raise InvalidArgumentError(f"{run_dir} holds no finished unit yet; resume it with --resume first")
    print(report.write_report(tables, run_dir))
    for p in figures.save_all(tables, run_dir):
        print(p)
    return 0


def run(args: argparse.Namespace) -> int:
    from . import config
    from . import run as vrun

    if args.report is not None:
        return report_run(args.report)
    if args.config is None:
        raise InvalidArgumentError("give a CONFIG.toml to run, or --report RUN")
    grid = config.load_config(args.config)
    if args.ship is not None:
        from .ship import ship

        rec = ship(
            args.out or Path("runs") / grid.name, args.ship, config=args.config, allow_partial=args.partial
        )
        state = "complete" if rec["complete"] else "PARTIAL"
        print(f"{rec['name']}: {rec['units_done']}/{rec['units_total']} units ({state}) -> {args.ship}")
        return 0
    if args.dry_run:
        est = vrun.estimate(grid, cores=args.cores)
        print(vrun.format_estimate(grid, est))
        return 0
    out = args.out or Path("runs") / grid.name
    prepare = None
    if args.seed_from is not None:
        from .seed import seeder

        # the account is printed before the units run: hours before the end
        prepare = seeder(args.seed_from, grid, out, lambda line: print(line, flush=True))
    tables = vrun.run_validation(
        grid,
        out,
        workers=args.workers,
        resume=args.resume,
        progress=not args.no_progress,
        scheduler=args.scheduler,
        csv=args.csv,
        retry_crashed=not args.no_retry_crashed,
        prepare=prepare,
    )
    print(
        f"{len(tables['runs'])} runs, {len(tables['curves'])} curve rows, {len(tables['roots'])} root rows in {out}"
    )
    print(f"report: matroots validate --report {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m matroots.study.validation``."""
    from ...core.errors import MatrootsError

    p = argparse.ArgumentParser(
        prog="python -m matroots.study.validation", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("-v", "--verbose", action="store_true")
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return run(args)
    except (MatrootsError, FileNotFoundError) as exc:
        print(f"matroots validate: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("matroots validate: interrupted; finished work is saved (rerun with --resume)", file=sys.stderr)
        if argv is None:  # this process is the command: end it now, without the slow finalisation
            from ..runner import exit_after_interrupt

            exit_after_interrupt(130)
        return 130


__all__ = ["add_arguments", "main", "register", "report_run", "run"]
