"""A peer that gives up on the numbers mid-run is a failed trial, not a crashed validation run.

Found in the full validation: Meta's DistributedShampoo raised ``PreconditionerValueError`` (a NaN
factor) on a diverging lsq trial, the exception left the unit and the runner stopped the whole run.
``peers.gives_up`` names each peer's own failure types; the unit records them like a diverged loss.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from matroots.study.validation import peers
from matroots.study.validation.config import load_config
from matroots.study.validation.training import run_unit

TINY = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "validate_tiny.toml"


class FakeGaveUp(ValueError):
    pass


def _fake_peer(monkeypatch: pytest.MonkeyPatch, raise_at: int, exc: type[Exception]) -> None:
    mod = types.ModuleType("fake_peer_pkg")
    mod.FakeGaveUp = FakeGaveUp

    class Opt(torch.optim.SGD):
        calls = 0

        def step(self, closure=None):
            Opt.calls += 1
            if Opt.calls == raise_at:
                raise exc("factor 0 is not finite")
            return super().step(closure)

    monkeypatch.setitem(sys.modules, "fake_peer_pkg", mod)
    fake = peers.Peer("heavyball_soap", "fake_peer_pkg", "Opt", "pip install fake", lambda m, c, model, lr, o, f: Opt(model.parameters(), lr=lr), gives_up=(("fake_peer_pkg", "FakeGaveUp"),))  # fmt: skip
    mod.Opt = Opt
    monkeypatch.setitem(peers.PEERS, "heavyball_soap", fake)


def _peer_unit():
    return next(u for u in load_config(TINY).units() if u.optimizer.name == "peer")


def _run_row(rows):
    return next(r for r in rows if r["table"] == "run")


def test_a_peer_giving_up_is_the_units_recorded_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_peer(monkeypatch, raise_at=4, exc=FakeGaveUp)
    run = _run_row(run_unit(_peer_unit()))
    assert run["failure"] == "FakeGaveUp"
    assert "not finite" in run["failure_message"]
    assert run["steps_done"] == 3  # the three steps before the one that gave up
    assert run["final_val_loss"] != run["final_val_loss"]  # NaN: a failed trial has no final loss


def test_any_other_peer_exception_still_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_peer(monkeypatch, raise_at=2, exc=RuntimeError)  # a harness or peer bug is not an outcome
    with pytest.raises(RuntimeError, match="not finite"):
        run_unit(_peer_unit())


def test_a_failure_type_missing_from_the_installed_peer_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_peer(monkeypatch, raise_at=0, exc=FakeGaveUp)
    monkeypatch.delattr(sys.modules["fake_peer_pkg"], "FakeGaveUp")
    with pytest.raises(peers.PeerUnavailableError, match="failure type is missing"):
        peers.gives_up("heavyball_soap")


def test_meta_shampoo_raises_its_registered_failure_type_on_a_nan_factor() -> None:
    """The type registered for Meta's DistributedShampoo is what it actually raises on a non-finite
    factor (the failure seen in the full validation); with the tests above, such a trial is recorded."""
    pytest.importorskip("distributed_shampoo")
    model = torch.nn.Linear(8, 4)
    opt = peers.make_peer("meta_shampoo", model, 1e-2, {}, 1)
    for step in range(3):
        model.zero_grad()
        model(torch.randn(16, 8)).square().mean().backward()
        if step == 2:
            model.weight.grad[0, 0] = float("nan")
            with pytest.raises(peers.gives_up("meta_shampoo"), match="nan/inf"):
                opt.step()
        else:
            opt.step()
