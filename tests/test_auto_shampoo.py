"""Shampoo with root_solver="auto": trains the validation tasks without root failures, shows the chosen
configuration per block, and follows a table whose choice depends on the factor's conditioning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import shampoo
from matroots.solvers.auto import AutoConfig
from matroots.study.tuning.select import TABLE_COLUMNS
from matroots.study.validation.tasks import get_task


def _train(task_name: str, root_solver, steps: int = 40, seed: int = 0):
    task = get_task(task_name, **({"hidden": 64} if task_name == "digits" else {}))
    model = task.build_model(seed)
    start = task.evaluate(model)["val_loss"]
    opt = shampoo.Shampoo(
        model.parameters(),
        lr=1e-2 if task_name == "digits" else 3e-3,
        grafting="adam",
        max_preconditioner_dim=128,
        precondition_frequency=10,
        start_preconditioning_step=10,
        root_solver=root_solver,
    )
    batches = task.batches(seed)
    names: set[str] = set()
    for step in range(steps):
        batch = next(batches)
        opt.zero_grad()
        task.loss(model, batch).backward()
        opt.step()
        if (step + 1) % 10 == 0:
            names |= {f.solver for b in opt.diagnostics() for f in b.factors if f.has_root}
    factors = [f for b in opt.diagnostics() for f in b.factors]
    return start, task.evaluate(model)["val_loss"], factors, names


@pytest.mark.parametrize("task", ["digits", "lsq"])
def test_shampoo_auto_trains_validation_tasks(task: str) -> None:
    with torch.random.fork_rng(devices=[]):
        start, auto_loss, factors, names = _train(task, "auto")
        _, eigh_loss, _, _ = _train(task, "eigh")
    assert factors and all(f.failures == 0 and f.primary_failures == 0 for f in factors)
    assert all(n.startswith("auto:") for n in names), names
    assert auto_loss < 0.7 * start
    assert auto_loss <= 1.1 * eigh_loss + 1e-3, (auto_loss, eigh_loss)


@pytest.fixture
def kappa_table(tmp_path: Path) -> str:
    """fp32, p in {2, 4}, n in [8, 300): kappa < 1e3 -> coupled Newton, kappa in [1e3, 1e13) -> eigh."""
    rows = []
    for p in (2, 4):
        for lo, hi, choice, method, opts in (
            (1.0, 1e3, "coupled_newton[scaling=optimal]", "coupled_newton", '{"scaling": "optimal"}'),
            (1e3, 1e13, "eigh", "eigh", "{}"),
        ):
            r = dict.fromkeys(TABLE_COLUMNS, np.nan)
            r.update(
                device="cpu", dtype="fp32", p=p, n_lo=8, n_hi=300, kappa_lo=lo, kappa_hi=hi, target=0.5,
                choice=choice, method=method, options=opts, worst_error=0.01, median_gemm_equivalents=1.0,
                failure_rate=0.0, cases=1, runner_up="NA", best_effort=choice, reason=f"toy {choice}",
            )  # fmt: skip
            rows.append(r)
    path = tmp_path / "kappa.csv"
    pd.DataFrame(rows, columns=TABLE_COLUMNS).to_csv(path, index=False, na_rep="NA")
    return str(path)


def test_shampoo_auto_follows_the_table_per_factor(kappa_table: str) -> None:
    cfg = AutoConfig(table=kappa_table, target=0.5, warn=False)
    _, _, factors, names = _train("digits", cfg, steps=30)
    assert all(f.failures == 0 for f in factors)
    allowed = {"auto:coupled_newton[scaling=optimal]", "auto:eigh"}
    assert names and names <= allowed | {"auto:eigh[after coupled_newton[scaling=optimal] failed]"}, names
    # The decision is the table's for the factor's estimated kappa: check it directly on one factor.
    for k, expect in ((10.0, "coupled_newton"), (1e5, "eigh")):
        d = cfg.decide(device="cpu", dtype=torch.float32, n=64, kappa=k, p=2, target=0.5)
        assert d.status == "chosen" and d.label.startswith(expect)


def test_shampoo_auto_parses_the_table_once_and_estimates_kappa_once_per_factor(monkeypatch) -> None:
    """The per-round cost of root_solver="auto" (issue 29): the table is read once per process, and
    a factor's kappa is estimated once per round at most: auto estimates it only in the first round
    (later rounds pass the previous round's kappa from the diagnostics as ``kappa_hint``), and the
    diagnostics estimate it only where the chosen solver reports no spectrum."""
    from matroots.solvers import auto_table as table
    from matroots.solvers import kappa_estimate as estimate

    table._load_cached.cache_clear()
    table._RECENT.clear()
    loads, auto_est, diag_est = [], [], []
    step = [0]
    orig_load, orig_est, orig_kappa = (
        table.SelectionTable.load,
        estimate.estimate_kappa,
        shampoo.root_solve._kappa,
    )
    monkeypatch.setattr(
        table.SelectionTable, "load", classmethod(lambda c, p: (loads.append(p), orig_load(p))[1])
    )
    monkeypatch.setattr(
        estimate,
        "estimate_kappa",
        lambda A, **kw: (auto_est.append((step[0], A.shape[0])), orig_est(A, **kw))[1],
    )
    monkeypatch.setattr(
        shampoo.root_solve,
        "_kappa",
        lambda A, *a: (diag_est.append((step[0], A.shape[0])), orig_kappa(A, *a))[1],
    )
    task = get_task("digits", hidden=64)
    model = task.build_model(0)
    opt = shampoo.Shampoo(
        model.parameters(), lr=1e-2, grafting="adam", max_preconditioner_dim=128, precondition_frequency=10,
        start_preconditioning_step=10, root_solver="auto",
    )  # fmt: skip
    batches = task.batches(0)
    for step[0] in range(1, 41):  # root rounds at steps 10, 20, 30, 40
        opt.zero_grad()
        task.loss(model, next(batches)).backward()
        opt.step()
    factors = [f for b in opt.diagnostics() for f in b.factors]
    assert len(loads) == 1
    assert auto_est and {s for s, _ in auto_est} == {10}, auto_est
    per_round: dict[int, int] = {}
    for s, b in auto_est + diag_est:
        per_round[s] = per_round.get(s, 0) + b
    assert set(per_round) <= {10, 20, 30, 40} and max(per_round.values()) <= len(factors), per_round
