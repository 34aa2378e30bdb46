"""Tests of matroots.truth.metrics against values known in closed form (diagonal matrices, scalars)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from matroots.core.errors import UnsupportedDtypeError, UnsupportedExponentError
from matroots.truth import metrics, reference

U = 2.0**-53


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("MATROOTS_CACHE_DIR", str(tmp_path / "cache"))


def test_relative_forward_error_known_values():
    Xr = np.diag([1.0, 2.0, 4.0])
    X = Xr.copy()
    X[2, 2] = 4.0 * (1 + 1e-3)
    assert metrics.relative_forward_error(X, Xr) == pytest.approx(4e-3 / math.sqrt(21), rel=1e-12)
    assert metrics.relative_forward_error(X, Xr, norm=2) == pytest.approx(4e-3 / 4, rel=1e-12)
    assert metrics.relative_forward_error(torch.from_numpy(X).float(), Xr) == pytest.approx(
        float(np.linalg.norm(X.astype(np.float32).astype(float) - Xr) / np.linalg.norm(Xr))
    )
    assert metrics.relative_forward_error(Xr, Xr) == 0.0
    assert metrics.relative_forward_error(np.full((3, 3), np.nan), Xr) == math.inf
    batch = np.stack([Xr, X])
    assert metrics.relative_forward_error(batch, np.stack([Xr, Xr])) == metrics.relative_forward_error(X, Xr)
    with pytest.raises(ValueError, match="norm must be 'fro' or 2, got 1"):
        metrics.relative_forward_error(X, Xr, norm=1)


def test_forward_error_accepts_reference():
    ref = reference.inverse_root(np.diag([4.0, 16.0]), 2, cache=False)
    assert metrics.relative_forward_error(np.diag([0.5, 0.25]), ref) == 0.0


def test_residual_and_rational_p():
    A = np.diag([4.0, 9.0])
    X = np.diag([0.5, 1 / 3])
    assert metrics.residual(X, A, 2) <= 4 * U
    assert metrics.residual(X * (1 + 1e-6), A, 2) == pytest.approx(math.sqrt(2) * 2e-6, rel=1e-5)
    # p = 3/2: X = A^{-2/3}, X^3 A^2 = I
    A = np.diag([8.0, 27.0])
    X = np.diag([0.25, 1 / 9])
    assert metrics.residual(X, A, 1.5) <= 8 * U
    # eps: X = (A + eps I)^{-1}
    assert metrics.residual(np.diag([1 / 9.0, 1 / 28.0]), A, 1, eps=1.0) <= 4 * U
    with pytest.raises(UnsupportedExponentError):
        metrics.residual(X, A, -1)


@pytest.mark.parametrize("precise", [True, False])
def test_backward_error_diagonal(precise):
    if precise and not reference.flint_available():
        pytest.skip("python-flint not installed")
    a = np.array([1.0, 1e-6, 1e-10])
    A = np.diag(a)
    # X = (A + dA)^{-1/2} with dA = diag(0, 0, 1e-13): backward error 1e-13 / ||A||_F
    X = np.diag((a + np.array([0, 0, 1e-13])) ** -0.5)
    expected = 1e-13 / np.linalg.norm(a)
    tol = 1e-6 if precise else 1e-2
    assert metrics.backward_error(X, A, 2, precise=precise) == pytest.approx(expected, rel=tol)
    assert metrics.backward_error(np.zeros((3, 3)), A, 2, precise=precise) == math.inf


def test_backward_error_rational_p():
    A = np.diag([8.0, 27.0])
    X = np.diag([0.25, 1 / 9])  # A^{-2/3}
    assert metrics.backward_error(X, A, 1.5) <= 1e-14


def test_condition_number():
    assert metrics.condition_number(np.diag([1.0, 1e-16, 3.0])) == pytest.approx(3e16)
    assert metrics.condition_number(np.diag([1.0, 0.0])) == math.inf
    assert metrics.condition_number(np.diag([2.0, 1.0]), eps=1.0) == pytest.approx(1.5)
    # exactly symmetric, kappa 2^52, eigenvalues unresolved in float64: the high-precision path
    H = np.array([[1.0]])
    for _ in range(3):
        H = np.block([[H, H], [H, -H]])
    lam = 2.0 ** -np.array([0, 3, 9, 17, 25, 40, 47, 52])
    A = (H * lam) @ H.T / 8.0
    assert metrics.condition_number(A) == pytest.approx(2.0**52, rel=1e-10)
    # general matrix: singular values of [[1, 1e3], [0, 1]] are sqrt(s) with s the roots of
    # s^2 - (2 + 1e6) s + 1 = 0
    s = np.roots([1.0, -(2 + 1e6), 1.0])
    assert metrics.condition_number(np.array([[1.0, 1e3], [0.0, 1.0]])) == pytest.approx(
        math.sqrt(s.max() / s.min()), rel=1e-9
    )


def test_cond_rel_matches_frechet_derivative():
    """For diagonal A the Frechet derivative of A^{-1/p} in direction E_ij is f[l_i, l_j] E_ij: the
    worst direction is E_nn at lambda_min, so cond_rel = |f'(l_min)| ||A||_F / ||f(A)||_F."""
    lam = np.array([1.0, 1e-3, 1e-8])
    for p in (1, 2, 4):
        with mpmath.workdps(40):
            fprime = float(mpmath.mpf(1) / p * mpmath.mpf(lam[-1]) ** (-mpmath.mpf(1) / p - 1))
        expected = fprime * np.linalg.norm(lam) / np.linalg.norm(lam ** (-1.0 / p))
        assert metrics.cond_rel(np.diag(lam), p) == pytest.approx(expected, rel=1e-12)
        # and it is ~ kappa / p
        assert 0.1 < metrics.cond_rel(np.diag(lam), p) / (1e8 / p) < 10
    assert metrics.cond_rel(np.diag([1.0, -1.0]), 2) == math.inf
    # general input: a finite upper estimate at least the normal-case value of its eigenvalues
    B = np.array([[2.0, -1.0], [1.0, 2.0]])
    assert math.isfinite(metrics.cond_rel(B, 2)) and metrics.cond_rel(B, 2) > 0


def test_kappa_u_line():
    assert metrics.kappa_u_line(1e6, 2, "fp32") == pytest.approx(1e6 / 2 * 2.0**-24)
    assert metrics.kappa_u_line(1e3, 4, torch.bfloat16) == pytest.approx(1e3 / 4 * 2.0**-8)
    with pytest.raises(UnsupportedDtypeError):
        metrics.kappa_u_line(1.0, 2, "int8")


def test_representation_error():
    A = np.array([[1.0, 0.5], [0.25, 2.0]])
    assert metrics.representation_error(A, "bf16") == 0.0
    B = np.array([[1.0 + 2.0**-10]])  # bf16 keeps 8 significant bits: rounds to 1
    assert metrics.representation_error(B, "bf16") == pytest.approx(2.0**-10 / (1 + 2.0**-10))
    assert metrics.representation_error(B, "fp32") == 0.0
    big = np.array([[1e6 + 1.0]])
    assert metrics.representation_error(big, "fp16", scale_fp16=False) == math.inf
    assert metrics.representation_error(big, "fp16") < 2.0**-11


def test_symmetry_defect():
    A = np.array([[1.0, 2.0], [2.0 + 1e-8, 1.0]])
    assert metrics.symmetry_defect(A) == pytest.approx(math.sqrt(2) * 1e-8 / np.linalg.norm(A), rel=1e-6)
    assert metrics.symmetry_defect(np.eye(3)) == 0.0


def test_eps_bias_closed_form():
    lam = np.array([1.0, 1e-4, 1e-8])
    A = np.diag(lam)
    eps, p = 1e-8, 2
    with mpmath.workdps(40):
        d = [float((mpmath.mpf(x) + eps) ** -0.5 - mpmath.mpf(x) ** -0.5) for x in lam]
    expected = np.linalg.norm(d) / np.linalg.norm(lam**-0.5)
    assert metrics.eps_bias(A, p, eps) == pytest.approx(expected, rel=1e-12)
    assert metrics.eps_bias(A, p, 1e-8, "relative") == pytest.approx(expected, rel=1e-12)  # lambda_max = 1
    assert metrics.eps_bias(A, p, 0.0) == 0.0
    assert math.isnan(metrics.eps_bias(np.diag([1.0, 0.0]), 2, 1e-3))


def test_eps_bias_general_matrix_uses_references():
    # 2x2 rotation-scaling block r R(t) with its closed-form shifted root
    r, t, eps = 2.0, 0.8, 0.1
    A = r * np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])

    def inv_sqrt(M):
        w, V = np.linalg.eig(M)
        return np.real((V * w**-0.5) @ np.linalg.inv(V))

    expected = np.linalg.norm(inv_sqrt(A + eps * np.eye(2)) - inv_sqrt(A)) / np.linalg.norm(inv_sqrt(A))
    assert metrics.eps_bias(A, 2, eps) == pytest.approx(expected, rel=1e-10)


def test_all_metrics_keys_and_values():
    lam = np.array([1.0, 1e-2, 1e-6])
    A = np.diag(lam)
    eps = 1e-9
    ref = reference.inverse_root(A, 2, eps, cache=False)
    X = torch.from_numpy(ref.root).float()
    out = metrics.all_metrics(X, A, 2, ref=ref, eps=eps)
    expected_keys = {
        "relative_forward_error",
        "relative_forward_error_2",
        "residual",
        "backward_error",
        "condition_number",
        "cond_rel",
        "kappa_u_line",
        "cond_u_line",
        "representation_error",
        "symmetry_defect",
        "input_symmetry_defect",
        "eps_bias",
        "reference_error_bound",
    }
    assert set(out) == expected_keys
    assert out["cond_u_line"] == pytest.approx(out["cond_rel"] * 2.0**-24)
    assert all(isinstance(v, float) for v in out.values())
    assert out["relative_forward_error"] <= 2.0**-24
    assert out["condition_number"] == pytest.approx((1 + eps) / (1e-6 + eps), rel=1e-9)
    assert out["kappa_u_line"] == pytest.approx(out["condition_number"] / 2 * 2.0**-24)
    assert out["eps_bias"] == pytest.approx(metrics.eps_bias(A, 2, eps), rel=1e-12)
    assert out["reference_error_bound"] == ref.error_bound
    ref0 = reference.inverse_root(A, 2, cache=False)
    with_ref0 = metrics.all_metrics(ref.root, A, 2, ref=ref, eps=eps, ref0=ref0)
    assert with_ref0["eps_bias"] == pytest.approx(out["eps_bias"], rel=1e-6)
    assert with_ref0["relative_forward_error"] == 0.0


def test_metric_parts_on_a_diagonal_closed_form() -> None:
    """matrix/dtype/root metrics against closed forms on a diagonal SPD matrix; all_metrics is their union."""
    lam = np.array([1e-6, 1e-3, 1.0, 4.0])
    A, p, e = np.diag(lam), 2, 1e-6
    ref = reference.inverse_root(A, p, e, backend="mpmath")
    ref0 = reference.inverse_root(A, p, 0.0, backend="mpmath")
    X = np.diag((lam + e) ** -0.5)
    rm = metrics.root_metrics(X, A, p, ref=ref, eps=e)
    assert rm["relative_forward_error"] < 1e-15 and rm["residual"] < 1e-13 and rm["symmetry_defect"] == 0
    mm = metrics.matrix_metrics(A, p, ref=ref, eps=e, ref0=ref0)
    assert mm["condition_number"] == pytest.approx((4 + e) / (1e-6 + e), rel=1e-12)
    mp_bias = mpmath.sqrt(
        sum((1 / mpmath.sqrt(mpmath.mpf(x) + e) - 1 / mpmath.sqrt(mpmath.mpf(x))) ** 2 for x in lam)
    )
    mp_bias /= mpmath.sqrt(sum(1 / mpmath.mpf(x) for x in lam))
    assert mm["eps_bias"] == pytest.approx(float(mp_bias), rel=1e-10)
    assert metrics.matrix_metrics(A, p, ref=ref, eps=e)["eps_bias"] == pytest.approx(
        float(mp_bias), rel=1e-10
    )
    dm = metrics.dtype_metrics(A, p, mm["condition_number"], torch.float32, cond=mm["cond_rel"])
    assert dm["kappa_u_line"] == pytest.approx(mm["condition_number"] / 2 * 2.0**-24)
    assert dm["representation_error"] > 0  # 1e-3 and 1e-6 are not fp32 numbers
    union = {**rm, **mm, **dm}
    full = metrics.all_metrics(X, A, p, ref=ref, eps=e, dtype=torch.float32, ref0=ref0)
    assert full.keys() == union.keys()
    for k, v in union.items():
        assert full[k] == pytest.approx(v, rel=1e-12, nan_ok=True), k


def test_info_per_element_broadcasts_checks_length_and_fills_missing():
    from matroots.core.result import info_per_element

    assert info_per_element(None, 3) == [0.0, 0.0, 0.0]
    assert (
        info_per_element(None, 2, missing=float("nan"))[0]
        != info_per_element(None, 2, missing=float("nan"))[0]
    )
    assert info_per_element(2.5, 2) == [2.5, 2.5]
    assert info_per_element(torch.tensor([1.0, 2.0], dtype=torch.float32), 2) == [1.0, 2.0]
    assert info_per_element(torch.tensor(4.0), 3) == [4.0, 4.0, 4.0]
    assert info_per_element(np.array([1, 2, 3]), 3) == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="3 elements for a batch of 2"):
        info_per_element([1.0, 2.0, 3.0], 2)
    with pytest.raises(ValueError, match="must be a number"):
        info_per_element("abc", 3)
