"""What the three SPD matmul iterations (newton_schulz, polar_express, halley) must all do: on the
SPD families and on real Shampoo factors, in fp64/fp32/bf16, a root within 10 (cond + 1) u sqrt(n) of
the reference of the matrix solved, or converged=False / a typed refusal
(:func:`_matmul_roots.check_accurate_or_reported`). Method-specific tests stay in each one's file.
"""

from __future__ import annotations

import numpy as np
import pytest
from _matmul_roots import DTYPES, check_accurate_or_reported, family_matrix

from matroots.study import matrices

METHODS = ("newton_schulz", "polar_express", "halley")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("family,kappa", [("randsvd", 1e2), ("randsvd", 1e5), ("clustered", 1e3)])
def test_families_every_dtype_accurate_or_reported(
    method: str, family: str, kappa: float, dtype: str
) -> None:
    A = family_matrix(family, 24, kappa, seed=5)
    got = check_accurate_or_reported(method, A, 4, DTYPES[dtype])
    if dtype != "bf16" or kappa <= 1e2:  # well inside the format: it must converge
        assert got == "converged", (method, family, kappa, dtype, got)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_real_shampoo_factors(method: str, dtype: str) -> None:
    """The factors shipped in matroots/data/shampoo_factors, with Shampoo's relative 1e-6 shift: in
    fp32/fp64 most must converge within the bound; in bf16 (u = 3.9e-3 against the shift's 1e-6, so the
    rounded factor is as ill-conditioned as the data) each is accurate, reported or refused."""
    solved = 0
    for task, n in (("digits", 64), ("bytes_lm", 32), ("wide1", 32)):
        for stage in ("early", "mid", "late"):
            A, _ = matrices.generate("shampoo", n, task=task, stage=stage, index=0)
            A = A + 1e-6 * np.abs(A).max() * np.eye(n)  # a relative regularisation, as Shampoo applies
            solved += check_accurate_or_reported(method, A, 4, DTYPES[dtype]) == "converged"
    if dtype != "bf16":
        assert solved >= 8, (method, dtype, solved)
