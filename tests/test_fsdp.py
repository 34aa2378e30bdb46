"""Shampoo on fully_shard'ed (FSDP2) models, local-shard strategy, 2 gloo ranks on CPU.

Every rank computes the loss of the same full batch, so FSDP2's reduce-scatter averages two equal
gradients (g + g) / 2 = g, exactly in binary floating point: the runs isolate the optimizer. The
reference is one process with ``row_shards=2`` (the same blocks). Tolerance 1e-6 after 20 steps:
the same kernels on the same data, but the blocks are stacked differently (one rank's blocks vs
all of them), and a batched solve over another stack may round differently (~1e-7 relative in
fp32, u = 6e-8 times the small per-step amplification of eps = 1e-2-regularised factors).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from _dist import run_ranks
from torch import nn

import matroots
import shampoo
from matroots.solvers import SolverConfig
from matroots.solvers.base import RawResult
from shampoo.comm import DistributedTimeoutError, RemoteRankError
from shampoo.fsdp import FSDPConfig, ShardLayoutError, local_layout, shard_info

STEPS = 20
SOLVERS = ["eigh", "eigh_warm", "coupled_newton", "schur_newton", "newton_schulz", "halley", "polar_express"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 7))  # 7 rows: shards of 4 and 3


def _data(steps: int = STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, 16, 12, generator=g), torch.randn(steps, 16, 7, generator=g)


def _opt(params, solver: str, distributed=None, row_shards=None) -> shampoo.Shampoo:
    if solver == "soap":
        kw = {"preconditioner": "soap", "grafting": "none", "start_preconditioning_step": 1}
    else:
        kw = {"root_solver": solver, "momentum": 0.5, "start_preconditioning_step": 2}
    return shampoo.Shampoo(
        params,
        lr=1e-2,
        betas=(0.9, 0.99),
        eps=1e-2,
        weight_decay=1e-3,
        max_preconditioner_dim=4,
        precondition_frequency=2,
        row_shards=row_shards,
        distributed=distributed,
        **kw,
    )


def _shard(model: nn.Module, mesh=None, **kw) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def _train(model: nn.Module, opt, X, Y, steps=None) -> list[float]:
    losses = []
    for t in range(X.shape[0] if steps is None else steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X[t]).float(), Y[t])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for n, p in model.named_parameters()
    }


def reference(solver: str, row_shards: int | None) -> dict[str, torch.Tensor]:
    model = _model()
    _train(model, _opt(model.named_parameters(), solver, row_shards=row_shards), *_data())
    return _full(model)


# ----------------------------------------------------------------------------------------------------
# Layout (no processes)


def test_row_shards_blocks_follow_torch_chunk():
    from shampoo.blocking import layout_param, row_pieces

    assert row_pieces(7, 2) == [(0, 4), (4, 7)]
    assert row_pieces(6, 4) == [(0, 2), (2, 4), (4, 6)]  # torch.chunk: the 4th rank holds no rows
    assert [len(c) for c in torch.arange(6).chunk(4)] == [2, 2, 2]
    lay = layout_param(0, (10, 12), max_preconditioner_dim=4, row_shards=2)
    rows = sorted({(b.slices[0].start, b.slices[0].stop) for b in lay.blocks})
    assert rows == [(0, 4), (4, 5), (5, 9), (9, 10)]  # no block across row 5
    one = layout_param(0, (10, 12), max_preconditioner_dim=4)
    assert sorted({(b.slices[0].start, b.slices[0].stop) for b in one.blocks}) == [(0, 4), (4, 8), (8, 10)]
    vec = layout_param(0, (7,), max_preconditioner_dim=4, row_shards=2)
    assert [b.shape for b in vec.blocks] == [(4,), (3,)]


def test_local_layout_and_straddling_block():
    from shampoo.blocking import layout_param
    from shampoo.fsdp import ShardInfo

    full = layout_param(3, (8, 6), max_preconditioner_dim=4, row_shards=2)
    r1 = local_layout(full, ShardInfo(1, 2))
    assert r1.shape == (8, 6) and r1.merged_shape == (4, 6)
    assert [b.index for b in r1.blocks] == [2, 3]  # the whole parameter's block indices
    assert all(b.slices[0] == slice(0, 4) for b in r1.blocks)
    # blocks of 4 rows (row_shards=2) on 4 ranks of 2 rows: refused, naming the block
    with pytest.raises(ShardLayoutError, match="block 0 spans rows"):
        local_layout(full, ShardInfo(0, 4))
    assert shard_info(torch.zeros(3)).count == 1
    with pytest.raises(ValueError, match="row_shards must be None"):
        shampoo.Shampoo([torch.nn.Parameter(torch.zeros(2, 2))], row_shards=0)
    with pytest.raises(ValueError, match="strategy must be one of"):
        FSDPConfig(strategy="ring")


# ----------------------------------------------------------------------------------------------------
# Equivalence with one process, mixed precision, HSDP


def _equivalence(rank: int, ws: int) -> dict:
    X, Y = _data()
    out: dict = {}
    for solver in [*SOLVERS, "soap"]:
        model = _shard(_model())
        opt = _opt(model.named_parameters(), solver, FSDPConfig(timeout=30))
        _train(model, opt, X, Y)
        out[solver] = _full(model)
    # HSDP on the 2 ranks: replicate x shard meshes (2, 1) and (1, 2)
    from torch.distributed.device_mesh import init_device_mesh

    for shape in ((2, 1), (1, 2)):
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
        model = _shard(_model(), mesh=mesh)
        opt = _opt(model.named_parameters(), "eigh", FSDPConfig(timeout=30))
        _train(model, opt, X, Y)
        out[f"hsdp{shape}"] = _full(model)
    # bf16 parameters (fp32 optimizer state), and fp32 parameters with a bf16 compute policy
    from torch.distributed.fsdp import MixedPrecisionPolicy

    for name, model in (
        ("bf16", _shard(_model().to(torch.bfloat16))),
        (
            "mp",
            _shard(
                _model(),
                mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            ),
        ),
    ):
        opt = _opt(model.named_parameters(), "eigh", FSDPConfig(timeout=30))
        Xb = X[:1].expand(STEPS, -1, -1).to(next(model.parameters()).dtype)  # one batch: the loss falls
        losses = _train(model, opt, Xb, Y[:1].expand(STEPS, -1, -1))
        st = next(iter(opt.state.values()))
        out[name] = {
            "losses": losses,
            "state_dtype": st.blocks[0].first_moment.dtype,
            "param_dtype": next(model.parameters()).dtype,
        }
    return out if rank == 0 else {}


def test_fsdp_local_shard_equals_one_process():
    r0, _ = run_ranks(_equivalence, 2, timeout=150, pg_timeout=60)
    for solver in [*SOLVERS, "soap"]:
        ref = reference(solver, row_shards=2)
        for k, v in r0[solver].items():
            torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6, msg=f"{solver} {k}")
    # HSDP (2 replicas x 1 shard) is standard blocking; (1 x 2 shards) the 2-shard blocking
    for shape, rows in (((2, 1), 1), ((1, 2), 2)):
        ref = reference("eigh", row_shards=rows)
        for k, v in r0[f"hsdp{shape}"].items():
            torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6, msg=f"hsdp {shape} {k}")
    model = _model()
    X, Y = _data()
    opt = _opt(model.named_parameters(), "eigh", row_shards=2)
    fp32_final = _train(model, opt, X[:1].expand(STEPS, -1, -1), Y[:1].expand(STEPS, -1, -1))[-1]
    for name in ("bf16", "mp"):
        rec = r0[name]
        assert rec["state_dtype"] == torch.float32
        assert rec["param_dtype"] == (torch.bfloat16 if name == "bf16" else torch.float32)
        # fp32 on one process: 1.095 -> 0.342 in 20 steps on this batch. bf16 rounds the parameters
        # (u = 3.9e-3) at every step; a final loss within 10% of fp32's says it trains the same way
        assert rec["losses"][-1] < 0.5 * rec["losses"][0], (name, rec["losses"])
        assert abs(rec["losses"][-1] - fp32_final) < 0.1 * fp32_final, (name, rec["losses"], fp32_final)


# ----------------------------------------------------------------------------------------------------
# Faults


@dataclass(frozen=True, kw_only=True)
class AlwaysFails(SolverConfig):
    """A root solver that raises (used on rank 1 only)."""

    name: ClassVar[str] = "fsdp_always_fails"

    def _run(self, prob, *, inverse, warm_start) -> RawResult:  # type: ignore[override]
        raise matroots.NotPositiveDefiniteError("injected failure")


def _faults(rank: int, ws: int) -> dict:
    X, Y = _data(4)
    out: dict = {}
    # 1. Rank 1's roots fail (a solver that raises there, no fallback): it raises its own error,
    #    rank 0 a RemoteRankError at the same step.
    solver = AlwaysFails() if rank == 1 else "eigh"
    model = _shard(_model())
    opt = shampoo.Shampoo(
        model.named_parameters(),
        lr=1e-2,
        root_solver=solver,
        precondition_frequency=1,
        start_preconditioning_step=1,
        failure=shampoo.FailurePolicy(fallback=None, max_consecutive_failures=1),
        distributed=FSDPConfig(timeout=10),
    )
    try:
        _train(model, opt, X, Y)
        out["fail"] = "no error"
    except RemoteRankError as err:
        out["fail"] = f"remote: {err}"
    except shampoo.ShampooError as err:
        out["fail"] = f"own: {type(err).__name__}"
    # 3. Placements the strategy cannot step (columns sharded) are refused with the reason.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (ws,))
    w = nn.Parameter(distribute_tensor(torch.ones(4, 6), mesh, [Shard(1)]))
    w.grad = distribute_tensor(torch.ones(4, 6), mesh, [Shard(1)])
    try:
        shampoo.Shampoo([w], distributed=FSDPConfig(timeout=10)).step()
        out["placement"] = "no error"
    except ShardLayoutError as err:
        out["placement"] = str(err)
    # 4. status_check=False: no optimizer collective; the steps still equal status_check=True's.
    runs = []
    for check in (True, False):
        model = _shard(_model())
        opt = _opt(model.named_parameters(), "eigh", FSDPConfig(status_check=check, timeout=10))
        _train(model, opt, X, Y)
        runs.append(_full(model))
    out["no_check_equal"] = all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    # 2. Rank 1 crashes after its backward and hangs: rank 0's step ends with a clear error.
    _crash_and_hang(FSDPConfig(timeout=3), rank, X, Y, out)
    return out


def _crash_and_hang(cfg: FSDPConfig, rank: int, X: torch.Tensor, Y: torch.Tensor, out: dict) -> None:
    """Rank 1 raises after its backward at step 3 and then sleeps past the timeout; rank 0's step must
    end with DistributedTimeoutError (out["hang"], out["seconds"]) instead of waiting for ever."""
    model = _shard(_model())
    opt = _opt(model.named_parameters(), "eigh", cfg)
    t0 = time.monotonic()
    try:
        for t in range(3):
            opt.zero_grad()
            nn.functional.mse_loss(model(X[t]), Y[t]).backward()
            if rank == 1 and t == 2:
                raise ValueError("simulated crash")
            opt.step()
    except ValueError:
        time.sleep(6)
        out["hang"] = "crashed"
    except DistributedTimeoutError as err:
        out["hang"] = f"timeout: {err}"
        out["seconds"] = time.monotonic() - t0


def test_fsdp_failing_and_hanging_rank_are_clear_errors():
    r0, r1 = run_ranks(_faults, 2, timeout=90, pg_timeout=30)
    assert r1["fail"].startswith("own:"), r1
    assert r0["fail"].startswith("remote:") and "rank(s) [1]" in r0["fail"], r0
    assert r1["hang"] == "crashed"
    assert r0["hang"].startswith("timeout:") and "within 3 s" in r0["hang"], r0
    assert r0["seconds"] < 15
    assert "Shard(dim=1)" in r0["placement"] and "needs rows" in r0["placement"], r0["placement"]
    assert r0["no_check_equal"] and r1["no_check_equal"]


# ----------------------------------------------------------------------------------------------------
# torch.distributed.checkpoint: save on 2 ranks, load on 1 and 4, continue

DCP_STEPS = 6  # before the checkpoint, and again after it


def _dcp_model() -> nn.Module:
    # 8 rows, blocks of 2 rows: the row_shards=2 blocks (4 rows per piece) also lie in 4 ranks' shards
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8, bias=False), nn.Tanh(), nn.Linear(8, 8, bias=False))


def _dcp_opt(model: nn.Module, distributed=None, strategy: str = "local_shard") -> shampoo.Shampoo:
    # unnamed parameters: torch.optim's integer keys, which get_optimizer_state_dict turns into FQNs
    if strategy == "owner":  # the blocks of one process (3 rows: [3, 6) straddles 2 and 4 ranks' rows)
        blocking = {"max_preconditioner_dim": 3, "row_shards": None}
        distributed = FSDPConfig(strategy="owner", timeout=30) if distributed is not None else None
    else:  # the blocking of the run that saves, fixed for every world size that loads
        blocking = {"max_preconditioner_dim": 2, "row_shards": 2}
    return shampoo.Shampoo(
        model.parameters(),
        lr=1e-2,
        betas=(0.9, 0.99),
        eps=1e-2,
        momentum=0.5,
        precondition_frequency=2,
        start_preconditioning_step=2,
        distributed=distributed,
        **blocking,
    )


def _dcp_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return torch.randn(2 * DCP_STEPS, 16, 8, generator=g), torch.randn(2 * DCP_STEPS, 16, 8, generator=g)


def _dcp_run(rank: int, ws: int, path: str, phase: str, strategy: str = "local_shard") -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model = _dcp_model()
    if ws > 1 and strategy == "share":  # HSDP, ws replicas x 1 shard: the replicas split the blocks
        from torch.distributed.device_mesh import init_device_mesh

        model = _shard(model, mesh=init_device_mesh("cpu", (ws, 1), mesh_dim_names=("replicate", "shard")))
    elif ws > 1:
        model = _shard(model)
    opt = _dcp_opt(model, FSDPConfig(timeout=30) if ws > 1 else None, strategy)
    X, Y = _dcp_data()
    if phase == "save":
        _train(model, opt, X[:DCP_STEPS], Y[:DCP_STEPS])
        osd = get_optimizer_state_dict(model, opt)
        dcp.save({"model": get_model_state_dict(model), "optim": osd}, checkpoint_id=path)
        kinds = sorted({type(v).__name__ for s in osd["state"].values() for v in s.values()})
        return {
            "kinds": kinds,
            "blocks": sorted((k, n) for k, s in osd["state"].items() for n in s if n.endswith("matrix")),
        }
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, opt, sd["optim"])
    _train(model, opt, X[DCP_STEPS:], Y[DCP_STEPS:])
    full = _full(model)  # collective
    return full if rank == 0 else {}


def _dcp_reference(strategy: str = "local_shard") -> dict[str, torch.Tensor]:
    model = _dcp_model()
    _train(model, _dcp_opt(model, None, strategy), *_dcp_data())
    return _full(model)


def _dcp_check(tmp_path, worlds: tuple[int, ...], strategy: str = "local_shard") -> None:
    path = str(tmp_path / "ckpt")
    saved = run_ranks(_dcp_run, 2, path, "save", strategy, timeout=60)
    assert "DTensor" in saved[0]["kinds"]  # the momentum buffer, placed as its parameter
    assert not set(saved[0]["blocks"]) & set(saved[1]["blocks"])  # each rank saves its own blocks
    ref = _dcp_reference(strategy)
    for ws in worlds:
        got = run_ranks(_dcp_run, ws, path, "load", strategy, timeout=120)[0]
        for k, v in got.items():
            # 1e-6: as the equivalence test (the same blocks, stacked per rank)
            torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6, msg=f"world {ws} {k}")


def test_dcp_save_on_2_load_on_1_continues(tmp_path):
    _dcp_check(tmp_path, (1,))


@pytest.mark.slow
def test_dcp_save_on_2_load_on_4_continues(tmp_path):
    _dcp_check(tmp_path, (4,))
