"""Every registered solver runs the one template of matroots.solvers.base (prepare -> run -> finalise),
``method="auto"`` included (it resolves each matrix to a concrete configuration and runs that
configuration's template), so every result says that its ``converged`` promises a finite root."""

from __future__ import annotations

import math

import torch

import matroots
from matroots.solvers import registry
from matroots.solvers.base import SolverConfig


def _spd(n: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    X = torch.randn(n, n, dtype=torch.float64, generator=g)
    return X @ X.T + n * torch.eye(n, dtype=torch.float64)


def test_no_registered_solver_overrides_the_template() -> None:
    for name in registry.available():
        cfg = registry.get(name)
        assert type(cfg).solve is SolverConfig.solve, name
        assert type(cfg)._solve is SolverConfig._solve or name == "auto", name


def test_every_result_of_the_template_promises_a_finite_root() -> None:
    A = _spd()
    for name in registry.available():
        res = registry.get(name).solve(A, 2)
        assert res.finite_checked, name
        assert bool(torch.as_tensor(res.converged).all()) and bool(torch.isfinite(res.root).all()), name


def test_a_result_built_outside_the_template_does_not_claim_the_check() -> None:
    A = _spd(4)
    res = matroots.RootResult(
        root=torch.full_like(A, math.nan), converged=True, iterations=0, residual=0.0, dtype=A.dtype
    )
    assert not res.finite_checked


def test_auto_takes_its_kappa_hint_as_a_solve_option_through_every_entry_point() -> None:
    A = _spd()
    via_api = matroots.inverse_root(A, 2, "auto", kappa_hint=50.0)
    via_options = matroots.inverse_root(A, 2, "auto", matroots.SolveOptions(kappa_hint=50.0))
    via_config = registry.get("auto").solve(A, 2, kappa_hint=50.0)
    for res in (via_api, via_options, via_config):
        assert res.info["auto"]["kappa_source"] == "kappa_hint"
        assert res.info["auto"]["kappa_estimate"] == [50.0]
    # every other method accepts and ignores it: bitwise the result without it
    for name in ("eigh", "coupled_newton"):
        with_hint = matroots.inverse_root(A, 2, name, kappa_hint=50.0).root
        assert torch.equal(with_hint, matroots.inverse_root(A, 2, name).root), name
