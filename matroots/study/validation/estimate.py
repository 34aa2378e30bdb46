"""The ``matroots validate --dry-run`` cost estimate: a grid's compute from a few cheap measurements.

A training step is ``zero_grad + loss + backward`` (the task's part: the same for every optimizer) followed
by ``opt.step()`` (the optimizer's part), and the runner's interleaved timing repeats the same steps for
the unit's optimizer and a fresh AdamW (:func:`matroots.study.validation.training.interleaved_timing`). So
the estimate measures each part once where it is shared:

* per distinct (task, size) -- :func:`probe_task`: building the task and a model, one evaluation, and
  a few real training steps with AdamW, timing forward + backward and AdamW's ``step()`` apart; their
  gradients are kept;
* per distinct optimizer cost class (:func:`cost_key`: optimizer, root solver, root dtype, precondition
  frequency, solver options) -- :func:`probe_optimizer`: building it on the task's model and timing
  ``timing_chunk`` calls of ``step()`` (after a warm-up past Shampoo's first root round) on the kept
  gradients, in turn, so no forward or backward is repeated.

A unit's step time is then forward + backward + its optimizer's ``step()``, with AdamW's on the same
task beside it; :func:`unit_cost` adds build, training, evaluations and the timing chunks. Times are
process CPU time on one thread (what the estimate reports) with the wall clock beside it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..threads import one_thread
from .config import Unit, ValidationGrid
from .preflight import check

#: Gradient sets kept per task: the optimizer probes cycle through them (distinct real minibatch
#: gradients, so a factor is a sum of different outer products as in training).
GRADIENT_SETS = 4

_ZERO = {"build_s": 0.0, "build_cpu_s": 0.0, "opt_s": 0.0, "opt_cpu_s": 0.0}


def cost_key(unit: Unit) -> tuple[Any, ...]:
    """What an optimizer's per-step cost depends on (units sharing it share one probe)."""
    s = unit.optimizer
    return (unit.task.name, tuple(sorted(unit.task.size.items())), s.name, s.root_solver, s.root_dtype,
            s.precondition_frequency, tuple(sorted(s.solver_options.items())))  # fmt: skip


def task_key(unit: Unit) -> tuple[Any, ...]:
    return (unit.task.name, tuple(sorted(unit.task.size.items())))


class _Clock:
    """Wall and process CPU seconds since construction."""

    def __init__(self) -> None:
        self.w, self.c = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        w, c = time.perf_counter(), time.process_time()
        out = (w - self.w, c - self.c)
        self.w, self.c = w, c
        return out


@dataclass
class TaskProbe:
    """The task part of a step, measured once per (task, size)."""

    task: Any
    seed: int
    build_s: float
    build_cpu_s: float
    eval_s: float
    eval_cpu_s: float
    fb_s: float  # zero_grad + loss + backward, median per step
    fb_cpu_s: float
    adamw_opt_s: float  # AdamW's step(), median per step
    adamw_opt_cpu_s: float
    grads: list[list[torch.Tensor | None]]


class TaskBuilder:
    """:func:`~matroots.study.validation.tasks.get_task` that keeps each built task with its build time
    (wall, CPU), so the preflight's tasks are the probes' too."""

    def __init__(self) -> None:
        self.built: dict[tuple[Any, ...], tuple[Any, float, float]] = {}

    def __call__(self, name: str, **size: Any) -> Any:
        key = (name, tuple(sorted(size.items())))
        if key not in self.built:
            from .tasks import get_task

            clock = _Clock()
            task = get_task(name, **size)
            self.built[key] = (task, *clock.lap())
        return self.built[key][0]


def probe_task(unit: Unit, builder: TaskBuilder | None = None) -> TaskProbe:
    """Build ``unit``'s task (or take it from ``builder``) and a model, evaluate once, and take
    ``1 + GRADIENT_SETS`` AdamW steps (the first creates AdamW's state and is not timed), timing
    forward + backward and ``step()`` apart."""
    one_thread()
    builder = builder or TaskBuilder()
    builder(unit.task.name, **unit.task.size)
    task, task_s, task_cpu_s = builder.built[task_key(unit)]
    clock = _Clock()
    model = task.build_model(unit.seed)
    model_s, model_cpu_s = clock.lap()
    build = (task_s + model_s, task_cpu_s + model_cpu_s)
    task.evaluate(model)
    ev = clock.lap()
    adam = torch.optim.AdamW(model.parameters(), lr=unit.lr, weight_decay=0.0)
    batches = task.batches(unit.seed)
    fb: list[tuple[float, float]] = []
    st: list[tuple[float, float]] = []
    grads = []
    for i in range(1 + GRADIENT_SETS):
        clock.lap()
        adam.zero_grad(set_to_none=True)
        task.loss(model, next(batches)).backward()
        t_fb = clock.lap()
        adam.step()
        t_st = clock.lap()
        if i:
            fb.append(t_fb)
            st.append(t_st)
            grads.append([None if p.grad is None else p.grad.detach().clone() for p in model.parameters()])
    (fb_w, fb_c), (st_w, st_c) = zip(*fb, strict=True), zip(*st, strict=True)
    med = (float(np.median(x)) for x in (fb_w, fb_c, st_w, st_c))
    return TaskProbe(task, unit.seed, *build, *ev, *med, grads)


def probe_optimizer(unit: Unit, tp: TaskProbe) -> dict[str, float]:
    """Build ``unit``'s optimizer on a fresh model of ``tp``'s task and time ``timing_chunk`` calls of
    its ``step()`` on the task's kept gradients, after ``max(precondition_frequency, 2)`` untimed ones
    (past Shampoo's first root round); a config that fails in training is costed like AdamW (its unit
    records the failure and stops)."""
    from shampoo.errors import RootComputationError

    from ...core.errors import MatrootsError
    from .peers import PeerUnavailableError
    from .training import make_optimizer

    one_thread()
    model = tp.task.build_model(tp.seed)  # its build time is the task probe's
    params = list(model.parameters())
    clock = _Clock()
    try:
        opt = make_optimizer(unit, model)
    except PeerUnavailableError:  # an absent peer: its units end at once
        return dict(_ZERO)
    build_s, build_cpu_s = clock.lap()
    warm = max(unit.optimizer.precondition_frequency, 2)
    times = []
    try:
        for i in range(warm + unit.timing_chunk):
            for p, g in zip(params, tp.grads[i % len(tp.grads)], strict=True):
                p.grad = None if g is None else g.clone()
            clock.lap()
            opt.step()
            if i >= warm:
                times.append(clock.lap())
    except (RootComputationError, MatrootsError):
        return {"build_s": build_s, "build_cpu_s": build_cpu_s, "opt_s": tp.adamw_opt_s,
                "opt_cpu_s": tp.adamw_opt_cpu_s}  # fmt: skip
    w, c = (sum(x) / len(times) for x in zip(*times, strict=True)) if times else (0.0, 0.0)
    return {"build_s": build_s, "build_cpu_s": build_cpu_s, "opt_s": w, "opt_cpu_s": c}


def unit_cost(u: Unit, tp: TaskProbe, op: dict[str, float]) -> dict[str, float]:
    """CPU and wall seconds of one unit: build + steps + evaluations + the interleaved timing chunks."""
    evals = u.task.steps // u.task.eval_every + 2
    out = {}
    for clock, sfx in (("cpu", "_cpu_s"), ("wall", "_s")):
        t = {k: getattr(tp, k + sfx) for k in ("build", "eval", "fb", "adamw_opt")}
        step = t["fb"] + op["opt" + sfx]
        adamw_step = t["fb"] + t["adamw_opt"]
        out[clock] = (
            t["build"]
            + op["build" + sfx]
            + u.task.steps * step
            + evals * t["eval"]
            + u.timing_rounds * u.timing_chunk * (step + adamw_step)
        )
    return out


def _add(
    total: dict[str, float], per_task: dict[str, float], task: str, c: dict[str, float], longest: float
) -> float:
    total["cpu"] += c["cpu"]
    total["wall"] += c["wall"]
    per_task[task] = per_task.get(task, 0.0) + c["cpu"]
    return max(longest, c["cpu"])


def estimate(grid: ValidationGrid, *, cores: int = 2) -> dict[str, Any]:
    """Estimated cost of a grid (see the module docstring): one task probe per distinct (task, size),
    one optimizer probe per distinct :func:`cost_key`.

    Per unit: build + steps x step time (Shampoo's including its root rounds, amortised) + evaluations
    + the interleaved timing (2 x rounds x chunk steps), from the probes' process CPU time (one thread),
    so the estimate does not depend on how loaded the machine is while probing. Wall time assumes
    ``cores`` workers kept busy (the total divided by ``cores``, never less than the longest unit);
    ``wall_seconds_at_current_load`` repeats the sum with the probes' wall clocks instead.
    """
    builder = TaskBuilder()
    check(grid, build_task=builder)
    units = grid.units()
    tasks: dict[tuple[Any, ...], TaskProbe] = {}
    probes: dict[tuple[Any, ...], dict[str, float]] = {}
    per_task: dict[str, float] = {}
    total = {"cpu": 0.0, "wall": 0.0}
    longest = 0.0
    per_entry: dict[tuple[str, str], list[dict[str, float]]] = {}
    for u in units:
        tk, k = task_key(u), cost_key(u)
        if tk not in tasks:
            tasks[tk] = probe_task(u, builder)
        if k not in probes:
            probes[k] = probe_optimizer(u, tasks[tk])
        costs = unit_cost(u, tasks[tk], probes[k])
        if u.phase == "tune":
            per_entry.setdefault((u.task.name, u.optimizer.label), []).append(costs)
        longest = _add(total, per_task, u.task.name, costs, longest)
    finals = 0
    if grid.protocol is not None:  # the final phase: each tuned entry's mean trial cost x final seeds
        for (task, _label), cs in per_entry.items():
            mean = {c: sum(x[c] for x in cs) / len(cs) for c in ("cpu", "wall")}
            for _ in grid.protocol.final_seeds:
                finals += 1
                longest = _add(total, per_task, task, mean, longest)
    return {
        "units": len(units) + finals,
        "final_units": finals,
        "core_seconds": total["cpu"],
        "cores": cores,
        "wall_seconds": max(total["cpu"] / cores, longest),
        "wall_seconds_at_current_load": max(total["wall"] / cores, longest),
        "load_average": os.getloadavg()[0],
        "per_task_core_seconds": per_task,
        "probes": len(probes),
        "task_probes": len(tasks),
    }


def format_estimate(grid: ValidationGrid, est: dict[str, Any]) -> str:
    def hm(s: float) -> str:
        return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"

    per = ", ".join(f"{t} {hm(s)}" for t, s in est["per_task_core_seconds"].items())
    return (
        f"{grid.name}: {est['units']} units ("
        + (
            f"tuning trials and untuned points, + {est['final_units']} chosen points at the final seeds"
            if est.get("final_units")
            else "task x optimizer config x lr x seed"
        )
        + "); estimated "
        f"{hm(est['core_seconds'])} of compute on one core ({per}), {hm(est['wall_seconds'])} wall on "
        f"{est['cores']} idle cores; {hm(est['wall_seconds_at_current_load'])} at the current load "
        f"(load average {est['load_average']:.1f}; {est.get('task_probes', 0)} task and {est['probes']} "
        "optimizer probes, one thread each)"
    )


__all__ = ["GRADIENT_SETS", "TaskBuilder", "TaskProbe", "cost_key", "estimate", "format_estimate", "probe_optimizer",
           "probe_task", "unit_cost"]  # fmt: skip
