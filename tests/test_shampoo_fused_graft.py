"""Adam grafting in one pass (``ShampooImplementation(fused_adam=...)``): torch's fused Adam kernel on a zeroed
buffer with lr = -1 updates the first moment and v and writes the graft direction.

What must hold: the same optimizer to rounding as the separate passes (fp64 1e-12, fp32 1e-5) over
preconditioned and graft-only steps, with blocks of one bucket at different steps (a parameter that
skipped a step), the same state; and the fused kernel really runs where it applies and never where it
does not (no bias correction, beta1 = 0, another grafting method).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import shampoo


def _run(
    monkeypatch: pytest.MonkeyPatch, fused: bool, dtype: torch.dtype, steps: int = 8, skip: bool = False, **kw
) -> tuple[list[torch.Tensor], shampoo.Shampoo, int]:
    calls = {"n": 0}
    real = torch._fused_adam_

    def counting(*a: object, **k: object) -> object:
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(torch, "_fused_adam_", counting)
    g = torch.Generator().manual_seed(0)
    # two 24 x 20 weights share a bucket; the 20-vector is a diagonal block
    params = [torch.randn(24, 20, generator=g, dtype=dtype).requires_grad_() for _ in range(2)]
    params.append(torch.randn(20, generator=g, dtype=dtype).requires_grad_())
    opts = dict(lr=0.02, betas=(0.9, 0.99), weight_decay=0.01, precondition_frequency=2,
                start_preconditioning_step=3, factor_dtype=dtype, root_dtype=dtype)  # fmt: skip
    opts.update(kw)
    opt = shampoo.Shampoo(params, implementation=shampoo.ShampooImplementation(fused_adam=fused), **opts)
    for t in range(steps):
        for p in params:
            # gradients that do not depend on the parameters: both runs then accumulate bitwise the
            # same factors, so what differs is the grafting arithmetic alone (feeding the parameters
            # back would amplify its rounding by the roots' conditioning, ~1e12 for these rank-
            # deficient factors early on, and compare the roots' sensitivity instead)
            p.grad = torch.randn(p.shape, generator=g, dtype=dtype)
        if skip and t == 1:
            params[0].grad[0, 0] = float("nan")  # this parameter skips step 2: its blocks lag by one
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.step()
    return [p.detach().clone() for p in params], opt, calls["n"]


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_fused_graft_is_the_separate_passes_to_rounding(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, tol: float, skip: bool
) -> None:
    a, opt_a, calls_a = _run(monkeypatch, True, dtype, skip=skip)
    b, opt_b, calls_b = _run(monkeypatch, False, dtype, skip=skip)
    assert calls_a > 0 and calls_b == 0
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol)
    if skip:
        steps = [opt_a.state[p].step for p in opt_a.param_groups[0]["params"]]
        assert steps[0] == steps[1] - 1  # the bucket's blocks really were at different steps
    for pa, pb in zip(opt_a.param_groups[0]["params"], opt_b.param_groups[0]["params"], strict=True):
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        for ba, bb in zip(sa.blocks, sb.blocks, strict=True):
            torch.testing.assert_close(ba.first_moment, bb.first_moment, rtol=tol, atol=tol)
            torch.testing.assert_close(ba.graft_state, bb.graft_state, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "kw",
    [
        dict(use_bias_correction=False),
        dict(betas=(0.0, 0.99)),
        dict(grafting="rmsprop"),
        dict(grafting="adagrad"),
    ],
)
def test_fused_kernel_only_where_it_applies(monkeypatch: pytest.MonkeyPatch, kw: dict) -> None:
    a, _, calls = _run(monkeypatch, True, torch.float64, **kw)
    b, _, _ = _run(monkeypatch, False, torch.float64, **kw)
    assert calls == 0
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
