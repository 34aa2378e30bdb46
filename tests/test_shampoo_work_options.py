"""Shampoo's work-reducing statistics options: exact semantics against hand-written references.

* ``statistics_frequency=k``: the factors, their bias correction and their roots equal those of a
  frequency-1 Shampoo fed only the gradients of the documented steps (t - start) % k == 0 (bitwise,
  fp64), and an independent float64 numpy EMA of those gradients (1e-12); resume mid-period is
  bitwise; 2 gloo ranks equal one process; the schedule is fixed once state exists.
* ``statistics_dtype=torch.bfloat16``: the factor equals the statistics of the bf16-rounded
  gradient computed independently in float64 within the fp32 accumulation bound (and is measurably
  not the statistics of the unrounded gradient).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from _dist import run_ranks
from torch import nn

import shampoo
from shampoo.config import GroupOptions
from shampoo.errors import ShampooError
from shampoo.transforms.kronecker import statistics_due, statistics_updates

U32 = 2.0**-24


def _factors(opt: shampoo.Shampoo, p: torch.Tensor) -> list[torch.Tensor]:
    """The mirrored statistics of every factor of p's blocks (via the state dict)."""
    key = next(
        k for g in opt.param_groups for k, q in zip(g["param_names"], g["params"], strict=True) if q is p
    )
    flat = opt.state_dict()["state"][key]
    return [v for k, v in sorted(flat.items()) if k.endswith(".matrix")]


def _roots(opt: shampoo.Shampoo, p: torch.Tensor) -> list[torch.Tensor]:
    return [f.root.clone() for b in opt.state[p].blocks for f in b.factors]


def _params(dtype=torch.float64) -> dict[str, nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": nn.Parameter(torch.randn(4, 6, generator=g, dtype=dtype)),  # 2-D: L 4x4, R 6x6
        "t": nn.Parameter(torch.randn(3, 4, 5, generator=g, dtype=dtype)),  # 3-D, merge_dims off
        "b": nn.Parameter(torch.randn(5, generator=g, dtype=dtype)),  # diagonal block
    }


def _grads(T: int, params: dict[str, nn.Parameter]) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        {k: torch.randn(p.shape, generator=g, dtype=p.dtype) for k, p in params.items()} for _ in range(T)
    ]


def _opt(params: dict[str, nn.Parameter], **kw) -> shampoo.Shampoo:
    base = dict(
        lr=1e-2, betas=(0.9, 0.95), eps=1e-3, psd="none", merge_dims=False, precondition_frequency=4,
        start_preconditioning_step=3, grafting="adam", root_solver="eigh", root_dtype=torch.float64,
        factor_dtype=torch.float64, momentum=0.5,
    )  # fmt: skip
    base.update(kw)
    return shampoo.Shampoo(list(params.items()), **base)


def _step(opt: shampoo.Shampoo, params: dict[str, nn.Parameter], grads: dict[str, torch.Tensor]) -> None:
    for k, p in params.items():
        p.grad = grads[k].clone()
    opt.step()


def test_schedule_closed_form():
    for k in (1, 2, 3, 5):
        for start in (1, 2, 3, 7, 10):
            due = [statistics_due(t, k, start) for t in range(1, 40)]
            assert sum(due[:start]) >= 1  # the first root never sees empty statistics
            assert due[start - 1]  # the first root step is an update step
            for t in range(1, 40):
                assert statistics_updates(t, k, start) == sum(due[:t])
    assert [statistics_updates(t, 1, 5) for t in range(1, 6)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("k,start,freq", [(3, 3, 4), (2, 4, 2), (4, 1, 1)])
def test_statistics_frequency_equals_frequency_one_fed_documented_gradients(k, start, freq):
    """Factors and roots of k-Shampoo at step t are bitwise those of a frequency-1 Shampoo after
    the u(t) documented gradients; the factor is the documented EMA (independent numpy, 1e-12)."""
    T = 13
    pa, pb = _params(), _params()
    A = _opt(pa, statistics_frequency=k, start_preconditioning_step=start, precondition_frequency=freq)
    # B: statistics every step, roots every step from step 1: its root after u steps is the root of
    # its factor, bias-corrected by 1 - beta2^u
    B = _opt(pb, precondition_frequency=1, start_preconditioning_step=1)
    grads = _grads(T, pa)
    b2 = 0.95
    fed = []
    for t in range(1, T + 1):
        _step(A, pa, grads[t - 1])
        if (t - start) % k == 0:
            fed.append(grads[t - 1])
            _step(B, pb, grads[t - 1])
        u = len(fed)
        assert u == statistics_updates(t, k, start)
        for name in ("w", "t"):
            fa = _factors(A, pa[name])
            if u == 0:  # before the first update the factors are empty
                assert all(not x.any() for x in fa)
                continue
            fb = _factors(B, pb[name])
            for x, y in zip(fa, fb, strict=True):
                assert torch.equal(x, y), (t, name)
            # independent reference: the documented EMA over the fed gradients, float64 numpy
            G = [f[name].numpy() for f in fed]
            for dim, x in enumerate(fa):
                ref = np.zeros(x.shape)
                for j, g in enumerate(G):
                    Gi = np.moveaxis(g, dim, 0).reshape(g.shape[dim], -1)
                    ref += (1 - b2) * b2 ** (u - 1 - j) * (Gi @ Gi.T)
                np.testing.assert_allclose(x.numpy(), ref, rtol=1e-12, atol=1e-14 * max(1, np.abs(ref).max()))
        if t >= start and (t - start) % freq == 0:  # A computed roots this step: B's, bitwise
            for name in ("w", "t"):
                for x, y in zip(_roots(A, pa[name]), _roots(B, pb[name]), strict=True):
                    assert torch.equal(x, y), (t, name)
                fs = [f for b in A.state[pa[name]].blocks for f in b.factors]
                assert all(f.root_step == t for f in fs)
                # the root is (L / (1 - b2^u) + eps I)^{-1/p}: numpy eigh, float64
                L = _factors(A, pa[name])[0].numpy() / (1 - b2**u) + 1e-3 * np.eye(fs[0].n)
                w, V = np.linalg.eigh(L)
                ref = (V * w ** (-1.0 / float(fs[0].root_p))) @ V.T
                np.testing.assert_allclose(fs[0].root.numpy(), ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def test_statistics_frequency_other_state_sees_every_gradient():
    """First moment and grafting state are updated every step: equal to the frequency-1 run's."""
    pa, pb = _params(), _params()
    A, B = _opt(pa, statistics_frequency=3), _opt(pb)
    for g in _grads(5, pa):
        _step(A, pa, g)
        _step(B, pb, g)
    for name in pa:
        for ba, bb in zip(A.state[pa[name]].blocks, B.state[pb[name]].blocks, strict=True):
            for attr in ("first_moment", "graft_state", "diagonal"):
                x, y = getattr(ba, attr), getattr(bb, attr)
                assert (x is None) == (y is None)
                if x is not None:
                    assert torch.equal(x, y), (name, attr)


def test_statistics_frequency_per_parameter_steps():
    """Blocks of one bucket with different parameter steps (a parameter without gradient at some
    steps) follow their own schedules: each factor is the EMA of its own documented steps."""
    g = torch.Generator().manual_seed(3)
    p1 = nn.Parameter(torch.randn(4, 6, generator=g, dtype=torch.float64))
    p2 = nn.Parameter(torch.randn(4, 6, generator=g, dtype=torch.float64))
    params = {"p1": p1, "p2": p2}
    opt = _opt(params, statistics_frequency=2, start_preconditioning_step=2, precondition_frequency=2)
    buckets = opt._engine(0, GroupOptions.from_group(opt.param_groups[0])).buckets
    assert [len(b) for b in buckets] == [2]  # both blocks in one stack
    fed: dict[str, list[np.ndarray]] = {"p1": [], "p2": []}
    steps = {"p1": 0, "p2": 0}
    for i in range(9):
        present = ["p1", "p2"] if i % 3 else ["p1"]
        for k, p in params.items():
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype) if k in present else None
        for k in present:
            steps[k] += 1
            if statistics_due(steps[k], 2, 2):
                fed[k].append(params[k].grad.numpy().copy())
        opt.step()
    assert steps["p1"] != steps["p2"]
    for k, p in params.items():
        L = _factors(opt, p)[0].numpy()
        u = len(fed[k])
        ref = sum((0.05) * 0.95 ** (u - 1 - j) * (G @ G.T) for j, G in enumerate(fed[k]))
        np.testing.assert_allclose(L, ref, rtol=1e-12)


@pytest.mark.parametrize("cut", [5, 6, 7])
def test_resume_mid_period_is_bitwise(cut):
    kw = dict(statistics_frequency=3, statistics_dtype=torch.bfloat16)
    pa, pb = _params(torch.float32), _params(torch.float32)
    kw32 = dict(factor_dtype=torch.float32, root_dtype=torch.float32, **kw)
    A = _opt(pa, **kw32)
    grads = _grads(12, pa)
    for g in grads:
        _step(A, pa, g)
    B = _opt(pb, **kw32)
    for g in grads[:cut]:
        _step(B, pb, g)
    buf = io.BytesIO()
    torch.save(B.state_dict(), buf)
    buf.seek(0)
    pc = {k: nn.Parameter(v.detach().clone()) for k, v in pb.items()}
    C = _opt(pc, **kw32)
    C.load_state_dict(torch.load(buf, weights_only=True))
    for g in grads[cut:]:
        _step(C, pc, g)
    for k in pa:
        assert torch.equal(pa[k], pc[k]), k
    sa, sc = A.state_dict()["state"], C.state_dict()["state"]
    for key in sa:
        for name, v in sa[key].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, sc[key][name]), (key, name)


def test_schedule_is_fixed_once_state_exists():
    p = _params()
    opt = _opt(p, statistics_frequency=2)
    _step(opt, p, _grads(1, p)[0])
    opt.param_groups[0]["statistics_frequency"] = 3
    with pytest.raises(ShampooError, match="changed after the state was created"):
        _step(opt, p, _grads(1, p)[0])


def test_dump_reports_updates_and_bias_correction(tmp_path):
    p = _params()
    opt = _opt(p, statistics_frequency=3, start_preconditioning_step=3)
    for g in _grads(7, p):
        _step(opt, p, g)
    import json

    data = np.load(opt.dump_factors(tmp_path))
    meta = [json.loads(m) for m in data["meta"]]
    assert meta and all(m["param_step"] == 7 and m["statistics_updates"] == 2 for m in meta)  # steps 3, 6
    assert all(m["bias_correction"] == pytest.approx(1 - 0.95**2, rel=1e-15) for m in meta)
    rows = opt.diagnostics()
    assert all(f.root_step == 7 for d in rows for f in d.factors)


# ----------------------------------------------------------------------------------------------------
# bf16 statistics


def _abs_stats(grads: list[np.ndarray], b2: float) -> tuple[np.ndarray, np.ndarray]:
    """float64 EMA of G G^T and of |G| |G|^T (the bound's scale) over the gradients."""
    u = len(grads)
    S = sum((1 - b2) * b2 ** (u - 1 - j) * (g @ g.T) for j, g in enumerate(grads))
    A = sum((1 - b2) * b2 ** (u - 1 - j) * (np.abs(g) @ np.abs(g).T) for j, g in enumerate(grads))
    return S, A


def test_bf16_statistics_are_fp32_statistics_of_the_rounded_gradient():
    n, m, T, b2 = 24, 96, 6, 0.95
    g = torch.Generator().manual_seed(5)
    w = nn.Parameter(torch.randn(n, m, generator=g))
    opt = shampoo.Shampoo(
        [("w", w)], betas=(0.9, b2), statistics_dtype=torch.bfloat16, precondition_frequency=100
    )
    raw = []
    for _ in range(T):
        w.grad = torch.randn(n, m, generator=g) * 1e-3
        raw.append(w.grad.clone())
        opt.step()
    L, R = _factors(opt, w)
    assert L.dtype == torch.float32
    rounded = [x.to(torch.bfloat16).double().numpy() for x in raw]
    for F, gs in ((L, rounded), (R, [x.T for x in rounded])):
        S, A = _abs_stats(gs, b2)
        err = np.abs(F.double().numpy() - S)
        # fp32 accumulation: dot products of length <= m (gamma_m), the EMA scaling and the T sums
        bound = (gs[0].shape[1] + 3 * T) * U32 * A
        assert (err <= bound).all(), float((err / bound).max())
    # and the rounding of G did happen: the unrounded gradient's statistics are far outside that bound
    S, A = _abs_stats([x.double().numpy() for x in raw], b2)
    assert np.abs(L.double().numpy() - S).max() > 50 * ((m + 3 * T) * U32 * A).max()


def test_bf16_statistics_train_and_off_by_default():
    assert GroupOptions.__dataclass_fields__["statistics_dtype"].default is None
    assert GroupOptions.__dataclass_fields__["statistics_frequency"].default == 1
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    X, Y = torch.randn(64, 8), torch.randn(64, 1)
    opt = shampoo.Shampoo(
        model.named_parameters(), lr=1e-2, statistics_dtype="bfloat16", statistics_frequency=2,
        precondition_frequency=4,
    )  # fmt: skip
    first = None
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(X), Y)
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
    assert loss.item() < 0.7 * first
    assert opt.param_groups[0]["statistics_dtype"] is torch.bfloat16


# ----------------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"statistics_frequency": 0}, r"statistics_frequency must be an int >= 1 .*got 0"),
        ({"statistics_frequency": 2.0}, r"statistics_frequency must be an int >= 1 .*got 2.0"),
        ({"statistics_frequency": True}, r"statistics_frequency must be an int >= 1 .*got True"),
        ({"statistics_dtype": torch.float16}, r"statistics_dtype must be None .* or torch.bfloat16.*float16"),
        ({"statistics_dtype": "int8"}, r"statistics_dtype must be None or torch.bfloat16, got 'int8'"),
        (
            {"statistics_dtype": torch.bfloat16, "factor_dtype": torch.bfloat16},
            r"statistics_dtype=torch.bfloat16 needs factor_dtype float32 or float64",
        ),
    ],
)
def test_bad_options_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        shampoo.Shampoo([nn.Parameter(torch.randn(3, 3))], **kw)
    opt = shampoo.Shampoo([nn.Parameter(torch.randn(3))])
    with pytest.raises(ValueError, match=match):  # per param group too
        opt.add_param_group({"params": [nn.Parameter(torch.randn(3, 3))], **kw})


# ----------------------------------------------------------------------------------------------------
# distributed: 2 gloo ranks equal one process with every option on

DIST_KW = dict(
    lr=3e-2, betas=(0.9, 0.99), eps=1e-4, max_preconditioner_dim=6, precondition_frequency=2,
    start_preconditioning_step=2, statistics_frequency=2, statistics_dtype=torch.bfloat16,
)  # fmt: skip


def _dist_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 6))


def _dist_train(distributed=None) -> dict[str, torch.Tensor]:
    model = _dist_model()
    opt = shampoo.Shampoo(model.named_parameters(), distributed=distributed, **DIST_KW)
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(7, 24, 12, generator=g), torch.randn(7, 24, 6, generator=g)
    for t in range(7):
        opt.zero_grad()
        nn.functional.mse_loss(model(X[t]), Y[t]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _dist_body(rank: int, ws: int) -> dict[str, torch.Tensor]:
    return _dist_train(shampoo.DDPConfig(timeout=60))


def test_two_ranks_equal_single_process_with_options():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = _dist_train()
    finally:
        torch.set_num_threads(threads)
    per_rank = run_ranks(_dist_body, 2)
    for res in per_rank:
        for k, v in res.items():
            assert torch.equal(v, per_rank[0][k])
            torch.testing.assert_close(v, ref[k], rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused bf16 -> fp32 GEMM path is CUDA only")
def test_bf16_statistics_cuda_fused_path_matches_cpu():
    """On CUDA the bf16 statistics use one baddbmm with out_dtype fp32; same semantics as the CPU
    path (fp32 statistics of the bf16-rounded gradient) within the fp32 accumulation bound."""
    g = torch.Generator().manual_seed(9)
    grads = [torch.randn(32, 128, generator=g) * 1e-3 for _ in range(4)]
    out = []
    for device in ("cpu", "cuda"):
        w = nn.Parameter(torch.zeros(32, 128, device=device))
        opt = shampoo.Shampoo([("w", w)], statistics_dtype=torch.bfloat16, precondition_frequency=100)
        for x in grads:
            w.grad = x.to(device)
            opt.step()
        out.append([f.cpu().double().numpy() for f in _factors(opt, w)])
    rounded = [x.to(torch.bfloat16).double().numpy() for x in grads]
    for (c, d), gs in zip(zip(*out, strict=True), (rounded, [x.T for x in rounded]), strict=True):
        _, A = _abs_stats(gs, 0.999)
        assert (np.abs(c - d) <= 2 * (gs[0].shape[1] + 12) * U32 * A).all()
