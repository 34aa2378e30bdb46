"""SolveOptions is the single definition of the solve options; solver capabilities are declared.

* every field of :class:`matroots.SolveOptions` is accepted by ``inverse_root``, ``root`` (except
  ``inverse``, which ``root`` fixes) and ``SolverConfig.solve``, and each call validates the options
  exactly once (one ``SolveOptions`` built per solve);
* a bad value raises the same InvalidArgumentError whichever entry point receives it;
* the declared :class:`matroots.Capabilities` of every registered solver match what it does
  (integer p, differentiability, general input, forward roots), and Shampoo reads them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import matroots
from matroots import Capabilities, SolveOptions
from matroots.solvers import registry

# a value differing from the default, valid for every field (tol/max_iter loose enough for eigh)
NON_DEFAULT = {
    "eps": 1e-3,
    "eps_mode": "relative",
    "dtype": "fp64",
    "compute_dtype": torch.float64,
    "tol": 1e-6,
    "max_iter": 50,
    "strict": True,
    "record_history": True,
    "inverse": False,
    "warm_start": None,  # set per test (needs the result of a first solve)
    "psd": "shift",
    "quiet": True,
    "trusted": True,
    "kappa_hint": 10.0,  # read by method="auto" only
}
BAD = {
    "eps": -1.0,
    "eps_mode": "rel",
    "dtype": torch.int32,
    "compute_dtype": "fp8",
    "tol": 2.0,
    "max_iter": 2.0,
    "strict": 1,
    "record_history": "yes",
    "inverse": None,
    "warm_start": "previous",
    "psd": "clamp",
    "quiet": 0,
    "trusted": 1,
    "kappa_hint": "high",
}


def _spd(n: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, n, dtype=torch.float64, generator=g)
    return X @ X.T + n * torch.eye(n, dtype=torch.float64)


def test_fields_are_the_documented_options() -> None:
    assert set(SolveOptions.names()) == set(NON_DEFAULT) == set(BAD)
    assert SolveOptions.names() == tuple(f.name for f in dataclasses.fields(SolveOptions))


@pytest.fixture
def count_validations(monkeypatch: pytest.MonkeyPatch) -> list[SolveOptions]:
    built: list[SolveOptions] = []
    original = SolveOptions.__post_init__

    def counting(self: SolveOptions) -> None:
        original(self)
        built.append(self)

    monkeypatch.setattr(SolveOptions, "__post_init__", counting)
    return built


@pytest.mark.parametrize("entry", ["inverse_root", "root", "config.solve"])
@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_every_option_is_accepted_and_validated_once(entry: str, name: str, count_validations) -> None:
    A = _spd()
    value = NON_DEFAULT[name]
    if name == "warm_start":
        value = matroots.inverse_root(A, 2, "coupled_newton")
    if entry == "root" and name == "inverse":
        with pytest.raises(matroots.InvalidArgumentError, match="inverse"):
            matroots.root(A, 2, "coupled_newton", inverse=False)
        return
    count_validations.clear()
    if entry == "inverse_root":
        res = matroots.inverse_root(A, 2, "coupled_newton", **{name: value})
    elif entry == "root":
        res = matroots.root(A, 2, "coupled_newton", **{name: value})
    else:
        res = matroots.CoupledNewtonConfig().solve(A, 2, **{name: value})
    assert len(count_validations) == 1  # one SolveOptions per solve: validated once
    opts = count_validations[0]
    if name == "warm_start":
        assert opts.warm_start is value
    elif name in ("dtype", "compute_dtype"):
        assert getattr(opts, name) == torch.float64
    else:
        assert getattr(opts, name) == value
    forward = entry == "root" or (name == "inverse" and value is False)
    w, V = np.linalg.eigh(A.numpy())
    shift = 0.0
    if name == "eps":
        shift = 1e-3
    elif name == "eps_mode":
        shift = 0.0  # relative of eps = 0 is no shift
    exact = (V * (w + shift) ** (0.5 if forward else -0.5)) @ V.T
    got = res.root.double().numpy()
    bound = 1e-5 if name == "tol" else 1e-9  # tol=1e-6 may stop one quadratic step earlier
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < bound


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_option_gets_one_typed_error_everywhere(name: str) -> None:
    A = _spd(4)
    messages = set()
    calls = [
        lambda: SolveOptions(**{name: BAD[name]}),
        lambda: matroots.inverse_root(A, 2, **{name: BAD[name]}),
        lambda: matroots.EighConfig().solve(A, 2, **{name: BAD[name]}),
    ]
    if name != "inverse":
        calls.append(lambda: matroots.root(A, 2, **{name: BAD[name]}))
    for call in calls:
        with pytest.raises(matroots.MatrootsInputError) as info:
            call()
        messages.add(str(info.value))
    assert len(messages) == 1, messages  # the same rule and message whichever entry point


def test_options_object_and_keywords() -> None:
    A = _spd()
    opts = SolveOptions(eps=1e-2, dtype="fp32")
    a = matroots.inverse_root(A, 4, "eigh", opts)
    b = matroots.inverse_root(A, 4, "eigh", eps=1e-2, dtype=torch.float32)
    assert a.dtype == torch.float32 and torch.equal(a.root, b.root)
    c = matroots.inverse_root(A, 4, "eigh", opts, dtype="fp64")  # keywords override the object
    assert c.dtype == torch.float64
    assert matroots.EighConfig().solve(A, 4, opts).dtype == torch.float32
    with pytest.raises(matroots.InvalidArgumentError, match="did you mean 'eps'"):
        SolveOptions.build(epss=1.0)
    with pytest.raises(matroots.InvalidArgumentError, match="solve options are eps, eps_mode"):
        matroots.inverse_root(A, 4, "eigh", epss=1.0)


# ------------------------------------------------------------------------------------------ capabilities


def test_every_registered_solver_declares_its_capabilities() -> None:
    for name in registry.available():
        cls = type(registry.get(name))
        assert isinstance(cls.capabilities, Capabilities), name
        assert "capabilities" not in registry.field_names(cls)  # a ClassVar, not an option
    with pytest.raises(ValueError, match="warm_start must be"):
        Capabilities(warm_start="yes")


@pytest.mark.parametrize("name", ["eigh", "eigh_warm", "coupled_newton", "schur_newton"])
def test_declared_capabilities_match_behaviour(name: str) -> None:
    cfg = registry.get(name)
    caps = cfg.capabilities
    A = _spd(5)
    if caps.integer_p:
        with pytest.raises(matroots.UnsupportedExponentError):
            cfg.solve(A, 2.5)
    else:
        assert cfg.solve(A, 2.5).root.shape == (5, 5)
    if caps.forward_root:
        w, V = np.linalg.eigh(A.numpy())
        exact = (V * w**0.5) @ V.T
        assert np.linalg.norm(cfg.solve(A, 2, inverse=False).root.numpy() - exact) < 1e-8 * np.linalg.norm(
            exact
        )
    Ag = A.clone().requires_grad_(True)
    if caps.differentiable:
        cfg.solve(Ag, 2).root.sum().backward()
        assert Ag.grad is not None and torch.isfinite(Ag.grad).all()
    else:
        with pytest.raises(matroots.InvalidArgumentError, match="not differentiable"):
            cfg.solve(Ag, 2)
    G = torch.triu(torch.ones(4, 4, dtype=torch.float64)) + 3 * torch.eye(4, dtype=torch.float64)
    if caps.general_input:
        X = cfg.solve(G, 2).root
        assert torch.allclose(X @ X @ G, torch.eye(4, dtype=torch.float64), atol=1e-9)
    else:
        with pytest.raises(matroots.NotSymmetricError):
            cfg.solve(G, 2)


def test_shampoo_reads_declared_warm_start() -> None:
    from shampoo.roots import supports_warm_start, uses_eigenbasis

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class RenamedNewton(matroots.CoupledNewtonConfig):
        name = "my_newton"  # a different name: the declaration, not the name, decides

    assert supports_warm_start(RenamedNewton()) and supports_warm_start(matroots.CoupledNewtonConfig())
    assert not supports_warm_start(matroots.EighConfig())
    warm = registry.get("eigh_warm")
    assert uses_eigenbasis(warm) and not supports_warm_start(warm)


def test_per_candidate_solve_options_are_solve_options() -> None:
    """The options a sweep or tuned candidate may fix per solver are a subset of the one definition."""
    from matroots.solvers import auto_candidates
    from matroots.study import grid

    assert set(grid.SOLVE_OPTIONS) <= set(SolveOptions.names())
    assert set(auto_candidates.SOLVE_OPTIONS) <= set(SolveOptions.names())
