"""Conditioning-aware accuracy: every converged root is within C sqrt(n) (cond(f, A) + 1) u of the truth.

cond(f, A) is the relative condition number of the root actually asked for (forward A^{1/p} or inverse
A^{-1/p}), :func:`matroots.core.conditioning.cond_root`, of the matrix actually solved (the input rounded to
the working format). It replaces the old (1 + kappa/p) rule, which is the SPD inverse-root special case
and hides forward-root failures: for A^{1/p} the condition number is only ~kappa^{1-1/p}/p (hilb(10),
p = 2: 2e6 against kappa/p = 8e12), and coupled_newton's forward root used to be 1e5 times worse than it.

The bound, stated once:

    ||X - X_ref||_F / ||X_ref||_F <= C * sqrt(n) * (cond(f, fl(A)) + 1) * u,      C = 5,

with X_ref the high-precision reference (:mod:`matroots.truth.reference`, flint/mpmath) of fl(A), the input
rounded to the working format, and u that format's unit roundoff; the "+ 1" is the rounding of the
output itself. Measured worst case over the default grid: 8.6 u (cond + 1) at n = 10-12, i.e. C sqrt(n)
= 16-17 leaves a factor 2. Each case may instead be reported: converged=False with a ConvergenceWarning,
or a typed MatrootsError. Where the problem is well posed (kappa(fl(A)) n u <= 0.1 for SPD input, so
that rounding, ~n u ||A||, cannot move lambda_min to 0; or a nonsymmetric matrix with a moderate
eigenvector condition number and its spectrum well inside the right half-plane), the solver must
actually deliver, so a solver that reports everything cannot pass.

cond_root itself is checked against an independent computation: the Kronecker form of the Fréchet
derivative built column by column from central differences of scipy's ``fractional_matrix_power``
(Schur-Padé, no eigenvectors), and against the SPD closed form.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.linalg
import torch

import matroots
from matroots.core import conditioning
from matroots.study import matrices
from matroots.truth import metrics, reference

C = 5.0
PS = (2, 3, 4, 5, 8)
U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}
SPD_METHODS = ("eigh", "coupled_newton", "schur_newton")
GENERAL_METHODS = ("coupled_newton", "schur_newton")


# ----------------------------------------------------------------------------------- cond_root itself
def _kron_by_differences(A: np.ndarray, q: float) -> np.ndarray:
    """K_f(A) for f(z) = z^q by central differences of scipy's ``fractional_matrix_power``:
    column j = vec (f(A + h E_j) - f(A - h E_j)) / (2h), E_j the j-th unit matrix (column-stacked)."""
    n = A.shape[0]
    h = 1e-5 * float(np.abs(np.linalg.eigvals(A)).min())
    K = np.zeros((n * n, n * n))
    for j in range(n * n):
        E = np.zeros(n * n)
        E[j] = h
        E = E.reshape(n, n, order="F")
        fp = np.real(scipy.linalg.fractional_matrix_power(A + E, q))
        fm = np.real(scipy.linalg.fractional_matrix_power(A - E, q))
        K[:, j] = ((fp - fm) / (2 * h)).reshape(-1, order="F")
    return K


def _cond_by_differences(A: np.ndarray, p: int, inverse: bool) -> float:
    q = (-1.0 if inverse else 1.0) / p
    fA = np.real(scipy.linalg.fractional_matrix_power(A, q))
    return float(np.linalg.norm(_kron_by_differences(A, q), 2) * np.linalg.norm(A) / np.linalg.norm(fA))


@pytest.mark.parametrize(("p", "inverse"), ((2, True), (3, False)))
def test_cond_root_matches_an_independent_kronecker_form(p, inverse):
    rng = np.random.default_rng(p)
    spd, _ = matrices.generate("randsvd3", 3, 1e2, rng)
    general, _ = matrices.generate("nonsymmetric", 3, 10.0, rng, max_angle=1.0)
    for A in (spd, general):
        assert conditioning.cond_root(A, p, inverse=inverse) == pytest.approx(
            _cond_by_differences(A, p, inverse), rel=1e-6
        )


def test_cond_root_power_iteration_matches_the_exact_norm():
    A, _ = matrices.generate("nonsymmetric", 7, 30.0, np.random.default_rng(3), max_angle=1.0)
    for inverse in (True, False):
        exact = conditioning.cond_root(A, 3, inverse=inverse)
        power = conditioning.cond_root(A, 3, inverse=inverse, kron_max_n=0)
        assert power == pytest.approx(exact, rel=1e-4)


def test_cond_root_spd_closed_form_and_forward_is_far_better_conditioned():
    lam = np.array([1e-8, 1e-3, 0.5, 1.0])
    A = np.diag(lam)
    fro = math.sqrt(float(np.sum(lam**2)))
    for p in PS:
        inv = (1 / p) * lam[0] ** (-1 / p - 1) * fro / math.sqrt(float(np.sum(lam ** (-2 / p))))
        fwd = (1 / p) * lam[0] ** (1 / p - 1) * fro / math.sqrt(float(np.sum(lam ** (2 / p))))
        assert conditioning.cond_root(A, p, inverse=True) == pytest.approx(inv, rel=1e-12)
        assert conditioning.cond_root(A, p, inverse=False) == pytest.approx(fwd, rel=1e-12)
        assert fwd <= 2 * 1e8 ** (1 - 1 / p) / p  # ~kappa^{1-1/p}/p: kappa/p overstates it by kappa^{1/p}
    assert conditioning.cond_root(np.diag([1.0, 0.0]), 2, inverse=False) == math.inf
    assert conditioning.cond_root(np.array([[0.0, 1.0], [-1.0, -1e-3]]), 2) < math.inf  # complex pair


def test_divided_differences_are_accurate_for_close_eigenvalues():
    lam = np.array([2.0, 2.0 * (1 + 1e-13), 3.0])
    for q in (-1 / 3, 1 / 3):
        D = conditioning.divided_differences(lam, q)
        deriv = q * 2.0 ** (q - 1)
        assert D[0, 1] == pytest.approx(deriv, rel=1e-12)
        assert D[0, 2] == pytest.approx((3.0**q - 2.0**q) / 1.0, rel=1e-14)


def test_metrics_expose_cond_root_and_its_u_line():
    A, _ = matrices.generate("hilbert", 6, None, None)
    m = metrics.matrix_metrics(A, 2, ref=reference.inverse_root(A, 2))
    assert m["cond_rel"] == pytest.approx(metrics.cond_root(A, 2), rel=1e-8)  # hp vs fp64 eigs
    d = metrics.dtype_metrics(A, 2, m["condition_number"], "fp32", cond=m["cond_rel"])
    assert d["cond_u_line"] == pytest.approx(m["cond_rel"] * 2.0**-24)


def test_eigenvalue_conditions_flag_a_jordan_block():
    w, k = conditioning.eigenvalue_conditions(np.array([[1.0, 1.0], [0.0, 1.0]]))
    assert np.allclose(w, 1.0) and (k > 1e7).all()
    w, k = conditioning.eigenvalue_conditions(np.diag([1.0, 2.0]))
    assert np.allclose(k, 1.0)


# ---------------------------------------------------------------------------------------- the grid
def _cases(dtype: torch.dtype, n: int, seeds: int) -> list[tuple[str, np.ndarray, bool]]:
    """(label, matrix, well_posed) for one working format."""
    u = U[dtype]
    out = []
    for seed in range(seeds):
        rng = np.random.default_rng(100 * seed + (1 if dtype == torch.float32 else 0))
        for mode in (1, 2, 3, 4, 5):
            for kappa in (1e2, math.sqrt(0.1 / u), 0.1 / u, 1.0 / u):
                A, _ = matrices.generate(f"randsvd{mode}", n, kappa, rng)
                out.append((f"randsvd{mode} kappa={kappa:.0e}", A, kappa * n * u <= 0.1))
        A, _ = matrices.generate("clustered", n, min(1e6, 0.1 / u), rng)
        out.append(("clustered", A, True))
        for kappa in (1e1, 1e3):
            A, _ = matrices.generate("nonsymmetric", 8, kappa, rng, max_angle=1.0)
            out.append((f"nonsymmetric kappa={kappa:.0e}", A, True))
            A, _ = matrices.generate("nonsymmetric", 8, kappa, rng)  # arguments up to 0.9 pi
            out.append((f"nonsymmetric-wide kappa={kappa:.0e}", A, False))
    small = dtype == torch.float32
    for name, nn in (("hilbert", 6 if small else 10), ("hilbert", 8 if small else 12), ("lehmer", 12)):
        A, meta = matrices.generate(name, nn, None, None)
        out.append((f"{name}({nn})", A, meta["kappa"] * nn * u <= 0.1))
    for name, nn in (("kms", 12), ("pascal", 5 if small else 8), ("moler", 6)):
        A, meta = matrices.generate(name, nn, None, None)
        out.append((f"{name}({nn})", A, meta["kappa"] * nn * u <= 0.1))
    return out


def _check(label: str, A: np.ndarray, dtype: torch.dtype, well_posed: bool) -> list[str]:
    """Run every solver, p and direction on A; return the failures (empty list = all fine)."""
    u = U[dtype]
    Aw = torch.from_numpy(A).to(dtype).double().numpy()  # the matrix actually solved
    sym = bool(np.array_equal(A, A.T))
    n = A.shape[0]
    bad = []
    for p in PS:
        for inverse in (True, False):
            try:
                ref = (reference.inverse_root if inverse else reference.root)(Aw, p)
            except matroots.MatrootsError:
                continue  # fl(A) has no principal root: every solver must refuse or flag (below)
            cond = metrics.cond_root(Aw, p, inverse=inverse)
            bound = C * math.sqrt(n) * (cond + 1.0) * u
            for method in SPD_METHODS if sym else GENERAL_METHODS:
                fn = matroots.inverse_root if inverse else matroots.root
                what = f"{label} {dtype} p={p} {'inverse' if inverse else 'forward'} {method}"
                try:
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        res = fn(torch.from_numpy(A), p, method=method, dtype=dtype)
                except matroots.MatrootsError as exc:
                    if well_posed:
                        bad.append(f"{what}: refused a well-posed problem ({type(exc).__name__}: {exc})")
                    continue
                if not res.converged:
                    if not any(issubclass(w.category, matroots.ConvergenceWarning) for w in caught):
                        bad.append(f"{what}: converged=False without a ConvergenceWarning")
                    if well_posed and (sym or method == "schur_newton"):
                        bad.append(
                            f"{what}: did not converge on a well-posed problem ({res.info.get('stop_reason')})"
                        )
                    continue
                err = metrics.relative_forward_error(res.root, ref.root)
                if not err <= bound:
                    bad.append(
                        f"{what}: SILENTLY WRONG: error {err:.2e} > bound {bound:.2e} (cond {cond:.2e}, "
                        f"stop {res.info.get('stop_reason')})"
                    )
    return bad


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32), ids=("fp64", "fp32"))
def test_converged_roots_are_within_the_condition_number_bound(dtype):
    failures = []
    for label, A, well_posed in _cases(dtype, n=10, seeds=1):
        failures += _check(label, A, dtype, well_posed)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32), ids=("fp64", "fp32"))
def test_converged_roots_are_within_the_condition_number_bound_heavy(dtype):
    failures = []
    for label, A, well_posed in _cases(dtype, n=20, seeds=1):
        failures += _check(label, A, dtype, well_posed)
    assert not failures, "\n".join(failures)
