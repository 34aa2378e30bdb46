"""The update added straight from the buckets (``ShampooImplementation(apply_from_buckets=...)``) and the
direction finiteness proved from the grafting norms (GroupEngine.finite_directions).

* With the switch on and off the parameters agree to rounding over steps with root rounds, for
  tiled parameters, parameters with edge blocks (per-block path), vectors, weight decay, a
  non-contiguous parameter (which keeps the direction tensors) and every grafting method.
* finite_directions equals the entrywise truth, (s_j D_j rounded to the parameter's dtype) all
  finite, on crafted directions: NaN, +-inf, a zero scale on an infinite block, a finite block whose
  bound fails, fp16 overflow of a finite fp32 direction, and ordinary blocks.
* A non-finite direction skips its parameter (counted warning) and only it, with the switch on as
  off; the other parameters get the update the switch-off path gives.
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import pytest
import torch
from _refs import fwd_bound
from torch import nn

import shampoo
from shampoo.engine import BucketDirections
from shampoo.errors import NonFiniteGradientWarning


class Net(nn.Module):
    """Tiled (64 x 96 in 32-blocks), edge-blocked (40 x 72), a vector and a conv kernel."""

    def __init__(self, noncontiguous: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = nn.Parameter(torch.randn(64, 96, generator=g) * 0.1)
        w = torch.randn(72, 40, generator=g) * 0.1
        self.b = nn.Parameter(w.t() if noncontiguous else w.t().contiguous())
        self.v = nn.Parameter(torch.randn(72, generator=g) * 0.1)
        self.k = nn.Parameter(torch.randn(8, 3, 3, 3, generator=g) * 0.1)

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x @ self.a)  # (n, 96)
        y = torch.tanh(h[:, :40] @ self.b + self.v)  # (n, 72)
        return (y**2).mean() + (self.k**2).sum() * (h.mean() + 1.0)


def run(flag: bool, steps: int = 12, noncontiguous: bool = False, **kw) -> dict[str, torch.Tensor]:
    net, opt, batches = _setup(noncontiguous, steps, direct=flag, **kw)
    for x in batches:
        _step(net, opt, x)
    return {k: v.detach().clone() for k, v in net.named_parameters()}


def _setup(noncontiguous: bool, steps: int, direct: bool = False, **kw):
    net = Net(noncontiguous)
    settings = dict(
        lr=0.01, max_preconditioner_dim=32, precondition_frequency=5, start_preconditioning_step=3
    )
    settings.update(kw)
    opt = shampoo.Shampoo(net.named_parameters(), implementation=_impl(direct), **settings)
    g = torch.Generator().manual_seed(1)
    return net, opt, [torch.randn(16, 64, generator=g) for _ in range(steps)]


def _step(net: Net, opt: shampoo.Shampoo, x: torch.Tensor, drop: str = "") -> None:
    opt.zero_grad()
    net.loss(x).backward()
    if drop:  # a parameter without a gradient this step: its bucket is only partly present
        getattr(net, drop).grad = None
    opt.step()


def _impl(direct: bool) -> shampoo.ShampooImplementation:
    """The optimizer's implementation setting with the update from the buckets on or off."""
    return shampoo.ShampooImplementation(apply_from_buckets=direct)


def one_step_each_way(at: int, dtype: torch.dtype = torch.float32, drop: str = "", **kw):
    """Train ``at`` steps (switch off), then the same next step from copies of that state with the
    switch on and off: the two updates (parameter deltas) per parameter."""
    import copy

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        net, opt, batches = _setup(False, at + 1, **kw)
        for x in batches[:at]:
            _step(net, opt, x)
        start = {k: v.detach().clone() for k, v in net.named_parameters()}
        deltas = []
        for flag in (True, False):
            n2 = copy.deepcopy(net)
            o2 = type(opt)(n2.named_parameters(), implementation=_impl(flag), **opt.defaults)
            o2.load_state_dict(copy.deepcopy(opt.state_dict()))
            _step(n2, o2, batches[at], drop)
            deltas.append({k: v.detach() - start[k] for k, v in n2.named_parameters()})
    finally:
        torch.set_default_dtype(default)
    return deltas


# steps: before preconditioning (2), the first root round (3), between rounds (6), a round (8)
@pytest.mark.parametrize("at", [1, 2, 5, 7])
@pytest.mark.parametrize("grafting", ["adam", "sgd", "none", "adagrad", "rmsprop"])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_direct_update_equals_the_direction_tensors_to_rounding(at, grafting, wd):
    on, off = one_step_each_way(at, grafting=grafting, weight_decay=wd)
    for k in on:
        size = float(off[k].abs().max())
        assert size > 1e-5, (k, size)  # the update did reach every parameter
        # one rounding of -lr s_j instead of s_j D_j: a few fp32 ulps of the parameter
        torch.testing.assert_close(on[k], off[k], rtol=0, atol=4e-7 * (1 + size), msg=k)


@pytest.mark.parametrize("at", [2, 5])
def test_direct_update_of_a_partly_present_bucket(at):
    """b has no gradient: a's 32 x 32 blocks share their bucket with b's, which are left alone."""
    on, off = one_step_each_way(at, drop="b", weight_decay=0.1)
    for k in on:
        if k == "b":
            assert float(on[k].abs().max()) == 0.0 == float(off[k].abs().max())
            continue
        size = float(off[k].abs().max())
        assert size > 1e-5, (k, size)
        torch.testing.assert_close(on[k], off[k], rtol=0, atol=4e-7 * (1 + size), msg=k)


def test_direct_update_in_float64_is_equal_to_rounding():
    on, off = one_step_each_way(7, torch.float64, weight_decay=0.05)
    for k in on:
        assert on[k].dtype == torch.float64
        torch.testing.assert_close(on[k], off[k], rtol=0, atol=1e-15, msg=k)


def test_direct_update_over_training_stays_with_the_direction_tensors():
    on, off = run(True, weight_decay=0.1), run(False, weight_decay=0.1)
    start = {k: v.detach() for k, v in Net().named_parameters()}
    for k in on:
        moved = float((off[k] - start[k]).abs().max())
        assert moved > 1e-2, (k, moved)
        assert float((on[k] - off[k]).abs().max()) <= 1e-4 * moved, k  # rounding, grown over 12 steps


def test_non_contiguous_parameter_keeps_the_direction_tensors(monkeypatch):
    used = []
    real = shampoo.update.apply_from_buckets
    monkeypatch.setattr(shampoo.update, "apply_from_buckets", lambda *a: used.append(1) or real(*a))
    """A transposed-view parameter goes through the direction tensors and trains as its contiguous twin.

    The twins' forward and backward GEMMs read b transposed or not, which some kernel paths round
    differently (bitwise equal with MKL's default path on AVX-512 EPYC, 7e-4 of b's motion under
    ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE), so they agree within a bound per parameter:
    a block's direction R_L G R_R has its two inverse roots within eps_j = fwd_bound(kappa_j, p, n, u)
    of the exact ones in either run (kappa_j from the diagnostics), so 2 eps_j apart, plus 2 n u for
    its two products; grafting's norm ratio doubles it, so do the later gradients that the differing
    parameters feed (x 2), and the graft's norms add m u (m the largest parameter's size). Each
    parameter may then differ by that relative bound times the distance it moved, step by step."""
    nc = run(True, noncontiguous=True)
    assert not used  # one parameter is a transposed view: its merged shape would be a copy
    net, opt, batches = _setup(False, 12)  # the contiguous twin through the direction tensors
    moved = {k: 0.0 for k, _ in net.named_parameters()}
    for x in batches:
        before = {k: v.detach().clone() for k, v in net.named_parameters()}
        _step(net, opt, x)
        for k, v in net.named_parameters():
            moved[k] += float((v.detach() - before[k]).abs().max())
    assert not used
    u = 2.0**-24
    m = max(v.numel() for v in net.parameters())
    eps = {k: 0.0 for k in moved}  # per parameter: the largest root bound of its factors (0: no root)
    for d in opt.diagnostics():
        for f in d.factors:
            eps[d.param] = max(eps[d.param], fwd_bound(f.kappa, float(Fraction(f.root_p)), f.n, u))
    for k, v in net.named_parameters():
        n = max(v.shape)
        tol = 2 * 2 * (2 * 2 * eps[k] + 2 * n * u) + m * u
        torch.testing.assert_close(nc[k], v.detach(), rtol=0, atol=tol * moved[k], msg=k)
    run(True, steps=2)
    assert used  # the contiguous model does take the direct path


def test_momentum_keeps_the_direction_tensors(monkeypatch):
    used = []
    real = shampoo.update.apply_from_buckets
    monkeypatch.setattr(shampoo.update, "apply_from_buckets", lambda *a: used.append(1) or real(*a))
    run(True, steps=3, momentum=0.9)
    assert not used


# --------------------------------------------------------------------------- finite_directions
def _engine(dtype: torch.dtype) -> tuple[shampoo.Shampoo, list[nn.Parameter]]:
    p = nn.Parameter(torch.randn(64, 64, dtype=dtype))
    q = nn.Parameter(torch.randn(64, 64, dtype=dtype))
    opt = shampoo.Shampoo([p, q], lr=0.01, max_preconditioner_dim=32)
    p.grad, q.grad = torch.randn_like(p), torch.randn_like(q)
    opt.step()  # builds the engine: one bucket of 8 blocks (32 x 32), 4 per parameter
    return opt, [p, q]


def _truth(
    eng, out: BucketDirections, params, alpha: float | None = None, written: bool = True
) -> list[bool]:
    """The definition: whatever the scatter writes (s_j D_j into direction tensors of the
    parameter's dtype) and/or adds (alpha s_j D_j into the parameters), from zero, is finite."""
    ok = []
    for i, p in enumerate(params):
        fine = True
        for a in ([None] if written else []) + ([alpha] if alpha is not None else []):
            view = eng.states[i].layout.merged_view(torch.zeros_like(p))
            eng.scatter(out.bucket, out.positions, out.D, out.scale, {i: view, 1 - i: view.clone()}, alpha=a)
            fine &= bool(torch.isfinite(view).all())
        ok.append(fine)
    return ok


CASES = {
    "ordinary": lambda D, s: (D, s),
    "nan": lambda D, s: (D.index_put_((torch.tensor([1]), torch.tensor([3]), torch.tensor([4])), torch.tensor(float("nan"))), s),
    "inf on a zero scale": lambda D, s: (D.index_put_((torch.tensor([5]),), torch.tensor(float("inf"))), s.index_fill_(0, torch.tensor([5]), 0.0)),
    "-inf": lambda D, s: (D.index_put_((torch.tensor([6]), torch.tensor([0]), torch.tensor([0])), torch.tensor(float("-inf"))), s),
    "huge scale": lambda D, s: (D, s.index_fill_(0, torch.tensor([2]), 1e300)),
    "finite block beyond the bound": lambda D, s: (D.index_fill_(0, torch.tensor([7]), 3e37), s),
    # s_j is finite in float64 but inf once rounded to fp32, the factor the scatter multiplies by
    "huge scale, tiny block": lambda D, s: (D.index_fill_(0, torch.tensor([4]), 1e-20), s.index_fill_(0, torch.tensor([4]), 1e40)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_norms", [True, False])
def test_finite_directions_equals_the_entrywise_truth(case, with_norms):
    opt, params = _engine(torch.float32)
    eng = opt._engines[0]
    g = torch.Generator().manual_seed(3)
    D = torch.randn(8, 32, 32, generator=g)
    s = torch.rand(8, generator=g, dtype=torch.float64) + 0.5
    D, s = CASES[case](D, s)
    norms = torch.linalg.vector_norm(D.reshape(8, -1), dim=1) if with_norms else None
    out = BucketDirections(0, list(range(8)), D, s, norms)
    assert eng.finite_directions([0, 1], [out]) == _truth(eng, out, params)
    # the update straight from the buckets multiplies by -lr s_j: lr = 1e10 overflows s_j ~ 1 too
    for alpha in (-0.01, -1e10 if case == "finite block beyond the bound" else -1e38):
        for written in (True, False):  # through the direction tensors, or straight from the buckets
            got = eng.finite_directions([0, 1], [out], alpha, written=written)
            assert got == _truth(eng, out, params, alpha, written), (alpha, written)


def test_finite_directions_in_fp16_judges_the_rounded_direction():
    """fp16 parameters keep fp32 state: a finite fp32 direction that overflows fp16 is not finite."""
    opt, params = _engine(torch.float16)
    eng = opt._engines[0]
    D = torch.ones(8, 32, 32)
    s = torch.ones(8, dtype=torch.float64)
    s[6] = 1e5  # 1e5 > 65504: inf in fp16, finite in fp32
    out = BucketDirections(0, list(range(8)), D, s, torch.full((8,), 32.0))
    assert eng.finite_directions([0, 1], [out]) == [True, False] == _truth(eng, out, params)


def test_a_grafting_subclass_that_overrides_graft_is_used():
    """A user's AdamGraft subclass with its own graft(): the pipeline must call it, not reuse the
    built-in norms (here: half the built-in scale, so the update halves)."""
    from dataclasses import dataclass

    from shampoo.grafting import AdamGraft

    @dataclass(frozen=True)
    class HalfGraft(AdamGraft):
        def graft(self, pre, pre_scale, d, d_scale):
            return 0.5 * super().graft(pre, pre_scale, d, d_scale)

    @dataclass(frozen=True)
    class HalfAdam(shampoo.AdamGrafting):
        def transform(self):
            return HalfGraft(eps=self.eps, beta2=self.beta2)

    # the first step from the same state, preconditioned at once (roots at step 1)
    half = one_step_each_way(0, grafting=HalfAdam(), start_preconditioning_step=1)
    full = one_step_each_way(0, grafting=shampoo.AdamGrafting(), start_preconditioning_step=1)
    for k in ("a", "b"):  # Kronecker-preconditioned, grafted
        for h, f in zip(half, full, strict=True):  # with the switch on and off
            assert float(h[k].norm() / f[k].norm()) == pytest.approx(0.5, rel=1e-5), k


@pytest.mark.parametrize("flag", [True, False])
def test_a_non_finite_direction_skips_only_its_parameter(flag):
    """An infinite root entry (a corrupted state) gives one parameter an infinite direction."""
    torch.manual_seed(0)
    p, q = nn.Parameter(torch.randn(64, 64)), nn.Parameter(torch.randn(64, 64))
    opt = shampoo.Shampoo([p, q], lr=0.01, max_preconditioner_dim=32, precondition_frequency=100,
                          start_preconditioning_step=1, implementation=_impl(flag))  # fmt: skip
    p.grad, q.grad = torch.randn_like(p), torch.randn_like(q)
    opt.step()
    eng = opt._engines[0]
    bucket = eng.buckets[0]
    j = next(j for j, i in enumerate(eng.members[0]) if i == 1)  # a block of q
    bucket.state.preconditioner.roots[0][j, 0, 0] = float("inf")
    p0, q0 = p.detach().clone(), q.detach().clone()
    p.grad, q.grad = torch.randn_like(p), torch.randn_like(q)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.step()
    assert any(issubclass(x.category, NonFiniteGradientWarning) and "update" in str(x.message) for x in w)
    assert torch.equal(q.detach(), q0) and opt.state[q].skipped_steps == 1
    assert not torch.equal(p.detach(), p0) and bool(torch.isfinite(p).all())


def test_two_optimizers_in_one_process_take_their_own_path():
    """The fast path is a setting of each optimizer (``implementation=``), not of the process: two
    optimizers stepped in turn, one from the buckets and one through the direction tensors, each
    give bitwise what it gives alone (same kernels in the same order), and report their path."""
    alone = {flag: run(flag, steps=8) for flag in (True, False)}
    pairs = {flag: _setup(False, 8, direct=flag) for flag in (True, False)}
    for k in range(8):
        for net, opt, batches in pairs.values():
            _step(net, opt, batches[k])
    for flag, (net, opt, _) in pairs.items():
        assert opt.implementation.apply_from_buckets is flag
        params = list(net.parameters())
        opts = shampoo.GroupOptions.from_group(opt.param_groups[0])
        assert opt._apply_path(opts, params) == ("buckets" if flag else "directions")
        for name, v in net.named_parameters():
            assert torch.equal(v.detach(), alone[flag][name]), (flag, name)
