"""The per-step work of Shampoo on a newcomer's small model (issue 29 item 7), counted in dispatched
torch operations, host reads and option validations, never timed (counts are the same on every
machine). On the 20-64-2 MLP each small operation costs microseconds of dispatch, more than its
arithmetic, so the count is the step's cost: 224 operations per step, among them 4 reads of one
value (one per bucket), before the direction finiteness took one read for the whole step, the
gradients' finiteness no isfinite kernels, the gather and the single-block scatter no views, the
step and fill tensors were shared, -lr s_j was rounded once and the options were validated once
(``experiments/profile_mlp_step.py``; 102 now)."""

from __future__ import annotations

import pytest
import torch
from _opcount import OpCount
from torch import nn

import shampoo
from shampoo.config import GroupOptions


def _mlp(**kw):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 2))
    opt = shampoo.Shampoo(model.parameters(), lr=1e-3, **kw)
    g = torch.Generator().manual_seed(1)

    def grad() -> None:
        opt.zero_grad()
        (model(torch.randn(64, 20, generator=g)) - torch.randn(64, 2, generator=g)).square().mean().backward()

    return opt, grad


@pytest.mark.parametrize("root_solver", ["eigh", "auto"])
def test_a_small_models_step_dispatches_few_operations(root_solver: str) -> None:
    """A step between root rounds (past the first, at step 100): at most 110 operations and one
    host read (the directions' finiteness proof), whichever root solver."""
    opt, grad = _mlp(root_solver=root_solver)
    for _ in range(150):
        grad()
        opt.step()
    grad()
    with OpCount() as count:
        opt.step()
    assert opt.diagnostics()[0].factors[0].solver  # the roots were computed at step 100
    assert count.ops["aten._local_scalar_dense.default"] <= 1, count.ops.most_common()
    assert sum(count.ops.values()) <= 110, count.ops.most_common()


def test_options_are_validated_once_while_the_group_stays_the_same(monkeypatch) -> None:
    """The group's options are built when it changes (its first step, an edit), not every step;
    an LR scheduler's new lr is checked alone; a bad value is still refused at the next step."""
    built = []
    post = GroupOptions.__post_init__
    monkeypatch.setattr(GroupOptions, "__post_init__", lambda self: built.append(1) or post(self))
    opt, grad = _mlp()

    def step() -> None:
        grad()
        opt.step()

    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    built.clear()  # the constructor's
    for _ in range(5):
        step()
        sched.step()
    assert len(built) == 1  # the first step's; the four new lrs were checked alone
    assert opt._options[0].get(opt.param_groups[0]).lr == opt.param_groups[0]["lr"] == 1e-3 / 32
    opt.param_groups[0]["eps"] = 1e-6
    step()
    assert len(built) == 2
    assert opt._options[0].get(opt.param_groups[0]).eps == 1e-6
    for key, bad in (("lr", -1.0), ("eps", -1.0)):
        good, opt.param_groups[0][key] = opt.param_groups[0][key], bad
        with pytest.raises(shampoo.InvalidShampooArgumentError, match=key):
            step()
        opt.param_groups[0][key] = good


def test_a_value_that_changes_in_place_is_validated_every_step() -> None:
    """A list (or a tensor) can change without becoming another object: such a group is not
    cached, so an edit in place is seen (here: betas as a list, then a bad beta2 in it)."""
    opt, grad = _mlp()

    def step() -> None:
        grad()
        opt.step()

    opt.param_groups[0]["betas"] = [0.9, 0.999]
    step()
    opt.param_groups[0]["betas"][1] = 1.5
    with pytest.raises(shampoo.InvalidShampooArgumentError, match="betas"):
        step()
