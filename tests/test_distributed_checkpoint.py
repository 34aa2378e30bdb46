"""Checkpoints of data-parallel Shampoo: saved on N ranks, loaded on M ranks (2->2, 2->1, 1->3).

``state_dict()`` is collective under ``distributed=``: it merges every rank's blocks into the
single-process form (keyed by parameter name and block), so it loads on any number of ranks, each rank
keeping the blocks it owns under the new assignment. Continuing on the same number of ranks is bitwise
identical to an uninterrupted run; on another number, equal within fp32 tolerance (different stacking
of the batched kernels).
"""

from __future__ import annotations

import torch
from _dist import run_ranks
from torch import nn

import shampoo
from matroots.study.matrices import load_shampoo_factors

K1, K2 = 4, 3  # steps before and after the checkpoint


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(9, 8), nn.Tanh(), nn.Linear(8, 4))


def _opt(model: nn.Module, distributed) -> shampoo.Shampoo:
    return shampoo.Shampoo(
        model.named_parameters(),
        lr=3e-2,
        betas=(0.9, 0.99),
        eps=1e-4,
        momentum=0.5,
        max_preconditioner_dim=5,
        precondition_frequency=2,
        start_preconditioning_step=2,
        root_solver="coupled_newton",  # warm-started: the saved roots matter for the continuation
        distributed=distributed,
    )


def _steps(model: nn.Module, opt: shampoo.Shampoo, start: int, stop: int) -> None:
    for t in range(start, stop):
        g = torch.Generator().manual_seed(t)
        x, y = torch.randn(16, 9, generator=g), torch.randn(16, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()  # every rank: the full batch
        opt.step()


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _continue(ckpt: dict, distributed) -> dict[str, torch.Tensor]:
    model = _model()
    model.load_state_dict(ckpt["model"])
    opt = _opt(model, distributed)
    opt.load_state_dict(ckpt["optim"])
    _steps(model, opt, K1, K1 + K2)
    return _params(model)


def _save_and_resume(rank: int, ws: int, dump_dir: str) -> dict:
    """Run K1 steps, checkpoint (and dump the factors), run K2 more (uninterrupted); then resume a
    fresh model and optimizer from the checkpoint on the same ranks."""
    model = _model()
    opt = _opt(model, shampoo.DDPConfig(timeout=60))
    _steps(model, opt, 0, K1)
    opt.dump_factors(dump_dir)
    ckpt = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optim": opt.state_dict()}
    _steps(model, opt, K1, K1 + K2)
    return {"ckpt": ckpt, "uninterrupted": _params(model), "resumed": _continue(ckpt, shampoo.DDPConfig())}


def _resume(rank: int, ws: int, ckpt: dict) -> dict[str, torch.Tensor]:
    return _continue(ckpt, shampoo.DDPConfig(timeout=60))


def _single_run(dump_dir=None) -> tuple[dict, dict[str, torch.Tensor]]:
    model = _model()
    opt = _opt(model, None)
    _steps(model, opt, 0, K1)
    if dump_dir is not None:
        opt.dump_factors(dump_dir)
    ckpt = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "optim": opt.state_dict()}
    _steps(model, opt, K1, K1 + K2)
    return ckpt, _params(model)


def _same_keys(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].keys() == b[k].keys(), k


def test_2_to_2_bitwise_and_2_to_1(tmp_path):
    r0, r1 = run_ranks(_save_and_resume, 2, str(tmp_path / "dist"))
    single_ckpt, single_params = _single_run(tmp_path / "single")
    # The saved state is rank-independent: identical on both ranks, with the single-process layout.
    _same_keys(r0["ckpt"]["optim"]["state"], single_ckpt["optim"]["state"])
    for key, flat in r0["ckpt"]["optim"]["state"].items():
        for name, v in flat.items():
            w = r1["ckpt"]["optim"]["state"][key][name]
            assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, (key, name)
    # Factor dumps: each rank writes its own blocks to dump_dir/rank<r>; together, the single process's.
    dumped = [load_shampoo_factors(tmp_path / "dist" / f"rank{r}") for r in range(2)]
    single = load_shampoo_factors(tmp_path / "single")
    assert all(dumped) and sum(len(d) for d in dumped) == len(single)
    key = lambda m: (m["param"], m["block"], m["dim"])  # noqa: E731
    assert sorted(key(m) for d in dumped for _, m in d) == sorted(key(m) for _, m in single)
    # 2 -> 2: bitwise identical continuation.
    for r in (r0, r1):
        for k, v in r["uninterrupted"].items():
            assert torch.equal(r["resumed"][k], v), k
    # 2 -> 1: a single process continues within fp32 tolerance.
    resumed = _continue(r0["ckpt"], None)
    for k, v in r0["uninterrupted"].items():
        torch.testing.assert_close(resumed[k], v, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(single_params[k], v, rtol=1e-5, atol=1e-6)


def test_1_to_3():
    ckpt, single_params = _single_run()
    results = run_ranks(_resume, 3, ckpt)
    for res in results:
        for k, v in single_params.items():
            assert torch.equal(res[k], results[0][k])
            torch.testing.assert_close(res[k], v, rtol=1e-5, atol=1e-6)
