"""An ill-posed root is never returned as converged (issue 22, class 2; docs/design.md §3).

converged promises C cond(f, A) u of the root of the matrix solved; where the computed spectrum
leaves lambda_min within the eigensolver's error n u ||A||_2 of 0, cond(f, A) u >= 1 is possible
and no digit is promised. The psd "shift" policy (Shampoo's default) floors lambda_min at
n u ||A||_F >= that error, so its roots stay converged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import matroots


def _rank_deficient() -> torch.Tensor:
    q = np.linalg.qr(np.random.default_rng(8).standard_normal((8, 8)))[0]
    S = (q * np.r_[np.linspace(1, 0.5, 7), 0.0]) @ q.T  # exact smallest eigenvalue after rounding: -1.5e-17
    return torch.tensor((S + S.T) / 2)


@pytest.mark.parametrize("method", ("eigh", "schur_newton", "auto"))
def test_a_numerically_singular_spd_matrix_gets_no_converged_inverse_root(method):
    res = matroots.inverse_root(_rank_deficient(), 2, method=method, quiet=True)
    assert not res.all_converged
    assert res.info.get("ill_conditioned")


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
def test_the_shift_policy_keeps_rank_deficient_factors_converged(dtype):
    res = matroots.inverse_root(_rank_deficient().to(dtype), 2, method="eigh", psd="shift", eps=1e-12)
    assert res.all_converged
