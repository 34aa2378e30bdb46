"""Checkpoints written before the transform refactor (issue 14) load and resume after it.

``tests/data/shampoo_checkpoint_v1.pt`` was written by ``python tests/test_shampoo_legacy_checkpoint.py``
at commit 7786b86 (the per-kind ``BlockBucket`` code): a small model with Kronecker blocks (cut into
several blocks by ``max_preconditioner_dim=4``), a 3-D conv weight, diagonal and graft-only vectors,
two param groups (Adam grafting + heavy-ball momentum + eigh_warm bases; RMSprop grafting without a
first moment), 7 steps in. It holds the model weights, the optimizer state dict, and the parameters
that code reached after 4 further steps on fixed batches. The test loads the checkpoint into
today's optimizer, takes the same 4 steps and compares with what the old code computed.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import torch
from _refs import U, fwd_bound
from torch import nn

import shampoo

FIXTURE = Path(__file__).parent / "data" / "shampoo_checkpoint_v1.pt"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(3, 4, 2), nn.Flatten(), nn.Linear(4 * 5, 6), nn.Tanh(), nn.Linear(6, 2))


def _opt(model: nn.Module, shampoo_mod=shampoo) -> torch.optim.Optimizer:
    named = list(model.named_parameters())
    first = [(n, p) for n, p in named if not n.startswith("4.")]
    last = [(n, p) for n, p in named if n.startswith("4.")]
    return shampoo_mod.Shampoo(
        [
            {"params": first},
            {"params": last, "grafting": "rmsprop", "betas": (0.0, 0.99), "vector_policy": "graft"},
        ],
        lr=0.05,
        betas=(0.9, 0.99),
        eps=1e-8,
        momentum=0.5,
        max_preconditioner_dim=4,
        precondition_frequency=3,
        start_preconditioning_step=3,
        root_solver="eigh_warm",
    )


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 3, 6, generator=g), torch.randn(8, 2, generator=g)


def _step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    x, y = _batch(step)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def _write(shampoo_mod=shampoo) -> None:  # pragma: no cover - regenerates the fixture
    model = _model()
    opt = _opt(model, shampoo_mod)
    for t in range(7):
        _step(model, opt, t)
    saved = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optimizer": opt.state_dict()}
    for t in range(7, 11):
        _step(model, opt, t)
    saved["expected"] = {k: v.clone() for k, v in model.state_dict().items()}
    FIXTURE.parent.mkdir(exist_ok=True)
    torch.save(saved, FIXTURE)


def _resume_tolerance(opt: torch.optim.Optimizer) -> float:
    """Relative error bound of one step's update between two CPUs (the fixture's and this one).

    The step direction of a Kronecker block of order d <= 3 is G multiplied by d inverse roots R_j
    (n <= 4, fp32). On either CPU each R_j is within eps_j = fwd_bound(kappa_j, p_j, n, u) of the exact
    root (tests/_refs.py; kappa_j of the matrix solved, from the optimizer's diagnostics), so the two
    differ by <= 2 eps_j, and the d products add d n u. Grafting rescales the direction to the graft's
    norm, a ratio that carries that error once more (x 2), and the graft itself (Adam / RMSprop,
    elementwise) adds its norms' reductions, m u for m <= the largest parameter's size. Parameters that
    differ by this much change the next steps' gradients by as much again: x 2 over the 4 steps.
    """
    u = U["fp32"]
    eps = max(
        fwd_bound(f.kappa, float(Fraction(f.root_p)), f.n, u) for d in opt.diagnostics() for f in d.factors
    )
    d, n = 3, 4
    m = max(p.numel() for g in opt.param_groups for p in g["params"])
    return 2 * (2 * (d * 2 * eps + d * n * u) + m * u)


def test_v1_checkpoint_loads_and_resumes_as_the_old_code_did() -> None:
    """Today's 4 steps from the v1 state match the old code's, to the rounding of a step on another CPU:
    bitwise only holds on the machine that wrote the fixture (the same kernels on the same bits), so
    each parameter may differ by the update's relative error bound times the distance it moved."""
    saved = torch.load(FIXTURE, weights_only=True)
    model = _model()
    model.load_state_dict(saved["model"])
    opt = _opt(model)
    opt.load_state_dict(saved["optimizer"])
    moved = {k: 0.0 for k in saved["expected"]}
    for t in range(7, 11):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        _step(model, opt, t)
        for k, v in model.state_dict().items():
            moved[k] += float((v - before[k]).abs().max())  # >= every entry's |sum of the 4 updates|
    tol = _resume_tolerance(opt)
    assert tol < 1e-3  # the bound says something: well-conditioned small factors
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, saved["expected"][k], rtol=0, atol=tol * moved[k], msg=k)


def test_v1_checkpoint_round_trips_unchanged() -> None:
    """Loading the old state dict and saving it again gives the same entries (same format), but the
    factors' wall-clock ``seconds``, which moved to the diagnostics (issue 23: two state dicts of the
    same state compare equal)."""
    saved = torch.load(FIXTURE, weights_only=True)
    model = _model()
    model.load_state_dict(saved["model"])
    opt = _opt(model)
    opt.load_state_dict(saved["optimizer"])
    old, new = saved["optimizer"]["state"], opt.state_dict()["state"]
    assert old.keys() == new.keys()
    for key in old:
        kept = {name for name in old[key] if not name.endswith(".seconds")}
        assert kept == new[key].keys(), key
        for name, v in old[key].items():
            if name not in kept:
                continue
            w = new[key][name]
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, w), (key, name)
            elif v == v:  # NaN bookkeeping compares unequal to itself
                assert v == w, (key, name)


if __name__ == "__main__":  # pragma: no cover
    _write()
