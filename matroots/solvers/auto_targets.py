"""The accuracy side of ``method="auto"``: default targets per working dtype, the error to expect from
what a group got, and the :class:`TargetWarning` where the target cannot be promised.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ..core import precision
from .auto_plan import Decision

DEFAULT_TARGETS = {"fp64": 1e-8, "fp32": 1e-3, "tf32": 1e-2, "fp16": 1e-1, "bf16": 1e-1}


class TargetWarning(UserWarning):
    """``method="auto"`` cannot promise the requested accuracy (the table says no candidate meets it, or
    the error to expect from what it chose exceeds it)."""


def default_target(dtype: Any) -> float:
    """The default relative forward-error target of ``method="auto"`` for a working dtype."""
    name = precision.info(dtype).name
    return DEFAULT_TARGETS.get(name, max(1e-8, math.sqrt(precision.unit_roundoff(dtype))))


@functools.lru_cache(maxsize=16)
def default_target_of(dtype: torch.dtype) -> tuple[float, str]:
    """(default target, where it came from) of a (validated) working dtype, once per dtype."""
    return default_target(dtype), f"default for {precision.info(dtype).name}"


def cond_spd(kappa: float, q: float) -> float:
    """Relative condition number of f(x) = x^q at an SPD matrix with condition number ``kappa``, from
    the divided differences f[lambda_i, lambda_j] over [lambda_min, lambda_max] (Higham, *Functions
    of Matrices*, 2008, Thm. 3.11; docs/design.md §4): |q| kappa for q < 0 (the inverse root,
    kappa/p), q kappa^(1-q) for 0 < q < 1, q for q >= 1."""
    if q < 0:
        return abs(q) * kappa
    if q < 1:
        return q * kappa ** (1.0 - q) if math.isfinite(kappa) else math.inf
    return q


def expected_error(
    d: Decision,
    failed: bool,
    sym: bool,
    kappa: list[float],
    flat: torch.Tensor,
    idx: list[int],
    p: Any,
    inverse: bool,
    wdtype: Any,
) -> tuple[float, str]:
    """The error to expect from what a group got: the cell's measured worst error (chosen) or the
    best effort's (unattainable), else cond(f, A) u of the working format (outside the table, or
    re-solved with the safe choice after the chosen solver failed). ``kappa``: the group's
    elements'; ``flat[idx]``: the group's matrices (only looked at for general input)."""
    if not failed and d.cell is not None:
        key = "worst_error" if d.status == "chosen" else "best_effort_error"
        v = d.cell.get(key)
        if v is not None and math.isfinite(float(v)):
            return float(v), f"the table's measured {key.replace('_', ' ')} in the cell"
    u = precision.unit_roundoff(wdtype)
    q = (-1.0 if inverse else 1.0) / float(p)
    if sym:
        k = max((x if not math.isnan(x) else math.inf) for x in kappa)
        return cond_spd(k, q) * u, f"cond(f, A) u, cond from kappa ~{k:.3g} (SPD)"
    from ..core.conditioning import cond_root

    cond = cond_root(flat[idx].to(torch.float64), p, inverse=inverse)
    return cond * u, "cond(f, A) u (matroots.core.conditioning.cond_root of the general input)"


def target_message(missed: list, target: float) -> str:
    """The TargetWarning's text for the groups (as :mod:`matroots.solvers.auto` keeps them) that miss
    ``target``."""
    parts = []
    for d, idx, _, used, _, _, expected, source in missed:
        parts.append(f"{used} for {len(idx)} matrices: expected error {expected:.2g} ({source}); {d.reason}")
    return (
        f"method='auto' cannot promise the target {target:g}: "
        + " | ".join(parts)
        + ". Use a wider dtype, a larger eps, or a looser target."
    )


__all__ = [
    "DEFAULT_TARGETS",
    "TargetWarning",
    "cond_spd",
    "default_target",
    "default_target_of",
    "expected_error",
    "target_message",
]
