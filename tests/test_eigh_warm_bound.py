"""eigh_warm's binned second-order bound (matroots/solvers/warm_bound.py) against
the exact second-order Daleckii-Krein term, and the acceptance it allows on real Shampoo factors with
eps (rank_policy "perturb", Shampoo's setting) judged against a float64 reference of the matrix solved."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_eigh_warm import check_warm_round, shampoo_factor_sequence

import matroots
from matroots.solvers.warm_bound import binned_second_order


def _exact_t2(O: np.ndarray, z: np.ndarray, e: float) -> float:
    """||T2||_F, T2_ij = sum_k f[z_i, z_k, z_j] O_ik O_kj (O zero-diagonal), by exact divided differences."""
    n = z.size
    f = z**e

    def dd1(a, b):
        return e * a ** (e - 1) if a == b else (a**e - b**e) / (a - b)

    D1 = np.array([[dd1(z[i], z[j]) for j in range(n)] for i in range(n)])
    T = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if z[i] == z[j]:
                g = np.array([(D1[i, k] - e * f[i] / z[i]) / (z[k] - z[i]) if z[k] != z[i] else
                              0.5 * e * (e - 1) * z[i] ** (e - 2) for k in range(n)])  # fmt: skip
            else:
                g = (D1[i, :] - D1[:, j]) / (z[i] - z[j])
            T[i, j] = np.sum(g * O[i, :] * O[:, j])
    return float(np.linalg.norm(T))


@pytest.mark.parametrize("e", [-0.25, -0.5, -1.0, 0.5])
def test_binned_bound_is_a_bound_and_sharp_where_a_large_direction_couples_small_ones(e):
    rng = np.random.default_rng(7)
    n = 24
    z = np.sort(np.concatenate([10 ** rng.uniform(-6, -4, n - 4), 10 ** rng.uniform(-1, 0, 4)]))
    O = rng.standard_normal((n, n)) * 1e-3 * np.sqrt(np.maximum.outer(z, z)) * np.maximum.outer(z, z) ** 0.5
    O = 0.5 * (O + O.T)
    np.fill_diagonal(O, 0.0)
    exact = _exact_t2(O, z, e)
    zt = torch.from_numpy(z)[None]
    Ot = torch.from_numpy(O)[None]
    Od = Ot.clone()
    Od[0].diagonal().add_(zt[0])  # the estimate passes O with its diagonal (the Ritz values) left in
    bound = float(binned_second_order(Od.square(), zt, zt.pow(e))[0])
    assert exact <= bound * (1 + 1e-12), (exact, bound)
    # the relative-perturbation bound it replaces: 3 ||Ohat||_F ||diag(f) Ohat||_F, Ohat = O / sqrt(z z^T)
    Oh = O / np.sqrt(np.outer(z, z))
    old = 3.0 * np.linalg.norm(Oh) * np.linalg.norm((z**e)[:, None] * Oh)
    assert bound < old / 4, (bound, old)  # small-large couplings not scaled by sqrt(z_large / z_small)


def test_real_factor_rounds_with_eps_are_accepted_within_the_cold_bound():
    """Factors of a digits MLP (rounds every 5 steps from step 100), Shampoo's solve: rank_policy
    'perturb' with eps = 1e-6 relative (``eps_mode='relative'``). Every root within the cold bound of
    the matrix solved (float64 eigh of the fp32 factor plus the same eps_abs); most rounds warm."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        factors = shampoo_factor_sequence(steps=200, every=5, start=100)
        cfg = matroots.solvers.EighWarmConfig()
        u, p = 2.0**-24, 4
        counts = {"cold": 0, "accepted": 0, "refined": 0, "fallback": 0}
        for n, seq in factors.items():
            prev = None
            for t in range(seq.shape[0]):
                A = seq[t]
                res = cfg.solve(A, p, eps=1e-6, eps_mode="relative", warm_start=prev)
                eps_abs = torch.as_tensor(res.info["eps_abs"], dtype=torch.float64).reshape(-1, 1)
                w, V = torch.linalg.eigh(A.double())
                z = w + eps_abs
                fz = z.pow(-1.0 / p)
                ref = (V * fz.unsqueeze(-2)) @ V.mT
                cond = (fz / z).amax(-1) / p * z.norm(dim=-1) / fz.norm(dim=-1)
                check_warm_round(res, ref, cond, u, n, t, counts)
                prev = res
    finally:
        torch.set_num_threads(before)
    assert counts["accepted"] + counts["refined"] >= 0.7 * sum(counts.values()), counts
    assert counts["accepted"] > 0, counts  # some rounds need no refinement step at all
