"""Smoke training: a small MLP on scikit-learn's digits (shipped with the package) learns with Shampoo."""

from __future__ import annotations

import functools

import pytest
import torch

import shampoo

sklearn_datasets = pytest.importorskip("sklearn.datasets")


@functools.cache
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    X, y = sklearn_datasets.load_digits(return_X_y=True)
    X = torch.tensor(X, dtype=torch.float32) / 16.0
    return X - X.mean(0), torch.tensor(y)


def _train(
    root_solver: str, grafting: str, lr: float, steps: int = 30
) -> tuple[float, float, shampoo.Shampoo]:
    X, y = _digits()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    opt = shampoo.Shampoo(
        model.named_parameters(),
        lr=lr,
        betas=(0.9, 0.99),
        eps=1e-4,
        eps_mode="relative",
        grafting=grafting,
        root_solver=root_solver,
        precondition_frequency=5,
        start_preconditioning_step=5,
        max_preconditioner_dim=64,
    )
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, len(X), (256,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = torch.nn.functional.cross_entropy(model(X), y).item()
    return losses[0], final, opt


@pytest.mark.parametrize(
    ("root_solver", "grafting", "lr"),
    [
        ("eigh", "adam", 0.01),
        ("coupled_newton", "adam", 0.01),
        ("schur_newton", "adam", 0.01),
        ("eigh", "none", 0.2),
    ],
)
def test_mlp_on_digits_learns(root_solver: str, grafting: str, lr: float) -> None:
    first, final, opt = _train(root_solver, grafting, lr)
    assert final < 0.5 * first, (first, final)
    diags = [f for d in opt.diagnostics() for f in d.factors]
    assert diags and all(f.has_root and f.primary_failures == 0 for f in diags)
    assert {f.solver for f in diags} == {root_solver}
    assert opt.timing.roots_computed == len(diags) * 6
