"""Block -> rank assignment (greedy LPT) and DDPConfig validation. No processes are spawned here."""

from __future__ import annotations

import datetime
import random

import pytest
import torch
from torch import nn

from shampoo.blocking import layout_param
from shampoo.distributed import (
    DDPConfig,
    DistributedError,
    assign_blocks,
    block_cost,
    lpt_assign,
)


def w1_model() -> nn.Module:
    """Workload W1 (docs/design.md §8): 4-layer encoder, d_model 256, 4 heads, ff 1024, vocab 512."""
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, batch_first=True)
    return nn.ModuleDict(
        {
            "embed": nn.Embedding(512, 256),
            "encoder": nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
            "head": nn.Linear(256, 512),
        }
    )


def w1_specs(vector_policy: str = "diagonal"):
    params = list(w1_model().parameters())
    specs = []
    for i, p in enumerate(params):
        lay = layout_param(i, tuple(p.shape), max_preconditioner_dim=256, vector_policy=vector_policy)
        specs.extend(lay.blocks)
    return specs


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("cost_model", ["roots", "memory"])
def test_w1_assignment_is_balanced(world_size, cost_model):
    specs = w1_specs()
    a = assign_blocks(specs, world_size, cost_model)
    assert set(a.owners.values()) == set(range(world_size))
    assert len(a.owners) == len(specs)
    assert a.imbalance <= 1.1, (a.loads, a.imbalance)
    # Every rank owns some of the 256x256 Shampoo blocks (the expensive ones).
    for r in range(world_size):
        assert any(s.kind.value == "shampoo" and a.owner(s) == r for s in specs)


def test_assignment_is_deterministic_and_order_independent():
    specs = w1_specs()
    a = assign_blocks(specs, 3)
    shuffled = list(specs)
    random.Random(0).shuffle(shuffled)
    b = assign_blocks(shuffled, 3)
    assert a.owners == b.owners and a.loads == b.loads
    # Keys per rank come back in canonical order.
    for r in range(3):
        assert a.owned_by(r) == sorted(a.owned_by(r))


def test_lpt_basic_properties():
    assert lpt_assign([], 3) == ()
    assert lpt_assign([5.0], 4) == (0,)
    # Graham's example: the optimum is 3+3 / 2+2+2 (makespan 6); LPT gives 3+2+2 / 3+2 (makespan 7),
    # within its 4/3 - 1/(3m) bound.
    owners = lpt_assign([3, 3, 2, 2, 2], 2)
    loads = [sum(c for c, r in zip([3, 3, 2, 2, 2], owners, strict=True) if r == k) for k in range(2)]
    assert loads == [7, 5]
    assert max(loads) <= (4 / 3 - 1 / 6) * 6 + 1e-9
    # Equal costs are dealt round robin, ties going to the lowest rank.
    assert lpt_assign([1.0] * 5, 2) == (0, 1, 0, 1, 0)
    with pytest.raises(ValueError, match="world_size"):
        lpt_assign([1.0], 0)


def test_block_cost_models():
    (spec,) = layout_param(0, (200, 30), max_preconditioner_dim=256).blocks
    assert block_cost(spec, "roots") == 200**3 + 30**3 + 6000
    assert block_cost(spec, "memory") == 200**2 + 30**2 + 6000
    (vec,) = layout_param(1, (77,), max_preconditioner_dim=256).blocks
    assert block_cost(vec, "roots") == 77
    with pytest.raises(ValueError, match="cost_model"):
        block_cost(spec, "flops")


def test_ddp_config_validation():
    c = DDPConfig(communication_dtype="bf16", cost_model="memory", timeout=30)
    assert c.communication_dtype is torch.bfloat16
    assert c.timeout == datetime.timedelta(seconds=30)
    assert DDPConfig().communication_dtype is torch.float32
    with pytest.raises(TypeError):
        DDPConfig(torch.float16)  # keyword-only
    with pytest.raises(ValueError, match="communication_dtype"):
        DDPConfig(communication_dtype=torch.float64)
    with pytest.raises(ValueError, match="communication_dtype"):
        DDPConfig(communication_dtype="int8")
    with pytest.raises(ValueError, match="cost_model"):
        DDPConfig(cost_model="n^3")
    with pytest.raises(ValueError, match="timeout"):
        DDPConfig(timeout=0)
    with pytest.raises(ValueError, match="process_group"):
        DDPConfig(process_group="world")
    with pytest.raises(DistributedError, match="init_process_group"):
        DDPConfig().world()


def test_incremental_assignment_keeps_existing_owners():
    """Blocks of a param group added after the first step are spread on top of the existing loads."""
    specs = w1_specs()
    first, later = specs[:40], specs[40:]
    a = assign_blocks(first, 2)
    b = assign_blocks(specs, 2, previous=a)
    assert all(b.owners[k] == r for k, r in a.owners.items())
    assert len(b.owners) == len(specs)
    assert b.imbalance <= 1.1
    with pytest.raises(ValueError, match="previous assignment"):
        assign_blocks(later, 3, previous=a)
