"""One test per silent-wrong or crash class of issue 9 in the Newton solvers (each failed before the fix).

Accuracy is judged as in tests/test_conditioning_accuracy.py: relative forward error
<= C sqrt(n) (cond(f, fl(A)) + 1) u with C = 5, against the high-precision reference of the matrix
actually solved (the input rounded to the working format, plus the eps shift the solver reports).
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import warnings

import numpy as np
import pytest
import torch
from _refs import spd_matrix

import matroots
from matroots import cli
from matroots.solvers.schur_newton import choose_k1
from matroots.study import matrices
from matroots.truth import metrics, reference

C = 5.0
U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _bound(Aw: np.ndarray, p: int, inverse: bool, u: float, eps: float = 0.0) -> float:
    cond = metrics.cond_root(Aw, p, inverse=inverse, eps=eps)
    return C * math.sqrt(Aw.shape[0]) * (cond + 1.0) * u


def _solve(A, p, method, *, inverse=True, **kw):
    fn = matroots.inverse_root if inverse else matroots.root
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fn(torch.as_tensor(A), p, method=method, **kw)
    if not res.all_converged:
        assert any(issubclass(w.category, matroots.ConvergenceWarning) for w in caught)
    return res


def _rounded(A: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(A).to(dtype).double().numpy()


# ------------------------------------------------------------- silent wrong 1: coupled_newton forward root
@pytest.mark.parametrize(("n", "dtype"), ((10, torch.float64), (8, torch.float32), (6, torch.float32)))
@pytest.mark.parametrize("p", (2, 3, 8))
def test_forward_root_of_ill_conditioned_spd_tracks_its_own_condition_number(n, dtype, p):
    """hilb(10) fp64 p=2 was 1e-5 (eigh 8e-12) and hilb(8) fp32 was 5.9, both flagged converged: Guo &
    Higham's c sends lambda_max(M_0) to ~p+1 and the two extreme eigen-directions couple (newton_core)."""
    H, _ = matrices.generate("hilbert", n, None, None)
    Hw = _rounded(H, dtype)
    ref = reference.root(Hw, p)
    lam = reference.eigvalsh(Hw)
    assert lam[0] > 0  # fl(hilb(n)) is SPD (exact eigenvalues, mpmath): a principal root exists
    ill_posed = lam[-1] / lam[0] * U[dtype] > 1  # hilb(8) in fp32: kappa(fl(A)) u ~ 90
    for method in ("coupled_newton", "schur_newton"):
        try:
            res = _solve(H, p, method, inverse=False, dtype=dtype)
        except matroots.NotPositiveDefiniteError:
            # kappa u > 1: the fp32 Schur form's smallest eigenvalue is pure rounding and lands on
            # either side of 0 depending on the CPU's kernels (-5.5e-10 on AVX-512 EPYC), so a typed
            # refusal is an allowed way to give up there, never elsewhere
            assert ill_posed, method
            continue
        if res.converged:
            err = metrics.relative_forward_error(res.root, ref.root)
            assert err <= _bound(Hw, p, False, U[dtype]), (method, err)
            assert res.info["backward_error"] <= 1e-3
        else:
            assert ill_posed, method  # only where kappa(fl(A)) u > 1 may a solver give up
    if dtype == torch.float64:  # and it must deliver where the problem is well posed
        res = _solve(H, p, "coupled_newton", inverse=False, dtype=dtype)
        assert res.converged and res.info["c_choice"][0].startswith("lambda_max / beta_p")


def test_forward_root_backward_error_check_flags_a_wrong_root():
    """The a posteriori test behind the forward roots: eta = ||Y^p - A||_F / ||A||_F > threshold turns a
    run the M_k residual called converged into converged=False, stop reason "backward_error"."""
    from matroots.solvers.newton_core import NewtonOutcome, forward_backward_check

    A = torch.from_numpy(spd_matrix(8, 1e4, seed=3))[None]
    Y = torch.from_numpy(reference.root(A[0].numpy(), 2).root)[None]
    good, bad = Y.clone(), Y + 1e-6 * torch.ones_like(Y)
    for root, flagged in ((good, False), (bad, True)):
        out = NewtonOutcome(
            X=root,
            converged=torch.tensor([True]),
            iterations=torch.tensor([5]),
            residual=torch.tensor([0.0], dtype=torch.float64),
            reason=["tol"],
            matmuls=0.0,
        )
        info: dict = {}
        forward_backward_check(root, A, torch.zeros(1, dtype=torch.float64), 2, out, 1e-12, info)
        assert bool(out.converged[0]) is not flagged and (out.reason == ["backward_error"]) is flagged
        assert (float(info["backward_error"][0]) > 1e-12) is flagged


# ------------------------------------------------------------ silent wrong 2: eigenvalue ratio overflow
def test_schur_newton_modulus_ratio_overflow_is_not_the_identity():
    """diag(1e10, 1e-300), p = 4: the ratio 1e310 overflowed and k1 ran until 0.5**k1 underflowed,
    returning the identity flagged converged."""
    A = torch.diag(torch.tensor([1e10, 1e-300], dtype=torch.float64))
    assert choose_k1(np.array([1e10, 1e-300], dtype=complex), 2) == 11
    res = _solve(A, 4, "schur_newton")  # solved correctly (11 square roots), not merely refused
    exact = np.array([1e10**-0.25, 1e-300**-0.25])
    got = res.root.diagonal().numpy()
    assert np.allclose(got, exact, rtol=1e-12, atol=0)
    # but not "converged": lambda_min = 1e-300 < u lambda_max = 1.1e-6, singular to working precision,
    # so cond(A^{-1/4}) u > 1 and no digit is promised for the matrix solved (the shared SPD domain test,
    # as coupled_newton's; docs/design.md §3, issue 22 class 2)
    assert not res.converged and res.info["stop_reason"] == ["not_determined"]
    assert res.info["k1"] == [11]


def test_huge_eigenvalue_spread_is_reported_by_coupled_newton():
    A = torch.diag(torch.tensor([1e10, 1e-300], dtype=torch.float64))
    res = _solve(A, 4, "coupled_newton")  # ~800 linear steps would be needed: says so
    assert not res.converged


# --------------------------------------------------------- silent wrong 5: domain of the matrix solved
def _cheb(N: int) -> np.ndarray:
    """Chebyshev spectral differentiation matrix (Trefethen, Spectral Methods in MATLAB, 2000): nilpotent."""
    x = np.cos(np.pi * np.arange(N + 1) / N)
    c = np.hstack([2.0, np.ones(N - 1), 2.0]) * (-1.0) ** np.arange(N + 1)
    X = np.tile(x, (N + 1, 1)).T
    D = np.outer(c, 1 / c) / (X - X.T + np.eye(N + 1))
    return D - np.diag(D.sum(1))


@pytest.mark.parametrize("N", (4, 5, 8, 9, 12, 16))
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32), ids=("fp64", "fp32"))
def test_nearly_nilpotent_matrix_is_refused(N, dtype):
    """All eigenvalues are 0 in exact arithmetic and scatter on a circle of radius ~u^{1/n} when
    computed; in fp32 (and often fp64) no computed one was real and <= 0, so the root of a matrix
    without a principal root came back converged with residual 1e6..1e13."""
    for shift in (0.0, 1e-3):
        A = _cheb(N) + shift * np.eye(N + 1)
        for method in ("schur_newton", "coupled_newton"):
            try:
                res = _solve(A, 2, method, dtype=dtype)
            except matroots.NegativeRealEigenvalueError as exc:
                assert "actually solved" in str(exc)
                continue
            assert not res.converged, (method, N, shift)


def test_well_separated_nonnormal_matrix_is_still_solved():
    """The refusal is not a blanket one: the same differentiation matrix shifted far from the axis."""
    A = _cheb(9) + 100.0 * np.eye(10)
    for dtype in (torch.float64, torch.float32):
        Aw = _rounded(A, dtype)
        ref = reference.inverse_root(Aw, 2)
        for method in ("schur_newton", "coupled_newton"):
            res = _solve(A, 2, method, dtype=dtype)
            assert res.converged
            err = metrics.relative_forward_error(res.root, ref.root)
            assert err <= _bound(Aw, 2, True, U[dtype])


# ----------------------------------------------------------------------------- crashes: 16-bit formats
@pytest.mark.parametrize("method", ("coupled_newton", "schur_newton"))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
def test_forward_roots_in_16_bit_formats(method, dtype):
    """torch.linalg.solve has no Half/BFloat16 CPU kernel (NotImplementedError before): the solve runs in
    fp32 on the 16-bit operands and info says so."""
    A = spd_matrix(16, 1e2, seed=1)
    Aw = _rounded(A, dtype)
    ref = reference.root(Aw, 2)
    res = _solve(A, 2, method, inverse=False, dtype=dtype)
    assert res.root.dtype == dtype and res.converged
    assert "fp32" in res.info["solve_dtype"]
    err = metrics.relative_forward_error(res.root, ref.root)
    assert err <= _bound(Aw, 2, False, U[dtype])


@pytest.mark.parametrize("scale", (1e-300, 1e-8, 1e8, 1e30))
@pytest.mark.parametrize("inverse", (True, False))
def test_compute_dtype_fp16_is_correct_or_a_typed_error(scale, inverse):
    """No raw torch error (LinAlgError from an overflow reaching Lanczos, NotImplementedError from the
    solve): a correct root or a MatrootsNumericalError."""
    A = spd_matrix(12, 1e2, seed=2) * scale
    ref = (reference.inverse_root if inverse else reference.root)(A, 2)
    for method in ("coupled_newton", "schur_newton"):
        for kw in ({"compute_dtype": "fp16"}, {"dtype": "fp16"}):
            try:
                res = _solve(A, 2, method, inverse=inverse, **kw)
            except matroots.MatrootsNumericalError:
                continue
            assert res.converged
            err = metrics.relative_forward_error(res.root, ref.root)
            # the fp16 input rounding adds kappa u to the error; bound in the format's u
            assert err <= _bound(A, 2, inverse, U[torch.float16]), (method, kw, err)


def test_huge_p_is_a_typed_refusal_or_correct():
    A = spd_matrix(16, 1e2, seed=1)
    with pytest.raises(matroots.UnsupportedExponentError, match="too large for a Newton iteration"):
        matroots.inverse_root(torch.from_numpy(A), 2**63, method="coupled_newton")
    with pytest.raises(matroots.UnsupportedExponentError):
        matroots.inverse_root(torch.from_numpy(A), 2**63 + 1, method="schur_newton")
    res = _solve(A, 2**63, "schur_newton")  # q = 1: 63 square roots, exact to rounding
    ref = reference.inverse_root(A, 2**63)
    assert res.converged
    assert metrics.relative_forward_error(res.root, ref.root) <= _bound(A, 2**63, True, U[torch.float64])


@pytest.mark.parametrize(
    ("p", "dtype"), ((10**10, torch.float64), (10**13, torch.float64), (10**5, torch.float32))
)
def test_large_p_inverse_root_is_within_its_condition_number(p, dtype):
    """cond(A^{-1/p}) ~ kappa/p is ~1 for large p; Guo & Higham's start costs ~kappa u (fp64, kappa 1e6,
    p = 1e13: 1600 u, flagged converged). Inverse roots with p > 8 use the capped start."""
    A = spd_matrix(16, 1e6, seed=1)
    Aw = _rounded(A, dtype)
    ref = reference.inverse_root(Aw, p)
    res = _solve(A, p, "coupled_newton", dtype=dtype)
    assert res.converged
    assert metrics.relative_forward_error(res.root, ref.root) <= _bound(Aw, p, True, U[dtype])


# ------------------------------------------------------------------- eps means the same matrix everywhere
def _lambda_max(A: np.ndarray) -> float:
    return float(reference.eigvalsh(A)[-1])


@pytest.mark.parametrize("eps", (1e-6, 1e-3))
def test_relative_eps_is_the_same_shift_in_every_solver(eps):
    """coupled_newton used 20 power-iteration steps for lambda_max (0.4% low at kappa 1e3): fp64 error
    2.3e-10 (here 6e-4) against the reference of A + eps lambda_max I, where eigh had 1e-13."""
    A, _ = matrices.generate("randsvd", 32, 1e3, np.random.default_rng(0))
    e = eps * _lambda_max(A)
    ref = reference.inverse_root(A, 2, e)
    bound = _bound(A, 2, True, U[torch.float64], eps=e)
    for method in ("eigh", "coupled_newton", "schur_newton"):
        res = _solve(A, 2, method, eps=eps, eps_mode="relative")
        eps_abs = torch.as_tensor(res.info["eps_abs"]).reshape(-1)
        assert eps_abs.shape == (1,) and float(eps_abs[0]) == pytest.approx(e, rel=1e-12), method
        assert metrics.relative_forward_error(res.root, ref.root) <= bound, method


def test_eps_abs_is_per_element_in_user_units():
    """Batched, relative eps, fp16 (pre-scaled): eps_abs per element in the caller's units, and
    solved_metrics measures each element against its own A + eps_abs I."""
    A = np.stack([spd_matrix(8, 1e2, seed=1) * 3e-3, spd_matrix(8, 1e2, seed=2) * 40.0])
    lmax = np.array([_lambda_max(a) for a in A])
    for method in ("eigh", "coupled_newton", "schur_newton"):
        for dtype, eps, mode, expect in (
            (torch.float64, 1e-4, "relative", 1e-4 * lmax),
            (torch.float16, 1e-2, "absolute", np.array([1e-2, 1e-2])),
        ):
            res = _solve(A, 2, method, eps=eps, eps_mode=mode, dtype=dtype)
            got = torch.as_tensor(res.info["eps_abs"]).double().numpy()
            assert got.shape == (2,) and np.allclose(
                got, expect, rtol=1e-3 if dtype == torch.float16 else 1e-12
            )
            m = metrics.solved_metrics(res, A, 2)
            assert (
                m["forward_error"] <= C * math.sqrt(8) * (m["cond_root"] + 1) * U[dtype] * 1e2
            )  # fp16 input
            assert m["eps_abs"] == pytest.approx(float(got.max()))


def _cli_lines(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(argv) == 0
    return buf.getvalue()


@pytest.mark.parametrize("forward", (False, True))
def test_cli_solve_reference_measures_the_matrix_actually_solved(tmp_path, forward):
    """`matroots solve --reference` printed 2.4e-7 for a coupled_newton solve accurate to 5e-14: it
    compared with the reference of A + eps * (a different lambda_max) I. It now uses info.eps_abs and
    prints the eps bias separately (and handles forward roots)."""
    A, _ = matrices.generate("randsvd", 32, 1e3, np.random.default_rng(0))
    f = tmp_path / "A.npy"
    np.save(f, A)
    argv = [
        "solve",
        str(f),
        "-p",
        "2",
        "--method",
        "coupled_newton",
        "--eps",
        "1e-3",
        "--eps-mode",
        "relative",
    ]
    out = _cli_lines([*argv, "--reference"] + (["--forward"] if forward else []))
    err = float(re.search(r"forward error vs reference of A \+ eps_abs I\s+(\S+)", out).group(1))
    bias = float(re.search(r"eps bias vs reference of A\s+(\S+)", out).group(1))
    cond_u = float(re.search(r"cond\(f, A\) u line\s+(\S+)", out).group(1))
    assert err <= C * math.sqrt(32) * cond_u + 1e-14
    assert bias > 1e3 * err  # eps = 1e-3 costs far more than the solver's rounding, reported apart


# ------------------------------------------------------------------ found by the fuzz test (tests/test_fuzz.py)
def test_shift_that_nearly_cancels_the_matrix_is_exact():
    """A = -1 + u, eps = 1: A + eps I = u exactly (Sterbenz); forming A/c^p + (eps/c^p) I instead
    cancelled two rounded numbers ~1e16 and gave a 2.5e-7 error flagged converged."""
    A = np.array([[np.nextafter(-1.0, 0.0)]])
    exact = (A[0, 0] + 1.0) ** -0.5
    for method in ("coupled_newton", "schur_newton"):
        res = _solve(A, 2, method, eps=1.0)
        assert res.converged and abs(float(res.root[0, 0]) / exact - 1) <= 4 * U[torch.float64]


def test_bf16_run_that_leaves_the_principal_branch_is_flagged():
    """bf16, eigenvalues at arguments up to 1.9 rad, p = 3 forward: the iteration settled on another cube
    root (error 1.06, Y^3 = A to 2%), which neither the scalar model nor the backward error can see."""
    from matroots.study import robustness

    case = robustness.Case(
        kind="nonsym_complex", n=6, batch=(), log10_kappa=0.0, log10_scale=0.0, dtype="bf16",
        input_dtype="fp64", layout="contiguous", eps=0.0, eps_mode="absolute", p=3, inverse=False, seed=2,
    )  # fmt: skip
    out = robustness.classify(case, "coupled_newton")
    assert out.outcome in ("flagged", "correct", "refused_numerical"), out


def test_first_root_is_the_matrix_itself():
    """p = 1 forward: schur_newton took k1 square roots and squared back, losing 2^k1 u (64 u for a
    diagonal matrix with kappa 1e5, whose A^{1/1} has cond 1)."""
    A = np.diag([1.0, 1e-5, 3e-3])
    res = _solve(A, 1, "schur_newton", inverse=False, eps=1e-3)
    assert res.converged and torch.equal(res.root, torch.from_numpy(A + 1e-3 * np.eye(3)))


def test_relative_eps_on_an_arithmetic_spectrum_matches_eigh():
    """24 Lanczos steps left lambda_max 2e-3 low on randsvd mode 4 (arithmetic spectrum) at n = 512; the
    relative shift is now certified to 1e-12 and equals eigh's."""
    A, _ = matrices.generate("randsvd4", 200, 1e6, np.random.default_rng(1))
    shifts = {}
    for method in ("eigh", "coupled_newton", "schur_newton"):
        res = _solve(A, 2, method, eps=1e-6, eps_mode="relative")
        shifts[method] = float(torch.as_tensor(res.info["eps_abs"]).reshape(-1)[0])
    assert shifts["coupled_newton"] == pytest.approx(shifts["eigh"], rel=1e-11)
    assert shifts["schur_newton"] == pytest.approx(shifts["eigh"], rel=1e-11)
