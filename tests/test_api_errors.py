"""Bad input: one test per class, each a typed MatrootsError (a ValueError) with a useful message.

Also: non-convergence is never silent (ConvergenceWarning, or ConvergenceError with strict=True).
"""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from _refs import spd_matrix

import matroots
from matroots import (
    ConvergenceError,
    ConvergenceWarning,
    EmptyMatrixError,
    FormatRangeError,
    MatrootsError,
    NegativeRealEigenvalueError,
    NonFiniteInputError,
    NotPositiveDefiniteError,
    NotSquareError,
    NotSymmetricError,
    UnsupportedDtypeError,
    UnsupportedExponentError,
)

METHODS = ("eigh", "coupled_newton", "schur_newton")
NEWTON = ("coupled_newton", "schur_newton")


def _spd(n: int = 6) -> torch.Tensor:
    return torch.from_numpy(spd_matrix(n, 10.0, seed=0))


def test_every_error_is_a_matroots_value_error():
    for cls in (
        ConvergenceError,
        EmptyMatrixError,
        NegativeRealEigenvalueError,
        NonFiniteInputError,
        NotPositiveDefiniteError,
        NotSquareError,
        NotSymmetricError,
        UnsupportedDtypeError,
        UnsupportedExponentError,
    ):
        assert issubclass(cls, MatrootsError) and issubclass(cls, ValueError)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", [(4,), (), (3, 4), (2, 3, 4)])
def test_not_2d_or_not_square(method, shape):
    with pytest.raises(NotSquareError, match="shape"):
        matroots.inverse_root(torch.ones(shape, dtype=torch.float64), 2, method=method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", [(0, 0), (3, 0, 0), (0, 4, 4)])
def test_empty(method, shape):
    with pytest.raises(EmptyMatrixError, match="zero-sized"):
        matroots.inverse_root(torch.ones(shape, dtype=torch.float64), 2, method=method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_inf(method, bad):
    A = _spd()
    A[1, 2] = bad
    with pytest.raises(NonFiniteInputError, match="non-finite"):
        matroots.inverse_root(A, 2, method=method)


@pytest.mark.parametrize("method", METHODS)
def test_overflow_when_rounded_to_the_working_format(method):
    A = _spd() * 1e300
    with pytest.raises(FormatRangeError, match="rounded to fp32"):
        matroots.inverse_root(A, 2, method=method, dtype=torch.float32)


def test_nonsymmetric_input_to_eigh_reports_defect_and_tol():
    A = _spd()
    A[0, 1] += 1e-3
    with pytest.raises(NotSymmetricError) as info:
        matroots.inverse_root(A, 2, method="eigh")
    msg = str(info.value)
    defect = float(torch.linalg.matrix_norm(A - A.T) / torch.linalg.matrix_norm(A))
    assert f"{defect:.3e}" in msg  # the measured defect
    tol = matroots.core.inputs.default_symmetry_tol(A)
    assert f"{tol:.3e}" in msg  # and the tolerance used
    assert "schur_newton" in msg  # what to do instead


@pytest.mark.parametrize("scaling", ("optimal", "power", "dynamic"))
def test_nonsymmetric_input_to_spd_scalings(scaling):
    A = _spd()
    A[0, 1] += 1e-3
    with pytest.raises(NotSymmetricError, match="frobenius"):
        matroots.inverse_root(A, 2, method="coupled_newton", scaling=scaling)


def _indefinite(n: int = 8) -> torch.Tensor:
    rng = np.random.default_rng(1)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    lam = np.linspace(-0.3, 2.0, n)
    A = (Q * lam) @ Q.T
    return torch.from_numpy(0.5 * (A + A.T))


@pytest.mark.parametrize(
    "method,opts",
    [
        ("eigh", {}),
        ("schur_newton", {}),
        ("coupled_newton", {"scaling": "optimal"}),  # Lanczos proves it before iterating
        ("coupled_newton", {"scaling": "frobenius"}),  # found when the iteration diverges
    ],
)
def test_not_positive_definite_after_regularisation(method, opts):
    with pytest.raises(NotPositiveDefiniteError, match="eps") as info:
        matroots.inverse_root(_indefinite(), 2, method=method, eps=0.1, **opts)
    assert "-2.000e-01" in str(info.value)  # the offending eigenvalue: -0.3 + eps
    # enough eps makes it positive definite
    res = matroots.inverse_root(_indefinite(), 2, method=method, eps=0.5, **opts)
    assert res.all_converged


@pytest.mark.parametrize("policy", ("clamp", "pseudo_inverse"))
def test_indefinite_is_accepted_by_clamp_and_pseudo_inverse(policy):
    res = matroots.inverse_root(_indefinite(), 2, method="eigh", rank_policy=policy, atol=1e-3)
    assert bool(torch.isfinite(res.root).all())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("p", (0, -1, -0.5, Fraction(-1, 2), float("nan"), float("inf")))
def test_p_not_positive(method, p):
    with pytest.raises(UnsupportedExponentError, match="p"):
        matroots.inverse_root(_spd(), p, method=method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("p", ("2", None, True, 2 + 0j))
def test_p_of_the_wrong_type(method, p):
    with pytest.raises(UnsupportedExponentError):
        matroots.inverse_root(_spd(), p, method=method)


@pytest.mark.parametrize("method", NEWTON)
@pytest.mark.parametrize("p", (2.5, Fraction(3, 2), 0.5))
def test_non_integer_p_for_newton_methods(method, p):
    with pytest.raises(UnsupportedExponentError, match="eigh"):
        matroots.inverse_root(_spd(), p, method=method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "A",
    [
        torch.eye(4, dtype=torch.int64),
        torch.eye(4, dtype=torch.complex128),
        np.eye(4, dtype=np.int32),
        np.eye(4, dtype=np.complex64),
        np.eye(4, dtype=bool),
    ],
    ids=["torch-int", "torch-complex", "numpy-int", "numpy-complex", "numpy-bool"],
)
def test_integer_or_complex_input_dtype(method, A):
    with pytest.raises(UnsupportedDtypeError, match="float"):
        matroots.inverse_root(A, 2, method=method)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.complex64, "int8", np.complex128, "float8"])
def test_integer_or_complex_working_dtype(method, dtype):
    with pytest.raises(UnsupportedDtypeError):
        matroots.inverse_root(_spd(), 2, method=method, dtype=dtype)


def _negative_real_eigenvalue() -> torch.Tensor:
    rng = np.random.default_rng(2)
    V = np.eye(5) + 0.3 * rng.standard_normal((5, 5))
    return torch.from_numpy(V @ np.diag([1.0, 2.0, -0.5, 3.0, 0.7]) @ np.linalg.inv(V))


def test_negative_real_eigenvalue_for_schur_newton():
    with pytest.raises(NegativeRealEigenvalueError, match="negative real axis"):
        matroots.inverse_root(_negative_real_eigenvalue(), 3, method="schur_newton")


def test_negative_real_eigenvalue_for_coupled_newton_on_general_input():
    with pytest.raises(NegativeRealEigenvalueError, match="negative real axis"):
        matroots.inverse_root(_negative_real_eigenvalue(), 3, method="coupled_newton", scaling="frobenius")


@pytest.mark.parametrize("method", NEWTON)
def test_zero_eigenvalue_is_on_the_closed_axis(method):
    A = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 3.0]], dtype=torch.float64)
    opts = {"scaling": "frobenius"} if method == "coupled_newton" else {}
    with pytest.raises(NegativeRealEigenvalueError, match=r"0\.000e\+00"):
        matroots.inverse_root(A, 2, method=method, **opts)


def _slow_case() -> torch.Tensor:
    return torch.from_numpy(spd_matrix(10, 1e8, seed=3))


@pytest.mark.parametrize("method", NEWTON)
def test_non_convergence_warns(method):
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        res = matroots.inverse_root(_slow_case(), 2, method=method, max_iter=2)
    assert res.converged is False
    assert res.info["stop_reason"] == ["max_iter"]
    assert bool(torch.isfinite(res.root).all())


@pytest.mark.parametrize("method", NEWTON)
def test_non_convergence_raises_with_strict(method):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # strict raises instead of warning
        with pytest.raises(ConvergenceError, match="did not converge") as info:
            matroots.inverse_root(_slow_case(), 2, method=method, max_iter=2, strict=True)
    partial = info.value.result
    assert isinstance(partial, matroots.RootResult) and partial.converged is False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"eps": -1.0},
        {"eps": float("nan")},
        {"eps_mode": "percent"},
        {"tol": 0.0},
        {"max_iter": 0},
        {"max_iter": 2.5},
    ],
)
def test_bad_solver_arguments(kwargs):
    with pytest.raises(ValueError):
        matroots.inverse_root(_spd(), 2, method="coupled_newton", **kwargs)


def test_unknown_method_and_option():
    with pytest.raises(MatrootsError, match="available"):
        matroots.inverse_root(_spd(), 2, method="no_such_method")
    with pytest.raises(MatrootsError, match="bad options"):
        matroots.inverse_root(_spd(), 2, method="eigh", no_such_option=1)
    with pytest.raises(ValueError, match="scaling"):
        matroots.CoupledNewtonConfig(scaling="fastest")
    with pytest.raises(ValueError, match="rank_policy"):
        matroots.EighConfig(rank_policy="ignore")


def test_registry_lists_the_three_methods():
    assert {"eigh", "coupled_newton", "schur_newton"} <= set(matroots.solvers.available())
