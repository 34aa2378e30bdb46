"""Preflight of a validation grid: everything only construction can check, before any unit starts.

Kept apart from :mod:`matroots.study.validation.config` (which parses and expands a config and is imported
by the training code) because it builds tasks and optimizers: it sits above both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from .config import ValidationGrid, bad_config
from .peers import PeerUnavailableError
from .tasks import Task, get_task
from .training import make_optimizer


def check(grid: ValidationGrid, *, build_task: Callable[..., Task] | None = None) -> None:
    """Validate what only construction can: build every task with its sizes (model and one loss) and
    every optimizer config with each of its learning rates (constructor and one step on a tiny model),
    before any unit starts, so a mistake is one error naming the entry instead of a failure inside
    the first worker.

    ``build_task(name, **size)`` builds the tasks (default :func:`get_task`; the dry run passes one that
    keeps them for its probes)."""
    build: Callable[..., Any] = build_task or get_task
    units = grid.units()
    for task in grid.tasks:
        try:
            t = build(task.name, **task.size)
            model = t.build_model(0)
            t.loss(model, next(t.batches(0))).backward()
        except (TypeError, ValueError, RuntimeError, AssertionError, KeyError, IndexError) as exc:
            raise bad_config(
                f"tasks.{task.name}: size {task.size} does not build ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:200]})"
            ) from None
    seen: set[tuple[str, float]] = set()
    for u in units:
        ident = (json.dumps(asdict(u.optimizer), sort_keys=True, default=str), u.lr)
        if ident in seen:
            continue
        seen.add(ident)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
        try:
            opt = make_optimizer(u, model)
            model(torch.randn(8, 6)).square().mean().backward()
            opt.step()
        except PeerUnavailableError:
            continue  # an absent peer: its units record "Unavailable" and the report lists it as absent
        except (TypeError, ValueError, RuntimeError, KeyError, IndexError, AttributeError) as exc:
            raise bad_config(
                f"optimizer {u.optimizer.label} (lr {u.lr:g}, options {dict(u.optimizer.options)}) does "
                f"not build ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
            ) from None


__all__ = ["check"]
