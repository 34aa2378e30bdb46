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
        ({"root_solver": 3}, "root_solver", "a matroots solver name or config"),
        ({"grafting": 3}, "grafting", "or a GraftingConfig"),
        ({"failure": "strict"}, "failure", "a FailurePolicy"),
        ({"betas": (0.9,)}, "betas", "a pair (beta1, beta2)"),
        ({"betas": ("a", 0.9)}, "betas", "a pair (beta1, beta2) of numbers in [0, 1)"),
        ({"betas": (0.9, 0.0)}, "betas[1]", "> 0"),
        ({"lr": "1e-3"}, "lr", "a finite number >= 0"),
        ({"psd": "clip"}, "psd", "(see matroots.core.psd) or None"),
        ({"nesterov": True}, "nesterov", "False when momentum is 0"),
        ({"row_shards": 0}, "row_shards", "None (as the parameters are sharded) or an int >= 1"),
        ({"statistics_frequency": 0}, "statistics_frequency", "an int >= 1"),
        ({"statistics_dtype": torch.float16}, "statistics_dtype", "None (G G^T in factor_dtype) or"),
        ({"statistics_dtype": "int8"}, "statistics_dtype", "None or torch.bfloat16"),
        ({"preconditioner": 3}, "preconditioner", "a per-block transform"),
        ({"exponent_override": [0.25]}, "exponent_override", "a mapping order -> exponent(s)"),
        ({"exponent_override": {2: -1.0}}, "exponent_override exponent", "finite and >= 0"),
        ({"exponent_override": {2: {5: 0.25}}}, "exponent_override dim (order 2)", "an int in [0, 2)"),
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


@pytest.mark.parametrize(
    ("make", "name", "allowed"),
    [
        (lambda: shampoo.FailurePolicy(max_consecutive_failures=0), "max_consecutive_failures", "an int >= 1"),
        (lambda: shampoo.FailurePolicy(max_consecutive_primary_failures=0), "max_consecutive_primary_failures", "None or"),
        (lambda: shampoo.DiagnosticsConfig(dump_every=-1), "dump_every", "an int >= 0"),
        (lambda: shampoo.DiagnosticsConfig(dump_every=2), "dump_dir", "a directory when dump_every > 0"),
        (lambda: shampoo.DiagnosticsConfig(kappa_power_iters=0), "kappa_power_iters", ">= 1"),
        (lambda: shampoo.DDPConfig(communication_dtype="fp8"), "communication_dtype", "one of fp32/bf16/fp16"),
        (lambda: shampoo.DDPConfig(communication_dtype=torch.int8), "communication_dtype", "torch.float32/bfloat16/float16"),
        (lambda: shampoo.DDPConfig(cost_model="flops"), "cost_model", "one of"),
        (lambda: shampoo.DDPConfig(process_group=3), "process_group", "a torch.distributed.ProcessGroup or None"),
        (lambda: shampoo.DDPConfig(timeout="10m"), "timeout", "a datetime.timedelta or seconds"),
        (lambda: shampoo.DDPConfig(timeout=-1.0), "timeout", "positive"),
        (lambda: shampoo.FSDPConfig(strategy="gather"), "strategy", "one of"),
        (lambda: shampoo.FSDPConfig(status_check=1), "status_check", "True or False"),
    ],
)  # fmt: skip
def test_config_object_errors_are_typed(make, name, allowed) -> None:
    """The configs passed to Shampoo (failure, diagnostics, distributed) refuse a bad field with the
    same typed error as Shampoo's own arguments: the field, the value and what is allowed."""
    with pytest.raises(shampoo.InvalidShampooArgumentError) as info:
        make()
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, InvalidArgumentError)
    msg = str(err)
    assert "\n" not in msg and msg.startswith(f"{name} must be ") and allowed in msg
    assert err.name == name and f"got {err.value!r}" in msg


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
