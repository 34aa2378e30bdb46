"""The ``matroots`` command line: sweep, report, plot, solve (and subcommands registered by other modules).

Every mistake a user can make on the command line or in a config (unknown solver, option, family or
dtype, TOML syntax, a run folder reused without ``--resume``, an unwritable folder, a file that is not
``.npy``, a run without metrics) ends in **one line** on stderr that names the problem and the fix,
and exit code 2, before any worker starts. A traceback means a bug in matroots.

Adding a subcommand: write ``register(subparsers)`` in your module; it adds its parser with
``subparsers.add_parser(NAME, ...)`` and sets ``parser.set_defaults(func=run)``, where
``run(args) -> int`` is the exit code. Then add the module's dotted path to :data:`COMMAND_MODULES`.
Raise :class:`matroots.MatrootsInputError` (or a subclass) for user mistakes: :func:`main` turns it
into the one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from .core.options import EPS_MODES

if TYPE_CHECKING:
    import pandas as pd

#: Modules defining ``register(subparsers)`` for further subcommands (see the module docstring).
COMMAND_MODULES: tuple[str, ...] = (
    "matroots.study.tuning.cli",
    "matroots.study.validation.cli",
    "matroots.study.shipped",
)

DTYPE_CHOICES = ("fp64", "fp32", "bf16", "fp16")


class UsageError(ValueError):
    """A command-line mistake found after parsing (bad file, run without rows); printed as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``PROG: error: MESSAGE (see PROG --help)``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return importlib.metadata.version("matroots")
    except importlib.metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {s!r}")
    return v


def _parse_option(s: str) -> tuple[str, object]:
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"--option expects KEY=VALUE, got {s!r}")
    k, v = s.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def _solver_names() -> list[str]:
    from .solvers import registry

    return registry.available()


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    sw = sub.add_parser(
        "sweep",
        help="run (or resume) a sweep from a TOML grid config",
        description="Run every (case, solver) pair of the grid in CONFIG and write tidy rows "
        "to DIR/parts/*.parquet and DIR/results.parquet, with DIR/provenance.json.",
    )
    sw.add_argument("config", type=Path, help="TOML grid config (see experiments/configs/)")
    sw.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<config name>)")
    sw.add_argument(
        "--workers", type=_positive_int, default=None, help="worker processes (default: number of cores)"
    )
    sw.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="run units on the dask.distributed cluster at ADDRESS (e.g. tcp://host:8786; "
        "needs pip install 'matroots[dask]') instead of a local process pool",
    )
    sw.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run in --out, skipping units already written",
    )
    sw.add_argument(
        "--seed-from",
        type=Path,
        default=None,
        metavar="RESULTS",
        help="first write the units of the shipped set RESULTS (results/NAME, of this config) into "
        "--out as finished parts, never over a part there; then run the rest (for a lost run folder)",
    )
    sw.add_argument(
        "--no-retry-crashed",
        action="store_true",
        help="with --resume: keep the units an earlier run recorded as WorkerCrashed (default: rerun them)",
    )
    sw.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the config, print the case count and an estimated cost, run nothing",
    )
    sw.add_argument(
        "--calibrate",
        type=int,
        default=0,
        metavar="K",
        help="with --dry-run: time K sampled units on this machine and scale the estimate by them",
    )
    sw.add_argument("--csv", action="store_true", help="also write results.csv")
    sw.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sw.set_defaults(func=cmd_sweep)


def _add_report(sub: argparse._SubParsersAction) -> None:
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
    rp.set_defaults(func=cmd_report)


def _add_plot(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser(
        "plot",
        help="write the figures of a run (PNG and PDF)",
        description="Write error-vs-kappa, iterations-vs-kappa, failure heat map and "
        "residual-vs-error figures to RUN_DIR/figures.",
    )
    pl.add_argument("run_dir", type=Path)
    pl.set_defaults(func=cmd_plot)


def _add_solve(sub: argparse._SubParsersAction) -> None:
    so = sub.add_parser(
        "solve",
        help="compute one inverse root and print its diagnostics",
        description="Load a square matrix from FILE.npy and print the result of "
        "matroots.inverse_root with its diagnostics.",
    )
    so.add_argument("file", type=Path, help=".npy file holding an (n, n) or (..., n, n) float array")
    so.add_argument("-p", type=float, required=True, help="the root: computes A^(-1/p)")
    so.add_argument(
        "--method",
        default="eigh",
        metavar="METHOD",
        help=f"solver: one of {', '.join(_solver_names())} (default: eigh)",
    )
    so.add_argument(
        "--dtype",
        default=None,
        choices=DTYPE_CHOICES,
        help=f"working precision: one of {', '.join(DTYPE_CHOICES)} (default: the input's own)",
    )
    so.add_argument("--eps", type=float, default=0.0, help="regularisation eps")
    so.add_argument("--eps-mode", default="absolute", choices=EPS_MODES)
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
        "--json",
        action="store_true",
        help="print the whole result (every info entry in full, e.g. eigh_warm's eigenvectors) as JSON",
    )
    so.add_argument(
        "--reference",
        action="store_true",
        help="also compute a high-precision reference and print the forward error",
    )
    so.set_defaults(func=cmd_solve)


BUILTIN_COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_sweep,
    _add_report,
    _add_plot,
    _add_solve,
)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="matroots",
        description="Inverse p-th roots of matrices: precision sweeps, reports, figures and one-off solves.",
    )
    ap.add_argument("--version", action="version", version=f"matroots {_version()}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log progress details to stderr")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in BUILTIN_COMMANDS:
        add(sub)
    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    return ap


def cmd_sweep(args: argparse.Namespace) -> int:
    from .study import grid, sweep, sweep_estimate
    from .study.runner import check_scheduler

    spec = grid.load_config(args.config)
    sweep_estimate.check_memory(spec)  # before check_families, which builds one matrix of each n
    grid.check_families(spec)
    check_scheduler(args.scheduler)
    if args.dry_run:
        est = sweep_estimate.estimate(spec, calibrate=args.calibrate)
        print(sweep_estimate.format_estimate(spec, est))
        return 0
    out = args.out or Path("runs") / spec.name
    df = sweep.run_sweep(
        spec,
        out,
        workers=args.workers,
        resume=args.resume,
        progress=not args.no_progress,
        csv=args.csv,
        scheduler=args.scheduler,
        retry_crashed=not args.no_retry_crashed,
        seed_from=args.seed_from,
        on_seeded=lambda line: print(line, flush=True),  # before the units run: hours before the end
    )
    print(f"{len(df)} rows in {out / 'results.parquet'}")
    return 0


def _is_validation_run(run_dir: Path) -> bool:
    """A ``matroots validate`` run folder: report and plot hand it to the validation report."""
    from .study.validation.run import is_validation_run

    return is_validation_run(run_dir)


def _rows(run_dir: Path, *, need_metrics: bool = True) -> pd.DataFrame:
    """The run's rows; a one-line UsageError when there are none (or no forward-error metrics)."""
    from .study import sweep

    if not run_dir.is_dir():
        raise UsageError(f"no run folder {run_dir}; run `matroots sweep CONFIG --out {run_dir}` first")
    df = sweep.load(run_dir)
    if df.empty:
        raise UsageError(
            f"no rows in {run_dir}: it holds no finished unit; run or resume "
            f"`matroots sweep CONFIG --out {run_dir} --resume` first"
        )
    if need_metrics and (
        "relative_forward_error" not in df or not df["relative_forward_error"].notna().any()
    ):
        why = ""
        if "reference_error" in df and df["reference_error"].notna().any():
            why = f" (reference failed: {df['reference_error'].dropna().iloc[0][:120]})"
        raise UsageError(
            f"the rows in {run_dir} have no forward-error metrics{why}; every solve failed or no reference "
            "was computed: check the sweep config (reference_backend, kappa, eps) and rerun it"
        )
    return df


def cmd_report(args: argparse.Namespace) -> int:
    from .study import atomic, report

    if _is_validation_run(args.run_dir):
        from .study.validation.cli import report_run

        return report_run(Path(args.run_dir))
    df = _rows(args.run_dir)
    acc = args.accuracy if args.accuracy is not None else report.DEFAULT_ACCURACY
    text = report.format_report(df, acc)
    print(text)
    atomic.write_text(Path(args.run_dir) / "report.txt", text)
    atomic.write_csv(
        Path(args.run_dir) / "best_solver.csv", report.best_solver_table(df, acc), index=False, na_rep="NA"
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from .study import plots

    if _is_validation_run(args.run_dir):
        from .study.validation.cli import report_run

        return report_run(Path(args.run_dir))
    df = _rows(args.run_dir)
    for p in plots.plot_all(df, args.run_dir):
        print(p)
    return 0


def _load_npy(path: Path) -> np.ndarray:
    if not path.exists():
        raise UsageError(f"no file {path}; give the path of a .npy matrix (numpy.save)")
    if path.suffix.lower() != ".npy":
        raise UsageError(f"{path} is not a .npy file; save the matrix with numpy.save('{path.stem}.npy', A)")
    try:
        A = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise UsageError(
            f"{path} is not a readable .npy array ({exc}); save the matrix with numpy.save"
        ) from None
    if not isinstance(A, np.ndarray) or A.dtype.kind not in "fiu":
        raise UsageError(f"{path} holds a {getattr(A, 'dtype', type(A))} array; save a real float matrix")
    return A


def cmd_solve(args: argparse.Namespace) -> int:
    from . import api
    from .truth import metrics

    A = _load_npy(args.file)
    p = int(args.p) if float(args.p).is_integer() else args.p
    fn = api.root if args.forward else api.inverse_root
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fn(
            A, p, args.method, eps=args.eps, eps_mode=args.eps_mode, dtype=args.dtype, **dict(args.option)
        )
    m = metrics.solved_metrics(res, A, p, inverse=not args.forward) if args.reference else None
    if args.json:
        record = _result_record(res, [str(w.message) for w in caught])
        if m is not None:
            record["reference"] = _plain(m)
        print(json.dumps(record, default=str))
    else:
        print(f"method      {res.method}   dtype {res.dtype}   shape {tuple(res.root.shape)}")
        print(f"converged   {res.converged}")
        print(f"iterations  {res.iterations}   matmuls {res.matmuls:.2f}   seconds {res.seconds:.4f}")
        print(f"residual    {res.residual}")
        for k, v in res.info.items():
            print(f"info.{k:<12} {_short(v)}")
        for w in caught:
            print(f"warning: {w.message}")
    if m is not None and not args.json:
        # Against the reference of the matrix the solver actually solved, A + eps_abs I with its own
        # reported shift (info.eps_abs); the cost of the shift is the separate eps bias.
        lines = (
            ("forward error vs reference of A + eps_abs I", "forward_error", "eps_abs", "eps_abs"),
            ("cond(f, A) u line", "cond_u_line", "cond", "cond_root"),
            ("eps bias vs reference of A", "eps_bias", "total error", "forward_error_total"),
        )
        for label, key, label2, key2 in lines:
            print(f"{label:<44} {m[key]:.3e}   ({label2} {m[key2]:.3e})")
    if args.save:
        np.save(args.save, res.root.double().numpy())
    return 0


#: Longest value ``matroots solve`` prints of an info entry that is data (tensor, array, list,
#: mapping); longer ones are summarised by type and shape (``--json`` prints everything).
SHORT_VALUE = 80


def _plain(v: object) -> object:
    """An info value as JSON-ready Python (tensors and arrays as nested lists)."""
    import torch

    if isinstance(v, torch.Tensor):
        return v.detach().cpu().tolist()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _short(v: object) -> str:
    """An info value as one readable line: text and short data in full, long data as its start, type
    and shape."""
    text = str(_plain(v))
    if isinstance(v, str) or len(text) <= SHORT_VALUE:
        return text
    shape = getattr(v, "shape", None)
    what = (
        f"{v.dtype} array of shape {tuple(shape)}"
        if shape is not None
        else f"{type(v).__name__}, {len(v)} entries"
    )
    return f"{text[:30]}... ({what}; --json prints it)"


def _result_record(res: object, warnings_seen: list[str]) -> dict[str, object]:
    keys = ("method", "converged", "iterations", "residual", "matmuls", "seconds")
    out: dict[str, object] = {k: _plain(getattr(res, k)) for k in keys}
    out.update(dtype=str(res.dtype), shape=list(res.root.shape), info=_plain(res.info))
    out["warnings"] = warnings_seen
    return out


#: name -> handler, for subcommands added without ``set_defaults(func=...)``.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "sweep": cmd_sweep,
    "report": cmd_report,
    "plot": cmd_plot,
    "solve": cmd_solve,
}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    from .core.errors import MatrootsError
    from .study.runner import CorruptPartError

    func = getattr(args, "func", None) or COMMANDS[args.command]
    prog = f"matroots {args.command}"
    try:
        return func(args)
    except MatrootsError as exc:
        print(f"{prog}: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
    except (UsageError, CorruptPartError) as exc:
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(
            f"{prog}: error: {exc.strerror or exc}:{where}; check the path and its permissions",
            file=sys.stderr,
        )
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; finished work is saved (rerun with --resume)", file=sys.stderr)
        if argv is None:  # this process is the command: end it now, without the slow finalisation
            from .study.runner import exit_after_interrupt

            exit_after_interrupt(130)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
