"""The ``matroots`` command line: sweep, report, plot, solve."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def _parse_option(s: str) -> tuple[str, object]:
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"--option expects KEY=VALUE, got {s!r}")
    k, v = s.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="matroots",
        description="Inverse p-th roots of matrices: precision sweeps, reports, figures and one-off solves.",
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="log progress details to stderr")
    sub = ap.add_subparsers(dest="command", required=True)

    sw = sub.add_parser(
        "sweep",
        help="run (or resume) a sweep from a TOML grid config",
        description="Run every (case, solver) pair of the grid in CONFIG and write tidy rows "
        "to DIR/parts/*.parquet and DIR/results.parquet, with DIR/provenance.json.",
    )
    sw.add_argument("config", type=Path, help="TOML grid config (see experiments/configs/)")
    sw.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<config name>)")
    sw.add_argument("--workers", type=int, default=None, help="worker processes (default: number of cores)")
    sw.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run in --out, skipping units already written",
    )
    sw.add_argument(
        "--dry-run", action="store_true", help="print the case count and an estimated cost, run nothing"
    )
    sw.add_argument("--csv", action="store_true", help="also write results.csv")
    sw.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    rp = sub.add_parser(
        "report",
        help="print summary tables of a run",
        description="Print per solver x dtype error/failure/iteration statistics and the best "
        "solver per (dtype, kappa band, eps).",
    )
    rp.add_argument("run_dir", type=Path)
    rp.add_argument(
        "--accuracy",
        type=float,
        default=None,
        help="relative forward error a solver must meet to count as best (default 1e-2)",
    )

    pl = sub.add_parser(
        "plot",
        help="write the figures of a run (PNG and PDF)",
        description="Write error-vs-kappa, iterations-vs-kappa, failure heat map and "
        "residual-vs-error figures to RUN_DIR/figures.",
    )
    pl.add_argument("run_dir", type=Path)

    so = sub.add_parser(
        "solve",
        help="compute one inverse root and print its diagnostics",
        description="Load a square matrix from FILE.npy and print the result of "
        "matroots.inverse_root with its diagnostics.",
    )
    so.add_argument("file", type=Path, help=".npy file holding an (n, n) or (..., n, n) float array")
    so.add_argument("-p", type=float, required=True, help="the root: computes A^(-1/p)")
    so.add_argument("--method", default="eigh", help="solver name (see matroots.solvers.available())")
    so.add_argument("--dtype", default=None, help="working precision: fp64, fp32, bf16, fp16")
    so.add_argument("--eps", type=float, default=0.0, help="regularisation eps")
    so.add_argument("--eps-mode", default="absolute", choices=["absolute", "relative"])
    so.add_argument("--forward", action="store_true", help="compute A^(1/p) instead of A^(-1/p)")
    so.add_argument(
        "--option",
        action="append",
        type=_parse_option,
        default=[],
        help="solver config option KEY=VALUE (repeatable), e.g. --option scaling=frobenius",
    )
    so.add_argument("--save", type=Path, default=None, help="write the root to this .npy file")
    so.add_argument(
        "--reference",
        action="store_true",
        help="also compute a high-precision reference and print the forward error",
    )
    return ap


def cmd_sweep(args: argparse.Namespace) -> int:
    from . import grid, sweep

    spec = grid.load_config(args.config)
    if args.dry_run:
        est = sweep.estimate_cost(spec)
        print(
            f"{spec.name}: {est['units']} units (matrix, p, eps), {est['rows']} (case, solver) rows; "
            f"estimated {est['estimated_seconds']:.0f} s of compute on one core"
        )
        return 0
    out = args.out or Path("runs") / spec.name
    df = sweep.run_sweep(
        spec, out, workers=args.workers, resume=args.resume, progress=not args.no_progress, csv=args.csv
    )
    print(f"{len(df)} rows in {out / 'results.parquet'}")
    return 0


def _rows(run_dir: Path) -> pd.DataFrame | None:
    """The run's rows, or None (with a message on stderr) when it has none."""
    from . import sweep

    df = sweep.load(run_dir)
    if df.empty:
        print(f"no rows in {run_dir}", file=sys.stderr)
        return None
    return df


def cmd_report(args: argparse.Namespace) -> int:
    from . import report

    df = _rows(args.run_dir)
    if df is None:
        return 1
    acc = args.accuracy if args.accuracy is not None else report.DEFAULT_ACCURACY
    text = report.format_report(df, acc)
    print(text)
    (Path(args.run_dir) / "report.txt").write_text(text)
    report.best_solver_table(df, acc).to_csv(Path(args.run_dir) / "best_solver.csv", index=False)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from . import plots

    df = _rows(args.run_dir)
    if df is None:
        return 1
    for p in plots.plot_all(df, args.run_dir):
        print(p)
    return 0


def cmd_solve(args: argparse.Namespace) -> int:
    import torch

    from . import api, metrics

    A = np.load(args.file)
    p = int(args.p) if float(args.p).is_integer() else args.p
    fn = api.root if args.forward else api.inverse_root
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fn(
            A, p, args.method, eps=args.eps, eps_mode=args.eps_mode, dtype=args.dtype, **dict(args.option)
        )
    print(f"method      {res.method}   dtype {res.dtype}   shape {tuple(res.root.shape)}")
    print(f"converged   {res.converged}")
    print(f"iterations  {res.iterations}   matmuls {res.matmuls:.2f}   seconds {res.seconds:.4f}")
    print(f"residual    {res.residual}")
    for k, v in res.info.items():
        if isinstance(v, torch.Tensor):
            v = v.tolist()
        print(f"info.{k:<12} {v}")
    for w in caught:
        print(f"warning: {w.message}")
    if args.reference and not args.forward and A.ndim == 2:
        from . import reference

        eps_abs = (
            args.eps * float(np.abs(np.linalg.eigvals(A)).max()) if args.eps_mode == "relative" else args.eps
        )
        ref = reference.inverse_root(A, p, eps_abs)
        err = metrics.relative_forward_error(res.root.double().numpy(), ref.root)
        print(f"forward error vs {ref.backend} reference ({ref.digits} digits): {err:.3e}")
    if args.save:
        np.save(args.save, res.root.double().numpy())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    from .errors import MatrootsError

    cmds = {"sweep": cmd_sweep, "report": cmd_report, "plot": cmd_plot, "solve": cmd_solve}
    try:
        return cmds[args.command](args)
    except (MatrootsError, FileNotFoundError) as exc:
        print(f"matroots {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
