"""What a direct ``method="auto"`` call adds to the solver it picks, counted in dispatched torch operations
and in built option objects (not timed: the counts are the same on every machine). Each small torch
operation costs microseconds of dispatch, as much as the kernels at small n, so auto's own work is
held to its kappa estimate and a few checks."""

from __future__ import annotations

import collections
from fractions import Fraction

import numpy as np
import pytest
import torch
from _opcount import OpCount as _Count
from _opcount import count_options_built

import matroots
from matroots.core.options import SolveOptions
from matroots.solvers.auto import AutoConfig
from matroots.solvers.auto_candidates import candidate, default_safe
from matroots.solvers.auto_first import SOURCE, SOURCE_ELSEWHERE
from matroots.solvers.auto_plan import plan_for
from matroots.solvers.auto_table import load_table
from matroots.solvers.auto_targets import default_target
from matroots.solvers.kappa_estimate import EXACT_MAX_WORK, estimate_kappa
from matroots.study import matrices

# auto's own checks beside the estimate: the exact-symmetry test (transpose + equal), the finiteness
# test (one sum and its read), the batch view, and detaches (each a view, dispatched) -- at most 8.
OWN_OPS = 8


def _spd(n: int, dtype: torch.dtype) -> torch.Tensor:
    A = torch.from_numpy(matrices.generate("randsvd", n, 1e3, np.random.default_rng(1))[0]).to(dtype)
    return torch.maximum(A, A.mT)  # exactly symmetric (elementwise max commutes with the transpose)


def _ops(fn) -> collections.Counter[str]:
    fn()  # first call: table load, memoised answers
    with _Count() as c:
        fn()
    return c.ops


@pytest.mark.parametrize("n", [16, 128, 256])  # the exact estimate (b n^3 <= 192^3) and the iterative one
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_auto_adds_only_its_kappa_estimate_and_a_few_checks(n: int, dtype: torch.dtype) -> None:
    """auto = the chosen solver's operations + one kappa estimate + at most OWN_OPS: before, it added a
    second symmetry defect in float64 (~10 operations), an entrywise finiteness scan and a dozen small
    operations around the eigenvalues (36 extra at n = 16, 175 at n = 128). Where it decomposes first
    (matroots.solvers.auto_first) the estimate is that eigh's eigenvalues: none at all when that eigh
    is the choice, that eigh's operations in place of the estimate's when another solve is."""
    A = _spd(n, dtype)
    res = matroots.inverse_root(A, 2, method="auto")
    cfg, sopts = candidate(load_table(), res.info["auto"]["chosen"][0])
    auto = _ops(lambda: matroots.inverse_root(A, 2, method="auto"))
    chosen = _ops(lambda: cfg.solve(A, 2, **sopts))
    estimate = _ops(lambda: estimate_kappa(A.reshape(1, n, n)))
    assert not chosen - auto  # the chosen solve runs as a direct call would
    extra = auto - chosen
    source = res.info["auto"]["kappa_source"]
    first = plan_for(
        AutoConfig(), None, default_safe(True), "cpu", dtype, n, Fraction(2), default_target(dtype), True
    )
    low = first.decision(1.0)
    if source == SOURCE:  # decomposed first, and the chosen eigh solved from it: no estimate at all
        budget = OWN_OPS  # (no test before decomposing: auto_first's docstring)
        if res.info["auto"]["chosen"][0] != low.label:  # another rank policy: the lowest's spectrum too
            prob = low.config._prepare(A, 2, SolveOptions.build(None))
            dec = low.config._decompose(prob)
            budget += sum(_ops(lambda: low.config.spectrum_of(prob, dec, inverse=True)).values())
        assert sum(extra.values()) <= budget, extra.most_common()
        assert extra["aten._linalg_eigh.default"] == 0
    elif source == SOURCE_ELSEWHERE:  # decomposed first, another solve chosen: that eigh, not the estimate
        eigh = _ops(lambda: low.config.solve(A, 2, **low.solve_options))
        assert sum(extra.values()) <= sum(eigh.values()) + OWN_OPS, extra.most_common()
        assert extra["aten._linalg_eigh.default"] == 1
    else:
        assert sum(extra.values()) <= sum(estimate.values()) + OWN_OPS, extra.most_common()
        assert extra["aten._linalg_eigh.default"] == (1 if n**3 <= EXACT_MAX_WORK else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kappa_estimate_costs_a_known_number_of_operations(dtype: torch.dtype) -> None:
    """Exact (one float64 eigvalsh): the copy to float64 (fp32 input), the eigenvalues, the two ends
    and their read. Iterative: a fixed part (start vectors, shift, Cholesky, the final ratio) + 7 per
    power step past the first (row matvec: unsqueeze, bmm, squeeze; normalise: norm, test, where,
    divide) + 4 per inverse step past the first (cholesky_solve; normalise: norm, clamp, divide):
    the Rayleigh quotients are formed once, after the last step."""
    small = _spd(16, dtype).reshape(1, 16, 16)
    assert sum(_ops(lambda: estimate_kappa(small)).values()) <= 5
    big = _spd(256, dtype).reshape(1, 256, 256)  # past EXACT_MAX_WORK: the iterative estimate
    base = sum(_ops(lambda: estimate_kappa(big, power_iters=1, inverse_iters=1)).values())
    for power, inverse in ((8, 4), (4, 2), (2, 3)):
        got = sum(
            _ops(lambda p=power, i=inverse: estimate_kappa(big, power_iters=p, inverse_iters=i)).values()
        )
        assert got == base + 7 * (power - 1) + 4 * (inverse - 1)
    assert base <= 50


def test_a_default_auto_call_builds_no_solve_options_and_a_given_option_is_validated_once(
    monkeypatch,
) -> None:
    """auto passes the chosen solver only the options the caller changed, so a default call reuses the
    cached default SolveOptions as a direct call does (before, it built and validated one per call
    from eps / eps_mode / dtype / inverse at their defaults)."""
    A = _spd(16, torch.float64)
    built = count_options_built(monkeypatch)
    matroots.inverse_root(A, 2, method="auto")
    built.clear()
    matroots.inverse_root(A, 2, method="auto")
    assert built["options"] == 0
    matroots.inverse_root(A, 2, method="auto", eps=1e-3)
    assert built["options"] == 1
