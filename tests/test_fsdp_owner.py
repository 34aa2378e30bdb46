"""FSDP2 "owner" strategy and HSDP replicas sharing the root work (2 gloo ranks, CPU).

``FSDPConfig(strategy="owner")`` blocks the whole parameters as one process does (standard
blocking; here blocks of 4 rows of a 10-row weight sharded 5 + 5, so block [4, 8) straddles the
shard boundary), each block on one owner: it must equal one process without ``row_shards``. Under
HSDP (a (2, 1) replicate x shard mesh) ``share_roots`` splits the blocks of the (one) shard between
the two replicas: it must equal one process too, with each block computed on one rank only.

Tolerance 1e-6 after 20 steps, as tests/test_fsdp.py: the same kernels on the same data (the
gradient rows and the fp32 directions are copied, not rounded), but the blocks are stacked per
owner, and a batched solve over another stack may round differently (~1e-7 relative in fp32).
"""

from __future__ import annotations

import pytest
import torch
from _dist import run_ranks
from test_fsdp import (
    STEPS,
    AlwaysFails,
    _crash_and_hang,
    _data,
    _dcp_check,
    _full,
    _model,
    _opt,
    _shard,
    _train,
)
from test_fsdp_skips import _counts, _run

import shampoo
from shampoo.comm import RemoteRankError
from shampoo.fsdp import FSDPConfig

OWNER_SOLVERS = ["eigh", "soap"]  # the two kinds of block transform (root solvers share one path)


def _owned(opt) -> list[tuple]:
    return sorted((st.key, b.spec.index) for st in opt._engines[0].states for b in st.blocks if b.owned)


def _mesh(shape):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))


def _ranks(rank: int, ws: int) -> dict:
    X, Y = _data()
    out: dict = {}
    for solver in OWNER_SOLVERS:
        model = _shard(_model())
        opt = _opt(model.named_parameters(), solver, FSDPConfig(strategy="owner", timeout=30))
        _train(model, opt, X, Y)
        out[solver] = _full(model)
        out[f"{solver} owned"] = _owned(opt)
    for name, cfg in (
        ("share", FSDPConfig(timeout=30)),
        ("owner hsdp", FSDPConfig(strategy="owner", timeout=30)),
    ):
        model = _shard(_model(), mesh=_mesh((2, 1)))
        opt = _opt(model.named_parameters(), "eigh", cfg)
        _train(model, opt, X, Y)
        out[name] = _full(model)
        out[f"{name} owned"] = _owned(opt)
    # share_roots=False: every replica computes every block (the previous behaviour)
    model = _shard(_model(), mesh=_mesh((2, 1)))
    opt = _opt(model.named_parameters(), "eigh", FSDPConfig(timeout=30, share_roots=False))
    _train(model, opt, X, Y, steps=2)
    out["no share owned"] = _owned(opt)
    # a NaN in rank 1's rows of "0.weight" skips the whole parameter on both ranks (the directions
    # are tested whole, on every rank alike: the engine's verdict is not used, nothing to inject)
    model = _shard(_model())
    opt = _opt(model.named_parameters(), "eigh", FSDPConfig(strategy="owner", timeout=30))
    with pytest.warns(Warning):
        _run(model, opt, rank, bad_direction=False)
    out["skips"] = _full(model)
    out["skips counts"] = _counts(opt)
    # rank 1's roots fail: it raises its own error, rank 0 a RemoteRankError at the same step
    for name, mesh, cfg in (
        ("fail owner", None, FSDPConfig(strategy="owner", timeout=10)),
        ("fail share", _mesh((2, 1)), FSDPConfig(timeout=10)),
    ):
        model = _shard(_model(), mesh=mesh)
        opt = shampoo.Shampoo(
            model.named_parameters(),
            lr=1e-2,
            root_solver=AlwaysFails() if rank == 1 else "eigh",
            precondition_frequency=1,
            start_preconditioning_step=1,
            max_preconditioner_dim=4,
            failure=shampoo.FailurePolicy(fallback=None, max_consecutive_failures=1),
            distributed=cfg,
        )
        try:
            _train(model, opt, X[:3], Y[:3])
            out[name] = "no error"
        except RemoteRankError as err:
            out[name] = f"remote: {err}"
        except shampoo.ShampooError as err:
            out[name] = f"own: {type(err).__name__}"
    # bf16 parameters under "owner" (bf16 gradient rows gathered, fp32 optimizer state): it trains
    model = _shard(_model().to(torch.bfloat16))
    opt = _opt(model.named_parameters(), "eigh", FSDPConfig(strategy="owner", timeout=30))
    Xb, Yb = X[:1].expand(STEPS, -1, -1).to(torch.bfloat16), Y[:1].expand(STEPS, -1, -1)
    out["bf16"] = _train(model, opt, Xb, Yb)
    out["bf16 state"] = next(
        b.first_moment.dtype for st in opt._engines[0].states for b in st.blocks if b.owned
    )
    # rank 1 crashes after its backward at step 3 and hangs: rank 0's step (waiting in the
    # agreement before the gradient rows' all-gather) ends with a clear error within the timeout
    _crash_and_hang(FSDPConfig(strategy="owner", timeout=3), rank, X, Y, out)
    return out


def test_owner_strategy_and_hsdp_shared_roots_equal_one_process():
    r0, r1 = run_ranks(_ranks, 2, timeout=150, pg_timeout=60)
    for solver in OWNER_SOLVERS:
        ref = _reference(solver)
        for k, v in r0[solver].items():
            torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6, msg=f"owner {solver} {k}")
    ref = _reference("eigh")
    for name in ("share", "owner hsdp"):
        for k, v in r0[name].items():
            torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6, msg=f"{name} {k}")
    # every block computed on exactly one rank: disjoint, and together the one-process blocks
    model = _model()
    opt = _opt(model.named_parameters(), "eigh")
    _train(model, opt, *_data(), steps=1)
    every = _owned(opt)
    # 0.weight (10 x 12): 3 x 3 blocks, rows [0, 4) [4, 8) [8, 10); 2.weight (7 x 10): 2 x 3; the biases 1 each
    assert len(every) == 17 and ("0.weight", 4) in every
    for name in ("eigh", "soap", "share", "owner hsdp"):
        a, b = r0[f"{name} owned"], r1[f"{name} owned"]
        assert not set(a) & set(b) and sorted(a + b) == every, (name, a, b)
        assert a and b, (name, a, b)  # both ranks have work
    assert r0["no share owned"] == r1["no share owned"] == every
    # the skip: equal to one process whose whole "0.weight" gradient holds the NaN
    model = _model()
    opt = _opt(model.named_parameters(), "eigh")
    with pytest.warns(Warning):
        _run(model, opt, None, bad_direction=False)
    ref = _full(model)
    for k, v in r0["skips"].items():
        torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6, msg=f"skips {k}")
    assert r0["skips counts"] == r1["skips counts"] == _counts(opt)
    # bf16: one batch, the loss falls as fp32's does (1.095 -> 0.342 in 20 steps, tests/test_fsdp.py)
    assert r0["bf16 state"] == torch.float32
    assert r0["bf16"][-1] < 0.5 * r0["bf16"][0], r0["bf16"]
    assert r1["hang"] == "crashed"
    assert r0["hang"].startswith("timeout:") and "within 3 s" in r0["hang"], r0["hang"]
    assert r0["seconds"] < 15, r0["seconds"]
    for name in ("fail owner", "fail share"):
        assert r1[name].startswith("own:"), (name, r1[name])
        assert r0[name].startswith("remote:") and "rank(s) [1]" in r0[name], (name, r0[name])


def _reference(solver: str) -> dict[str, torch.Tensor]:
    model = _model()
    _train(model, _opt(model.named_parameters(), solver), *_data())
    return _full(model)


def test_owner_dcp_save_on_2_load_on_1_continues(tmp_path):
    # the owner strategy's blocking does not depend on the world size: any world size loads
    _dcp_check(tmp_path, (1,), "owner")


def test_hsdp_share_roots_dcp_save_on_2_load_on_1_continues(tmp_path):
    # 2 replicas x 1 shard: each replica saves its half of the blocks (the check that the ranks'
    # block keys are disjoint), one process loads the union and continues
    _dcp_check(tmp_path, (1,), "share")


@pytest.mark.slow
def test_owner_dcp_save_on_2_load_on_4_continues(tmp_path):
    _dcp_check(tmp_path, (4,), "owner")


def _hsdp_2x2(rank: int, ws: int) -> dict:
    X, Y = _data()
    out: dict = {}
    for name, cfg in (("share", FSDPConfig(timeout=60)), ("owner", FSDPConfig(strategy="owner", timeout=60))):
        model = _shard(_model(), mesh=_mesh((2, 2)))
        opt = _opt(model.named_parameters(), "eigh", cfg)
        _train(model, opt, X, Y)
        out[name] = _full(model)
        out[f"{name} owned"] = _owned(opt)
    return out


@pytest.mark.slow
def test_hsdp_2x2_share_roots_and_owner_equal_one_process():
    """4 ranks, 2 replicas x 2 shards: share_roots == one process with the 2-shard blocking (each
    shard's blocks split between its 2 replicas), owner == one process with standard blocking (each
    block on one of the 4 ranks); 1e-6 as above."""
    recs = run_ranks(_hsdp_2x2, 4, timeout=300, pg_timeout=120)
    for name, rows in (("share", 2), ("owner", None)):
        model = _model()
        opt = _opt(model.named_parameters(), "eigh", row_shards=rows)
        _train(model, opt, *_data())
        ref = _full(model)
        for k, v in recs[0][name].items():
            torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6, msg=f"{name} {k}")
        every = _owned(opt)
        owned = [recs[r][f"{name} owned"] for r in range(4)]
        if name == "owner":  # the 4 ranks split the blocks
            assert sorted(k for o in owned for k in o) == every and all(owned), owned
        else:  # ranks (0, 2) and (1, 3) are the replicas of shards 0 and 1 (mesh [[0, 1], [2, 3]])
            for a, b in ((0, 2), (1, 3)):
                assert not set(owned[a]) & set(owned[b]) and owned[a] and owned[b], owned
            assert sorted(k for o in owned for k in o) == every, owned
