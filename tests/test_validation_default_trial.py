"""``[protocol] default_trial = true``: trial 0 of every tuned optimizer is its own default point
(matroots.study.validation.protocol.DEFAULT_POINTS, or the entry's ``default`` table), trials 1..T-1 the
first T-1 Sobol points; every optimizer still gets the same number of trials. The default points are
checked against the constructors' own defaults where those are installed."""

from __future__ import annotations

import inspect
import tomllib
from collections import Counter

import pytest
import torch
from _tiny_validation import tiny_protocol

import shampoo
from matroots.core.errors import InvalidArgumentError
from matroots.study.validation import config, protocol


def _grid(text: str) -> config.ValidationGrid:
    return config.from_dict(tomllib.loads(text))


def _with_default_trial(text: str) -> str:
    return text.replace("[protocol]\n", "[protocol]\ndefault_trial = true\n", 1)


def test_trial_zero_is_each_optimizers_default_and_the_rest_the_shared_sobol_points() -> None:
    trials = 4
    plain = _grid(tiny_protocol(trials=trials))
    grid = _grid(_with_default_trial(tiny_protocol(trials=trials)))
    tune = [u for u in grid.units() if u.phase == "tune"]
    counts = Counter(u.optimizer.label for u in tune)
    assert set(counts.values()) == {trials}  # the same number of trials for every tuned optimizer
    by = {(u.optimizer.label, u.trial): u.hparams for u in tune}
    old = {(u.optimizer.label, u.trial): u.hparams for u in plain.units() if u.phase == "tune"}
    expected0 = {
        "adamw": protocol.DEFAULT_POINTS["adamw"],
        # the tiny entry samples frequency only from [5]: the default keeps its own 100 (not in the space)
        "shampoo-eigh": protocol.DEFAULT_POINTS["shampoo"],
        "heavyball_soap": protocol.DEFAULT_POINTS["heavyball_soap"],
    }
    for label, point in expected0.items():
        assert by[(label, 0)] == point, label
        for k in range(1, trials):  # common random numbers: trial k is the plain protocol's trial k - 1
            assert by[(label, k)] == old[(label, k - 1)], (label, k)
    lrs = {u.optimizer.label: u.lr for u in tune if u.trial == 0}
    assert lrs == {"adamw": 1e-3, "shampoo-eigh": 1e-3, "heavyball_soap": 3e-3}


def test_an_entry_default_table_and_fixed_dimensions_shape_trial_zero() -> None:
    text = _with_default_trial(tiny_protocol(trials=2)).replace(
        'root_solver = "eigh"\n',
        'root_solver = "eigh"\ndefault = { lr = 3e-3, grafting = "rmsprop" }\n'
        "fixed = { weight_decay = 1e-4 }\n",
        1,
    )
    hp = {u.trial: u.hparams for u in _grid(text).units() if u.optimizer.label == "shampoo-eigh"}
    assert hp[0] == {
        **protocol.DEFAULT_POINTS["shampoo"],
        "lr": 3e-3,
        "grafting": "rmsprop",
        "weight_decay": 1e-4,
    }
    assert hp[1]["weight_decay"] == 1e-4  # fixed applies to every trial


@pytest.mark.parametrize(
    ("edit", "fragment"),
    (
        (("[protocol]\n", "[protocol]\ndefault_trial = 1\n"), "default_trial must be true or false"),
        (
            ('root_solver = "eigh"\n', 'root_solver = "eigh"\ndefault = { momentum = 0.9 }\n'),
            ".default must be",
        ),
    ),
)
def test_bad_default_trial_settings_are_typed_errors(edit: tuple[str, str], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment.replace(".", r"\.")):
        _grid(tiny_protocol(trials=2).replace(*edit, 1))


def _defaults(cls) -> dict:
    return {k: v.default for k, v in inspect.signature(cls).parameters.items()}


def _check(point: dict, d: dict, freq_key: str = "precondition_frequency") -> None:
    assert point["lr"] == d["lr"]
    assert point["beta2"] == d["betas"][1]
    assert point["weight_decay"] == d["weight_decay"]
    if freq_key in d:
        assert point["precondition_frequency"] == d[freq_key]


def test_default_points_are_the_constructors_defaults() -> None:
    _check(protocol.DEFAULT_POINTS["adamw"], _defaults(torch.optim.AdamW))
    d = _defaults(shampoo.Shampoo)
    _check(protocol.DEFAULT_POINTS["shampoo"], d)
    assert protocol.DEFAULT_POINTS["shampoo"]["grafting"] == d["grafting"]
    assert all(p["warmup_fraction"] == 0.0 for p in protocol.DEFAULT_POINTS.values())


def test_peer_default_points_are_their_constructors_defaults() -> None:
    heavyball = pytest.importorskip("heavyball")
    _check(protocol.DEFAULT_POINTS["heavyball_soap"], _defaults(heavyball.SOAP))


def test_meta_default_point_is_its_constructors_defaults() -> None:
    ds = pytest.importorskip("distributed_shampoo")
    _check(protocol.DEFAULT_POINTS["meta_shampoo"], _defaults(ds.DistributedShampoo))
