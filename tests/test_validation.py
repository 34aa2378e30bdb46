"""matroots validate: tasks build offline, runs write the documented columns, summaries follow from
the curves, and the reference roots match an independent implementation."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import torch
from _tiny_validation import TINY_SIZES, tiny_config

from matroots.core.errors import InvalidArgumentError
from matroots.study.validation import config, corpus, get_task, run, summary, training
from matroots.study.validation.tasks import TASKS

TASK_NAMES = sorted(TASKS)


def _size(name: str) -> dict:
    import tomllib

    return tomllib.loads(f"s = {TINY_SIZES[name]}")["s"]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("a validation task tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_task_builds_offline_and_is_deterministic(name: str, offline: None) -> None:
    task = get_task(name, **_size(name))
    m1, m2 = task.build_model(0), task.build_model(0)
    for a, b in zip(m1.state_dict().values(), m2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(m1.state_dict().values(), task.build_model(1).state_dict().values(), strict=True)
    )
    b0, b0_again, b1 = next(task.batches(0)), next(task.batches(0)), next(task.batches(1))
    assert torch.equal(b0[0], b0_again[0]) and torch.equal(b0[1], b0_again[1])
    assert not torch.equal(b0[0], b1[0])
    loss = task.loss(m1, b0)
    assert torch.isfinite(loss)
    loss.backward()
    ev = task.evaluate(m1)
    assert set(ev) == {"val_loss", task.metric} and all(math.isfinite(v) for v in ev.values())
    assert m1.training  # evaluate restores train mode


def test_w1_is_the_benchmark_architecture(offline: None) -> None:
    task = get_task("w1", batch_size=2, val_windows=2, max_train_bytes=100_000, max_val_bytes=20_000)
    m = task.build_model(0)
    assert m.embed.weight.shape == (256, 256) and m.pos.shape == (128, 256)
    assert len(m.encoder.layers) == 4
    layer = m.encoder.layers[0]
    assert layer.self_attn.num_heads == 4 and layer.linear1.weight.shape == (1024, 256)
    x, y = next(task.batches(0))
    assert x.shape == (2, 128) and torch.equal(x[:, 1:], y[:, :-1])  # next-byte targets
    assert int(x.max()) < 256


def test_corpus_split_by_file() -> None:
    import sysconfig

    base = Path(sysconfig.get_paths()["stdlib"])
    files = corpus.stdlib_files()
    assert len(files) > 100 and all("site-packages" not in p.relative_to(base).parts for p in files)
    rel = [p.relative_to(base).as_posix() for p in files]
    val = [r for r in rel if corpus.is_validation_file(r, 0.1)]
    assert 0.03 < len(val) / len(rel) < 0.2
    full = corpus.load_corpus()
    assert (full.val_files, full.train_files) == (len(val), len(rel) - len(val))  # whole files per split
    sizes = {r: p.stat().st_size for r, p in zip(rel, files, strict=True)}
    sep = len(corpus.SEPARATOR)
    assert full.val.size == sum(sizes[r] for r in val) + sep * (len(val) - 1)
    c = corpus.load_corpus(300_000, 100_000)
    assert 0 < c.train_files < full.train_files and c.train.dtype == np.uint8
    assert corpus.load_corpus(300_000, 100_000).fingerprint == c.fingerprint != full.fingerprint


def test_lsq_task_condition_number_and_optimum() -> None:
    task = get_task("lsq")
    X = task.x_train.double().numpy()
    ev = np.linalg.eigvalsh(np.cov(X, rowvar=False))
    assert ev[-1] / ev[0] == pytest.approx(1e4, rel=1e-3)
    # the closed-form optimum is a lower bound of what the linear model can reach on validation...
    coef, *_ = np.linalg.lstsq(np.c_[X, np.ones(len(X))], task.y_train.double().numpy(), rcond=None)
    model = task.build_model(0)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(coef[:-1].T))
        model.bias.copy_(torch.tensor(coef[-1]))
    ev_opt = task.evaluate(model)
    assert ev_opt["val_excess_loss"] == pytest.approx(0.0, abs=1e-5)
    assert task.evaluate(task.build_model(0))["val_excess_loss"] > 0.1


def test_reference_root_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    G = rng.standard_normal((12, 5))
    A = G @ G.T  # rank 5: the PSD projection keeps it, eps makes it invertible
    for eps, mode in ((1e-3, "absolute"), (1e-4, "relative")):
        ((R, e),) = training.reference_roots(A, 4.0, [(eps, mode)])
        shift = eps * np.linalg.eigvalsh(A)[-1] if mode == "relative" else eps
        assert e == pytest.approx(shift)
        want = np.real(scipy.linalg.fractional_matrix_power(A + shift * np.eye(12), -0.25))
        assert np.linalg.norm(R - want) / np.linalg.norm(want) < 1e-9
    ((R0, _),) = training.reference_roots(A, 4.0, [(0.0, "absolute")])
    assert R0 is None  # singular without eps: no reference, not garbage


def test_config_errors_name_the_problem(tmp_path: Path) -> None:
    good = config.from_dict(
        {
            "tasks": {"digits": {}},
            "optimizers": [{"name": "adamw", "lr": [1e-3]}, {"name": "sgd", "lr": [0.1]}],
        }
    )
    assert [u.optimizer.name for u in good.units()] == ["adamw", "sgd"]
    with pytest.raises(InvalidArgumentError, match="unknown task 'digit'"):
        config.from_dict({"tasks": {"digit": {}}, "optimizers": [{"name": "adamw", "lr": [1e-3]}]})
    with pytest.raises(InvalidArgumentError, match="needs an 'adamw' entry"):
        config.from_dict({"tasks": {"digits": {}}, "optimizers": [{"name": "sgd", "lr": [0.1]}]})
    with pytest.raises(InvalidArgumentError, match="unknown root solver 'eig'"):
        config.from_dict(
            {
                "tasks": {"digits": {}},
                "optimizers": [
                    {"name": "adamw", "lr": [1e-3]},
                    {"name": "shampoo", "lr": [1e-3], "root_solver": "eig"},
                ],
            }
        )
    with pytest.raises(InvalidArgumentError, match=r"unknown keys.*'root_solver'"):
        config.from_dict(
            {"tasks": {"digits": {}}, "optimizers": [{"name": "adamw", "lr": [1e-3], "root_solver": "x"}]}
        )
    p = tmp_path / "bad.toml"
    p.write_text("name = [")
    with pytest.raises(InvalidArgumentError, match="not valid TOML"):
        config.load_config(p)


def test_same_seed_same_data_for_every_optimizer() -> None:
    grid = config.from_dict(
        {
            "seeds": [3],
            "tasks": {"digits": {"size": {"hidden": 16}}},
            "optimizers": [
                {"name": "adamw", "lr": [1e-3]},
                {"name": "shampoo", "lr": [1e-3], "root_solver": "all"},
            ],
        }
    )
    from matroots.solvers import registry

    units = grid.units()
    solvers = set(registry.available()) - {"auto"}  # "auto" only selects one of the others
    assert {"eigh", "coupled_newton", "schur_newton"} <= solvers
    assert {u.seed for u in units} == {3} and len(units) == 1 + len(solvers)
    assert {u.optimizer.root_solver for u in units[1:]} == solvers


# ----------------------------------------------------------------------------------------------------
# a 2-optimizer, 2-step run of every task


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    out = tmp_path_factory.mktemp("val") / "run"
    grid = config.from_dict(__import__("tomllib").loads(tiny_config(TASK_NAMES, freq=2)))
    return run.run_validation(grid, out, workers=2, progress=False)


def test_two_step_run_writes_documented_columns(two_step_run: dict[str, pd.DataFrame]) -> None:
    t = two_step_run
    curves, runs, roots = t["curves"], t["runs"], t["roots"]
    assert set(runs["task"]) == set(TASK_NAMES) and len(runs) == len(TASK_NAMES) * 4
    assert set(run.CURVE_COLUMNS) <= set(curves), set(run.CURVE_COLUMNS) - set(curves)
    assert set(run.RUN_COLUMNS) <= set(runs), set(run.RUN_COLUMNS) - set(runs)
    assert set(run.SHAMPOO_RUN_COLUMNS) <= set(runs)
    assert set(run.ROOT_COLUMNS) <= set(roots), set(run.ROOT_COLUMNS) - set(roots)
    assert (runs["failure"] == "").all() and (runs["steps_done"] == 2).all()
    assert sorted(curves["step"].unique()) == [0, 1, 2]
    assert curves.groupby("unit").size().eq(3).all()
    sh = runs[runs["optimizer"] == "shampoo"]
    assert (sh["root_rounds"] == 1).all()  # precondition_frequency 2: the first round at step 2
    samp = roots[roots["sampled"]]
    assert samp["forward_error"].notna().all() and (samp["forward_error"] < 1).all()
    # fp32 roots of the matrix actually solved (eps 1e-2 relative + the rank shift): within
    # 10 cond(A^{-1/p}) u of the float64 root, cond = kappa / p (kappa of that matrix, as reported)
    p = samp["root_p"].astype(str).map(lambda v: float(__import__("fractions").Fraction(v)))
    assert (samp["kappa"] <= 101 * 1.01).all()
    assert (samp["forward_error_solved"] <= 10 * samp["kappa"] / p * 6e-8).all()
    for name in ("curves", "runs", "roots", "summary", "accuracy"):
        assert name in t
    # initial weights and data order are the seed's: the step-0 validation loss agrees across optimizers
    v0 = curves[curves["step"] == 0].groupby("task")["val_loss"].nunique()
    assert (v0 == 1).all()


def test_summary_recomputed_from_curves(two_step_run: dict[str, pd.DataFrame]) -> None:
    curves, runs, s = two_step_run["curves"], two_step_run["runs"], two_step_run["summary"]
    for task in TASK_NAMES:
        r = runs[runs["task"] == task]
        ad = r[r["optimizer"] == "adamw"]
        target = ad.groupby("lr")["final_val_loss"].median().min()
        assert s[s["task"] == task]["target"].iloc[0] == pytest.approx(target)
        for _, row in s[s["task"] == task].iterrows():
            units = r[(r["config"] == row["config"]) & (r["lr"] == row["lr"])]["unit"]
            hits, curves_u = [], []
            for u in units:
                c = curves[curves["unit"] == u].sort_values("step")
                curves_u.append(c.set_index("step")["val_loss"])
                reached = c[c["val_loss"] <= target]["step"]
                hits.append(float(reached.iloc[0]) if len(reached) else math.inf)
            med = pd.concat(curves_u, axis=1).median(axis=1)
            first = med[med <= target]
            want = float(first.index[0]) if len(first) else math.inf
            assert row["steps_to_target"] == want, row["config"]
            assert row["steps_to_target_per_seed"] == float(np.median(hits)), row["config"]
            ru = r[(r["config"] == row["config"]) & (r["lr"] == row["lr"])]
            assert row["time_ratio"] == pytest.approx(float((ru["step_s"] / ru["adamw_step_s"]).median()))
            assert row["time_ratio_cpu"] == pytest.approx(
                float((ru["step_cpu_s"] / ru["adamw_step_cpu_s"]).median())
            )
        b = summary.best(s[s["task"] == task])
        ad_best = b[b["optimizer"] == "adamw"].iloc[0]
        for _, row in b.iterrows():
            assert row["steps_ratio"] == pytest.approx(row["steps_to_target"] / ad_best["steps_to_target"])


def test_summary_definitions_on_hand_made_curves() -> None:
    """Steps-to-target, best lr and ratios on curves with known answers (independent of training)."""

    def unit(
        u: str, opt: str, lr: float, seed: int, vals: list[float], failure: str = "", cfg: str = ""
    ) -> tuple:
        c = pd.DataFrame(
            {"unit": u, "task": "t", "optimizer": opt, "config": cfg or opt, "lr": lr, "seed": seed,
             "step": [0, 10, 20, 30][: len(vals)], "val_loss": vals, "wall_s": [0, 1, 2, 3][: len(vals)],
             "cpu_s": [0, 2, 4, 6][: len(vals)]}
        )  # fmt: skip
        r = {"unit": u, "task": "t", "optimizer": opt, "config": cfg or opt, "lr": lr, "seed": seed,
             "final_val_loss": vals[-1], "final_metric": 0.0, "failure": failure,
             "step_s": 2.0 if opt == "shampoo" else 1.0, "adamw_step_s": 1.0,
             "step_cpu_s": 3.0 if opt == "shampoo" else 1.0, "adamw_step_cpu_s": 1.0}  # fmt: skip
        r["time_ratio"], r["time_ratio_cpu"] = r["step_s"] / r["adamw_step_s"], r["step_cpu_s"]
        return c, r

    parts = [
        unit("a1", "adamw", 1e-3, 0, [3, 2, 1.5, 1.0]),
        unit("a2", "adamw", 1e-2, 0, [3, 1.5, 0.9, 0.8]),  # best AdamW: target 0.8, reached at 30
        unit("s1", "shampoo", 1e-3, 0, [3, 0.7, 0.6, 0.5]),  # reaches 0.8 at step 10
        unit("s2", "shampoo", 1e-2, 0, [3, 0.5, math.nan, math.nan], failure="Diverged"),
        # two seeds: the median curve [3, 1.0, 0.75, 0.725] reaches 0.8 at step 20; per seed: 10 and +inf
        unit("m0", "shampoo", 1e-3, 0, [3, 0.7, 0.6, 0.6], cfg="two"),
        unit("m1", "shampoo", 1e-3, 1, [3, 1.3, 0.9, 0.85]),
    ]
    parts[-1][0]["config"] = "two"
    parts[-1][1]["config"] = "two"
    curves = pd.concat([c for c, _ in parts], ignore_index=True)
    runs = pd.DataFrame([r for _, r in parts])
    s = summary.summarize(curves, runs)
    assert (s["target"] == 0.8).all()
    b = summary.best(s).set_index("config")
    assert b.loc["adamw", "lr"] == 1e-2 and b.loc["adamw", "steps_to_target"] == 30
    assert b.loc["shampoo", "lr"] == 1e-3  # the diverged lr counts as +inf final loss
    assert b.loc["shampoo", "steps_to_target"] == 10 and b.loc["shampoo", "steps_ratio"] == pytest.approx(
        1 / 3
    )
    assert b.loc["shampoo", "time_ratio"] == 2.0 and b.loc["shampoo", "time_ratio_cpu"] == 3.0
    assert b.loc["shampoo", "time_to_target_ratio"] == pytest.approx(1 / 3 * 3.0)  # steps x CPU ratio
    assert b.loc["shampoo", "cpu_to_target_ratio"] == pytest.approx(2 / 6)
    assert b.loc["shampoo", "min_steps_to_target"] == 10 and b.loc[
        "shampoo", "min_steps_ratio"
    ] == pytest.approx(1 / 3)
    assert b.loc["adamw", "min_steps_to_target"] == 30 and b.loc["adamw", "min_steps_lr"] == 1e-2
    two = b.loc["two"]
    assert two["steps_to_target"] == 20 and math.isinf(two["steps_to_target_per_seed"])  # median of [10, inf]
    assert two["final_val_loss"] == pytest.approx(0.725) and two["seeds"] == 2
    div = s[(s["config"] == "shampoo") & (s["lr"] == 1e-2)].iloc[0]
    assert div["failures"] == 1 and math.isinf(div["final_val_loss"])
    assert div["steps_to_target"] == 10  # it did reach the target before diverging


def test_validate_cli_report_and_dry_run(
    two_step_run: dict[str, pd.DataFrame], tmp_path: Path, capsys
) -> None:
    from matroots.study.validation.cli import main

    run_dir = Path(two_step_run["runs"]["unit"].iloc[0]).parent  # placeholder to keep the fixture
    del run_dir
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(tiny_config(["digits"], steps=3))
    assert main([str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 units" in out and "wall on 2 idle cores" in out
    assert main([str(cfg), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert main(["--report", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "== digits: target" in out and "root accuracy vs training outcome" in out
    for f in ("learning_curves", "accuracy_vs_outcome"):
        assert (tmp_path / "r" / "figures" / f"{f}.png").stat().st_size > 0
        assert (tmp_path / "r" / "figures" / f"{f}.pdf").exists()
    assert (tmp_path / "r" / "steps_to_target.csv").exists()
    assert main(["--report", str(tmp_path / "nope")]) == 2
    assert main([str(cfg), "--out", str(tmp_path / "r")]) == 2  # rows exist: needs --resume


@pytest.mark.parametrize(
    "root_dtype,statistics_frequency", [("fp32", 1), ("fp64", 1), ("fp32", 2), ("fp32", 3)]
)
def test_forward_errors_of_real_shampoo_roots(root_dtype: str, statistics_frequency: int) -> None:
    """Roots of real digits factors (rank deficient after 2 steps of batch 8) against the matrix
    Shampoo reports it solved: within 10 (kappa/p) u of the float64 root, kappa that matrix's condition
    number as Shampoo reports it (the conditioning of A^{-1/p} itself), u that of the fp32 statistics;
    the error against the matrix
    asked for (eps 1e-12 on a rank-deficient factor) is O(1), which is why both are recorded.

    With ``statistics_frequency`` k > 1 the factor at the root's step t has had u < t updates and
    Shampoo divides it by 1 - beta2^u: the reference must too (with 1 - beta2^t the "solved" error of
    these roots read 0.1-0.4, against a reference that was not the matrix solved)."""
    steps = 2 if statistics_frequency == 1 else 6  # k = 2: u = 3 of t = 6; k = 3: u = 2
    grid = config.from_dict(
        {
            "tasks": {"digits": {"steps": steps, "size": {"hidden": 16, "batch_size": 8}}},
            "diagnostics": {"root_error_samples": 100},
            "optimizers": [
                {"name": "adamw", "lr": [1e-3]},
                {
                    "name": "shampoo", "lr": [1e-2], "root_dtype": [root_dtype],
                    "precondition_frequency": [steps],
                    "options": {"statistics_frequency": statistics_frequency},
                },
            ],
        }
    )  # fmt: skip
    unit = grid.units()[1]
    task = get_task("digits", hidden=16, batch_size=8)
    model = task.build_model(0)
    opt = training.make_optimizer(unit, model)
    for _, batch in zip(range(steps), task.batches(0), strict=False):
        training._one_step(task, model, opt, batch)
    rows = training.root_rows(opt, unit, steps)
    assert all(r["root_step"] == steps for r in rows)
    assert len(rows) >= 3 and all(r["sampled"] for r in rows)
    # The statistics are fp32 data (and Shampoo bias-corrects them in fp32), so even an fp64 solve
    # is of a matrix known to fp32's u: the bound uses the coarser of the two formats.
    u = 6e-8
    for r in rows:
        assert math.isfinite(r["regularisation"]) and r["regularisation"] > 0
        assert r["forward_error_solved"] <= 10 * (r["kappa"] / 4) * u, r
        if r["n"] > 16:  # rank <= 2 steps x batch 8 < n: eps 1e-12 is far below the shift applied
            assert r["forward_error"] > 0.1


def test_seed_order_covers_every_task_first() -> None:
    raw = {
        "seeds": [0, 1],
        "tasks": {"digits": {}, "lsq": {}},
        "optimizers": [{"name": "adamw", "lr": [1e-3]}, {"name": "sgd", "lr": [0.1]}],
    }
    by_task = [(u.task.name, u.seed) for u in config.from_dict(raw).units()]
    by_seed = [(u.task.name, u.seed) for u in config.from_dict({**raw, "order": "seed"}).units()]
    assert by_task[:4] == [("digits", 0)] * 2 + [("digits", 1)] * 2
    assert by_seed[:4] == [("digits", 0)] * 2 + [("lsq", 0)] * 2
    assert sorted(by_task) == sorted(by_seed)
    with pytest.raises(InvalidArgumentError, match="order must be"):
        config.from_dict({**raw, "order": "random"})
