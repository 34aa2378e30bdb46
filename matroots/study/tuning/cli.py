"""``matroots tune CONFIG --out DIR``: the tune subcommand (registered by :mod:`matroots.cli`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``tune`` subparser."""
    tp = sub.add_parser(
        "tune",
        help="run (or resume) a tune sweep and write a selection table",
        description="Run every candidate solver configuration of CONFIG on its sweep grids "
        "(DIR/sweeps/<name>/), then write DIR/selection.csv: per (device, dtype, p, n band, kappa band, "
        "target) the cheapest configuration that met the target on every case, with worst error, "
        "median cost (GEMM-equivalents and CPU seconds), failure rate and runner-up; provenance in "
        "DIR/selection.json, a summary in DIR/summary.txt.",
    )
    tp.add_argument("config", type=Path, help="TOML tune config (see experiments/configs/tune_default.toml)")
    tp.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<config name>)")
    tp.add_argument("--workers", type=int, default=None, help="worker processes (default: config or cores)")
    tp.add_argument("--scheduler", default=None, metavar="ADDRESS", help="dask scheduler address")
    tp.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    tp.add_argument(
        "--no-retry-crashed",
        action="store_true",
        help="with --resume: keep the units an earlier run recorded as WorkerCrashed (default: rerun them)",
    )
    tp.add_argument(
        "--install",
        nargs="?",
        const="package",
        default=None,
        metavar="DIR",
        help="also copy the table to DIR as selection_<device>.csv/.json (no DIR: the package's data "
        "folder, i.e. replace the shipped table)",
    )
    tp.add_argument(
        "--select-only",
        action="store_true",
        help="run nothing: rebuild the table from the rows already in --out",
    )
    tp.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    tp.set_defaults(func=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    """Run the tune and print the summary."""
    from ...core.errors import InvalidArgumentError, MatrootsError
    from ...solvers.auto_table import DATA_DIR
    from .. import atomic
    from . import run, spec

    try:
        ts = spec.load_config(args.config)
    except MatrootsError:
        raise
    except (OSError, ValueError) as exc:  # unreadable file, TOML syntax, unknown solver/option/family
        raise InvalidArgumentError(f"bad tune config {args.config}: {exc}") from exc
    from ..runner import check_scheduler
    from ..sweep_estimate import check_memory

    for g in ts.sweeps:
        check_memory(g)
    check_scheduler(args.scheduler)
    out = args.out or Path("runs") / ts.name
    install = DATA_DIR if args.install == "package" else args.install
    if args.select_only:
        rows = run.load_rows(ts, out)
        if rows.empty:
            raise InvalidArgumentError(f"no sweep rows in {out}/sweeps; run without --select-only first")
        from .select import planned_cases, select
        from .summary import format_summary

        tab, summ = select(rows, ts, planned=planned_cases(ts))
        prov = run.provenance_record(ts, rows, summ)
        path = run.write_table(tab, prov, out)
        text = format_summary(tab, prov)
        atomic.write_text(out / "summary.txt", text)
        if install is not None:
            run.write_table(tab, prov, Path(install), stem=f"selection_{ts.device}")
    else:
        tab, path = run.run_tune(
            ts,
            out,
            workers=args.workers,
            resume=args.resume,
            progress=not args.no_progress,
            scheduler=args.scheduler,
            install=install,
            retry_crashed=not args.no_retry_crashed,
        )
        text = (out / "summary.txt").read_text()
    print(text)
    print(f"selection table: {path} ({len(tab)} rows); provenance: {path.with_suffix('.json')}")
    if install is not None:
        print(f"installed as {Path(install) / f'selection_{ts.device}.csv'}")
    return 0
