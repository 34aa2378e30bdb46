"""Regenerate the paper's figure set from sweep runs, as PNG and PDF.

    python paper_figs/figures.py                # small default (experiments/configs/figures_small.toml)
    python paper_figs/figures.py --full         # the real study, from the shipped results/ (minutes)
    python paper_figs/figures.py --full --recompute   # the real study, rerun or resumed in runs/ (hours)
    make figures                                # the same as the first line; `make figures FULL=1`

The full set is drawn from the shipped results (``results/<name>/``, written by ``matroots ship``
and checked against the repository's config of the same name by :func:`matroots.study.shipped.load`);
with ``--recompute`` (and for the small default) each config's sweep is run (or resumed) into
``runs/<name>``. The figures are written to
``paper_figs/out/<small|full>/`` with an ``index.md`` saying what each shows. Validation runs (folders
of ``runs/`` written by ``matroots validate``) add the optimizer curves and the accuracy-vs-training
figure; without one those two are skipped with a note in the index. One function per figure is in
:data:`FIGURES` (each takes the rows and returns a matplotlib Figure); :func:`build` is what
``make figures`` calls.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "experiments" / "configs"
SMALL = [CONFIGS / "figures_small.toml"]
FULL = [CONFIGS / "precision_full.toml", CONFIGS / "eps_regularisation.toml"]
RESULTS = ROOT / "results"

log = logging.getLogger("paper_figs")


def _plots():
    from matroots.study import plots

    return plots


def error_vs_kappa(df: pd.DataFrame) -> plt.Figure:
    return _plots().fig_error_vs_kappa(df)


def cond_error_ratio(df: pd.DataFrame) -> plt.Figure:
    return _plots().fig_cond_error_ratio(df)


def iterations_vs_kappa(df: pd.DataFrame) -> plt.Figure:
    return _plots().fig_iterations_vs_kappa(df)


def eps_bias_vs_rounding(df: pd.DataFrame) -> plt.Figure:
    return _plots().fig_eps_bias_vs_rounding(df)


def failure_heatmap(df: pd.DataFrame) -> plt.Figure:
    return _plots().fig_failure_heatmap(df)


def residual_vs_error(df: pd.DataFrame) -> plt.Figure:
    return _plots().fig_residual_vs_error(df)


def cost_accuracy(df: pd.DataFrame) -> plt.Figure:
    return _plots().fig_cost_accuracy(df)


def shampoo_factors(df: pd.DataFrame) -> plt.Figure:
    return _plots().fig_shampoo_factors(df)


#: file name -> (figure function of the sweep rows, one-line caption for the index)
FIGURES: dict[str, tuple[Callable[[pd.DataFrame], plt.Figure], str]] = {
    "error_vs_kappa": (error_vs_kappa, "forward error vs kappa per dtype, against (kappa/p)u and cond(f,A)u"),
    "cond_error_ratio": (cond_error_ratio, "error / (cond(f,A) u) per solver: the constant C of the promise"),
    "iterations_vs_kappa": (
        iterations_vs_kappa,
        "iterations vs kappa per dtype (Schur–Newton + square roots)",
    ),
    "eps_bias_vs_rounding": (
        eps_bias_vs_rounding,
        "eps bias vs rounding error vs total error, least-error eps",
    ),
    "failure_heatmap": (failure_heatmap, "failure rate per solver x kappa x dtype, with the failure type"),
    "residual_vs_error": (residual_vs_error, "residual vs forward error; outliers are ill-conditioned roots"),
    "cost_accuracy": (cost_accuracy, "GEMM-equivalents vs error per dtype, Pareto frontier"),
    "shampoo_factors": (shampoo_factors, "real Shampoo factors: spectra by stage, solver errors on them"),
}
#: figures drawn from validation runs (when there are any)
VALIDATION_FIGURES = {
    "optimizer_curves": "validation loss curves per task at each optimizer's best learning rate",
    "accuracy_vs_training": "training outcome against the root error of the configuration",
}


#: figures drawn from the shipped validation set (results/validation) in the full build: x axis, caption
SHIPPED_VALIDATION = "validation"
SHIPPED_VALIDATION_FIGURES = {
    "validation_vs_steps": (
        "step",
        "held-out loss vs steps per task, each optimizer at its tuned point, seed range",
    ),
    "validation_vs_cpu": (
        "cpu_s",
        "held-out loss vs training CPU seconds per task, each optimizer at its tuned point",
    ),
}


def shipped_validation_figures(results: Path, out: Path) -> tuple[dict[str, list[Path]], list[str]]:
    """The validation figures of the shipped set ``results/validation`` (files, index lines); none, with
    a note, when no set is shipped. Every task of the set's config gets a panel (one without final
    seeds says so), and the index says how much of the run the set holds."""
    from matroots.study import plots
    from matroots.study.validation import config, ship
    from matroots.study.validation import figures as vfig

    where = Path(results) / SHIPPED_VALIDATION
    if not (where / "provenance.json").exists():
        note = (
            f"skipped {', '.join(SHIPPED_VALIDATION_FIGURES)}: no shipped validation set in {where} "
            "(`matroots validate CONFIG --out RUN --ship results/validation`)"
        )
        log.warning(note)
        return {}, [f"Note: {note}."]
    tables = ship.load(where, repo_root=ROOT)
    prov = ship.read_provenance(where)
    cfg = Path(prov["config"])
    tasks = [t.name for t in config.load_config(cfg if cfg.is_absolute() else ROOT / cfg).tasks]
    state = "complete" if prov.get("complete") else "PARTIAL"
    written, lines = {}, []
    for name, (x, caption) in SHIPPED_VALIDATION_FIGURES.items():
        fig = vfig.held_out_curves(tables["curves"], tables["protocol"], x, tasks=tasks)
        written[name] = plots.save(fig, out, name)
        lines.append(
            f"* `{name}.png` / `.pdf`: {caption} (`results/{SHIPPED_VALIDATION}`, {prov['units_done']}/"
            f"{prov['units_total']} units, {state})."
        )
    return written, lines


def _validation_runs(runs_dir: Path) -> list[Path]:
    if not runs_dir.exists():
        return []
    from matroots.study.validation import run as vrun

    return [d for d in sorted(runs_dir.iterdir()) if d.is_dir() and vrun.is_validation_run(d)]


def _validation_tables(run: Path) -> dict[str, pd.DataFrame]:
    tables = {}
    for name in ("curves", "summary", "accuracy"):
        f = run / f"{name}.parquet"
        tables[name] = pd.read_parquet(f) if f.exists() else pd.DataFrame()
    return tables


def build(
    configs: Sequence[str | Path] = SMALL,
    *,
    out_dir: str | Path = ROOT / "paper_figs" / "out" / "small",
    runs_dir: str | Path = ROOT / "runs",
    workers: int | None = None,
    progress: bool = True,
    shipped: str | Path | None = None,
    sample: int | None = None,
) -> dict[str, list[Path]]:
    """Write every figure of the set from each config's rows; return name -> files.

    The rows come from the shipped results under ``shipped`` (``shipped/<config name>``), or, when
    ``shipped`` is None, from each config's sweep run (or resumed) in ``runs_dir``. ``sample`` keeps
    that many rows per config (a fixed random sample: for a quick check of the figure code only).
    Figures that need validation runs are skipped (with a note in ``index.md``) when there are none.
    """
    from matroots.study import grid, plots, sweep
    from matroots.study import shipped as shipped_results

    out, runs = Path(out_dir), Path(runs_dir)
    frames, sources = [], []
    for cfg in configs:
        spec = grid.load_config(cfg)
        if shipped is not None:
            where = Path(shipped) / spec.name
            rows = shipped_results.load(where, repo_root=ROOT)
            prov = shipped_results.read_provenance(where)
            state = "complete" if prov.get("complete") else "partial"
            sources.append(
                f"`{spec.name}`: shipped {where.relative_to(ROOT) if where.is_relative_to(ROOT) else where}, "
                f"{prov['units_done']}/{prov['units_total']} units ({state}), commit(s) "
                f"{', '.join(c[:10] for c in prov['commits'])}"
            )
        else:
            grid.check_families(spec)
            rows = sweep.run_sweep(spec, runs / spec.name, workers=workers, resume=True, progress=progress)
            sources.append(f"`{spec.name}`: run {runs / spec.name}")
        if sample is not None and len(rows) > sample:
            rows = rows.sample(sample, random_state=0)
        frames.append(rows)
    df = pd.concat(frames, ignore_index=True)
    written: dict[str, list[Path]] = {}
    index = [f"# Figures ({', '.join(Path(c).name for c in configs)}; {len(df)} rows)", ""]
    index += ["Rows: " + "; ".join(sources) + ".", ""]
    with plt.rc_context({"font.size": 8}):
        for name, (fn, caption) in FIGURES.items():
            written[name] = plots.save(fn(df), out, name)
            index.append(f"* `{name}.png` / `.pdf`: {caption}.")
        if shipped is not None:
            vwritten, vlines = shipped_validation_figures(Path(shipped), out)
            written.update(vwritten)
            index += vlines
        vruns = _validation_runs(runs)
        if vruns:
            from matroots.study.validation import figures as vfig

            t = _validation_tables(vruns[-1])
            if len(t["curves"]) and len(t["summary"]):
                written["optimizer_curves"] = plots.save(
                    vfig.learning_curves(t["curves"], t["summary"]), out, "optimizer_curves"
                )
                index.append(
                    f"* `optimizer_curves`: {VALIDATION_FIGURES['optimizer_curves']} ({vruns[-1].name})."
                )
            if len(t["accuracy"]):
                written["accuracy_vs_training"] = plots.save(
                    vfig.accuracy_vs_outcome(t["accuracy"]), out, "accuracy_vs_training"
                )
                index.append(
                    f"* `accuracy_vs_training`: {VALIDATION_FIGURES['accuracy_vs_training']} ({vruns[-1].name})."
                )
        missing = [n for n in VALIDATION_FIGURES if n not in written]
        if missing:
            note = (
                f"skipped {', '.join(missing)}: no finished validation run under {runs} "
                "(run `matroots validate CONFIG --out runs/NAME`, then rerun this)"
            )
            log.warning(note)
            index += ["", f"Note: {note}."]
    index += ["", plots.FAILURE_MEANING + "."]
    (out / "index.md").write_text("\n".join(index) + "\n")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the real study (hours) instead of the small default")
    ap.add_argument(
        "--config", action="append", type=Path, default=None, help="sweep config(s) to use instead"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="figure folder (default paper_figs/out/small|full)"
    )
    ap.add_argument(
        "--runs", type=Path, default=ROOT / "runs", help="folder of the sweep runs (default runs/)"
    )
    ap.add_argument(
        "--recompute",
        action="store_true",
        help="with --full: rerun (or resume) the sweeps in --runs instead of reading the shipped results/",
    )
    ap.add_argument(
        "--results", type=Path, default=RESULTS, help="folder of the shipped results (default results/)"
    )
    ap.add_argument("--sample", type=int, default=None, help="keep N rows per config (figure-code check)")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    matplotlib.use("Agg")  # a script writing files: no display needed (the library never forces this)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    configs = args.config or (FULL if args.full else SMALL)
    out = args.out or ROOT / "paper_figs" / "out" / ("full" if args.full else "small")
    from matroots import MatrootsError

    try:
        written = build(
            configs,
            out_dir=out,
            runs_dir=args.runs,
            workers=args.workers,
            shipped=args.results if args.full and not args.recompute else None,
            sample=args.sample,
        )
    except MatrootsError as exc:
        print(f"figures: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"{sum(len(v) for v in written.values())} files for {len(written)} figures in {out} (see index.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
