"""The tuning protocol of ``matroots validate``: equal trials, deterministic quasi-random points inside
their ranges, selection on the validation split and reporting on the held-out split, the schedule,
and the bootstrap intervals on closed-form cases."""

from __future__ import annotations

import itertools
import math
import tomllib
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from _tiny_validation import synthetic_protocol_tables as _runs_and_curves
from _tiny_validation import tiny_protocol

from matroots.core.errors import InvalidArgumentError
from matroots.study.validation import config, protocol, protocol_report
from matroots.study.validation.tasks import get_task


def _grid(text: str) -> config.ValidationGrid:
    return config.from_dict(tomllib.loads(text))


def test_every_tuned_optimizer_gets_the_same_number_of_trials() -> None:
    for trials in (2, 5):
        grid = _grid(tiny_protocol(trials=trials))
        units = grid.units()
        tune = Counter(u.optimizer.label for u in units if u.phase == "tune")
        assert tune == {"adamw": trials, "shampoo-eigh": trials, "heavyball_soap": trials}
        assert {u.trial for u in units if u.phase == "tune"} == set(range(trials))
        fixed = [u for u in units if u.phase == "final"]  # the untuned SOAP row: its point at the final seeds
        assert {u.optimizer.label for u in fixed} == {"soap-published"} and sorted(u.seed for u in fixed) == [
            1,
            2,
        ]
        assert grid.final_unit_count() == 3 * 2
        assert all(u.task.size["holdout"] for u in units)


def test_sobol_points_are_deterministic_shared_and_inside_their_ranges() -> None:
    p = protocol.parse_protocol({"trials": 16, "sobol_seed": 3})
    space = p.space
    a = protocol.trial_points(p, "shampoo", space, {})
    assert a == protocol.trial_points(p, "shampoo", space, {})  # fixed seed: the same points every time
    assert a != protocol.trial_points(
        protocol.parse_protocol({"trials": 16, "sobol_seed": 4}), "shampoo", space, {}
    )
    adam = protocol.trial_points(p, "adamw", space, {})
    for hs, ha in zip(a, adam, strict=True):
        for name in protocol.OPTIMIZER_DIMS["shampoo"]:
            assert space[name].contains(hs[name]), (name, hs[name])
        for name in protocol.COMMON:  # the shared dimensions are the same point for both optimizers
            assert hs[name] == ha[name]
        assert set(ha) == set(protocol.COMMON)
    assert len({h["lr"] for h in a}) == 16
    # Sobol balance: each half of [0, 1) of every coordinate holds exactly half of 16 points
    u = protocol.unit_points(16, 3)
    assert ((u < 0.5).sum(axis=0) == 8).all()
    # the log scale: the lr's logarithm is uniform on the range, so its median is near the geometric middle
    lo, hi = space["lr"].low, space["lr"].high
    mid = math.exp(np.median(np.log([h["lr"] for h in a])))
    assert abs(math.log(mid / math.sqrt(lo * hi))) < 0.2 * math.log(hi / lo)


def test_fixed_dimensions_and_ranges_from_the_config() -> None:
    p = protocol.parse_protocol({"trials": 4, "space": {"lr": [1e-3, 2e-3]}})
    pts = protocol.trial_points(
        p, "shampoo", protocol.parse_space({"grafting": ["adam"]}, p.space, "x"), {"beta2": 0.99}
    )
    assert all(1e-3 <= h["lr"] <= 2e-3 and h["beta2"] == 0.99 and h["grafting"] == "adam" for h in pts)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"final_seeds": [0, 1]}, "disjoint"),
        ({"space": {"lr": [0.0, 1e-2]}}, "0 < low"),
        ({"space": {"momentum": [0.1, 0.2]}}, "unknown hyperparameter"),
        ({"trials": 0}, "protocol.trials"),
    ],
)
def test_bad_protocol_tables_are_typed_errors(change: dict, fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment):
        protocol.parse_protocol({"tuning_seeds": [0], **change})


def test_a_protocol_entry_with_an_lr_list_is_refused() -> None:
    text = tiny_protocol().replace(
        '[[optimizers]]\nname = "adamw"', '[[optimizers]]\nname = "adamw"\nlr = [1e-3]'
    )
    with pytest.raises(InvalidArgumentError, match="samples lr"):
        _grid(text)


def test_schedule_is_linear_warmup_then_cosine() -> None:
    assert [protocol.lr_factor(t, 10, 0.2) for t in (1, 2)] == [0.5, 1.0]
    assert protocol.lr_factor(3, 10, 0.2) == 1.0  # cosine starts at its peak
    # cosine over the 8 steps after warmup: step 7 is halfway, 0.5 (1 + cos(pi/2))
    assert protocol.lr_factor(7, 10, 0.2) == pytest.approx(0.5, abs=1e-15)
    assert 0 < protocol.lr_factor(10, 10, 0.2) < 0.05
    assert protocol.lr_factor(1, 10, 0.0) == 1.0


def test_holdout_splits_are_disjoint_halves_of_the_validation_data() -> None:
    plain, held = get_task("digits", hidden=8), get_task("digits", hidden=8, holdout=True)
    xv, xt = held.splits["val"][0], held.splits["test"][0]
    assert len(xv) + len(xt) == len(plain.x_val)
    assert torch_equal(torch_cat(xv, xt), plain.x_val)
    ev = held.evaluate(held.build_model(0))
    assert set(ev) == {"val_loss", "val_accuracy", "test_loss", "test_metric"}
    assert ev["val_loss"] != ev["test_loss"]


def torch_cat(a, b):
    import torch

    return torch.cat([a, b])


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


# ---------------------------------------------------------------------------------------------------
# selection on the validation split, reporting on the held-out split


def test_selection_uses_the_validation_split_and_the_report_the_held_out_split() -> None:
    runs, curves = _runs_and_curves()
    chosen = protocol.select(runs)
    assert set(chosen["trial"]) == {0}  # trial 0 wins on validation loss (it would lose on held-out)
    assert set(chosen["score"]) == {1.0}
    s = protocol_report.protocol_summary(curves, runs, b=200).set_index("config")
    # the reported loss is the held-out one of the final seeds (median 1.6), not their validation (1.0)
    assert s.loc["adamw", "final_test_loss"] == 1.6
    assert s.loc["adamw", "target"] == 1.7  # the largest AdamW final held-out loss
    # curves in held-out loss: AdamW reaches 1.7 at step 10 (median seed), Shampoo at step 5
    assert s.loc["adamw", "steps_to_target"] == 10 and s.loc["shampoo", "steps_to_target"] == 5
    assert s.loc["shampoo", "steps_ratio"] == 0.5
    assert s.loc["shampoo", "cpu_ratio"] == pytest.approx(1.0)  # twice the CPU per step, half the steps


def test_an_absent_peer_is_reported_absent() -> None:
    runs, curves = _runs_and_curves()
    peer = [{"task": "t", "config": "heavyball_soap", "optimizer": "peer", "phase": "tune", "trial": k, "seed": 0,
             "hparams": "{}", "failure": "Unavailable", "failure_message": "heavyball.SOAP is not installed",
             "final_val_loss": math.nan, "final_test_loss": math.nan} for k in range(2)]  # fmt: skip
    runs = pd.concat([runs, pd.DataFrame(peer)], ignore_index=True)
    s = protocol_report.protocol_summary(curves, runs, b=50).set_index("config")
    assert s.loc["heavyball_soap", "status"] == "absent"
    assert "not installed" in s.loc["heavyball_soap", "note"]
    assert "absent" in protocol_report.format_protocol_report(s.reset_index())


# ---------------------------------------------------------------------------------------------------
# bootstrap


def test_percentile_interval_is_the_order_statistics() -> None:
    stats = np.arange(1.0, 41.0)[::-1]  # B = 40: ceil(40 * 0.025) = 1st and ceil(40 * 0.975) = 39th smallest
    assert protocol_report.percentile_interval(stats) == (1.0, 39.0)
    assert protocol_report.percentile_interval(np.array([1.0, math.inf, 2.0] * 20))[1] == math.inf


def test_bootstrap_interval_of_a_mean_matches_the_exact_bootstrap_distribution() -> None:
    """Closed form: with n = 4 values the bootstrap distribution of the resampled mean is that of all
    4^4 equally likely resamples; its 2.5% and 97.5% quantiles are found by enumeration. With B = 40000
    replicates, the empirical CDF at a value is within 5 standard errors (5 sqrt(p(1-p)/B) <= 0.004 at
    p ~ 0.025) of the exact one, so the sampled interval equals the exact one wherever the exact CDF
    does not cross 0.025 (0.975) within that margin -- checked first."""
    x = np.array([0.0, 1.0, 3.0, 7.0])
    means = np.sort([np.mean(x[list(idx)]) for idx in itertools.product(range(4), repeat=4)])
    vals, counts = np.unique(means, return_counts=True)
    cdf = np.cumsum(counts) / counts.sum()
    margin = 5 * math.sqrt(0.025 * 0.975 / 40000)
    assert np.min(np.abs(cdf - 0.025)) > margin and np.min(np.abs(cdf - 0.975)) > margin
    exact = (vals[np.searchsorted(cdf, 0.025)], vals[np.searchsorted(cdf, 0.975)])
    reps = protocol_report.bootstrap([4], lambda i: float(np.mean(x[i])), b=40000)
    assert protocol_report.percentile_interval(reps) == exact
    # the same rng seed gives the same replicates
    assert np.array_equal(reps, protocol_report.bootstrap([4], lambda i: float(np.mean(x[i])), b=40000))


def test_identical_seeds_give_a_degenerate_ratio_interval() -> None:
    """Every seed of each optimizer has the same curve: every resample gives the point ratio."""
    runs, curves = _runs_and_curves()
    curves["test_loss"] = curves.groupby(["config", "step"])["test_loss"].transform("first")
    runs.loc[runs["phase"] == "final", "final_test_loss"] = 1.5
    s = protocol_report.protocol_summary(curves, runs, b=100).set_index("config")
    r = s.loc["shampoo"]
    assert r["steps_ratio_lo"] == r["steps_ratio"] == r["steps_ratio_hi"] == 0.5


def test_validate_full_is_the_protocol_at_full_scale() -> None:
    """The shipped full config: 8 trials for every tuned row, 3 fresh final seeds, long horizons."""
    from pathlib import Path

    grid = config.load_config(Path(__file__).resolve().parents[1] / "experiments/configs/validate_full.toml")
    assert grid.protocol is not None and grid.protocol.trials == 8 and len(grid.protocol.final_seeds) >= 3
    assert grid.protocol.default_trial  # trial 0: each optimizer's own default point
    steps = {t.name: t.steps for t in grid.tasks}
    assert steps["w1"] >= 1000 and steps["bytes_lm"] >= 1000
    tune = Counter((u.task.name, u.optimizer.label) for u in grid.units() if u.phase == "tune")
    assert set(tune.values()) == {8}
    labels = {label for _, label in tune}
    assert labels == {"adamw", "shampoo-eigh", "shampoo-auto", "soap-tuned", "heavyball_soap", "meta_shampoo"}


def test_an_absent_peer_package_is_a_typed_error_naming_the_install() -> None:
    from matroots.study.validation import peers

    def missing(name: str) -> None:
        raise ImportError(f"No module named {name!r}")

    for name in peers.PEERS:
        with pytest.raises(peers.PeerUnavailableError, match="not installed") as exc:
            peers.load(name, importer=missing)
        assert peers.PEERS[name].install.split()[0] in str(exc.value)


def test_each_task_and_optimizer_finishes_its_final_seeds_before_the_next_starts(
    tmp_path, monkeypatch
) -> None:
    """A long protocol run lands whole tasks one after another, and within a task whole optimizers in
    config order (tuning, selection, final seeds), so a run stopped midway already holds finished,
    reportable tasks and, in the task it stopped in, AdamW and the first optimizers whole. The runner is replaced by one that
    records the order units are handed to it and writes each a run row (validation loss = trial
    index, so trial 0 is chosen), so the order is observed without training anything."""
    from matroots.study import runner
    from matroots.study.validation import run

    order: list[tuple[str, str]] = []

    def fake_run_units(units, job_fn, out_dir, **kw):
        for u in units:
            if u.key in runner.done_units(out_dir):
                continue
            order.append((u.task.name, u.phase, u.optimizer.label))
            row = {"table": "run", "unit": u.key, "task": u.task.name, "optimizer": u.optimizer.name,
                   "config": u.optimizer.label, "phase": u.phase, "trial": u.trial, "seed": u.seed,
                   "hparams": str(u.hparams), "final_val_loss": float(u.trial), "failure": "",
                   "failure_message": ""}  # fmt: skip
            runner.atomic_write_parquet(pd.DataFrame([row]), runner.part_path(out_dir, u.key))
        return runner.RunStats(units=len(units), ran=len(units))

    monkeypatch.setattr(run.runner, "run_units", fake_run_units)
    monkeypatch.setattr(run, "check", lambda grid: None)  # the preflight trains a step of each config
    monkeypatch.setattr(run, "collect", lambda out, csv=False: {})  # the report wants real rows
    grid = _grid(tiny_protocol(trials=2, name="pertask", tasks=("lsq",)))
    run.run_validation(grid, tmp_path / "run", workers=1, progress=False)
    first_lsq = next(i for i, (task, *_) in enumerate(order) if task == "lsq")
    assert any(o[:2] == ("digits", "final") for o in order[:first_lsq])
    assert any(o[:2] == ("lsq", "final") for o in order)
    assert all(task == "lsq" for task, *_ in order[first_lsq:])
    labels = list(dict.fromkeys(u.optimizer.label for u in grid.units()))
    assert labels[0] == "adamw" and len(labels) == 4
    for task in ("digits", "lsq"):
        mine = [(phase, label) for t, phase, label in order if t == task]
        blocks = [label for i, (_, label) in enumerate(mine) if i == 0 or mine[i - 1][1] != label]
        assert blocks == labels, blocks  # one contiguous block per optimizer, in config order
        for label in ("adamw", "shampoo-eigh"):  # tuned: every trial before its first final seed
            phases = [phase for phase, lab in mine if lab == label]
            assert phases == sorted(phases, key=lambda p: p == "final") and phases[-1] == "final", phases
    assert len(order) == len(grid.units()) + len(
        grid.final_units(protocol.select(run.load(tmp_path / "run")["runs"]))
    )
