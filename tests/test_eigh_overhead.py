"""The per-call work of a direct eigh solve around its two kernels (LAPACK eigh and one GEMM), counted
in dispatched torch operations (not timed: counts are the same on every machine), and the range helper
its fast paths rest on (:func:`matroots.solvers.eigh._log2_top`) on the rows the fast path leaves out."""

from __future__ import annotations

import math

import pytest
import torch
from _opcount import OpCount as _Count

import matroots
from matroots.solvers.eigh import _log2_top


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_direct_eigh_solve_dispatches_few_small_operations(dtype: torch.dtype) -> None:
    """Each small torch operation costs microseconds of dispatch, as much as the kernels at n ~ 100
    (more after the eigensolver has evicted the caches: ~20 us each at n = 128 on the shared CPU box):
    the validated solve used 144 (fp32) before its checks took one-reduction fast paths (finite sums
    prove finiteness; log2 max f instead of max log2 f), 81 before each check read its numbers once
    (the spectrum's ends in one copy and one tolist, eigh_checked's finiteness proof not repeated,
    no symmetry-defect read for exactly symmetric input, the range check's log2 reused for the root's
    finiteness proof); 29 (fp32) and 30 (fp64) before no-op conversions and detaches were skipped, the
    exact-symmetry test stopped building a zero defect, the range check took its log2 in Python and a
    direct method's iterations, residual and converged flags stopped being tensors for a single matrix;
    20 (fp32) and 19 (fp64) now, and the budget of 22 keeps it there."""
    g = torch.Generator().manual_seed(0)
    G = torch.randn(64, 128, generator=g, dtype=torch.float64)
    A = (G @ G.T / 128 + 0.1 * torch.eye(64, dtype=torch.float64)).to(dtype)
    A = torch.maximum(A, A.mT)  # exactly symmetric (elementwise max commutes with the transpose)
    matroots.inverse_root(A, 4, method="eigh")
    with _Count() as count:
        res = matroots.inverse_root(A, 4, method="eigh")
    assert res.converged
    assert count.ops["aten._linalg_eigh.default"] == 1
    assert sum(count.ops.values()) <= 22, count.ops.most_common()


def test_log2_top_on_rows_with_zero_inf_and_nan_maxima() -> None:
    """log2 of each row's largest f; +inf for a row with a non-finite f; an all-zero row reads log2 of
    half the smallest subnormal where a zero was powered (an underflow), -inf where none was."""
    fi = torch.finfo(torch.float32)
    half_sub = math.log2(fi.smallest_normal) + math.log2(fi.eps) - 1
    f = torch.tensor(
        [[0.5, 4.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, math.inf, 2.0], [1.0, math.nan, 2.0]]
    )
    powered = torch.tensor([[True] * 3, [True, False, False], [False] * 3, [True] * 3, [True] * 3])
    top = _log2_top(f, powered)
    assert top.dtype == torch.float64
    assert top.tolist() == [2.0, half_sub, -math.inf, math.inf, math.inf]
    assert _log2_top(f[:1]).tolist() == [2.0]  # the fast path: every row's max positive, finite
    assert _log2_top(f[1:3], True).tolist() == [half_sub, half_sub]
