"""run_coupled's plateau stop (matroots/solvers/coupled_loop.py): a residual stuck above the quadratic
phase ends the run, not converged, instead of running to max_iter; a slow but steady linear phase does
not stop there."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import matroots
from matroots.solvers.coupled_loop import PLATEAU_STEPS, run_coupled

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))


def _run(residuals: list[float], max_iter: int = 100):
    """run_coupled on a 1 x 2 x 2 'iteration' whose k-th step has ||M - I||_F = residuals[k]."""
    I = torch.eye(2, dtype=torch.float64)[None]

    def step(k, rows, state, M):
        r = residuals[min(k, len(residuals) - 1)]
        return state, I + torch.tensor([[r, 0.0], [0.0, 0.0]], dtype=torch.float64)[None]

    M0 = I + torch.tensor([[10.0, 0.0], [0.0, 0.0]], dtype=torch.float64)[None]
    return run_coupled((I.clone(),), M0, step, tol=1e-8, max_iter=max_iter, accept=1e-6, per_iter=3.0)


def test_a_residual_stuck_above_one_half_stops_not_converged() -> None:
    out = _run([5.0, 2.0, 0.8, 0.7, 0.72, 0.69, 0.71, 0.7, 0.75, 0.7, 0.72])  # a floor ~0.7
    assert out.reason == ["plateau"] and not bool(out.converged[0])
    assert int(out.iterations[0]) == 6 + PLATEAU_STEPS  # last minimum 0.69 at the 6th step
    assert float(out.matmuls_each[0]) == 3.0 * int(out.iterations[0])


def test_a_slow_linear_phase_is_not_a_plateau() -> None:
    # 1% less per step (slower than Newton-Schulz's ~2% at kappa 1e8), then quadratic: converges on tol
    slow = [5.0 * 0.99**k for k in range(400)]
    k0 = next(k for k, r in enumerate(slow) if r < 0.6)
    quad = [slow[k0]]
    while quad[-1] > 1e-9:
        quad.append(quad[-1] ** 2)
    out = _run(slow[:k0] + quad, max_iter=400)
    assert out.reason == ["tol"] and bool(out.converged[0])


def test_bf16_polar_express_stops_at_its_floor() -> None:
    """bf16, n = 256, kappa 1e5 (shifted before rounding so the rounded matrix is SPD): the residual's
    floor (~u ||Z|| ||Y||) stays near 1/2; before the plateau stop the sign stages ran to max_iter (103
    iterations, 412 products); the run is flagged, not converged, either way."""
    import bench_solvers as bs

    A, _, _ = bs.matrix_in_format(256, 1e5, torch.bfloat16, 4)
    res = matroots.inverse_root(A, 4, method="polar_express", quiet=True)
    assert not bool(res.converged)
    assert int(res.iterations) < 40, (int(res.iterations), res.info["stop_reason"])
