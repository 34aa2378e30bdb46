"""Every registered root solver trains real small models end to end, at the README's settings and at
both eps conventions, in fp32 and fp64 factors/roots: no exception, no NaN/Inf, the loss goes down,
failure counts are reported (and zero: rank-deficient factors are a policy, not a failure).

Models: an MLP on scikit-learn's bundled digits, a byte-level transformer LM on Python standard-library
source text, and an MLP with a 1-wide output layer (its factors stay rank one). The LM is 8 wide: its
factors are 8 to 256 (the 256-byte embedding and head; the attention and feed-forward weights merged into
vectors of 128-256 by the default blocking, whose factors have rank <= steps), rank-deficient, with kappa
up to ~1e11 at eps 1e-12; at width 16 the merged factors were 512-768 and one fp64 newton_schulz case
cost 31 CPU-s instead of 7 (the suite's largest). Full-batch on fixed
data, so "the loss goes down" is deterministic. Plus the acceptance check the project runs before every
stop (20-64-2 MLP, eps=1e-12, 60 steps).
"""

from __future__ import annotations

import inspect
import textwrap
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import matroots
import shampoo

SOLVERS = [s for s in matroots.solvers.available() if s != "auto"]


def digits_task() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X[:256] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[:256], dtype=torch.long)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))
    return model, lambda m: nn.functional.cross_entropy(m(X), y)


class TinyByteLM(nn.Module):
    def __init__(self, d: int = 8, seq: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.layer = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, 256)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos
        return self.head(self.layer(h, src_mask=self.mask, is_causal=True))


def bytelm_task() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    text = torch.tensor(list(inspect.getsource(textwrap).encode()), dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, text.numel() - 17, (24, 1), generator=g)
    w = text[starts + torch.arange(17)]
    x, y = w[:, :-1], w[:, 1:]
    torch.manual_seed(0)
    model = TinyByteLM()
    return model, lambda m: nn.functional.cross_entropy(m(x).reshape(-1, 256), y.reshape(-1))


def wide1_task() -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(128, 8, generator=g)
    y = torch.sin(X[:, :1]) + 0.5 * X[:, 1:2]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, lambda m: nn.functional.mse_loss(m(X), y)


TASKS = {"digits": (digits_task, 3e-3), "bytelm": (bytelm_task, 3e-3), "wide1": (wide1_task, 3e-3)}
CONFIGS = {
    "fp32_abs1e-12": dict(
        eps=1e-12, eps_mode="absolute", factor_dtype=torch.float32, root_dtype=torch.float32
    ),
    "fp32_rel1e-6": dict(eps=1e-6, eps_mode="relative", factor_dtype=torch.float32, root_dtype=torch.float32),
    "fp64_abs1e-12": dict(
        eps=1e-12, eps_mode="absolute", factor_dtype=torch.float64, root_dtype=torch.float64
    ),
    "fp64_rel1e-6": dict(eps=1e-6, eps_mode="relative", factor_dtype=torch.float64, root_dtype=torch.float64),
}


def train(task: str, solver: str, config: str) -> tuple[list[float], shampoo.Shampoo, nn.Module]:
    build, lr = TASKS[task]
    model, loss_fn = build()
    if config == "readme":  # the README's Shampoo snippet, verbatim but for the solver and lr
        steps = 120
        opt = shampoo.Shampoo(
            model.named_parameters(),
            lr=lr,
            betas=(0.9, 0.999),
            eps=1e-12,
            max_preconditioner_dim=1024,
            precondition_frequency=100,
            start_preconditioning_step=100,
            grafting=shampoo.AdamGrafting(),
            root_solver=solver,
        )
    else:
        steps = 100
        opt = shampoo.Shampoo(
            model.named_parameters(),
            lr=lr,
            precondition_frequency=20,  # 5 root rounds (and warm starts) in 100 steps
            start_preconditioning_step=20,
            root_solver=solver,
            **CONFIGS[config],
        )
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, opt, model


@pytest.mark.parametrize("config", [*CONFIGS, "readme"])
@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("task", list(TASKS))
def test_every_solver_trains_real_models(task: str, solver: str, config: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", shampoo.RootFailureWarning)  # no round may fail
        warnings.simplefilter("error", matroots.ConvergenceWarning)
        losses, opt, model = train(task, solver, config)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses[::10]
    df = opt.diagnostics_frame().dropna(subset=["n"])
    assert len(df) and {"failures", "primary_failures", "fallback_uses", "regularisation"} <= set(df)
    assert int(df["failures"].sum()) == 0 and int(df["primary_failures"].sum()) == 0
    assert (df["solver"] == solver).all()
    assert df["kappa"].map(lambda k: 1.0 <= k < float("inf")).all()  # kappa of the matrix solved
    assert (df["regularisation"] > 0).all()
    assert all(st.skipped_steps == 0 for st in opt.state.values())


@pytest.mark.parametrize("solver", SOLVERS)
def test_acceptance_check(solver: str) -> None:
    """The project's stop check, verbatim."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 2))
    x = torch.randn(256, 20)
    y = (x[:, 0] > 0).long()
    o = shampoo.Shampoo(
        m.named_parameters(),
        lr=1e-3,
        eps=1e-12,
        precondition_frequency=10,
        start_preconditioning_step=10,
        grafting="adam",
        root_solver=solver,
    )
    for _ in range(60):
        o.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        o.step()
    assert all(torch.isfinite(p).all() for p in m.parameters())
    df = o.diagnostics_frame().dropna(subset=["n"])
    assert int(df["primary_failures"].sum()) == 0  # the rank-2 factor is shifted, not failed


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_parameter_models_lower_their_loss(dtype: torch.dtype) -> None:
    """fp16/bf16 parameters with the default Adam grafting: state kept in float32, no skipped step."""
    model, loss_fn = digits_task()
    model = model.to(dtype)
    opt = shampoo.Shampoo(model.named_parameters(), lr=3e-3, precondition_frequency=10)
    losses = []
    for _ in range(60):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(lambda x: model(x.to(dtype)).float())
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    assert all(st.skipped_steps == 0 for st in opt.state.values())
    assert all(p.dtype == dtype for p in model.parameters())
    for st in opt.state.values():
        for b in st.blocks:
            assert b.graft_state is None or b.graft_state.dtype == torch.float32
            assert all(f.root.dtype == torch.float32 for f in b.factors)
