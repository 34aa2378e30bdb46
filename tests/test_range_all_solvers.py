"""The range check of the root runs for every solver (SolverConfig._finalise), not only for eigh.

A root that underflows the working format is a FormatRangeError whichever method computed it: before,
schur_newton returned the fp16 forward root of A + 1e-16 I (A = 0, batched with a matrix of scale 1,
so no prescaling moved it into range) as 0 with converged=True, while eigh raised FormatRangeError
(issue 28, item 4; the silent-wrong case of ``experiments/robustness.py --cases 3000 --seed 1``).
A zero root is legitimate only for a zero matrix solved with no shift.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import matroots
from matroots.core.errors import FormatRangeError
from matroots.solvers import registry

FORWARD = [m for m in registry.available() if registry.get(m).capabilities.forward_root]


@pytest.mark.parametrize("method", FORWARD)
def test_underflowing_root_in_a_batch_is_refused(method: str) -> None:
    # (0 + 1e-16)^(1/1) = 1e-16 is below fp16's smallest normal 6.1e-5 (and its smallest subnormal)
    A = torch.stack([torch.zeros(1, 1), torch.ones(1, 1)]).half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        with pytest.raises(FormatRangeError, match="fp16"):
            matroots.root(A, 1, method=method, eps=1e-16)


@pytest.mark.parametrize("method", ["coupled_newton", "schur_newton"])
def test_underflowing_inverse_root_is_refused(method: str) -> None:
    # (6e4)^(-1) = 1.7e-5: a non-zero root below fp16's smallest normal (subnormal entries only)
    A = (6e4 * torch.eye(2)).half()
    with pytest.raises(FormatRangeError, match="smallest normal"):
        matroots.inverse_root(A, 1, method=method, eps=0.0)


def test_zero_root_of_the_zero_matrix_is_not_a_range_error() -> None:
    # the forward root of 0 with no shift is 0 itself: not an underflow (coupled Newton flags its own
    # convergence on it; the range check must not turn the legitimate zero into an error)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        res = matroots.root(torch.zeros(2, 2).half(), 1, method="coupled_newton", eps=0.0)
    assert bool((res.root == 0).all())


def test_in_range_batch_is_unchanged() -> None:
    # the check reads max|X| only: an in-range batch returns as before (fp16 root of diag(1, 4))
    A = torch.stack([torch.eye(2), 4 * torch.eye(2)]).half()
    res = matroots.root(A, 2, method="schur_newton", eps=0.0)
    assert bool(res.converged.all())
    # sqrt(4) = 2 to fp16 rounding (u = 4.9e-4; a few u for the Newton iteration)
    assert torch.allclose(res.root[1].float(), 2 * torch.eye(2), atol=0, rtol=8 * 4.9e-4)
