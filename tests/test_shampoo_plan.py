"""The typed plan between a group's engine and the sharding layer, and the block-wise state merge."""

from __future__ import annotations

import torch
from torch import nn

import shampoo
from shampoo.engine import GroupPlan
from shampoo.state import join_blocks, merge_shards, split_blocks


def _trained() -> tuple[nn.Module, shampoo.Shampoo]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))
    opt = shampoo.Shampoo(
        model.named_parameters(), lr=0.01, max_preconditioner_dim=4, precondition_frequency=2
    )
    X = torch.randn(16, 6)
    for _ in range(4):
        opt.zero_grad()
        model(X).square().mean().backward()
        opt.step()
    return model, opt


def test_plan_names_every_block_and_where_each_bucket_position_goes() -> None:
    model, opt = _trained()
    (eng,) = [e for e in opt._engines if e is not None]
    plan = eng.plan
    assert isinstance(plan, GroupPlan)
    params = list(model.parameters())
    want = [(i, b.spec) for i, p in enumerate(params) for b in opt.state[p].blocks]
    assert [(pb.param, pb.spec) for pb in plan.blocks] == want
    assert all(pb.owned for pb in plan.blocks)  # one process owns everything
    for bi, bucket in enumerate(eng.buckets):
        assert [pb.spec for pb in plan.buckets[bi]] == [b.spec for b in bucket.blocks]
    views = plan.direction_views(list(range(len(params))))
    for i, p in enumerate(params):
        assert views[i].data_ptr() == plan.directions[i].data_ptr()
        assert views[i].shape == opt.state[p].layout.merged_shape
        assert plan.directions[i].shape == p.shape


def test_split_join_round_trip_and_merge_of_block_shards() -> None:
    _, opt = _trained()
    state = opt.state_dict()["state"]
    for key, flat in state.items():
        entries, blocks = split_blocks(flat)
        assert "step" in entries and all(isinstance(i, int) for i in blocks)
        assert list(join_blocks(entries, blocks)) == list(flat)
        # two processes holding alternate blocks, each with the replicated entries
        shards = [join_blocks(entries, {i: b for i, b in blocks.items() if i % 2 == r}) for r in (1, 0)]
        merged = merge_shards(shards)
        assert list(merged) == list(flat), key  # the single-process form, in its order
        for name, v in flat.items():
            w = merged[name]
            assert torch.equal(v, w) if isinstance(v, torch.Tensor) else (v == w or v != v), (key, name)
