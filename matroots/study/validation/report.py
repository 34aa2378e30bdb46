"""Text report of a validation run: steps-to-target per task and the accuracy-vs-outcome table."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .summary import best, degradation_threshold


def _f(x: float, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return format(x, spec)


def steps_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Each config at its best lr, the columns of the steps-to-target table."""
    b = best(summary)
    cols = ["task", "config", "lr", "final_val_loss", "spread", "final_metric", "steps_to_target",
            "steps_ratio", "min_steps_to_target", "min_steps_lr", "min_steps_ratio", "time_ratio_cpu",
            "time_ratio", "time_to_target_ratio", "reached", "seeds", "failures"]  # fmt: skip
    return b[[c for c in cols if c in b]].sort_values(["task", "steps_ratio"], kind="stable")


def format_report(tables: dict[str, pd.DataFrame]) -> str:
    s = tables["summary"]
    lines = []
    for task, g in steps_table(s).groupby("task", sort=True):
        t = s[s["task"] == task].iloc[0]
        lines.append(
            f"== {task}: target = AdamW's best final val loss {_f(float(t['target']), '.4f')} "
            f"(metric: {t.get('metric_name', '')}); 'steps' at each config's best-final lr, "
            "'fastest' over its lrs; time per step vs AdamW, interleaved in the same process"
        )
        lines.append(
            f"{'config':<52} {'lr':>8} {'final val':>10} {'IQR':>8} {'metric':>8} {'steps':>6} "
            f"{'x AdamW':>8} {'fastest':>7} {'at lr':>7} {'x AdamW':>8} {'t/step cpu':>10} {'t/step wall':>11} "
            f"{'reached':>8} {'fail':>4}"
        )
        for _, r in g.iterrows():
            lines.append(
                f"{r['config']:<52} {r['lr']:>8.2g} {_f(r['final_val_loss'], '.4f'):>10} "
                f"{_f(r['spread'], '.2g'):>8} {_f(r['final_metric'], '.4f'):>8} "
                f"{_f(r['steps_to_target'], '.0f'):>6} {_f(r['steps_ratio'], '.2f'):>8} "
                f"{_f(r['min_steps_to_target'], '.0f'):>7} {r['min_steps_lr']:>7.2g} "
                f"{_f(r['min_steps_ratio'], '.2f'):>8} "
                f"{_f(r['time_ratio_cpu'], '.2f'):>10} {_f(r['time_ratio'], '.2f'):>11} "
                f"{int(r['reached'])}/{int(r['seeds']):<6} {int(r['failures']):>4}"
            )
        lines.append("")
    acc = tables.get("accuracy")
    if acc is not None and len(acc):
        lines.append("== root accuracy vs training outcome (Shampoo configs at their best lr)")
        lines.append(
            "   median relative forward error of the roots against float64 eigh of the same factor: 'solved' = "
            "the matrix Shampoo solved (shift + eps), 'asked' = the configured eps, 'total' = the common "
            "reference eps"
        )
        lines.append(
            f"{'task':<9} {'config':<52} {'solved':>9} {'asked':>9} {'total':>9} {'final val':>10} "
            f"{'delta':>8} {'x AdamW':>8} {'fallbk':>6} {'degraded':>8}"
        )
        for _, r in acc.iterrows():
            lines.append(
                f"{r['task']:<9} {r['config']:<52} {_f(r.get('forward_error_solved', math.nan), '.2e'):>9} "
                f"{_f(r['forward_error'], '.2e'):>9} "
                f"{_f(r['forward_error_total'], '.2e'):>9} {_f(r['final_val_loss'], '.4f'):>10} "
                f"{_f(r['delta_final'], '+.2%'):>8} {_f(r['steps_ratio'], '.2f'):>8} "
                f"{_f(r.get('fallback_uses', math.nan), '.0f'):>6} {'yes' if r['degraded'] else 'no':>8}"
            )
        lines.append("")
        for _, d in degradation_threshold(acc).iterrows():
            if math.isinf(d["min_degraded_error"]):
                lines.append(
                    f"{d['task']}: no config degraded; training unaffected up to root error "
                    f"{_f(d['max_ok_error'], '.2e')} (largest measured)"
                )
            else:
                lines.append(
                    f"{d['task']}: training degrades from root error {_f(d['min_degraded_error'], '.2e')}; "
                    f"unaffected up to {_f(d['max_ok_error'], '.2e')} "
                    f"({int(d['degraded_configs'])} of {int(d['configs'])} configs degraded)"
                )
    return "\n".join(lines) + "\n"


def write_report(tables: dict[str, pd.DataFrame], run_dir: str | Path) -> str:
    """Write validation_report.txt, steps_to_target.csv and accuracy.csv into the run folder."""
    run = Path(run_dir)
    if "protocol" in tables:
        from .protocol_report import format_protocol_report

        text = format_protocol_report(tables["protocol"])
        (run / "validation_report.txt").write_text(text)
        tables["protocol"].to_csv(run / "protocol.csv", index=False)
        return text
    text = format_report(tables)
    (run / "validation_report.txt").write_text(text)
    steps_table(tables["summary"]).to_csv(run / "steps_to_target.csv", index=False)
    if len(tables.get("accuracy", [])):
        tables["accuracy"].to_csv(run / "accuracy.csv", index=False)
    return text


__all__ = ["format_report", "steps_table", "write_report"]
