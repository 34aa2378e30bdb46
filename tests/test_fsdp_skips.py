"""Non-finite gradients and directions under FSDP2 (2 gloo ranks): one verdict for all shards.

A NaN in one rank's shard of a gradient (or a non-finite direction on one rank) skips the whole
parameter on every rank (``FSDPConfig.consistent_skips``, the default), so the run equals one
process with the same blocking (``row_shards=2``) where the whole parameter's gradient holds the NaN;
both ranks count the same steps and skips. With ``consistent_skips=False`` each rank skips its own
shard only, and the step counts of the shards differ (the documented drift).

Tolerance 1e-6 after 20 steps, as tests/test_fsdp.py (same kernels and data, blocks stacked per
rank, ~1e-7 relative in fp32).
"""

from __future__ import annotations

import pytest
import torch
from _dist import run_ranks
from test_fsdp import STEPS, _data, _full, _model, _opt, _shard
from torch import nn

from shampoo.fsdp import FSDPConfig

NAN_GRAD_STEP = 5  # rank 1's shard of "0.weight" gets a NaN gradient entry
BAD_DIR_STEP = 8  # rank 0 sees a non-finite direction of "2.weight"
BAD_PARAM = 2  # "2.weight": its position in the group


def _run(model: nn.Module, opt, rank: int | None, bad_direction: bool = True) -> None:
    """20 steps with the two injected faults (the second with ``bad_direction``); ``rank`` None:
    one process (the whole parameter)."""
    X, Y = _data()
    for t in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(X[t]), Y[t]).backward()
        if t == NAN_GRAD_STEP and rank in (None, 1):
            g = model[0].weight.grad
            (g.to_local() if hasattr(g, "to_local") else g)[-1, 0] = float("nan")
        eng = opt._engines[0]
        if bad_direction and t == BAD_DIR_STEP and rank in (None, 0):
            orig = eng.finite_directions

            def fake(idx, *a, orig=orig, **kw):
                return [ok and i != BAD_PARAM for i, ok in zip(idx, orig(idx, *a, **kw), strict=True)]

            eng.finite_directions = fake
        opt.step()
        if eng is not None:
            eng.__dict__.pop("finite_directions", None)


def _counts(opt) -> dict[str, tuple[int, int]]:
    return {st.key: (st.step, st.skipped_steps) for st in opt._engines[0].states}


def _ranks(rank: int, ws: int) -> dict:
    out = {}
    for consistent in (True, False):
        model = _shard(_model())
        opt = _opt(model.named_parameters(), "eigh", FSDPConfig(timeout=30, consistent_skips=consistent))
        with pytest.warns(Warning):
            _run(model, opt, rank)
        out[consistent] = {"params": _full(model), "counts": _counts(opt)}
    return out


def test_non_finite_shard_skips_the_parameter_on_every_rank():
    r0, r1 = run_ranks(_ranks, 2, timeout=120, pg_timeout=60)
    model = _model()
    opt = _opt(model.named_parameters(), "eigh", row_shards=2)
    with pytest.warns(Warning):
        _run(model, opt, None)
    ref, ref_counts = _full(model), _counts(opt)
    assert ref_counts["0.weight"] == (STEPS - 1, 1) and ref_counts["2.weight"] == (STEPS, 1)
    for r in (r0, r1):
        assert r[True]["counts"] == ref_counts, r[True]["counts"]
    for k, v in r0[True]["params"].items():
        torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6, msg=k)
    # per-rank skips: each shard counts its own, and the parameters leave the one-process run
    assert r1[False]["counts"]["0.weight"] == (STEPS - 1, 1)
    assert r0[False]["counts"]["0.weight"] == (STEPS, 0)
    assert r0[False]["counts"]["2.weight"] == (STEPS, 1) and r1[False]["counts"]["2.weight"] == (STEPS, 0)
    assert not torch.allclose(r0[False]["params"]["0.weight"], ref["0.weight"], rtol=1e-6, atol=1e-6)
