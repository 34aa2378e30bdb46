"""A plain ``pickle`` round trip of :class:`shampoo.Shampoo` whose buckets stack several blocks.

Each block's state is a view into its bucket's stacked storage (docs/design.md, :mod:`shampoo.state`).
Plain pickle serialises every tensor's storage on its own, so without care the unpickled views no
longer alias their stack and the copy silently diverges. The copy must continue exactly like the
original: same ops on the same bits in one process, so parameters and state agree bitwise by
construction.
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch

import shampoo

CASES = {
    "sync": {},
    "soap": {"preconditioner": shampoo.SOAP()},
    "no_first_moment": {"betas": (0.0, 0.99)},
    "async": {"root_schedule": "async", "max_root_delay": 2},
}


def _model() -> torch.nn.Module:
    # three (5, 5) weights in one Kronecker bucket, three (5,) biases in one diagonal bucket, and the
    # (6, 5) weight split into blocks (max_preconditioner_dim=3) of one shape
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 5),
        torch.nn.Tanh(),
        torch.nn.Linear(5, 5),
        torch.nn.Tanh(),
        torch.nn.Linear(5, 5),
        torch.nn.Tanh(),
        torch.nn.Linear(5, 6),
    )


def _make(model: torch.nn.Module, **kw) -> shampoo.Shampoo:
    return shampoo.Shampoo(
        model.named_parameters(), lr=1e-2, precondition_frequency=2, start_preconditioning_step=2,
        max_preconditioner_dim=3, **kw,
    )  # fmt: skip


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for k in steps:
        g = torch.Generator().manual_seed(100 + k)
        x, y = torch.randn(8, 5, generator=g), torch.randn(8, 6, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _assert_same(a: object, b: object, path: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b, path


def _buckets(opt: shampoo.Shampoo) -> list:
    return [b for e in opt._engines if e is not None for b in e.buckets]


@pytest.mark.parametrize("case", CASES)
def test_pickled_optimizer_with_multi_block_buckets_continues_bitwise(case: str) -> None:
    kw = CASES[case]
    model = _model()
    opt = _make(model, **kw)
    _train(model, opt, range(3))
    assert any(len(b) >= 2 for b in _buckets(opt)), "the model must stack several blocks per bucket"
    # model and optimizer in one pickle (one memo): the copy's optimizer holds the copy's parameters
    model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    assert all(p2 is q for p2, q in zip(opt2.param_groups[0]["params"], model2.parameters(), strict=True))
    _assert_same(opt2.state_dict(), opt.state_dict())
    _train(model, opt, range(3, 9))  # crosses the root rounds at steps 4, 6 and 8
    _train(model2, opt2, range(3, 9))
    _assert_same([p.detach() for p in model2.parameters()], [p.detach() for p in model.parameters()])
    _assert_same(opt2.state_dict(), opt.state_dict())


def test_unpickled_block_state_views_its_stack() -> None:
    """Every block tensor of the copy shares storage with a stacked tensor of its bucket, as in
    the original (a write through the stack is seen by the block)."""
    model = _model()
    opt = _make(model)
    _train(model, opt, range(3))
    _, opt2 = pickle.loads(pickle.dumps((model, opt)))
    for bucket in _buckets(opt2):
        stacks = {t.untyped_storage().data_ptr() for t in _tensors(bucket.state)}
        for block in bucket.blocks:
            views = [block.first_moment, block.graft_state, block.diagonal, *block.tensors.values()]
            views += [t for f in block.factors for t in (f.matrix, f.root)]
            for t in views:
                if t is not None:
                    assert t.untyped_storage().data_ptr() in stacks


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for x in obj for t in _tensors(x)]
    if hasattr(obj, "__dataclass_fields__"):
        return [t for name in obj.__dataclass_fields__ for t in _tensors(getattr(obj, name))]
    return []


def _pickled_bucket_state() -> dict:
    """The pickled state of a multi-block Kronecker bucket, unpickled without its rebinding: block
    tensors are then copies apart from the stacks, free to be edited."""
    model = _model()
    opt = _make(model)
    _train(model, opt, range(3))
    bucket = next(b for b in _buckets(opt) if len(b) >= 2 and b.blocks[0].factors)
    return pickle.loads(pickle.dumps(bucket.__getstate__()))


def _edit_bits(state: dict) -> str:
    state["blocks"][1].factors[0].matrix.add_(1.0)
    return "block 1's factors.0.matrix differs from stacked tensor"


def _edit_dtype(state: dict) -> str:
    f = state["blocks"][0].factors[0]
    f.matrix = f.matrix.double()
    return "block 0's factors.0.matrix is torch.float64"


def _edit_stack_index(state: dict) -> str:
    j, path, _, *rest = state["_views"][0]
    state["_views"][0] = (j, path, 999, *rest)
    return "is recorded in stacked tensor 999, but the bucket has"


def _edit_offset(state: dict) -> str:
    j, path, k, _, shape, stride = state["_views"][0]
    state["_views"][0] = (j, path, k, 10**9, shape, stride)
    return "lie outside stacked tensor"


def _edit_block_index(state: dict) -> str:
    _, path, *rest = state["_views"][0]
    state["_views"][0] = (len(state["blocks"]), path, *rest)
    return "the bucket has"


def _edit_path(state: dict) -> str:
    j, _, *rest = state["_views"][0]
    state["_views"][0] = (j, ("factors", 7, "matrix"), *rest)
    return "the block has no tensor there"


@pytest.mark.parametrize(
    "edit", [_edit_bits, _edit_dtype, _edit_stack_index, _edit_offset, _edit_block_index, _edit_path]
)
def test_inconsistent_bucket_pickle_raises_a_typed_error(edit) -> None:
    """A pickled bucket whose views and stacks disagree is refused with InconsistentPickleError (a
    StateDictError and a pickle.UnpicklingError) naming the block, the tensor and the mismatch, and
    saying what is allowed; nothing is silently rebound."""
    from shampoo.preconditioner import BlockBucket

    state = _pickled_bucket_state()
    expected = edit(state)
    bucket = BlockBucket.__new__(BlockBucket)
    with pytest.raises(shampoo.InconsistentPickleError) as info:
        bucket.__setstate__(state)
    assert isinstance(info.value, shampoo.StateDictError) and isinstance(info.value, pickle.UnpicklingError)
    message = str(info.value)
    assert message.startswith("unpickling a BlockBucket: block ") and expected in message
    assert "must be a view of one of the bucket's stacked tensors" in message


def test_consistent_bucket_pickle_state_rebinds() -> None:
    """The same unedited state rebinds without error (the edits above are what the errors are for)."""
    from shampoo.preconditioner import BlockBucket

    state = _pickled_bucket_state()
    bucket = BlockBucket.__new__(BlockBucket)
    bucket.__setstate__(state)
    stacks = {t.untyped_storage().data_ptr() for t in _tensors(bucket.state)}
    assert bucket.blocks[1].factors[0].matrix.untyped_storage().data_ptr() in stacks
