"""Tests of matroots.truth.reference against independent closed forms, across backends and precisions.

Closed forms are evaluated with mpmath scalars (never with the code under test): diagonal matrices,
c I, tridiag(-1, 2, -1) with its analytic eigenvectors, 2x2 rotation-scaling blocks, and matrices
H diag(2^-e) H^T / 8 that are exact in float64 (H an 8 x 8 Hadamard matrix, so H H^T = 8 I).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

from matroots.core.errors import (
    EmptyMatrixError,
    InvalidArgumentError,
    NegativeRealEigenvalueError,
    NonFiniteInputError,
    NotPositiveDefiniteError,
    NotSquareError,
    NotSymmetricError,
    UnsupportedExponentError,
)
from matroots.study import matrices
from matroots.truth import reference

U = 2.0**-53
BACKENDS = ["flint", "mpmath"] if reference.flint_available() else ["mpmath"]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))


def rel(X: np.ndarray, Y: np.ndarray) -> float:
    return float(np.linalg.norm(X - Y) / np.linalg.norm(Y))


def mp_pow(x: float | complex, q: Fraction) -> complex:
    with mpmath.workdps(50):
        return complex(mpmath.exp(mpmath.mpf(q.numerator) / q.denominator * mpmath.log(mpmath.mpmathify(x))))


def hadamard8() -> np.ndarray:
    H = np.array([[1.0]])
    for _ in range(3):
        H = np.block([[H, H], [H, -H]])
    return H


def exact_hadamard_matrix(exponents: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A = H diag(2^-e) H^T / 8, exact in float64 when the exponents span <= 52 bits."""
    H = hadamard8()
    lam = np.array([2.0**-e for e in exponents])
    A = (H * lam) @ H.T / 8.0
    # exactness check independent of the code under test: rational arithmetic
    from fractions import Fraction as F

    for i in range(8):
        for j in range(8):
            exact = sum(F(int(H[i, k] * H[j, k])) * F(lam[k]) for k in range(8)) / 8
            assert F(A[i, j]) == exact
    return A, lam


def hadamard_closed_form(lam: np.ndarray, q: Fraction) -> np.ndarray:
    H = hadamard8()
    with mpmath.workdps(60):
        f = [mpmath.exp(mpmath.mpf(q.numerator) / q.denominator * mpmath.log(mpmath.mpf(x))) for x in lam]
        return np.array(
            [
                [float(mpmath.fsum(H[i, k] * H[j, k] * f[k] for k in range(8)) / 8) for j in range(8)]
                for i in range(8)
            ]
        )


def tridiag_closed_form(n: int, q: Fraction) -> np.ndarray:
    """(tridiag(-1,2,-1))^q from v_k(i) = sqrt(2/(n+1)) sin(i k pi/(n+1)), lambda_k = 4 sin^2(k pi/(2(n+1)))."""
    with mpmath.workdps(60):
        h = mpmath.mpf(1) / (n + 1)
        lam = [4 * mpmath.sin(k * mpmath.pi * h / 2) ** 2 for k in range(1, n + 1)]
        f = [mpmath.exp(mpmath.mpf(q.numerator) / q.denominator * mpmath.log(x)) for x in lam]
        V = [
            [mpmath.sqrt(2 * h) * mpmath.sin(i * k * mpmath.pi * h) for k in range(1, n + 1)]
            for i in range(1, n + 1)
        ]
        return np.array(
            [
                [float(mpmath.fsum(V[i][k] * f[k] * V[j][k] for k in range(n))) for j in range(n)]
                for i in range(n)
            ]
        )


# ----------------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [1, 2, 4, Fraction(3, 2)])
def test_diagonal_closed_form_up_to_kappa_1e16(backend, p):
    d = np.array([1.0, 0.37, 1e-4, 3e-9, 1e-12, 1e-16])
    ref = reference.inverse_root(np.diag(d), p, backend=backend, cache=False)
    q = -1 / Fraction(p)
    expected = np.diag([mp_pow(x, q).real for x in d])
    assert rel(ref.root, expected) <= 2 * U
    assert np.max(np.abs(ref.root - np.diag(np.diag(ref.root)))) == 0 or backend == "flint"
    assert ref.error_bound <= 1e-20
    assert ref.kappa == pytest.approx(1e16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_identity_repeated_eigenvalue(backend):
    c = 7.25
    for p in (2, 3):
        ref = reference.inverse_root(c * np.eye(9), p, backend=backend, cache=False)
        assert rel(ref.root, mp_pow(c, Fraction(-1, p)).real * np.eye(9)) <= 2 * U
        fwd = reference.root(c * np.eye(9), p, backend=backend, cache=False)
        assert rel(fwd.root, mp_pow(c, Fraction(1, p)).real * np.eye(9)) <= 2 * U


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [2, 4])
def test_tridiag_closed_form(backend, p):
    n = 10
    A, _ = matrices.generate("tridiag", n)
    ref = reference.inverse_root(A, p, backend=backend, cache=False)
    assert rel(ref.root, tridiag_closed_form(n, Fraction(-1, p))) <= 4 * U
    fwd = reference.root(A, p, backend=backend, cache=False)
    assert rel(fwd.root, tridiag_closed_form(n, Fraction(1, p))) <= 4 * U


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_hadamard_kappa_4e15(backend):
    A, lam = exact_hadamard_matrix([0, 1, 7, 13, 20, 33, 45, 52])  # kappa = 2^52
    for p in (2, 4):
        ref = reference.inverse_root(A, p, backend=backend, cache=False)
        assert rel(ref.root, hadamard_closed_form(lam, Fraction(-1, p))) <= 4 * U
        assert ref.kappa == pytest.approx(2.0**52, rel=1e-12)


def rotation_scaling(r: float, t: float) -> np.ndarray:
    return r * np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])


def rotation_root(r: float, t: float, q: Fraction) -> np.ndarray:
    """(r R(t))^q = r^q R(q t) for |t| < pi (principal branch), in mpmath."""
    with mpmath.workdps(50):
        rq = mpmath.mpf(r) ** (mpmath.mpf(q.numerator) / q.denominator)
        a = mpmath.mpf(q.numerator) / q.denominator * mpmath.mpf(t)
        return np.array(
            [
                [float(rq * mpmath.cos(a)), float(-rq * mpmath.sin(a))],
                [float(rq * mpmath.sin(a)), float(rq * mpmath.cos(a))],
            ]
        )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [0.3, 2.0, 3.1])
def test_rotation_scaling_block(backend, t):
    r = 2.5
    A = rotation_scaling(r, t)
    for p in (2, 3):
        ref = reference.inverse_root(A, p, backend=backend, cache=False)
        assert not ref.symmetric
        assert rel(ref.root, rotation_root(r, t, Fraction(-1, p))) <= 4 * U
        fwd = reference.root(A, p, backend=backend, cache=False)
        assert rel(fwd.root, rotation_root(r, t, Fraction(1, p))) <= 4 * U


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_diagonal_rotations_with_permutation(backend):
    blocks = [(1.0, 0.5), (0.01, 2.5), (3.0, -1.0)]
    n = 7
    A = np.zeros((n, n))
    X = np.zeros((n, n))
    for b, (r, t) in enumerate(blocks):
        A[2 * b : 2 * b + 2, 2 * b : 2 * b + 2] = rotation_scaling(r, t)
        X[2 * b : 2 * b + 2, 2 * b : 2 * b + 2] = rotation_root(r, t, Fraction(-1, 2))
    A[6, 6], X[6, 6] = 0.25, 2.0
    P = np.eye(n)[[3, 0, 6, 1, 5, 2, 4]]  # exact similarity
    ref = reference.inverse_root(P @ A @ P.T, 2, backend=backend, cache=False)
    assert rel(ref.root, P @ X @ P.T) <= 4 * U


def test_repeated_complex_eigenvalues_fall_back_to_mpmath():
    """Arb cannot isolate repeated eigenvalues of a general matrix: the fallback is recorded."""
    if not reference.flint_available():
        pytest.skip("python-flint not installed")
    B = rotation_scaling(1.5, 0.7)
    A = np.block([[B, np.zeros((2, 2))], [np.zeros((2, 2)), B]])
    A[0, 3] = 0.0
    ref = reference.inverse_root(A, 2, backend="auto", cache=False)
    assert ref.backend == "mpmath" and "fell back" in ref.method_notes
    Xb = rotation_root(1.5, 0.7, Fraction(-1, 2))
    expected = np.block([[Xb, np.zeros((2, 2))], [np.zeros((2, 2)), Xb]])
    assert rel(ref.root, expected) <= 4 * U


# ------------------------------------------------------------------------ backends and precisions
def _cases() -> list[tuple[str, np.ndarray, float]]:
    """>= 20 matrices across the families: (label, A, eps)."""
    rng_cases = [
        ("randsvd3_1e4", "randsvd", 8, 1e4, {}, 0.0),
        ("randsvd3_1e12", "randsvd", 8, 1e12, {}, 0.0),
        ("randsvd1_1e8", "randsvd1", 7, 1e8, {}, 0.0),
        ("randsvd2_1e6", "randsvd2", 7, 1e6, {}, 0.0),
        ("randsvd4_1e10", "randsvd4", 6, 1e10, {}, 0.0),
        ("randsvd5_1e14", "randsvd5", 6, 1e14, {}, 0.0),
        ("randsvd3_1e16_eps", "randsvd", 8, 1e16, {}, 1e-15),
        ("clustered_1e8", "clustered", 9, 1e8, {"width": 1e-9}, 0.0),
        ("near_repeated_1e12", "near_repeated", 8, 1e6, {"gap": 1e-12}, 0.0),
        ("correlation_1e6", "correlation", 8, 1e6, {}, 0.0),
        ("lowrank_eps", "lowrank", 8, 1e4, {"rank": 3}, 1e-10),
        ("lowrank_eps_tiny", "lowrank", 6, 1e2, {"rank": 2}, 1e-14),
        ("nonsym_1e2", "nonsymmetric", 6, 1e2, {}, 0.0),
        ("nonsym_1e6", "nonsymmetric", 7, 1e6, {"eigvec_cond": 100.0}, 0.0),
        ("nonsym_eps", "nonsymmetric", 5, 1e3, {}, 1e-3),
    ]
    out = []
    for label, fam, n, kappa, kw, eps in rng_cases:
        A, _ = matrices.generate(fam, n, kappa, np.random.default_rng(7), **kw)
        out.append((label, A, eps))
    for fam, n in [
        ("hilbert", 12),
        ("lehmer", 8),
        ("pascal", 8),
        ("minij", 8),
        ("moler", 8),
        ("pei", 6),
        ("kms", 8),
    ]:
        out.append((fam, matrices.generate(fam, n)[0], 0.0))
    out.append(("diag_1e16", np.diag(np.geomspace(1.0, 1e-16, 6)), 0.0))
    return out


CASES = _cases()


@pytest.mark.parametrize("label,A,eps", CASES, ids=[c[0] for c in CASES])
def test_backends_agree_and_self_agree_at_two_precisions(label, A, eps):
    assert len(CASES) >= 20
    p = 2
    refs = {}
    for backend in BACKENDS:
        r = reference.inverse_root(A, p, eps, backend=backend, cache=False)
        assert r.error_bound <= 1e-20, (backend, r.error_bound, r.method_notes)
        hi = reference.inverse_root(A, p, eps, backend=backend, digits=2 * r.digits, cache=False)
        assert rel(r.root, hi.root) <= 4 * U, backend
        refs[backend] = r
    if len(refs) == 2:
        assert rel(refs["flint"].root, refs["mpmath"].root) <= 4 * U


@pytest.mark.slow
@pytest.mark.parametrize("fam,kappa", [("randsvd", 1e12), ("clustered", 1e10), ("randsvd2", 1e8)])
def test_flint_mpmath_agree_at_n24(fam, kappa):
    if not reference.flint_available():
        pytest.skip("python-flint not installed")
    A, _ = matrices.generate(fam, 24, kappa, np.random.default_rng(3))
    a = reference.inverse_root(A, 4, backend="flint", cache=False)
    b = reference.inverse_root(A, 4, backend="mpmath", cache=False)
    assert rel(a.root, b.root) <= 4 * U


def test_hilbert12_is_kappa_1e16():
    ref = reference.inverse_root(matrices.generate("hilbert", 12)[0], 2, cache=False)
    assert 1e16 < ref.kappa < 1e17


def test_digits_rule_documented_values():
    assert reference.default_digits(1.0, 1) == reference.TARGET_DIGITS + reference.GUARD_DIGITS
    assert reference.default_digits(1e16, 100) == 20 + 16 + 2 + 5
    assert reference.default_digits(1e16, 100, eigvec_cond=1e3) == 20 + 16 + 3 + 2 + 5
    assert reference.default_digits(math.inf, 10) <= reference.MAX_DIGITS


def test_explicit_digits_are_used():
    A = matrices.generate("tridiag", 6)[0]
    r = reference.inverse_root(A, 2, digits=60, backend="mpmath", cache=False)
    assert r.digits >= 60
    if reference.flint_available():
        assert reference.inverse_root(A, 2, digits=60, backend="flint", cache=False).digits == 60


def test_inputs_convert_exactly():
    A = np.diag([2.0, 3.0, 5.0]).astype(np.float32)
    r32 = reference.inverse_root(torch.from_numpy(A), 2, cache=False)
    r64 = reference.inverse_root(A.astype(np.float64), 2, cache=False)
    assert np.array_equal(r32.root, r64.root)
    ri = reference.inverse_root(np.array([[4, 0], [0, 9]]), 2, cache=False)
    assert np.allclose(ri.root, np.diag([0.5, 1 / 3]), rtol=0, atol=1e-16)


def test_eps_is_added_exactly():
    """A + eps I with eps far below u ||A||: float64 would lose it, the reference must not."""
    eps = 2.0**-70
    ref = reference.inverse_root(np.diag([1.0, 1e-30]), 1, eps, cache=False)
    with mpmath.workdps(60):
        expected = float(1 / (mpmath.mpf(1e-30) + mpmath.mpf(eps)))
    assert ref.root[1, 1] == pytest.approx(expected, rel=4 * U)
    assert ref.root[0, 0] == 1.0  # 1/(1 + 2^-70) rounds to 1


def test_batch_input():
    A = np.stack([np.diag([1.0, 4.0]), np.diag([9.0, 16.0])])
    ref = reference.inverse_root(A, 2, cache=False)
    assert ref.root.shape == (2, 2, 2)
    assert np.allclose(ref.root[1], np.diag([1 / 3, 0.25]), rtol=0, atol=1e-16)


def test_symmetric_flag():
    A = np.array([[2.0, 1.0], [0.5, 3.0]])
    with pytest.raises(NotSymmetricError):
        reference.inverse_root(A, 2, symmetric=True, cache=False)
    S = matrices.generate("tridiag", 4)[0]
    a = reference.inverse_root(S, 2, symmetric=False, cache=False)
    assert not a.symmetric and rel(a.root, tridiag_closed_form(4, Fraction(-1, 2))) <= 4 * U


def test_eigvalsh_closed_form():
    n = 12
    lam = reference.eigvalsh(matrices.generate("tridiag", n)[0])
    with mpmath.workdps(40):
        exact = [float(4 * mpmath.sin(k * mpmath.pi / (2 * (n + 1))) ** 2) for k in range(1, n + 1)]
    assert np.allclose(lam, exact, rtol=4 * U, atol=0)
    assert reference.eigvalsh(np.diag([-1.0, 2.0]))[0] == -1.0


# ----------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_raises_typed_errors(backend):
    with pytest.raises(NonFiniteInputError):
        reference.inverse_root(np.array([[1.0, np.nan], [0.0, 1.0]]), 2, backend=backend)
    with pytest.raises(NotSquareError):
        reference.inverse_root(np.ones((2, 3)), 2, backend=backend)
    with pytest.raises(EmptyMatrixError):
        reference.inverse_root(np.ones((0, 0)), 2, backend=backend)
    for p in (0, -2, 0.0, float("nan")):
        with pytest.raises(UnsupportedExponentError):
            reference.inverse_root(np.eye(2), p, backend=backend)
    with pytest.raises(InvalidArgumentError, match=r"eps must be a finite number >= 0, got -1\.0"):
        reference.inverse_root(np.eye(2), 2, -1.0, backend=backend)
    # symmetric with a negative eigenvalue: both error types
    with pytest.raises(NegativeRealEigenvalueError) as info:
        reference.inverse_root(np.diag([1.0, -2.0]), 2, backend=backend, cache=False)
    assert isinstance(info.value, NotPositiveDefiniteError)
    # singular symmetric matrix (zero eigenvalue on the closed negative real axis)
    with pytest.raises(NegativeRealEigenvalueError):
        reference.inverse_root(np.diag([1.0, 0.0]), 2, backend=backend, cache=False)
    # general matrix with a real negative eigenvalue (-1 and 2)
    with pytest.raises(NegativeRealEigenvalueError):
        reference.inverse_root(np.array([[-1.0, 1.0], [0.0, 2.0]]), 2, backend=backend, cache=False)


def test_unknown_backend():
    with pytest.raises(
        InvalidArgumentError, match=r"backend must be one of \('auto', 'flint', 'mpmath'\), got 'lapack'"
    ):
        reference.inverse_root(np.eye(2), 2, backend="lapack")


# ------------------------------------------------------------------------------------------ cache
def _entries(tmp_path) -> list:
    return sorted((tmp_path / "cache" / "references").rglob("*.npz"))


def test_cache_dir_env_override(tmp_path):
    assert reference.cache_dir() == tmp_path / "cache"


def test_cache_hit_returns_identical_bytes(tmp_path):
    A, _ = matrices.generate("randsvd", 6, 1e6, np.random.default_rng(1))
    first = reference.inverse_root(A, 4)
    assert not first.cached and len(_entries(tmp_path)) == 1
    second = reference.inverse_root(A, 4)
    assert second.cached
    assert first.root.tobytes() == second.root.tobytes()
    assert (first.error_bound, first.digits, first.backend) == (
        second.error_bound,
        second.digits,
        second.backend,
    )
    # a different p, eps or digits is a different entry
    reference.inverse_root(A, 2)
    reference.inverse_root(A, 4, 1e-9)
    assert len(_entries(tmp_path)) == 3


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupted_entry_is_recomputed(tmp_path, caplog, damage):
    A, _ = matrices.generate("randsvd", 5, 1e3, np.random.default_rng(2))
    first = reference.inverse_root(A, 2)
    (path,) = _entries(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 3]
    else:
        data = bytearray(b"not an npz file")
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="matroots.truth.reference"):
        again = reference.inverse_root(A, 2)
    assert not again.cached
    assert "corrupted" in caplog.text
    assert again.root.tobytes() == first.root.tobytes()
    assert reference.inverse_root(A, 2).cached  # the rewritten entry is good


def test_tampered_payload_fails_checksum(tmp_path, caplog):
    A = np.diag([2.0, 3.0])
    first = reference.inverse_root(A, 2)
    (path,) = _entries(tmp_path)
    with np.load(path) as z:
        payload = {k: z[k] for k in z.files}
    payload["root"] = payload["root"] * 2  # a valid npz with a wrong root
    with open(path, "wb") as fh:
        np.savez(fh, **payload)
    with caplog.at_level(logging.WARNING, logger="matroots.truth.reference"):
        again = reference.inverse_root(A, 2)
    assert not again.cached and np.array_equal(again.root, first.root)


def _worker(args: tuple[str, int]) -> bytes:
    cache, seed = args
    os.environ["MATROOTS_CACHE_DIR"] = cache
    A, _ = matrices.generate("randsvd", 10, 1e8, np.random.default_rng(seed))
    return reference.inverse_root(A, 2, backend="mpmath").root.tobytes()


def test_concurrent_writers_do_not_corrupt(tmp_path):
    cache = str(tmp_path / "cache")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        results = pool.map(_worker, [(cache, 11)] * 8)
    assert len(set(results)) == 1
    entries = _entries(tmp_path)
    assert len(entries) == 1
    assert not list((tmp_path / "cache").rglob("*.tmp"))
    A, _ = matrices.generate("randsvd", 10, 1e8, np.random.default_rng(11))
    hit = reference.inverse_root(A, 2, backend="mpmath")
    assert hit.cached and hit.root.tobytes() == results[0]


def test_unwritable_cache_still_computes(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(blocker))  # a file, not a folder
    with caplog.at_level(logging.WARNING, logger="matroots.truth.reference"):
        ref = reference.inverse_root(np.diag([4.0]), 2)
    assert ref.root[0, 0] == 0.5


def test_auto_backend_without_flint(monkeypatch):
    monkeypatch.setattr(reference, "flint_available", lambda: False)
    ref = reference.inverse_root(np.diag([4.0, 9.0]), 2, cache=False)
    assert ref.backend == "mpmath"
    with pytest.raises(InvalidArgumentError, match="python-flint"):
        reference.inverse_root(np.diag([4.0, 9.0]), 2, backend="flint", cache=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("e", [-1000, 1000])
def test_extreme_scaling(backend, e):
    """(2^e T)^{-1/2} = 2^{-e/2} T^{-1/2}: exact scalings near the float64 range limits."""
    T = matrices.generate("tridiag", 5)[0]
    ref = reference.inverse_root(2.0**e * T, 2, backend=backend, cache=False)
    assert rel(ref.root, 2.0 ** (-e / 2) * tridiag_closed_form(5, Fraction(-1, 2))) <= 4 * U
    assert ref.error_bound <= 1e-20


def test_flint_relative_radius_is_inf_without_overflow_when_the_ball_holds_zero() -> None:
    """The certified relative radius err / (mid - err): a ball as wide as its midpoint's norm holds the
    zero matrix, so nothing is certified (inf, and the caller raises PrecisionTooLow), with no numpy
    overflow warning (the old err / max(mid - err, tiny) divided 1e300 by 2.2e-308)."""
    import warnings

    if not reference.flint_available():
        pytest.skip("python-flint not installed")
    from matroots.truth._ref_flint import _relative_radius

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _relative_radius(1.0, 3.0) == 0.5
        assert _relative_radius(0.0, 2.0) == 0.0
        assert _relative_radius(1e300, 1e300) == math.inf
        assert _relative_radius(2.0, 1.0) == math.inf
