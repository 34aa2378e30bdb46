"""method="auto": lookup semantics on a hand-written table, the contract of info["auto"], grouping of
batches, the fallbacks, and (on the shipped table) accuracy on matrices held back from the tuning run:
other families and seeds. Cost against the cheapest candidate is a timing, measured by
experiments/bench_auto_cost.py, never asserted here."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _auto_table import table_entry

import matroots
from matroots.solvers import auto_table as table
from matroots.solvers.auto import AutoConfig
from matroots.solvers.auto_targets import TargetWarning, default_target
from matroots.solvers.kappa_estimate import estimate_kappa
from matroots.study import matrices
from matroots.study.tuning.select import TABLE_COLUMNS
from matroots.truth import reference
from matroots.truth.metrics import relative_forward_error
from shampoo.state import mirror_upper_


@pytest.fixture
def toy_table(tmp_path: Path) -> str:
    """fp64, p = 2, n in [8, 64): kappa < 1e2 -> coupled Newton (Frobenius), 1e2 <= kappa < 1e8 -> eigh,
    targets 1e-4 and 1e-10; at kappa in [1e6, 1e8) no candidate meets 1e-10."""
    cn = '{"scaling": "frobenius"}'
    rows = [
        table_entry(1, 1e2, 1e-4, "coupled_newton[scaling=frobenius]", "coupled_newton", cn),
        table_entry(1, 1e2, 1e-10, "coupled_newton[scaling=frobenius]", "coupled_newton", cn),
        table_entry(1e2, 1e6, 1e-4, "eigh", "eigh"),
        table_entry(1e2, 1e6, 1e-10, "eigh", "eigh"),
        table_entry(1e6, 1e8, 1e-4, "eigh", "eigh"),
        table_entry(
            1e6, 1e8, 1e-10, "NA", "NA", "", reason="no candidate meets 1e-10 here; best is eigh at 1e-9"
        ),
    ]
    path = tmp_path / "toy.csv"
    pd.DataFrame(rows, columns=TABLE_COLUMNS).to_csv(path, index=False, na_rep="NA")
    return str(path)


def _spd(kappa: float, n: int = 16, seed: int = 5, family: str = "randsvd") -> np.ndarray:
    return matrices.generate(family, n, kappa, np.random.default_rng(seed))[0]


def test_lookup_semantics(toy_table: str) -> None:
    t = table.load_table(toy_table)
    look = lambda **kw: t.lookup(**({"device": "cpu", "dtype": "fp64", "n": 16, "p": 2} | kw))  # noqa: E731
    assert look(kappa=10.0, target=1e-4).entry["choice"].startswith("coupled_newton")
    # the loosest tuned target that is still <= the requested one
    assert look(kappa=1e3, target=1e-6).target_used == 1e-10
    assert look(kappa=1e3, target=0.5).target_used == 1e-4
    assert look(kappa=1e7, target=1e-10).status == "unattainable"
    for kw, why in [
        ({"kappa": 1e3, "target": 1e-12}, "tighter than every tuned target"),
        ({"kappa": 1e9, "target": 1e-4}, "outside the tuned kappa bands"),
        ({"kappa": math.inf, "target": 1e-4}, "not finite"),
        ({"kappa": 10.0, "target": 1e-4, "n": 100}, "outside the tuned n bands"),
        ({"kappa": 10.0, "target": 1e-4, "p": 3}, "p=3 is not in the table"),
        ({"kappa": 10.0, "target": 1e-4, "dtype": "bf16"}, "no rows for dtype bf16"),
        ({"kappa": 10.0, "target": 1e-4, "device": "cuda"}, "no rows for device"),
    ]:
        lk = look(**kw)
        assert lk.status == "outside" and why in lk.reason, (kw, lk.reason)


def test_auto_chooses_per_kappa_and_reports_why(toy_table: str) -> None:
    for kappa, expect in [(10.0, "coupled_newton"), (1e4, "eigh")]:
        A = _spd(kappa)
        res = matroots.inverse_root(A, 2, "auto", table=toy_table, target=1e-4)
        a = res.info["auto"]
        assert res.method == "auto" and a["chosen"][0].startswith(expect)
        g = a["groups"][0]
        assert g["status"] == "chosen" and g["cells"][0]["cell"]["choice"].startswith(expect)
        assert a["target"] == 1e-4 and a["target_source"] == "argument"
        assert a["kappa_estimate"][0] == pytest.approx(kappa, rel=0.6)
        assert a["estimate_matmuls"] > 0 and res.matmuls >= a["estimate_matmuls"]
        ref = reference.inverse_root(A, 2)
        assert relative_forward_error(res.root.numpy(), ref.root) <= 1e-4


def test_auto_batch_is_grouped_by_choice(toy_table: str) -> None:
    A = np.stack([_spd(10.0, seed=1), _spd(1e4, seed=2), _spd(20.0, seed=3), _spd(1e5, seed=4)])
    res = matroots.inverse_root(torch.from_numpy(A), 2, "auto", table=toy_table, target=1e-4)
    chosen = res.info["auto"]["chosen"]
    assert [c.split("[")[0] for c in chosen] == ["coupled_newton", "eigh", "coupled_newton", "eigh"]
    groups = res.info["auto"]["groups"]
    assert sorted(tuple(g["elements"]) for g in groups) == [(0, 2), (1, 3)]
    assert res.root.shape == (4, 16, 16) and res.converged.shape == (4,) and bool(res.converged.all())
    assert res.info["eps_abs"].shape == (4,)
    for i in range(4):
        ref = reference.inverse_root(A[i], 2)
        assert relative_forward_error(res.root[i].numpy(), ref.root) <= 1e-4
    # transposed view and a leading batch shape (2, 2) give the same roots
    res2 = matroots.inverse_root(
        torch.from_numpy(A).mT.reshape(2, 2, 16, 16), 2, "auto", table=toy_table, target=1e-4
    )
    assert torch.allclose(res2.root.reshape(4, 16, 16), res.root, rtol=1e-8, atol=1e-10)


def test_unattainable_target_warns_and_uses_the_most_accurate(toy_table: str) -> None:
    A = _spd(1e7)
    with pytest.warns(TargetWarning, match="no candidate meets 1e-10"):
        res = matroots.inverse_root(A, 2, "auto", table=toy_table, target=1e-10)
    g = res.info["auto"]["groups"][0]
    assert g["status"] == "unattainable" and g["config"] == "eigh"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TargetWarning)
        AutoConfig(table=toy_table, target=1e-10, warn=False).solve(A, 2)


def test_outside_the_table_uses_the_documented_safe_choice(toy_table: str) -> None:
    big = _spd(10.0, n=80)
    res = matroots.inverse_root(big, 2, "auto", table=toy_table, target=1e-4)
    g = res.info["auto"]["groups"][0]
    assert g["status"] == "outside" and g["config"] == "eigh" and "n=80" in g["cells"][0]["reason"]
    # outside the table the error to expect is cond(f, A) u: kappa/p for an SPD inverse root
    assert g["expected_error"] == pytest.approx(
        res.info["auto"]["kappa_estimate"][0] / 2 * 2.0**-53, rel=1e-12
    )
    # rational p: eigh; general (non-symmetric) input: Schur-Newton
    assert matroots.inverse_root(_spd(10.0), 0.5, "auto", table=toy_table).info["auto"]["chosen"] == ["eigh"]
    G = matrices.generate("nonsymmetric", 12, 10.0, np.random.default_rng(0))[0]
    res = matroots.inverse_root(G, 2, "auto", table=toy_table)
    assert res.info["auto"]["chosen"] == ["schur_newton"] and "not symmetric" in str(
        res.info["auto"]["groups"]
    )
    ref = reference.inverse_root(G, 2)
    assert relative_forward_error(res.root.numpy(), ref.root) < 1e-8
    # a user-given safe choice
    res = AutoConfig(table=toy_table, fallback=matroots.EighConfig(rank_policy="clamp")).solve(big, 2)
    assert res.info["auto"]["chosen"] == ["eigh"] and res.info.get("clamped") is not None


def test_chosen_solver_that_raises_is_resolved_by_the_safe_choice(toy_table: str) -> None:
    # rank-deficient fp32 factor built by baddbmm: the table's eigh ("perturb") rejects its rounding-negative
    # eigenvalues; the safe choice (eigh with clamping) solves it and info says so.
    g = torch.Generator().manual_seed(0)
    G = torch.randn(1, 32, 4, generator=g)
    F = mirror_upper_(torch.baddbmm(torch.zeros(1, 32, 32), G, G.mT)).double()  # read as Shampoo does
    auto = AutoConfig(table=toy_table, target=1e-4, fallback=matroots.EighConfig(rank_policy="clamp"))
    with pytest.raises(matroots.NotPositiveDefiniteError):
        matroots.inverse_root(F, 2, "eigh")
    res = auto.solve(F, 2, eps=0.0, kappa_hint=[1e3])
    g0 = res.info["auto"]["groups"][0]
    assert g0["status"] == "chosen" and "raised NotPositiveDefiniteError" in g0["note"]
    assert res.info["auto"]["kappa_source"] == "kappa_hint"
    assert bool(torch.isfinite(res.root).all())


@pytest.mark.parametrize(
    "bad", [{"target": 0.0}, {"target": 2.0}, {"kappa_safety": 0.5}, {"power_iters": 0}, {"typo": 1}]
)
def test_bad_auto_options_are_typed_errors(bad: dict) -> None:
    with pytest.raises(matroots.MatrootsInputError):
        matroots.inverse_root(np.eye(4), 2, "auto", **bad)


def _bad_table_files(tmp: Path) -> list[str]:
    ragged = tmp / "ragged.csv"  # pandas: ParserError (more fields than the header)
    ragged.write_text("a,b\n1,2,3,4\n")
    binary = tmp / "table.png"  # not text
    binary.write_bytes(bytes(range(256)) * 4)
    other = tmp / "other.csv"  # a CSV, but not a selection table
    other.write_text("x,y\n1,2\n")
    return [str(ragged), str(binary), str(other), str(tmp / "missing.csv"), 5]


BAD_FIELDS = {
    "target": ["abc", 0.0, 1.5, float("nan"), True],
    "table": None,  # files made in the test (tmp_path)
    "device": ["nonsense", 3],
    "kappa_safety": ["x", 0.5, float("inf")],
    "power_iters": [1.5, 0, 10**9],
    "inverse_iters": [1.5, 0, 10**9],
    "fallback": ["auto", 3, AutoConfig()],
    "warn": ["yes", 1],
    "psd": ["bogus"],
}


@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_every_auto_field_is_validated(field: str, tmp_path: Path) -> None:
    """A bad field is an InvalidArgumentError at construction naming the field and the value (and
    never a TypeError / pandas error at the first solve, or a run of minutes: the effort is capped)."""
    values = BAD_FIELDS[field] if field != "table" else _bad_table_files(tmp_path)
    for value in values:
        with pytest.raises(matroots.InvalidArgumentError, match=field) as err:
            AutoConfig(**{field: value})
        assert repr(value)[:20] in str(err.value) or str(value) in str(err.value), (field, value, err.value)


def test_kappa_hint_is_validated(toy_table: str) -> None:
    A = _spd(10.0)
    auto = AutoConfig(table=toy_table, target=1e-4)
    for bad in ("abc", [0.5], [2.0, 3.0], [True], [1 + 2j]):
        with pytest.raises(matroots.InvalidArgumentError, match="kappa_hint"):
            auto.solve(A, 2, kappa_hint=bad)
    # a real number applies to every element; nan means "unknown": estimated instead
    assert auto.solve(A, 2, kappa_hint=50.0).info["auto"]["kappa_source"] == "kappa_hint"
    assert auto.solve(A, 2, kappa_hint=[math.nan]).info["auto"]["kappa_source"] != "kappa_hint"


def test_bad_inputs_keep_their_typed_errors(toy_table: str) -> None:
    A = _spd(10.0)
    A[0, 0] = np.nan
    with pytest.raises(matroots.NonFiniteInputError):
        matroots.inverse_root(A, 2, "auto", table=toy_table)
    with pytest.raises(matroots.NotSquareError):
        matroots.inverse_root(np.ones((3, 4)), 2, "auto", table=toy_table)
    with pytest.raises(matroots.MatrootsInputError):
        matroots.inverse_root(_spd(10.0), -1, "auto", table=toy_table)


def test_default_targets_follow_the_dtype() -> None:
    assert default_target(torch.float64) == 1e-8 and default_target("fp32") == 1e-3
    assert default_target("bf16") == 1e-1
    res = matroots.inverse_root(_spd(10.0).astype(np.float32), 2, "auto")
    assert res.info["auto"]["target"] == 1e-3 and res.info["auto"]["target_source"] == "default for fp32"
    assert res.dtype == torch.float32


def test_forward_root_and_warm_start_path(toy_table: str) -> None:
    A = _spd(1e3)
    res = matroots.root(A, 2, "auto", table=toy_table, target=1e-4)
    X = res.root.numpy()
    assert np.allclose(X @ X, A, rtol=0, atol=1e-10)
    # small problems get their kappa exactly (one eigvalsh), larger ones from the warm start's root
    res = AutoConfig(table=toy_table, target=1e-4).solve(A, 2, warm_start=matroots.inverse_root(A, 2, "eigh"))
    assert res.info["auto"]["kappa_source"].startswith("eigenvalues")
    # eigvalsh errs by ~n u lambda_max: kappa to ~n u kappa = 2e-12 relative
    assert res.info["auto"]["kappa_estimate"][0] == pytest.approx(1e3, rel=1e-9)
    big = _spd(1e3, n=80)
    prev = matroots.inverse_root(big, 2, "eigh")
    # n = 80 is outside the toy table's n bands: the safe choice (eigh) whatever kappa, so none is
    # estimated to choose; kappa is read from the spectrum eigh computed (of the matrix solved)
    res = AutoConfig(table=toy_table, target=1e-4).solve(big, 2, warm_start=prev)
    assert res.info["auto"]["kappa_source"].startswith("eigenvalues of the matrix solved")
    assert res.info["auto"]["estimate_matmuls"] == 0.0
    assert res.info["auto"]["kappa_estimate"][0] == pytest.approx(1e3, rel=1e-9)
    # the estimate from a previous root (taken where kappa decides: inside the table), for a matrix
    # past the exact estimate's size (b n^3 > EXACT_MAX_WORK = 192^3)
    big = _spd(1e3, n=200)
    prev = matroots.inverse_root(big, 2, "eigh")
    ke = estimate_kappa(torch.from_numpy(big).reshape(1, 200, 200), previous_root=prev.root, p=2.0)
    assert ke.source.startswith("previous root")
    assert ke.kappa[0] == pytest.approx(1e3, rel=0.6)


# ------------------------------------------------------------------- shipped table, held-out matrices
HELD_OUT = ("randsvd5", "correlation", "near_repeated", "randsvd4")


def _held_out_cases():
    for fam in HELD_OUT:
        for n in (16, 40):
            for kappa in (30.0, 3e3, 3e5):
                yield fam, n, kappa, 1000 + n + int(math.log10(kappa))


@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_auto_meets_target_on_held_out_matrices(dtype: str) -> None:
    """Wherever the shipped table says a target can be met, auto meets it on matrices of families and
    seeds the tuning never saw, or says it could not (status/warning)."""
    shipped = table.load_table()
    checked = 0
    for fam, n, kappa, seed in _held_out_cases():
        A = matrices.generate(fam, n, kappa, np.random.default_rng(seed))[0]
        for p in (2, 4):
            ref = reference.inverse_root(A, p)
            for target in sorted(set(shipped.df["target"])):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    res = matroots.inverse_root(A, p, "auto", dtype=dtype, target=float(target))
                a = res.info["auto"]
                status = a["groups"][0]["status"]
                err = relative_forward_error(res.root.double().numpy(), ref.root)
                if status == "chosen":
                    checked += 1
                    assert bool(res.converged), (fam, n, kappa, p, target)
                    assert err <= target, (fam, n, kappa, p, dtype, target, err, a["chosen"])
                elif status == "unattainable":
                    assert any(issubclass(w.category, TargetWarning) for w in caught)
                else:
                    assert a["groups"][0]["cells"][0]["reason"]
    assert checked >= 50


def test_outside_the_table_warns_when_cond_u_exceeds_the_target() -> None:
    """Issue 22 class 5: p = 3 is not in the shipped table; fp32 at kappa 1e8 the safe choice's error
    is O(1) (cond u = kappa/p u ~ 2), far above the default target 1e-3, and auto must say so. A
    well-conditioned problem outside the table (cond u ~ 1e-15) meets its target without a warning."""
    A = matrices.generate("randsvd", 32, 1e8, np.random.default_rng(1))[0]
    ref = reference.inverse_root(A, 3)
    with pytest.warns(TargetWarning, match="cannot promise the target 0.001") as caught:
        res = matroots.inverse_root(A, 3, "auto", dtype="fp32")
    # eigh's own ConvergenceWarning (cond u >= 1: no digit promised) may come first; both are due.
    target_msgs = [str(w.message) for w in caught if issubclass(w.category, TargetWarning)]
    assert any("p=3 is not in the table" in m for m in target_msgs), target_msgs
    g = res.info["auto"]["groups"][0]
    assert g["status"] == "outside" and g["expected_error"] > 1e-3
    assert relative_forward_error(res.root.double().numpy(), ref.root) > 1e-3  # the warning was due
    B = _spd(10.0, n=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TargetWarning)
        res = matroots.inverse_root(B, 3, "auto", target=1e-10)
    assert res.info["auto"]["groups"][0]["status"] == "outside"
    assert relative_forward_error(res.root.numpy(), reference.inverse_root(B, 3).root) <= 1e-10


def test_best_effort_does_not_change_the_matrix() -> None:
    """Issue 22 class 5: a held-out fp32 matrix at kappa 2e6 (no candidate meets 1e-3 there) got
    eigh[rank_policy=clamp], error ~0.4: the root of a clamped matrix. The best effort is the most
    accurate candidate measured (coupled Newton), within the stable-method line cond(f, A) u =
    kappa/p u (= 0.06 here) of the reference, with a TargetWarning."""
    A = matrices.generate("randsvd5", 32, 2e6, np.random.default_rng(2032))[0]
    ref = reference.inverse_root(A, 2)
    with pytest.warns(TargetWarning, match="no candidate meets"):
        res = matroots.inverse_root(A, 2, "auto", dtype="fp32")
    g = res.info["auto"]["groups"][0]
    assert g["status"] == "unattainable" and "clamp" not in g["config"], g["config"]
    err = relative_forward_error(res.root.double().numpy(), ref.root)
    assert err <= 2e6 / 2 * 2.0**-24, err
    clamped = matroots.EighConfig(rank_policy="clamp").solve(A, 2, dtype="fp32")
    assert relative_forward_error(clamped.root.double().numpy(), ref.root) > 10 * err
