"""Regenerate every figure of the accuracy study from its sweep config.

    python paper_figs/make_figures.py                 # the demo grid (minutes)
    python paper_figs/make_figures.py --full          # precision_full + eps_regularisation (hours)

Each config's sweep is run (or resumed) into runs/<name>, then its figures are written to
paper_figs/out/<name>/ as PNG and PDF, with the report table beside them.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from matroots import grid, plots, report, sweep

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "experiments" / "configs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the full study instead of the demo grid")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    names = ["precision_full", "eps_regularisation"] if args.full else ["demo"]
    for name in names:
        spec = grid.load_config(CONFIGS / f"{name}.toml")
        run = ROOT / "runs" / name
        df = sweep.run_sweep(spec, run, workers=args.workers, resume=True)
        out = ROOT / "paper_figs" / "out" / name
        out.mkdir(parents=True, exist_ok=True)
        for p in plots.plot_all(df, run):
            shutil.copy(p, out / p.name)
        (out / "report.txt").write_text(report.format_report(df))
        print(f"{name}: figures and report in {out}")


if __name__ == "__main__":
    main()
