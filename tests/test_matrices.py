"""Tests of matroots.study.matrices: spectra (checked with the high-precision eigensolver), symmetry,
reproducibility, and the Shampoo factor .npz layout."""

from __future__ import annotations

import json
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matroots.study import matrices
from matroots.truth import reference

U = 2.0**-53
RANDOM = [
    "randsvd",
    "randsvd1",
    "randsvd2",
    "randsvd3",
    "randsvd4",
    "randsvd5",
    "clustered",
    "near_repeated",
    "correlation",
    "lowrank",
    "nonsymmetric",
]
FIXED = ["tridiag", "minij", "pei", "hilbert", "lehmer", "pascal", "moler", "kms"]
DATA = ["shampoo"]  # shipped real Kronecker factors (tests/test_real_factors.py covers them)


def test_every_family_is_registered():
    assert set(RANDOM) | set(FIXED) | set(DATA) <= set(matrices.FAMILIES)
    assert set(matrices.FAMILIES) <= set(RANDOM) | set(FIXED) | set(DATA)


@pytest.mark.parametrize("family", RANDOM)
def test_same_seed_same_matrix(family):
    A1, m1 = matrices.generate(family, 9, 1e4, np.random.default_rng(5))
    A2, _ = matrices.generate(family, 9, 1e4, np.random.default_rng(5))
    A3, _ = matrices.generate(family, 9, 1e4, np.random.default_rng(6))
    assert A1.dtype == np.float64 and A1.shape == (9, 9)
    assert A1.tobytes() == A2.tobytes()
    assert not np.array_equal(A1, A3)
    assert m1["family"] == family and m1["n"] == 9
    assert np.isfinite(A1).all()
    with pytest.raises(ValueError, match=r"family '\w+' is random: pass rng="):
        matrices.generate(family, 9, 1e4, None)


@pytest.mark.parametrize("family", RANDOM + FIXED)
def test_symmetry_where_promised(family):
    A, meta = matrices.generate(family, 8, 1e3, np.random.default_rng(0))
    if family == "nonsymmetric":
        assert not meta["symmetric"] and not np.array_equal(A, A.T)
    else:
        assert meta["symmetric"] and np.array_equal(A, A.T)


def _hp_eigvals(A: np.ndarray) -> np.ndarray:
    return reference.eigvalsh(A)


@pytest.mark.parametrize(
    "family,kappa,kw",
    [
        ("randsvd", 1e6, {}),
        ("randsvd1", 1e8, {}),
        ("randsvd2", 1e8, {}),
        ("randsvd4", 1e4, {}),
        ("randsvd5", 1e10, {}),
        ("clustered", 1e8, {"n_clusters": 3, "width": 1e-7}),
        ("near_repeated", 1e6, {"gap": 1e-9}),
        ("correlation", 1e5, {}),
        ("lowrank", 1e3, {"rank": 4, "eps": 1e-6}),
        ("randsvd", 1e15, {}),
    ],
)
def test_prescribed_spectrum(family, kappa, kw):
    """The float64 matrix has the prescribed eigenvalues up to Weyl's bound c n u lambda_max."""
    n = 10
    A, meta = matrices.generate(family, n, kappa, np.random.default_rng(1), **kw)
    assert meta["kappa_source"] == "prescribed"
    lam = np.sort(meta["eigenvalues"])
    assert lam.shape == (n,)
    hp = _hp_eigvals(A)
    assert np.max(np.abs(hp - lam)) <= 8 * n * U * lam.max()
    if family != "correlation":
        assert meta["kappa"] == pytest.approx(kappa if family != "lowrank" else (1 + 1e-6) / 1e-6, rel=1e-9)
    else:
        assert np.array_equal(np.diag(A), np.ones(n))
        assert lam.sum() == pytest.approx(n)
        assert meta["kappa"] == pytest.approx(kappa, rel=1e-9)


def test_clustered_and_near_repeated_structure():
    _, m = matrices.generate("clustered", 12, 1e6, np.random.default_rng(0), n_clusters=3, width=1e-8)
    lam = m["eigenvalues"]
    centres = np.geomspace(1.0, 1e-6, 3)
    assert all(np.min(np.abs(lam / c - 1)) <= 1e-8 for c in centres)
    assert lam.max() == 1.0 and lam.min() == 1e-6
    _, m = matrices.generate("near_repeated", 8, 1e4, np.random.default_rng(0), gap=1e-11)
    pairs = m["eigenvalues"].reshape(-1, 2)
    assert np.allclose(pairs[:, 1] / pairs[:, 0] - 1, 1e-11, rtol=1e-3, atol=0)


def test_lowrank_is_singular_without_eps():
    A, m = matrices.generate("lowrank", 10, 1e2, np.random.default_rng(0), rank=3)
    assert m["kappa"] == math.inf and m["kappa_nonzero"] == 1e2
    hp = _hp_eigvals(A)
    assert np.sum(np.abs(hp) > 1e-12) == 3
    assert np.max(np.abs(hp[:7])) <= 10 * 10 * U


def test_nonsymmetric_prescribed_complex_spectrum():
    n = 7
    A, m = matrices.generate("nonsymmetric", n, 1e3, np.random.default_rng(2), eigvec_cond=5.0)
    lam = np.asarray(m["eigenvalues"])
    assert m["kappa"] == pytest.approx(1e3, rel=1e-9)
    # off the closed negative real axis
    assert np.all((np.abs(lam.imag) > 0) | (lam.real > 0))
    assert np.all(np.abs(np.angle(lam)) <= m["max_angle"] + 1e-12)
    with mpmath.workdps(40):
        E, _ = mpmath.eig(mpmath.matrix(A.tolist()))
        hp = np.array([complex(x) for x in E])
    for x in lam:
        assert np.min(np.abs(hp - x)) <= 1e-12 * (1 + abs(x)) * 25


def test_tridiag_minij_pei_closed_forms_match_hp_eigensolver():
    for fam in ("tridiag", "minij", "pei"):
        A, m = matrices.generate(fam, 11)
        assert m["kappa_source"] == "closed_form"
        assert np.allclose(_hp_eigvals(A), m["eigenvalues"], rtol=8 * U * 11, atol=0), fam
    A, m = matrices.generate("pei", 6, 1e5)
    assert m["kappa"] == pytest.approx(1e5, rel=1e-12)
    assert np.allclose(_hp_eigvals(A), m["eigenvalues"], rtol=1e-14, atol=0)


@pytest.mark.parametrize("family", ["hilbert", "lehmer", "pascal", "moler", "kms"])
def test_gallery_computed_spectrum(family):
    A, m = matrices.generate(family, 10, None)
    assert m["kappa_source"] == "computed"
    hp = _hp_eigvals(A)
    assert np.allclose(m["eigenvalues"], hp, rtol=1e-13, atol=0)
    assert hp[0] > 0  # all these are SPD
    assert m["kappa"] == pytest.approx(hp[-1] / hp[0], rel=1e-12)


def test_gallery_entries():
    H, _ = matrices.generate("hilbert", 4)
    assert H[1, 2] == 1 / 4
    L, _ = matrices.generate("lehmer", 4)
    assert L[1, 3] == 2 / 4
    P, _ = matrices.generate("pascal", 5)
    assert P[2, 2] == 6 and P[4, 4] == 70
    M, _ = matrices.generate("moler", 4)
    assert M[3, 3] == 4 and M[0, 3] == -1 and M[1, 3] == 0  # min(i, j) - 2, 1-based
    K, m = matrices.generate("kms", 5, None, rho=0.25)
    assert K[0, 4] == 0.25**4 and m["rho"] == 0.25
    K, m = matrices.generate("kms", 6, 1e3)
    assert m["kappa"] == pytest.approx(1e3, rel=1e-6)
    assert matrices.generate("hilbert", 12)[1]["kappa"] > 1e16


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"unknown matrix family 'nope'; available: \[.*'hilbert'"):
        matrices.generate("nope", 4)
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        matrices.generate("randsvd", 0, 10.0, 0)
    with pytest.raises(ValueError, match=r"kappa must be a finite number >= 1, got 0\.5"):
        matrices.generate("randsvd", 4, 0.5, 0)
    with pytest.raises(ValueError, match=r"randsvd mode must be 1\.\.5, got 7"):
        matrices.generate("randsvd", 4, 10.0, 0, mode=7)
    with pytest.raises(ValueError, match=r"rank must be in 1\.\.4, got 5"):
        matrices.generate("lowrank", 4, 10.0, 0, rank=5)
    with pytest.raises(ValueError, match=r"max_angle must be in \[0, pi\), got 4\.0"):
        matrices.generate("nonsymmetric", 4, 10.0, 0, max_angle=4.0)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 8),
    log_kappa=st.floats(0, 10),
    mode=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_randsvd_property(n, log_kappa, mode, seed):
    kappa = 10.0**log_kappa
    A, m = matrices.randsvd(n, kappa, np.random.default_rng(seed), mode=mode)
    assert np.array_equal(A, A.T)
    lam = m["eigenvalues"]
    assert np.max(np.abs(np.linalg.eigvalsh(A) - lam)) <= 16 * n * U
    if n > 1:
        assert m["kappa"] == pytest.approx(kappa, rel=1e-9)


# ----------------------------------------------------------------------------------- Shampoo dumps
def _factors() -> list:
    rng = np.random.default_rng(0)
    out = []
    for k, d in enumerate((3, 5)):
        G = rng.standard_normal((d, 7))
        out.append(
            (
                G @ G.T,
                {
                    "param": "layer.weight",
                    "block": 0,
                    "dim": k,
                    "step": 100,
                    "beta2": 0.999,
                    "eps": 1e-12,
                    "shape": [3, 5],
                },
            )
        )
    return out


def test_shampoo_roundtrip(tmp_path):
    path = tmp_path / "factors_step00000100.npz"
    matrices.save_shampoo_factors(path, _factors())
    with np.load(path, allow_pickle=False) as z:  # the documented layout, read without matroots
        assert set(z.files) == {"factor_0", "factor_1", "meta", "format_version"}
        assert z["factor_1"].dtype == np.float64 and z["factor_1"].shape == (5, 5)
        assert json.loads(str(z["meta"][1]))["dim"] == 1
    loaded = matrices.load_shampoo_factors(path)
    assert len(loaded) == 2
    for (A, meta), (F, stored) in zip(loaded, _factors(), strict=True):
        assert np.array_equal(A, F)
        assert meta["family"] == "shampoo" and meta["source"] == path.name
        for key in ("param", "block", "dim", "step", "beta2", "eps", "shape"):
            assert meta[key] == stored[key]
        assert meta["kappa"] == pytest.approx(meta["eigenvalues"][-1] / meta["eigenvalues"][0])
    assert not list(tmp_path.glob("*.tmp"))


def test_shampoo_folder_and_errors(tmp_path):
    matrices.save_shampoo_factors(tmp_path / "a.npz", _factors()[:1])
    matrices.save_shampoo_factors(tmp_path / "b.npz", _factors())
    assert len(matrices.load_shampoo_factors(tmp_path)) == 3
    with pytest.raises(ValueError, match=r"factor 0: meta lacks \['block', 'dim', 'step', 'beta2', 'eps'\]"):
        matrices.save_shampoo_factors(tmp_path / "c.npz", [(np.eye(2), {"param": "x"})])
    with pytest.raises(FileNotFoundError):
        matrices.load_shampoo_factors(tmp_path / "empty_dir_does_not_exist")
    np.savez(tmp_path / "bad.npz", factor_0=np.eye(2))
    with pytest.raises(ValueError):
        matrices.load_shampoo_factors(tmp_path / "bad.npz")
