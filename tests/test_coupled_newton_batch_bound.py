"""A batch element's coupled_newton root against its solo solve: a stated bound, not bitwise (issue 22,
class 6).

An element of a batch runs its solo iteration up to perturbations of size u in its start: the batch is
pre-scaled by one power of two for all elements (matroots.core.inputs), so c = (c^p)^{1/p} and the final
unscaling by a fractional power of two round differently; batched BLAS products and Lanczos projections
may round a stack element by its alignment (docs/design.md, "Across CPUs"). The iteration propagates
such a perturbation like any other rounding error, i.e. up to the root's condition number, so at kappa
1e13 (fp64) the two roots differ by ~1e-5 (measured 0 .. 6.8e-5 on AVX-512 EPYC with MKL, n = 16 and
33), as their errors do. The bound is the accuracy contract applied to both (triangle inequality):

    ||X_batch - X_solo||_F / ||X_ref||_F <= ||X_batch - X_ref||_F / ||X_ref||_F + ||X_solo - X_ref||_F / ||X_ref||_F
                                         <= 2 B,    B = C_FWD sqrt(n) (1 + cond(A^{-1/p})) u,

with X_ref from matroots.truth.reference and cond from its eigenvalues (tests/test_coupled_newton_warm.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _refs import spd_matrix
from test_coupled_newton_warm import C_FWD, cond_power

import matroots
from matroots.truth import reference

KAPPAS = (1e13, 1e2, 1e6, 1e9, 10.0)  # the kappa-1e13 element batched with others


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("n", [16, 33])
def test_batched_element_is_within_twice_the_contract_of_its_solo_solve(n, p):
    A = np.stack([spd_matrix(n, k, seed=10 + i, lmax=10.0 ** (i % 3 - 1)) for i, k in enumerate(KAPPAS)])
    res = matroots.inverse_root(torch.tensor(A), p, method="coupled_newton")
    assert bool(res.converged.all())
    for i in range(A.shape[0]):
        one = matroots.inverse_root(torch.tensor(A[i]), p, method="coupled_newton")
        assert one.converged
        ref = reference.inverse_root(A[i], p, cache=False)
        X_ref = np.asarray(ref.root, dtype=float)
        scale = float(np.linalg.norm(X_ref))
        cond = cond_power(np.asarray(ref.eigenvalues, dtype=float).real, -1.0 / p)
        bound = C_FWD * math.sqrt(n) * (1.0 + cond) * 2.0**-53
        err_b = float(np.linalg.norm(res.root[i].numpy() - X_ref)) / scale
        err_s = float(np.linalg.norm(one.root.numpy() - X_ref)) / scale
        diff = float(np.linalg.norm(res.root[i].numpy() - one.root.numpy())) / scale
        assert err_b <= bound and err_s <= bound, (i, err_b, err_s, bound)
        assert diff <= 2.0 * bound, (i, diff, bound)
