"""The validation's write-up, computed from the shipped results: the generated blocks of docs/validation.md.

    python paper_figs/validation_findings.py            # print every block
    python paper_figs/validation_findings.py --write    # regenerate the blocks of docs/validation.md
    python paper_figs/validation_findings.py --check    # exit 1 when docs/validation.md differs from the data

The rows are the shipped protocol set ``results/validation`` (written by ``matroots validate CONFIG --out
RUN --ship results/validation [--partial]``, read with :func:`matroots.study.validation.ship.load`, which
checks each file's sha256 and the config's hash in this checkout). The per-task numbers are those of its
``protocol`` table (:func:`matroots.study.validation.protocol_report.protocol_summary`: target,
steps- and CPU-time-to-target, ratios to AdamW with percentile-bootstrap 95% intervals over seeds,
held-out loss, the chosen point); what each task still lacks is counted against the config the set names
(its tuning trials and final seeds), so a partial set says **PARTIAL** per task and a task without final
seeds says "not yet run". Between ``<!-- finding:NAME BEGIN -->`` and ``<!-- finding:NAME END -->`` the
page holds exactly what :data:`BLOCKS` ``[NAME]`` returns (the same machinery as paper_figs/findings.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
SET = "validation"
DOC = ROOT / "docs" / "validation.md"
COMMAND = "python paper_figs/validation_findings.py --write"
FIGS = "paper_figs/out/full"
FIG_COMMAND = "make figures FULL=1"
BASELINE = "adamw"
#: the hyperparameter columns of the tuned-point table, in the protocol's order
HPARAMS = ("lr", "beta2", "weight_decay", "warmup_fraction", "precondition_frequency", "grafting")


def _findings():
    """paper_figs/findings.py (markers, render, table): one block machinery for both pages."""
    spec = importlib.util.spec_from_file_location("paper_findings", ROOT / "paper_figs" / "findings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


F = _findings()


@dataclass
class TaskCoverage:
    """What a task of the config has in the shipped set: tuning trials and final seeds done / expected."""

    task: str
    tune_done: int
    tune_total: int
    final_done: int
    final_total: int
    baseline_done: int
    baseline_total: int
    #: config label -> tuning trials the protocol gives it on this task (0: an untuned entry)
    trials: dict[str, int]
    #: config label -> "absent" (its package is not installed) or "failed" (every trial failed): its
    #: tuning is done and chose nothing, so it has no final seeds to run (not counted in final_total)
    unchosen: dict[str, str] = field(default_factory=dict)

    @property
    def started(self) -> bool:
        return self.tune_done + self.final_done > 0

    @property
    def complete(self) -> bool:
        return self.tune_done >= self.tune_total and self.final_done >= self.final_total

    @property
    def has_baseline(self) -> bool:
        return self.baseline_total > 0 and self.baseline_done >= self.baseline_total

    def line(self) -> str:
        state = "complete" if self.complete else ("**PARTIAL**" if self.started else "**not yet run**")
        return (
            f"**{self.task}**: {state}; tuning trials {self.tune_done}/{self.tune_total}, final seeds "
            f"{self.final_done}/{self.final_total} (AdamW's {self.baseline_done}/{self.baseline_total})."
            + "".join(f" {lab}: {why} (no final seeds)." for lab, why in sorted(self.unchosen.items()))
        )


def coverage(runs: pd.DataFrame, grid) -> dict[str, TaskCoverage]:
    """Per task of ``grid`` (the config the set was shipped from): units done in ``runs`` against the
    units the protocol asks for (its tuning trials, and the final seeds of every entry, chosen or not yet).
    An entry whose tuning is complete but chose nothing (:func:`protocol.select` status "absent": the
    peer's package is not installed; "failed": every trial failed) has no final seeds to wait for: it is
    named in ``unchosen`` and left out of ``final_total``."""
    from matroots.study.validation import protocol as vprotocol

    n_final = len(grid.protocol.final_seeds)
    sel = vprotocol.select(runs) if len(runs) else pd.DataFrame(columns=["task", "config", "status"])
    out = {}
    for t in grid.tasks:
        units = [u for u in grid.units() if u.task.name == t.name]
        labels = list(dict.fromkeys(u.optimizer.label for u in units))
        trials = {lab: sum(u.phase == "tune" and u.optimizer.label == lab for u in units) for lab in labels}
        base = [u.optimizer.label for u in units if u.optimizer.name == BASELINE]
        r = runs[runs["task"] == t.name]
        done = r.drop_duplicates("unit") if "unit" in r else r
        fin = done[done["phase"] == "final"]
        tuned = done[done["phase"] == "tune"]
        unchosen = {
            row.config: row.status
            for row in sel[(sel["task"] == t.name) & sel["status"].isin(["absent", "failed"])].itertuples()
            if trials.get(row.config, 0) > 0
            and int((tuned["config"] == row.config).sum()) >= trials[row.config]
        }
        out[t.name] = TaskCoverage(
            task=t.name,
            tune_done=int((done["phase"] == "tune").sum()),
            tune_total=sum(trials.values()),
            final_done=len(fin),
            final_total=n_final * len([lab for lab in labels if lab not in unchosen]),
            baseline_done=int((fin["optimizer"] == BASELINE).sum()),
            baseline_total=n_final * len(set(base)),
            trials=trials,
            unchosen=unchosen,
        )
    return out


def trials_of(runs: pd.DataFrame, task: str, config: str) -> int:
    r = runs[(runs["task"] == task) & (runs["config"] == config) & (runs["phase"] == "tune")]
    return int(r["unit"].nunique()) if "unit" in r else len(r)


# --- formatting ----------------------------------------------------------------------------------------


def num(x, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "never"
    return format(x, spec)


def ratio_cell(r: pd.Series, name: str) -> str:
    v, lo, hi = (r.get(k, math.nan) for k in (name, f"{name}_lo", f"{name}_hi"))
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{num(v, '.2f')} [{num(lo, '.2f')}, {num(hi, '.2f')}]"


def hp_value(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "–" if v is None else str(v)


def time_verdict(r: pd.Series, name: str = "cpu_ratio") -> str:
    """'faster' when the 95% interval of the ratio lies below 1, 'slower' above 1, else 'not separated'."""
    lo, hi = r.get(f"{name}_lo", math.nan), r.get(f"{name}_hi", math.nan)
    if not (isinstance(lo, float) and isinstance(hi, float)) or math.isnan(lo) or math.isnan(hi):
        return "not measured"
    if hi < 1:
        return "faster"
    if lo > 1:
        return "slower"
    return "not separated"


# --- the blocks ----------------------------------------------------------------------------------------


@dataclass
class Shipped:
    protocol: pd.DataFrame
    runs: pd.DataFrame
    prov: dict
    cover: dict[str, TaskCoverage]


def load(results: Path = RESULTS) -> Shipped | None:
    """The shipped set under ``results/validation`` with its per-task coverage, or None when none is shipped."""
    from matroots.study.validation import config, ship

    where = results / SET
    if not (where / "provenance.json").exists():
        return None
    tables = ship.load(where, repo_root=ROOT)
    prov = ship.read_provenance(where)
    cfg = Path(prov["config"])
    grid = config.load_config(cfg if cfg.is_absolute() else ROOT / cfg)
    return Shipped(tables["protocol"], tables["runs"], prov, coverage(tables["runs"], grid))


def source_line(s: Shipped) -> str:
    p = s.prov
    state = (
        "complete"
        if p.get("complete")
        else "**PARTIAL**: the numbers below change as the run completes (reship, then rerun the command)"
    )
    return (
        f"_Rows: `results/{SET}` ({p['config']}, hash {p['config_hash']}), {p.get('units_done')}/"
        f"{p.get('units_total')} units ({state}), commit {', '.join(c[:10] for c in p.get('commits', []))}, "
        f"shipped {str(p.get('shipped', '?'))[:10]}._"
    )


NOT_SHIPPED = (
    "_Not yet shipped: `results/validation` holds no set. Ship the protocol run with "
    "`matroots validate experiments/configs/validate_full.toml --out RUN --ship results/validation "
    "[--partial]`, then run `" + COMMAND + "`._"
)


def _task_rows(s: Shipped, task: str) -> pd.DataFrame:
    return s.protocol[s.protocol["task"] == task]


def time_to_target(s: Shipped) -> str:
    """Per task: steps- and CPU-time-to-target ratios vs AdamW [95%], held-out loss, status."""
    parts = [source_line(s)]
    for task, cov in s.cover.items():
        parts.append(cov.line())
        if not cov.has_baseline:
            parts.append(
                "Time to target: not yet run (the target and every ratio need AdamW's final seeds, "
                f"{cov.baseline_done}/{cov.baseline_total} done)."
            )
            continue
        g = _task_rows(s, task)
        out = []
        for _, r in g.iterrows():
            status = r["status"]
            if (status in ("chosen", "fixed") and int(r["seeds"]) == 0) or status == "pending":
                status = "final seeds not yet run"
            out.append(
                {
                    "optimizer": r["config"],
                    "status": status,
                    "seeds": str(int(r["seeds"]))
                    + (f" ({int(r['failures'])} failed)" if r["failures"] else ""),
                    "held-out loss [IQR]": (
                        f"{num(r.get('final_test_loss'), '.4f')} [{num(r.get('final_test_loss_q25'), '.4f')}, "
                        f"{num(r.get('final_test_loss_q75'), '.4f')}]"
                        if int(r["seeds"])
                        else "–"
                    ),
                    "steps to target": num(r.get("steps_to_target"), ".0f"),
                    "steps × AdamW [95%]": ratio_cell(r, "steps_ratio"),
                    "CPU s to target": num(r.get("cpu_to_target_s"), ".3g"),
                    "CPU time × AdamW [95%]": ratio_cell(r, "cpu_ratio"),
                }
            )
        parts.append(f"Target: held-out loss {num(float(g['target'].iloc[0]), '.4f')}.")
        parts.append(F.table(pd.DataFrame(out)))
    parts.append(
        "Cell: median over the final seeds; ratio = the optimizer's steps (CPU seconds) to the target / "
        "AdamW's, [percentile-bootstrap 95% interval over seeds, each optimizer's seeds resampled]; "
        "'never': the median curve does not reach the target within the horizon."
    )
    parts.append(
        f"Figures: [`{FIGS}/validation_vs_steps.png`](../{FIGS}/validation_vs_steps.png) and "
        f"[`{FIGS}/validation_vs_cpu.png`](../{FIGS}/validation_vs_cpu.png) (held-out loss vs steps and vs "
        f"training CPU seconds, median and range over seeds; `{FIG_COMMAND}`)."
    )
    return "\n\n".join(parts)


def tuned_hparams(s: Shipped) -> str:
    """Per task: each optimizer's chosen point (on the validation split) and its tuning score."""
    parts = [source_line(s)]
    for task, cov in s.cover.items():
        if not cov.started:
            parts.append(f"**{task}**: not yet run.")
            continue
        g = _task_rows(s, task).set_index("config")
        out = []
        for label, want in cov.trials.items():
            done = trials_of(s.runs, task, label)
            r = g.loc[label] if label in g.index else None
            row = {"optimizer": label}
            if r is None or (want and done == 0):
                row["chosen"] = "not yet run"
            elif not want:
                row["chosen"] = "fixed (not tuned)"
            elif done >= want:
                row["chosen"] = f"best of {done} trials: val loss {num(float(r['tuning_val_loss']), '.4f')}"
            else:
                row["chosen"] = f"tuning not finished ({done}/{want} trials)"
            hp = {}
            if row["chosen"].startswith(("best", "fixed")):
                try:
                    hp = json.loads(r["hparams"]) if r["hparams"] else {}
                except (TypeError, ValueError):
                    hp = {}
            for k in HPARAMS:
                row[k] = hp_value(hp.get(k)) if hp else "–"
            out.append(row)
        parts.append(f"**{task}** ({'complete' if cov.complete else 'PARTIAL'}):")
        parts.append(F.table(pd.DataFrame(out)))
    parts.append(
        "Cell: the point of least final validation loss over the tuning seeds (the held-out split is not "
        "looked at); '–': the optimizer has no such hyperparameter."
    )
    return "\n\n".join(parts)


def reading(s: Shipped) -> str:
    """One line per task: who reaches the target first in CPU time and in steps, and Shampoo vs AdamW."""
    lines, waiting, wins = [], [], []
    for task, cov in s.cover.items():
        if not cov.has_baseline:
            waiting.append(task)
            continue
        g = _task_rows(s, task)
        g = g[g["seeds"] > 0]
        tag = "" if cov.complete else " (PARTIAL)"
        best_cpu = g.sort_values("cpu_to_target_s", kind="stable").iloc[0]
        best_steps = g.sort_values("steps_to_target", kind="stable").iloc[0]
        ours = g[g["optimizer"] == "shampoo"]
        verdicts = [
            f"{r['config']} {time_verdict(r)} ({ratio_cell(r, 'cpu_ratio')})" for _, r in ours.iterrows()
        ]
        if any(time_verdict(r) == "faster" for _, r in ours.iterrows()):
            wins.append(task)
        reached = math.isfinite(float(best_cpu["cpu_to_target_s"]))
        lines.append(
            f"* {task}{tag}: least CPU time to target: "
            + (
                f"{best_cpu['config']} ({ratio_cell(best_cpu, 'cpu_ratio')} × AdamW)"
                if reached
                else "none reaches it"
            )
            + f"; fewest steps: {best_steps['config']} ({ratio_cell(best_steps, 'steps_ratio')}); "
            + "Shampoo vs AdamW in CPU time: "
            + ("; ".join(verdicts) if verdicts else "no Shampoo row")
            + "."
        )
    measured = len(lines)
    head = (
        f"Reading: Shampoo (this project's) is faster than AdamW in CPU time, with its 95% interval below 1, "
        f"on {len(wins)} of {measured} tasks measured" + (f" ({', '.join(wins)})" if wins else "") + "."
    )
    out = [source_line(s), head, "\n".join(lines) if lines else "No task has final seeds yet."]
    if waiting:
        out.append(f"Not yet run (no final seeds of AdamW): {', '.join(waiting)}.")
    return "\n\n".join(out)


#: block name -> function of the shipped set
BLOCKS = {
    "validation_time": time_to_target,
    "validation_hparams": tuned_hparams,
    "validation_reading": reading,
}


def blocks(results: Path = RESULTS) -> dict[str, str]:
    s = load(results)
    return {
        name: (NOT_SHIPPED if s is None else fn(s)) + f"\n\n_Command: `{COMMAND}` (block `{name}`)._"
        for name, fn in BLOCKS.items()
    }


def main(argv: list[str] | None = None) -> int:
    return F.block_cli(
        argv, blocks, doc=DOC, results=RESULTS, command=COMMAND, label="validation", description=__doc__
    )


if __name__ == "__main__":
    sys.exit(main())
