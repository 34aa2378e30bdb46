"""Shampoo with root_solver="eigh_warm": each factor keeps its eigenbasis (checkpointed) and the next
root round warm-starts from it; the warm path is actually taken, and resuming is bitwise."""

from __future__ import annotations

import io

import pytest
import torch

import shampoo


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(24, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _make(model: torch.nn.Module, solver: str, names=None) -> shampoo.Shampoo:
    named = list(model.named_parameters()) if names is None else names
    return shampoo.Shampoo(
        named,
        lr=0.02,
        betas=(0.9, 0.999),
        eps=1e-6,
        precondition_frequency=1,
        start_preconditioning_step=1,
        merge_dims=False,  # factors 16, 24 (layer 1) and 4, 16 (layer 2)
        root_solver=solver,
        grafting="adam",
    )


_TEACHER = torch.randn(24, 4, generator=torch.Generator().manual_seed(99))


def _train(model, opt, steps: range) -> list[float]:
    losses = []
    for t in steps:
        g = torch.Generator().manual_seed(t)
        x = torch.randn(64, 24, generator=g)
        y = torch.tanh(x @ _TEACHER)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _roundtrip(obj) -> dict:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_training_takes_the_warm_path_and_matches_eigh():
    model = _model()
    opt = _make(model, "eigh_warm")
    losses = _train(model, opt, range(30))
    early = [f.warm_hits for d in opt.diagnostics() for f in d.factors]
    losses += _train(model, opt, range(30, 60))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0]
    factors = [f for d in opt.diagnostics() for f in d.factors]
    assert len(factors) == 4 and all(f.solver == "eigh_warm" and f.has_root for f in factors)
    # a root round every step: once the statistics settle (steps 30-59), the warm start is taken on
    # most rounds (accepted or refined, not a fallback to the full eigh)
    late = [f.warm_hits - e for f, e in zip(factors, early, strict=True)]
    assert sum(late) >= 0.8 * 30 * len(factors), late
    # the same training with the cold eigh: the roots agree to the cold bound, so the runs agree
    ref_model = _model()
    ref = _train(ref_model, _make(ref_model, "eigh"), range(60))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=2e-3, atol=1e-6)


def test_checkpoint_round_trip_keeps_the_basis_and_resumes_bitwise():
    model = _model()
    opt = _make(model, "eigh_warm")
    _train(model, opt, range(7))
    ckpt = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    flat = [v for st in ckpt["opt"]["state"].values() for k, v in st.items() if k.endswith(".basis")]
    assert len(flat) == 4 and all(v.shape[-1] == v.shape[-2] for v in flat)
    _train(model, opt, range(7, 8))
    verdicts = [f.warm for d in opt.diagnostics() for f in d.factors]
    _train(model, opt, range(8, 15))

    model2 = _model(seed=5)
    model2.load_state_dict(ckpt["model"])
    opt2 = _make(model2, "eigh_warm", names=list(model2.named_parameters()))
    opt2.load_state_dict(ckpt["opt"])
    restored = [
        v for st in opt2.state_dict()["state"].values() for k, v in st.items() if k.endswith(".basis")
    ]
    assert all(torch.equal(a, b) for a, b in zip(flat, restored, strict=True))
    _train(model2, opt2, range(7, 8))
    # the first round after the resume warm-started from the checkpointed basis, as the run did
    assert [f.warm for d in opt2.diagnostics() for f in d.factors] == verdicts
    assert not any(v == "cold" or not v for v in verdicts), verdicts
    _train(model2, opt2, range(8, 15))
    for (name, a), b in zip(model.named_parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_checkpoint_without_basis_starts_cold():
    model = _model()
    opt = _make(model, "eigh")
    _train(model, opt, range(7))
    ckpt = _roundtrip(opt.state_dict())
    assert not any(k.endswith(".basis") for st in ckpt["state"].values() for k in st)
    opt2 = _make(model, "eigh_warm")
    opt2.load_state_dict(ckpt)
    _train(model, opt2, range(7, 8))
    factors = [f for d in opt2.diagnostics() for f in d.factors]
    assert all(f.converged and f.warm == "cold" for f in factors)  # no basis yet: a plain eigh
    _train(model, opt2, range(8, 9))
    factors = [f for d in opt2.diagnostics() for f in d.factors]
    assert all(f.converged and f.warm != "cold" for f in factors)  # warm-started from the new basis


def _rounds(model, opt, steps: range) -> list[list[str]]:
    """The warm verdict of every factor after each step (a root round every step)."""
    out = []
    for t in steps:
        _train(model, opt, range(t, t + 1))
        out.append([f.warm for d in opt.diagnostics() for f in d.factors])
    return out


def test_warm_fallbacks_back_off_and_reset_as_documented():
    from shampoo.state import WARM_BACKOFF_MAX

    model = _model()
    rounds = _rounds(model, _make(model, "eigh_warm"), range(40))
    per_factor = list(zip(*rounds, strict=True))
    skipped = sum(v == "skipped (backoff)" for col in per_factor for v in col)
    assert skipped > 0, "early rounds of this model fall back; the backoff must engage"
    for col in per_factor:
        # the documented rule, replayed on the verdicts: after a fallback skip `backoff` rounds, the
        # backoff doubling with each further fallback (cap WARM_BACKOFF_MAX), reset by a warm success
        backoff, pending = 0, 0
        for r, v in enumerate(col):
            if pending:
                assert v == "skipped (backoff)", (r, col)
                pending -= 1
                continue
            assert v != "skipped (backoff)", (r, col)
            if v.startswith("fallback"):
                backoff = min(max(1, 2 * backoff), WARM_BACKOFF_MAX)
                pending = backoff
            elif v in ("accepted", "refined"):
                backoff = 0


def test_resume_with_a_pending_backoff_is_bitwise():
    model = _model()
    opt = _make(model, "eigh_warm")
    for t in range(30):
        _train(model, opt, range(t, t + 1))
        skips = [f.warm_skip for st in opt.state.values() for b in st.blocks for f in b.factors]
        if any(skips) and t > 2:
            break
    assert any(skips), "no backoff pending in 30 steps"
    ckpt = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()})
    saved = [v for st in ckpt["opt"]["state"].values() for k, v in st.items() if k.endswith(".warm_skip")]
    assert sorted(saved) == sorted(s for s in skips if s)
    _train(model, opt, range(t + 1, t + 12))

    model2 = _model(seed=5)
    model2.load_state_dict(ckpt["model"])
    opt2 = _make(model2, "eigh_warm", names=list(model2.named_parameters()))
    opt2.load_state_dict(ckpt["opt"])
    _train(model2, opt2, range(t + 1, t + 12))
    for (name, a), b in zip(model.named_parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b), name

    bad = _roundtrip(ckpt["opt"])
    st = next(st for st in bad["state"].values() if any(k.endswith(".warm_skip") for k in st))
    st[next(k for k in st if k.endswith(".warm_skip"))] = -1
    with pytest.raises(shampoo.errors.StateDictError, match="warm_skip' must be an int >= 0, got -1"):
        _make(_model(), "eigh_warm").load_state_dict(bad)
