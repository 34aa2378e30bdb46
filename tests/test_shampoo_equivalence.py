"""Grafting alone (preconditioning never starts) reproduces torch.optim's optimizers."""

from __future__ import annotations

import pytest
import torch

import shampoo

STEPS = 6
NEVER = 10**9


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _run(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(16, 6, generator=g)
        y = torch.randn(16, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


CASES = {
    "sgd_momentum": (
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
        dict(
            lr=0.05,
            betas=(0.0, 1.0),
            momentum=0.9,
            weight_decay=0.01,
            decoupled_weight_decay=False,
            grafting="sgd",
        ),
    ),
    "sgd_nesterov": (
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
        dict(lr=0.05, betas=(0.0, 1.0), momentum=0.8, nesterov=True, grafting="sgd"),
    ),
    "adagrad": (
        lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-10),
        dict(lr=0.1, betas=(0.0, 1.0), grafting=shampoo.AdaGradGrafting(eps=1e-10)),
    ),
    "rmsprop": (
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.95, eps=1e-8),
        dict(lr=0.01, betas=(0.0, 1.0), grafting=shampoo.RMSpropGrafting(beta2=0.95, eps=1e-8)),
    ),
    "adam": (
        lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-8),
        dict(lr=0.01, betas=(0.9, 0.5), grafting=shampoo.AdamGrafting(beta2=0.99, eps=1e-8)),
    ),
    "adam_l2": (
        lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.1),
        dict(lr=0.01, betas=(0.9, 1.0), weight_decay=0.1, decoupled_weight_decay=False, grafting="adam"),
    ),
    "adamw": (
        lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.8, 0.999), weight_decay=0.1),
        dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.1, grafting="adam"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_grafting_alone_matches_torch(name: str) -> None:
    make_torch, kw = CASES[name]
    ref_model, model = _model(), _model()
    ref = _run(ref_model, make_torch(ref_model.parameters()))
    opt = shampoo.Shampoo(model.named_parameters(), start_preconditioning_step=NEVER, **kw)
    got = _run(model, opt)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-7)
    # The factors were accumulated even though no root was computed.
    assert opt.timing.roots_computed == 0
    assert all(not f.has_root for d in opt.diagnostics() for f in d.factors)
