"""A row of method="auto"'s selection table for tests (every column; the test sets what it reads)."""

from __future__ import annotations

import numpy as np

from matroots.study.tuning.select import TABLE_COLUMNS


def table_entry(kappa_lo, kappa_hi, target, choice, method, options="{}", **kw):
    row = dict.fromkeys(TABLE_COLUMNS, np.nan)
    row.update(
        device="cpu", dtype="fp64", p=2, n_lo=8, n_hi=64, kappa_lo=kappa_lo, kappa_hi=kappa_hi, target=target,
        choice=choice, method=method, options=options, worst_error=target / 10, median_gemm_equivalents=10.0,
        failure_rate=0.0, cases=3, families="randsvd", runner_up="NA", best_effort="eigh",
        best_effort_error=1e-3, reason=f"test entry {choice}",
    )  # fmt: skip
    row.update(kw)
    return row
