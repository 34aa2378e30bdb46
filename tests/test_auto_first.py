"""method="auto" decomposing first (matroots.solvers.auto_first): where the table's lowest kappa band
names eigh, that eigh runs first and kappa is read off its eigenvalues. The result is bitwise the
chosen eigh's own solve when the band they prove decides it; otherwise the band's solver runs as
before (on the eigenvalues' kappa, or on the float64 estimate where the band is uncertain), and a
raising eigh leaves the usual path to decide."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _auto_table import table_entry
from _opcount import OpCount

import matroots
from matroots.solvers.auto import AutoConfig
from matroots.solvers.auto_candidates import candidate
from matroots.solvers.auto_first import (
    SOURCE,
    SOURCE_CERTIFIED,
    SOURCE_ELSEWHERE,
    SOURCE_ELSEWHERE_CERTIFIED,
    spectrum_estimate,
)
from matroots.solvers.auto_plan import plan_for
from matroots.solvers.auto_table import load_table
from matroots.solvers.auto_targets import TargetWarning
from matroots.solvers.kappa_estimate import estimate_kappa
from matroots.study import matrices
from matroots.study.tuning.select import TABLE_COLUMNS

ESTIMATED = "eigenvalues (float64 eigvalsh)"
CN = "coupled_newton[scaling=frobenius]"
CLAMP = "eigh[rank_policy=clamp]"


@pytest.fixture
def eigh_low(tmp_path: Path) -> str:
    """fp64, p = 2, n in [8, 64): kappa < 1e2 -> eigh, 1e2 <= kappa < 1e6 -> coupled Newton."""
    cn = '{"scaling": "frobenius"}'
    rows = [table_entry(1, 1e2, 1e-4, "eigh", "eigh"), table_entry(1e2, 1e6, 1e-4, CN, "coupled_newton", cn)]
    path = tmp_path / "eigh_low.csv"
    pd.DataFrame(rows, columns=TABLE_COLUMNS).to_csv(path, index=False, na_rep="NA")
    return str(path)


def _spd(kappa: float, n: int = 16, seed: int = 5) -> torch.Tensor:
    A = torch.from_numpy(matrices.generate("randsvd", n, kappa, np.random.default_rng(seed))[0])
    return torch.maximum(A, A.mT)  # exactly symmetric (elementwise max commutes with the transpose)


def _eighs(fn) -> int:
    with OpCount() as c:
        fn()
    return c.ops["aten._linalg_eigh.default"]


def test_the_lowest_band_is_one_eigh_bitwise_the_chosen_solve(eigh_low: str) -> None:
    """kappa 10: one decomposition (before: a float64 eigvalsh, then the eigh), the root and every
    info entry of the eigh solve exactly, and info["auto"] saying what was chosen and why."""
    A = _spd(10.0)
    auto = AutoConfig(table=eigh_low, target=1e-4)
    res = auto.solve(A, 2)
    direct = matroots.EighConfig().solve(A, 2)
    assert torch.equal(res.root, direct.root) and res.converged == direct.converged
    assert res.info.keys() - {"auto"} == direct.info.keys()
    for k in ("lambda_min", "lambda_max", "eps_abs", "regularisation_abs"):
        assert torch.equal(res.info[k], direct.info[k]), k
    a = res.info["auto"]
    assert a["chosen"] == ["eigh"] and a["kappa_source"] == SOURCE and a["estimate_matmuls"] == 0.0
    g = a["groups"][0]
    assert g["status"] == "chosen" and g["cells"][0]["reason"] == "test entry eigh" and g["note"] == ""
    # the kappa the eigenvalues give is the float64 estimate's to its rounding (both exact)
    assert a["kappa_estimate"][0] == pytest.approx(estimate_kappa(A.reshape(1, 16, 16)).kappa[0], rel=1e-12)
    assert res.matmuls == direct.matmuls
    assert _eighs(lambda: auto.solve(A, 2)) == 1
    # eps (absolute and relative) is in the kappa the eigenvalues give, as in the estimate
    for eps, mode in ((0.5, "absolute"), (0.05, "relative")):
        r = auto.solve(A, 2, eps=eps, eps_mode=mode)
        assert torch.equal(r.root, matroots.EighConfig().solve(A, 2, eps=eps, eps_mode=mode).root)
        ke = estimate_kappa(A.reshape(1, 16, 16), eps=eps, eps_mode=mode).kappa[0]
        assert r.info["auto"]["kappa_estimate"][0] == pytest.approx(ke, rel=1e-12)


def test_a_band_proved_another_solve_after_decomposing_runs_it_on_the_eigenvalues_kappa(
    eigh_low: str,
) -> None:
    """kappa 1e4, above the lowest non-eigh edge (1e2): auto decomposes first (no test before it), the
    eigenvalues prove the coupled Newton band, and that solve runs as its own on the eigenvalues'
    kappa: one eigh in all (the first decomposition in place of the float64 eigvalsh), the same root
    and decision as estimating first."""
    A = _spd(1e4)
    auto = AutoConfig(table=eigh_low, target=1e-4)
    res = auto.solve(A, 2)
    a = res.info["auto"]
    assert a["chosen"] == [CN] and a["kappa_source"] == SOURCE_ELSEWHERE
    assert a["kappa_estimate"][0] == pytest.approx(1e4, rel=1e-6)
    cfg, sopts = candidate(load_table(eigh_low), CN)
    assert torch.equal(res.root, cfg.solve(A, 2, **sopts).root)
    ref = _estimating_first(AutoConfig(table=eigh_low, target=1e-4)).solve(A, 2)
    assert ref.info["auto"]["chosen"] == [CN] and torch.equal(ref.root, res.root)
    assert _eighs(lambda: auto.solve(A, 2)) == 1  # the first decomposition; no float64 eigvalsh


def _estimating_first(cfg: AutoConfig) -> AutoConfig:
    """``cfg`` with decomposing first disabled: the float64 estimate decides every call (the path the
    decisions of decomposing first are compared with)."""
    object.__setattr__(cfg, "_first_decision", lambda *a: None)  # the instance attribute shadows the method
    return cfg


@pytest.fixture
def clamp_low(tmp_path: Path) -> str:
    """fp64, p = 2, n in [8, 64): kappa < 10 -> eigh[rank_policy=clamp], 10 <= kappa < 1e2 -> eigh
    (perturb), 1e2 <= kappa < 1e6 -> coupled Newton: two eigh configurations of the same matrix."""
    cn = '{"scaling": "frobenius"}'
    rows = [
        table_entry(1, 10, 1e-4, CLAMP, "eigh", '{"rank_policy": "clamp"}'),
        table_entry(10, 1e2, 1e-4, "eigh", "eigh"),
        table_entry(1e2, 1e6, 1e-4, CN, "coupled_newton", cn),
    ]
    path = tmp_path / "clamp_low.csv"
    pd.DataFrame(rows, columns=TABLE_COLUMNS).to_csv(path, index=False, na_rep="NA")
    return str(path)


@pytest.mark.parametrize(("eps", "mode"), [(0.0, "absolute"), (1e-3, "absolute"), (1e-6, "relative")])
def test_another_rank_policy_of_the_same_eigh_reuses_the_decomposition(clamp_low: str, eps, mode) -> None:
    """kappa 50: the lowest band's eigh[clamp] decomposes first, the eigenvalues prove the band of
    eigh (perturb): that one solves from the same decomposition, bitwise its own solve, one eigh."""
    A = _spd(50.0)
    auto = AutoConfig(table=clamp_low, target=1e-4)
    r = auto.solve(A, 2, eps=eps, eps_mode=mode)
    a = r.info["auto"]
    assert a["chosen"] == ["eigh"] and a["kappa_source"] == SOURCE
    direct = matroots.EighConfig().solve(A, 2, eps=eps, eps_mode=mode)
    assert torch.equal(r.root, direct.root) and r.converged == direct.converged
    assert r.iterations == direct.iterations and r.matmuls == direct.matmuls
    assert list(r.info)[:-1] == list(direct.info) and "clamped" not in r.info  # perturb's own notes
    for k, v in direct.info.items():
        assert torch.equal(r.info[k], v) if isinstance(v, torch.Tensor) else r.info[k] == v, k
    assert _eighs(lambda: auto.solve(A, 2, eps=eps, eps_mode=mode)) == 1
    # kappa 5: the clamping eigh itself, bitwise, one eigh
    B = _spd(5.0)
    r = auto.solve(B, 2)
    assert r.info["auto"]["chosen"] == [CLAMP] and r.info["auto"]["kappa_source"] == SOURCE
    direct = matroots.EighConfig(rank_policy="clamp").solve(B, 2)
    assert torch.equal(r.root, direct.root) and torch.equal(r.info["clamped"], direct.info["clamped"])
    assert _eighs(lambda: auto.solve(B, 2)) == 1


def test_a_batch_of_two_rank_policies_solves_each_group_as_before(clamp_low: str) -> None:
    A = torch.stack([_spd(5.0, seed=1), _spd(50.0, seed=2)])
    res = AutoConfig(table=clamp_low, target=1e-4).solve(A, 2)
    a = res.info["auto"]
    assert a["chosen"] == [CLAMP, "eigh"] and a["kappa_source"] == SOURCE_ELSEWHERE
    assert torch.equal(res.root[0], matroots.EighConfig(rank_policy="clamp").solve(A[:1], 2).root[0])
    assert torch.equal(res.root[1], matroots.EighConfig().solve(A[1:], 2).root[0])


def test_an_uncertain_band_takes_the_float64_estimate(eigh_low: str) -> None:
    """kappa at a band edge within the eigenvalues' error bound: the usual estimate decides."""
    plan = plan_for(object(), eigh_low, matroots.EighConfig(), "cpu", torch.float64, 16, 2, 1e-4, True)
    u, n = 2.0**-53, 16
    delta = 2 * (n + 2) * u  # lambda_max = 1: the module's bound
    info = lambda lo: {  # noqa: E731
        "lambda_min": torch.tensor([lo], dtype=torch.float64),
        "lambda_max": torch.tensor([1.0], dtype=torch.float64),
        "eps_abs": torch.zeros(1, dtype=torch.float64),
    }
    assert spectrum_estimate(plan, info(1e-2 * (1 + 3 * delta * 100)), n, torch.float64) is not None
    assert spectrum_estimate(plan, info(1e-2), n, torch.float64) is None  # kappa = 100, the edge
    assert spectrum_estimate(plan, info(1e-2 * (1 + 0.5 * delta * 100)), n, torch.float64) is None
    assert spectrum_estimate(plan, info(delta / 2), n, torch.float64) is None  # lambda_min within the bound
    assert spectrum_estimate(plan, info(-1.0), n, torch.float64) is None
    # a matrix whose computed kappa rounds to the edge: the float64 estimate, the same decision as before
    w = torch.linspace(1.0, 100.0, 16, dtype=torch.float64)
    Q, _ = torch.linalg.qr(
        torch.randn(16, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    )
    A = Q * w @ Q.T
    A = torch.maximum(A, A.mT)
    res = AutoConfig(table=eigh_low, target=1e-4).solve(A, 2)
    assert res.info["auto"]["kappa_source"] == ESTIMATED


def test_the_computed_kappa_interval_holds_the_float64_kappa() -> None:
    """The bound the band test rests on: for fp32 factors over the kappa range of the first bands,
    the float64 kappa lies inside [k_lo, k_hi] built from the fp32 eigh's eigenvalues."""
    n, u = 128, 2.0**-24
    for kappa in (1.0, 3.0, 50.0, 99.0, 1e3, 1e5):
        for seed in range(3):
            A = _spd(kappa, n=n, seed=seed).float()
            w = torch.linalg.eigh(A)[0].double()
            lo, hi = float(w[0]), float(w[-1])
            delta = 2 * (n + 2) * u * hi
            exact = estimate_kappa(A.reshape(1, n, n)).kappa[0]  # float64 eigvalsh of the same matrix
            k_hi = (hi + delta) / (lo - delta) if lo > delta else math.inf  # unbounded: never certain
            assert (hi - delta) / (lo + delta) <= exact <= k_hi, (kappa, seed)


def test_a_mixed_batch_solves_each_group_as_before(eigh_low: str) -> None:
    A = torch.stack([_spd(10.0, seed=1), _spd(1e4, seed=2), _spd(20.0, seed=3)])
    res = AutoConfig(table=eigh_low, target=1e-4).solve(A, 2)
    a = res.info["auto"]
    # the batch decomposes first; its bands are certain but decide two solves: each group solves as
    # before, on the eigenvalues' kappa
    assert a["chosen"] == ["eigh", CN, "eigh"] and a["kappa_source"] == SOURCE_ELSEWHERE
    assert torch.equal(res.root[[0, 2]], matroots.EighConfig().solve(A[[0, 2]], 2).root)
    cfg, sopts = candidate(load_table(eigh_low), CN)
    assert torch.equal(res.root[1], cfg.solve(A[1:2], 2, **sopts).root[0])


def test_an_eigh_that_raises_leaves_the_usual_path_to_decide(eigh_low: str) -> None:
    """An indefinite matrix: the first eigh (rank_policy perturb) raises; the usual path estimates
    kappa = inf (outside the table) and its safe choice decides, here the user's clamping eigh."""
    A = _spd(10.0)
    A[0, 0] = -1.0
    with pytest.raises(matroots.NotPositiveDefiniteError):
        AutoConfig(table=eigh_low, target=1e-4).solve(A, 2)
    safe = matroots.EighConfig(rank_policy="clamp")
    res = AutoConfig(table=eigh_low, target=1e-4, fallback=safe).solve(A, 2)
    a = res.info["auto"]
    assert a["kappa_source"] == ESTIMATED and a["kappa_estimate"] == [math.inf]
    assert a["groups"][0]["status"] == "outside" and torch.equal(res.root, safe.solve(A, 2).root)


@pytest.mark.parametrize("how", [{"psd": "shift"}, {"dtype": torch.float32}, {"kappa_hint": [10.0]}], ids=str)
def test_where_the_estimate_is_not_the_eigenvalues_kappa_auto_estimates_first(eigh_low: str, how) -> None:
    """A psd policy (its shift is in the eigenvalues, not in the estimate's kappa), input rounded to
    another working format (the table keys on the unrounded matrix), a kappa hint (no estimate)."""
    res = AutoConfig(table=eigh_low, target=1e-4).solve(_spd(10.0), 2, **how)
    assert res.info["auto"]["kappa_source"] not in (SOURCE, SOURCE_ELSEWHERE)


def test_a_non_exactly_symmetric_input_is_estimated_first(eigh_low: str) -> None:
    A = _spd(10.0)
    A[0, 1] += 1e-17  # within the symmetry tolerance, not exactly symmetric
    res = AutoConfig(table=eigh_low, target=1e-4).solve(A, 2)
    assert res.info["auto"]["kappa_source"] == ESTIMATED


def test_the_shipped_table_at_n_128_fp32_is_one_eigh_bitwise_the_chosen_solve() -> None:
    """The issue-29 case: a well-conditioned fp32 factor, p = 4: auto is the table's eigh exactly."""
    g = torch.Generator().manual_seed(0)
    G = torch.randn(128, 256, generator=g, dtype=torch.float64)
    A = (G @ G.T / 256 + 1e-3 * torch.eye(128, dtype=torch.float64)).float()
    A = torch.maximum(A, A.mT)
    res = matroots.inverse_root(A, 4, method="auto")
    label = res.info["auto"]["chosen"][0]
    assert label.startswith("eigh") and res.info["auto"]["kappa_source"] == SOURCE
    cfg, sopts = candidate(load_table(), label)
    assert torch.equal(res.root, cfg.solve(A, 4, **sopts).root)
    assert _eighs(lambda: matroots.inverse_root(A, 4, method="auto")) == 1


# (dtype, kappa, kappa_source, eighs besides the chosen solve's own) on the shipped table, n = 128,
# p = 4, at the default targets: around the edge of the eigh bands (fp32 1e4, fp64 1e6), where the
# Cholesky test that decided the path until 2026-12-03 mattered (it failed from fp32 kappa ~3e3), and
# beyond it, where the fp32 eigenvalues alone cannot prove a band (kappa > 1 / (2 (n + 2) u) ~ 6e4)
SHIPPED_128 = [
    (torch.float32, 10.0, SOURCE, 0),
    (torch.float32, 3e3, SOURCE, 0),  # the test failed here: estimate first, then the eigh
    # Weyl's interval straddles 1e4; the eigenpairs' certificate (a float64 Cholesky) proves kappa < 1e4
    (torch.float32, 9e3, SOURCE_CERTIFIED, 0),
    (torch.float32, 2e4, SOURCE_ELSEWHERE, 1),  # polar_express on the eigenvalues' kappa
    # lambda_min within fp32's Weyl bound: the Rayleigh quotient and a Cholesky prove the band
    (torch.float32, 1e5, SOURCE_ELSEWHERE_CERTIFIED, 1),
    (torch.float32, 1e7, SOURCE_ELSEWHERE_CERTIFIED, 1),  # unattainable: halley, with a TargetWarning
    (torch.float64, 1e3, SOURCE, 0),  # eigh[clamp] decomposes, eigh[perturb] solves from it
    (torch.float64, 9e5, SOURCE, 0),
    (torch.float64, 1.5e6, SOURCE_ELSEWHERE, 1),  # coupled Newton on the eigenvalues' kappa
]


@pytest.mark.parametrize(("dtype", "kappa", "source", "spare"), SHIPPED_128, ids=lambda x: str(x))
def test_the_shipped_table_at_n_128_decides_as_the_float64_estimate(dtype, kappa, source, spare) -> None:
    """Decomposing first changes the cost only: the configuration, the root (bitwise), the status and
    the TargetWarning are those of estimating first (the float64 eigvalsh), and bitwise the chosen
    configuration's own solve; the eigh first adds one decomposition only where it proves no band
    that reuses it."""
    A = _spd(kappa, n=128).to(dtype)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = matroots.inverse_root(A, 4, method="auto")
        ref = _estimating_first(AutoConfig()).solve(A, 4)
    warned = [w.category for w in seen]
    a, b = res.info["auto"], ref.info["auto"]
    assert a["kappa_source"] == source and b["kappa_source"] == ESTIMATED
    assert a["chosen"] == b["chosen"] and torch.equal(res.root, ref.root)
    assert [g["status"] for g in a["groups"]] == [g["status"] for g in b["groups"]]
    assert warned.count(TargetWarning) == 2 * (a["groups"][0]["status"] == "unattainable")
    k, exact = a["kappa_estimate"][0], b["kappa_estimate"][0]
    if source in (SOURCE_CERTIFIED, SOURCE_ELSEWHERE_CERTIFIED):
        # the computed eigenvalues' kappa or the Rayleigh quotients' (at most the exact one), inside
        # Weyl's interval: within 2 (n + 2) u kappa (relative, to first order) of the exact kappa
        rate = 2 * 130 * (2.0**-24 if dtype == torch.float32 else 2.0**-53) * exact
        assert k == pytest.approx(exact, rel=1.01 * rate / (1 - rate) if rate < 1 else 1.0)
    else:
        assert k == pytest.approx(exact, rel=1e-3 if dtype == torch.float32 else 1e-9)
    cfg, sopts = candidate(load_table(), a["chosen"][0])
    assert torch.equal(res.root, cfg.solve(A, 4, **sopts).root)
    own = _eighs(lambda: cfg.solve(A, 4, **sopts))  # the chosen solve's own (1 for eigh)
    assert _eighs(lambda: matroots.inverse_root(A, 4, method="auto")) == own + spare


@pytest.mark.parametrize(
    ("dtype", "kappa"), [(torch.float64, 300.0), (torch.float64, 10.0), (torch.float32, 10.0)]
)
def test_only_the_chosen_eighs_root_spectrum_is_computed(dtype, kappa) -> None:
    """Shipped table, n = 128, p = 4: fp64 kappa 300 decomposes for eigh[clamp] (the lowest band) and
    solves with eigh[perturb]; only perturb's root spectrum is computed (one pow: until 2026-12-03
    clamp's was computed too and dropped, 17 operations beyond the chosen solve's instead of 5). auto
    adds at most 5 dispatched operations to the chosen solve's own (the exact-symmetry test, the
    finiteness sum, the batch view, the spectrum's ends)."""
    A = _spd(kappa, n=128).to(dtype)
    res = matroots.inverse_root(A, 4, method="auto")
    cfg, sopts = candidate(load_table(), res.info["auto"]["chosen"][0])
    assert res.info["auto"]["kappa_source"] == SOURCE and torch.equal(res.root, cfg.solve(A, 4, **sopts).root)
    with OpCount() as mine:
        matroots.inverse_root(A, 4, method="auto")
    with OpCount() as own:
        cfg.solve(A, 4, **sopts)
    assert mine.ops["aten.pow.Tensor_Scalar"] == own.ops["aten.pow.Tensor_Scalar"] == 1
    assert sum(mine.ops.values()) - sum(own.ops.values()) <= 5, mine.ops - own.ops
