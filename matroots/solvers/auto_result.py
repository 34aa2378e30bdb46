"""The result of ``method="auto"``: the kappa estimate it chose by, the groups' results merged into one
:class:`matroots.RootResult`, and the ``info["auto"]`` report of what was chosen and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..core import precision
from ..core.result import RootResult


@dataclass(slots=True)  # not frozen: a frozen init sets each field through object.__setattr__
class Estimate:
    """kappa per element, where it came from, its cost in matmuls, and whether it is exact."""

    kappa: list[float]
    source: str
    matmuls: float
    exact: bool


def spectrum_kappa(info: dict[str, Any], b: int) -> Estimate | None:
    """kappa per element from the extreme eigenvalues of the matrix solved, when the solver reports
    them (eigh: ``solved_lambda_min/max``, user units, psd and eps shifts included), else None."""
    lo, hi = info.get("solved_lambda_min"), info.get("solved_lambda_max")
    if not isinstance(lo, torch.Tensor) or not isinstance(hi, torch.Tensor):
        return None
    if lo.numel() != b or hi.numel() != b:
        return None
    ends = zip(lo.reshape(-1).tolist(), hi.reshape(-1).tolist(), strict=True)
    kappa = [h / lo_ if lo_ > 0 and math.isfinite(h) else math.inf for lo_, h in ends]
    return Estimate(kappa, "eigenvalues of the matrix solved (the chosen solver's)", 0.0, True)


def report(
    question: dict[str, Any], b: int, est: Estimate, est_seconds: float, safety: float, groups: list
) -> dict[str, Any]:
    """``info["auto"]``: ``question`` (the table, device, dtype, target and its source), the
    estimates, and one record per group."""
    chosen = [""] * b
    for _, idx, _, used, *_ in groups:
        for i in idx:
            chosen[i] = used
    return {
        **question,
        "kappa_estimate": est.kappa,
        "kappa_source": est.source,
        "kappa_safety": safety,
        "estimate_matmuls": est.matmuls,
        "estimate_seconds": est_seconds,
        "chosen": chosen,
        "groups": [
            {
                "config": used,
                "elements": idx,
                "status": d.status,
                "note": note,
                "cells": cells,
                "matmuls": float(res.matmuls),
                "expected_error": expected,
                "expected_error_source": source,
            }
            for d, idx, res, used, note, cells, expected, source in groups
        ],
    }


def question(table_name: str, device: str, wdtype: Any, target: float, target_src: str) -> dict[str, Any]:
    """The head of ``info["auto"]``: what was asked of which table."""
    return {
        "table": table_name,
        "device": device,
        "dtype": precision.info(wdtype).name,
        "target": target,
        "target_source": target_src,
    }


def merge(groups: list, t: torch.Tensor, b: int, n: int, est_cost: float) -> RootResult:
    """The groups' results as one result of the caller's batch shape (a single group's as it is)."""
    bs = tuple(t.shape[:-2])
    if len(groups) == 1:
        res = groups[0][2]
        res.matmuls = float(res.matmuls) + est_cost
        return res
    first = groups[0][2]
    root = torch.empty((b, n, n), dtype=first.root.dtype, device=first.root.device)
    conv = torch.zeros(b, dtype=torch.bool)
    iters = torch.zeros(b, dtype=torch.int64)
    resid = torch.full((b,), math.nan, dtype=torch.float64)
    per_elem: dict[str, torch.Tensor] = {}
    info_groups = []
    matmuls = 0.0
    for _, idx, res, used, *_ in groups:
        ii = torch.tensor(idx)
        root[ii] = res.root.reshape(-1, n, n).to(root.dtype)
        conv[ii] = torch.as_tensor(res.converged).reshape(-1).cpu()
        iters[ii] = torch.as_tensor(res.iterations).reshape(-1).cpu().to(torch.int64)
        resid[ii] = torch.as_tensor(res.residual, dtype=torch.float64).reshape(-1).cpu()
        matmuls += float(res.matmuls) * len(idx) / b
        for key in ("lambda_min", "lambda_max", "eps_abs"):
            v = res.info.get(key)
            if isinstance(v, torch.Tensor) and v.numel() == len(idx):
                per_elem.setdefault(key, torch.full((b,), math.nan, dtype=torch.float64))[ii] = (
                    v.reshape(-1).double().cpu()
                )
        info_groups.append({"config": used, "info": res.info})
    info: dict[str, Any] = dict(per_elem)
    info["group_infos"] = info_groups
    return RootResult(
        root=root.reshape(*bs, n, n),
        converged=conv.reshape(bs),
        iterations=iters.reshape(bs),
        residual=resid.reshape(bs),
        history=[],
        matmuls=matmuls + est_cost,
        seconds=0.0,
        method="auto",
        dtype=first.dtype,
        info=info,
        finite_checked=all(g[2].finite_checked for g in groups),
    )


__all__ = ["Estimate", "merge", "question", "report", "spectrum_kappa"]
