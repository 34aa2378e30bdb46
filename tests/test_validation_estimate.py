"""The ``matroots validate --dry-run`` estimate measures each shared part once: one task probe per distinct
(task, size) and one optimizer probe per distinct cost class, with no forward/backward per configuration."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import pytest
import torch

from matroots.study.validation import config, estimate, tasks
from tests._tiny_validation import tiny_config


def _grid(tmp_path: Path) -> config.ValidationGrid:
    cfg = tmp_path / "tiny.toml"
    # two tasks x (AdamW, Shampoo) x 2 lrs x 2 seeds: 16 units sharing 2 tasks and 4 cost classes
    cfg.write_text(tiny_config(["digits", "lsq"], steps=3, seeds="[0, 1]"))
    return config.load_config(cfg)


def test_dry_run_probes_each_task_and_cost_class_once(tmp_path: Path, monkeypatch) -> None:
    grid = _grid(tmp_path)
    units = grid.units()
    assert len(units) == 16
    calls: collections.Counter[str] = collections.Counter()

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)

        return wrapper

    monkeypatch.setattr(tasks, "get_task", counted("get_task", tasks.get_task))
    monkeypatch.setattr(estimate, "probe_task", counted("probe_task", estimate.probe_task))
    monkeypatch.setattr(estimate, "probe_optimizer", counted("probe_optimizer", estimate.probe_optimizer))
    for cls in {type(tasks.get_task(t.name, **t.size)) for t in grid.tasks}:
        monkeypatch.setattr(cls, "loss", counted("loss", cls.loss))
    adamw_step = torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, "step", counted("adamw_step", adamw_step))
    calls.clear()

    est = estimate.estimate(grid)

    n_tasks = len({estimate.task_key(u) for u in units})
    n_costs = len({estimate.cost_key(u) for u in units})
    assert (n_tasks, n_costs) == (2, 4)
    assert calls["get_task"] == n_tasks  # the preflight's tasks are the probes' tasks
    assert calls["probe_task"] == n_tasks and calls["probe_optimizer"] == n_costs
    assert est["task_probes"] == n_tasks and est["probes"] == n_costs and est["units"] == len(units)
    # forward + backward: the preflight's one per task, then 1 + GRADIENT_SETS per task, none per config
    assert calls["loss"] == n_tasks * (2 + estimate.GRADIENT_SETS)
    assert math.isfinite(est["core_seconds"]) and est["core_seconds"] > 0


def test_unit_cost_adds_the_task_and_optimizer_parts(tmp_path: Path) -> None:
    """step = forward/backward + the optimizer's step(); AdamW's beside it in the timing chunks."""
    tp = estimate.TaskProbe(
        task=None, seed=0, build_s=1.0, build_cpu_s=0.5, eval_s=0.25, eval_cpu_s=0.125, fb_s=0.02,
        fb_cpu_s=0.01, adamw_opt_s=0.004, adamw_opt_cpu_s=0.002, grads=[],
    )  # fmt: skip
    op = {"build_s": 0.5, "build_cpu_s": 0.25, "opt_s": 0.03, "opt_cpu_s": 0.015}
    u = _grid(tmp_path).units()[0]
    steps, evals, timed = (
        u.task.steps,
        u.task.steps // u.task.eval_every + 2,
        u.timing_rounds * u.timing_chunk,
    )
    c = estimate.unit_cost(u, tp, op)
    assert c["cpu"] == pytest.approx(0.75 + steps * 0.025 + evals * 0.125 + timed * (0.025 + 0.012))
    assert c["wall"] == pytest.approx(1.5 + steps * 0.05 + evals * 0.25 + timed * (0.05 + 0.024))
