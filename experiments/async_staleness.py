"""What root staleness costs in steps: per-seed steps-to-target of synchronous and asynchronous Shampoo.

Reads the curves of a ``matroots validate experiments/configs/validate_async.toml`` run (a run folder,
or the shipped copy ``results/async_staleness``). Per task the target is the validation loss every
AdamW seed reaches (the largest of their final losses: the protocol's definition, per seed set);
per configuration and seed the first evaluated step whose validation loss is at or below it (None:
never), and the final validation loss. The configurations share their seeds, hence their initial
weights and data order, so a column compares like with like; the spread over seeds of the
synchronous row is the seed noise a delay is judged against.

    python experiments/async_staleness.py                        # the shipped run
    python experiments/async_staleness.py runs/validate_async --markdown
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "results" / "async_staleness"


def delay(config: str) -> str:
    """``"sync"`` or the ``max_root_delay`` k of a Shampoo config label (``...|async=k]``)."""
    m = re.search(r"\|async=(\d+)\]$", config)
    return f"k = {m.group(1)}" if m else "sync"


def table(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, config): target, per-seed steps to it and final losses, their medians."""
    rows = []
    for task, g in curves.groupby("task", sort=True):
        finals = g[g["optimizer"] == "adamw"].sort_values("step").groupby("seed")["val_loss"].last()
        if finals.empty:
            raise ValueError(f"task {task}: no AdamW curve to set the target")
        target = float(finals.max())
        for cfg, h in g.groupby("config", sort=False):
            steps, final = [], []
            for _, k in h.sort_values("step").groupby("seed", sort=True):
                hit = k[k["val_loss"] <= target]
                steps.append(int(hit["step"].iloc[0]) if len(hit) else None)
                final.append(float(k["val_loss"].iloc[-1]))
            reached = [s for s in steps if s is not None]
            rows.append({
                "task": task, "config": cfg, "schedule": "AdamW" if cfg == "adamw" else delay(cfg),
                "target": target, "steps": steps,
                "median_steps": statistics.median(reached) if len(reached) == len(steps) else None,
                "final": final, "median_final": statistics.median(final),
            })  # fmt: skip
    order = {"AdamW": -2, "sync": -1}
    out = pd.DataFrame(rows)
    key = out["schedule"].map(lambda s: order.get(s, int(s.split("= ")[1]) if "=" in s else 0))
    return out.assign(_k=key).sort_values(["task", "_k"]).drop(columns="_k").reset_index(drop=True)


def render(t: pd.DataFrame, markdown: bool = False) -> str:
    lines = []
    for task, g in t.groupby("task", sort=True):
        lines.append(f"{task}: target {g['target'].iloc[0]:.4f} (every AdamW seed's final validation loss)")
        if markdown:
            lines += ["", "| schedule | steps per seed | median | final loss per seed |", "|---|---|---|---|"]
        for _, r in g.iterrows():
            steps = ", ".join("-" if s is None else str(s) for s in r["steps"])
            med = "-" if pd.isna(r["median_steps"]) else f"{r['median_steps']:g}"
            fin = ", ".join(f"{x:.4f}" for x in r["final"])
            if markdown:
                lines.append(f"| {r['schedule']} | {steps} | {med} | {fin} |")
            else:
                lines.append(f"  {r['schedule']:<8} steps {steps:<20} median {med:>6}  final {fin}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", default=str(SHIPPED), help="a run folder or the shipped copy")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    path = Path(args.run) / "curves.parquet"
    if not path.exists():
        print(f"async_staleness: no {path} (run matroots validate experiments/configs/validate_async.toml)")
        return 2
    print(render(table(pd.read_parquet(path)), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
