"""One second-moment rule (shampoo.transforms.moments.SecondMoment) for the Adam, RMSprop and AdaGrad
grafting, the diagonal preconditioner and SOAP's rotated second moment.

The four users run the same code on the same tensors, so their directions agree bitwise by
construction (on every CPU); the accuracy is judged against the formula evaluated in float64.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from shampoo.grafting import AdaGradGraft, AdamGraft, GraftState, RMSpropGraft
from shampoo.transforms import SOAP, Diagonal, Stack, StepContext
from shampoo.transforms.moments import SecondMoment

B2, EPS = 0.99, 1e-3


def _ctx(steps: list[int], bias_correction: bool = True) -> StepContext:
    opts = SimpleNamespace(use_bias_correction=bias_correction, beta2=B2)
    return StepContext(opts, steps, None, torch.device("cpu"))  # type: ignore[arg-type]


def _data(b: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    v = torch.rand(b, 4, 5, generator=g) * 1e-2
    m = torch.randn(b, 4, 5, generator=g)
    return v, m


def _soap(v: torch.Tensor, m: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, object]:
    soap = SOAP(basis_update="identity", eps=EPS)  # Q = I: Adam on the block itself
    stack = Stack(v.shape[0], tuple(v.shape[1:]), (None, None), v.dtype, v.device, v.dtype)
    state = soap.init(stack)
    state.v.copy_(v)
    return soap.direction(state, m, ctx)


def _same(a: tuple[torch.Tensor, object], b: tuple[torch.Tensor, object]) -> None:
    assert torch.equal(a[0], b[0])
    sa, sb = a[1], b[1]
    if isinstance(sa, torch.Tensor) or isinstance(sb, torch.Tensor):
        assert isinstance(sa, torch.Tensor) and isinstance(sb, torch.Tensor)
        assert sa.dtype == sb.dtype and torch.equal(sa, sb)
    else:
        assert sa == sb


@pytest.mark.parametrize("steps", [[7, 7, 7], [3, 7, 40]])  # per-block steps: a (b,) scale
def test_adam_grafting_diagonal_and_soap_share_one_direction(steps: list[int]) -> None:
    v, m = _data()
    ctx = _ctx(steps)
    adam = AdamGraft(eps=EPS, beta2=B2).direction(GraftState(v.clone()), m, ctx)
    diag = Diagonal(beta2=B2, eps=EPS).direction(SimpleNamespace(u=v.clone()), m, ctx)  # type: ignore[arg-type]
    _same(adam, diag)
    _same(adam, _soap(v, m, ctx))
    # against the formula in float64: 5 roundings of at most u/2 each (sqrt, sqrt(c) to fp32,
    # eps sqrt(c), the sum of two positive terms, the quotient), no cancellation: within 4 u
    D, s = adam
    c = torch.tensor([1.0 - B2**t for t in steps], dtype=torch.float64).view(-1, 1, 1)
    ref = m.double() / ((v.double() / c).sqrt() + EPS)
    got = D.double() * (s.view(-1, 1, 1) if isinstance(s, torch.Tensor) else s)
    u = torch.finfo(torch.float32).eps / 2
    assert bool(((got - ref).abs() <= 4 * u * ref.abs()).all())


def test_rmsprop_and_adagrad_grafting_are_the_rule_without_bias_correction() -> None:
    v, m = _data()
    ctx = _ctx([3, 7, 40])
    rms = RMSpropGraft(eps=EPS, beta2=B2).direction(GraftState(v.clone()), m, ctx)
    _same(rms, Diagonal(beta2=B2, eps=EPS, use_bias_correction=False).direction(SimpleNamespace(u=v), m, ctx))  # type: ignore[arg-type]
    ada = AdaGradGraft(eps=EPS).direction(GraftState(v.clone()), m, ctx)
    _same(ada, Diagonal(beta2=1.0, eps=EPS).direction(SimpleNamespace(u=v), m, ctx))  # type: ignore[arg-type]
    assert ada[1] == 1.0 and rms[1] == 1.0
    # Adam without the group's bias correction is RMSprop
    _same(AdamGraft(eps=EPS, beta2=B2).direction(GraftState(v.clone()), m, _ctx([3, 7, 40], False)), rms)


@pytest.mark.parametrize("beta2", [1.0, 0.9])
def test_the_update_is_the_ema_or_the_sum_of_squares(beta2: float) -> None:
    v, G = _data()
    out = v.clone()
    SecondMoment(beta2, EPS).update(out, G)
    ref = v.double() + G.double() ** 2 if beta2 == 1.0 else beta2 * v.double() + (1 - beta2) * G.double() ** 2
    # at most three roundings of u/2 each (G^2, (1 - beta2) G^2 or beta2 v, the sum of positive terms)
    assert bool(((out.double() - ref).abs() <= 2 * torch.finfo(torch.float32).eps * ref).all())
