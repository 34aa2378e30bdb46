"""Shampoo's own argument errors are typed like matroots' (issue 23, item 5): an
:class:`shampoo.InvalidShampooArgumentError`, a ValueError and a ``matroots.core.errors.InvalidArgumentError``,
whose one-line message names the argument, the value given and what is allowed; ``eps_mode`` is
checked against matroots' one ``EPS_MODES``; the implementation setting is validated the same way."""

from __future__ import annotations

import pytest
import torch

import shampoo
from matroots.core.errors import InvalidArgumentError
from matroots.core.options import EPS_MODES


def _make(**kw) -> shampoo.Shampoo:
    return shampoo.Shampoo([torch.nn.Parameter(torch.randn(4, 3))], **kw)


@pytest.mark.parametrize(
    ("kw", "name", "allowed"),
    [
        ({"eps": -1.0}, "eps", "a finite number >= 0"),
        ({"eps": float("nan")}, "eps", "a finite number >= 0"),
        ({"eps_mode": "relativ"}, "eps_mode", f"one of {EPS_MODES}"),
        ({"lr": -0.1}, "lr", "a finite number >= 0"),
        ({"betas": (0.9, 1.5)}, "betas[1] (factor EMA; 1.0 = sum)", "in [0, 1]"),
        ({"weight_decay": -1.0}, "weight_decay", "a finite number >= 0"),
        ({"nesterov": "yes"}, "nesterov", "True or False"),
        ({"vector_policy": "dense"}, "vector_policy", "one of"),
        ({"precondition_frequency": 0}, "precondition_frequency", "an int >= 1"),
        ({"start_preconditioning_step": 0}, "start_preconditioning_step", "an int >= 1"),
        ({"max_preconditioner_dim": 0}, "max_preconditioner_dim", "an int >= 1"),
        ({"distributed": "ddp"}, "distributed", "a shampoo.DDPConfig"),
        ({"diagnostics": {}}, "diagnostics", "a shampoo.DiagnosticsConfig"),
        ({"implementation": {"fused_adam": False}}, "implementation", "a shampoo.ShampooImplementation"),
    ],
)
def test_a_bad_argument_is_a_typed_error_naming_argument_value_and_what_is_allowed(kw, name, allowed) -> None:
    with pytest.raises(shampoo.InvalidShampooArgumentError) as info:
        _make(**kw)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, InvalidArgumentError)
    msg = str(err)
    assert "\n" not in msg and msg.startswith(f"{name} must be ") and allowed in msg
    assert f"got {err.value!r}" in msg


def test_eps_mode_is_matroots_own_list() -> None:
    from shampoo import config

    assert config.EPS_MODES is EPS_MODES
    for mode in EPS_MODES:
        _make(eps_mode=mode)


@pytest.mark.parametrize(
    ("kw", "name"),
    [({"fused_adam": 1}, "fused_adam"), ({"round_chunk_bytes": 0}, "round_chunk_bytes"),
     ({"round_chunk_bytes": True}, "round_chunk_bytes"), ({"trust_factors": None}, "trust_factors")],
)  # fmt: skip
def test_the_implementation_setting_is_validated(kw, name) -> None:
    with pytest.raises(shampoo.InvalidShampooArgumentError, match=f"^{name} must be "):
        shampoo.ShampooImplementation(**kw)


def test_the_implementation_setting_is_frozen_and_per_optimizer() -> None:
    import dataclasses

    off = shampoo.ShampooImplementation(fused_adam=False, round_chunk_bytes=None)
    a, b = _make(implementation=off), _make()
    assert a.implementation is off and b.implementation == shampoo.ShampooImplementation()
    with pytest.raises(dataclasses.FrozenInstanceError):
        off.fused_adam = True  # type: ignore[misc]
    assert shampoo.ShampooImplementation().chunk_rows(4 * 16 * 16) == 8 * 2**20 // (4 * 16 * 16)
    assert off.chunk_rows(4 * 16 * 16) is None


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: shampoo.AdamGrafting(beta2=1.0), "AdamGrafting.beta2"),
        (lambda: shampoo.AdaGradGrafting(eps=-1.0), "AdaGradGrafting.eps"),
        (lambda: shampoo.RMSpropGrafting(eps=float("inf")), "RMSpropGrafting.eps"),
    ],
)
def test_grafting_config_errors_are_typed(make, name) -> None:
    """The grafting configs share shampoo.checks with the group options: the same typed error."""
    with pytest.raises(shampoo.InvalidShampooArgumentError, match=f"^{name.replace('.', '[.]')} must be "):
        make()


@pytest.mark.parametrize("bad", [True, float("inf"), "1e-8", torch.ones(2)])
def test_eps_follows_matroots_rule_at_construction(bad) -> None:
    """eps is checked once, by matroots' own rule (the one every solve applies again): a bool, an
    infinite value, a string or a tensor of two elements is refused when the optimizer is built (a
    bool passed before and failed at the first root round)."""
    with pytest.raises(shampoo.InvalidShampooArgumentError, match=r"^eps must be a finite number >= 0"):
        _make(eps=bad)
    with pytest.raises(shampoo.InvalidShampooArgumentError, match=r"^AdamGrafting\.eps must be"):
        shampoo.AdamGrafting(eps=bad)


def test_numpy_and_0d_tensor_eps_are_accepted_as_matroots_accepts_them() -> None:
    """A numpy or 0-d torch scalar eps (refused before, though every solve accepts it) is the float."""
    import numpy as np

    W = torch.nn.Parameter(torch.randn(4, 3))
    opt = shampoo.Shampoo(
        [W], eps=np.float32(1e-6), diagonal_eps=torch.tensor(1e-8), precondition_frequency=1,
        start_preconditioning_step=1, grafting=shampoo.AdamGrafting(eps=np.float64(1e-8)),
    )  # fmt: skip
    from shampoo.config import GroupOptions

    opts = GroupOptions.from_group(opt.param_groups[0])
    assert type(opts.eps) is float and opts.eps == float(np.float32(1e-6))
    assert type(opts.diagonal_eps) is float and type(opts.grafting.eps) is float
    for _ in range(3):
        W.grad = torch.randn(4, 3)
        opt.step()
    assert all(f.has_root for f in opt.state[W].blocks[0].factors)
