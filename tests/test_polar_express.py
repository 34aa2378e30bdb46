"""polar_express: minimax polynomial coupled iterations for A^{-1/p} (and A^{1/2}) of SPD matrices.

Accuracy bound and reference: tests/_matmul_roots.py. The minimax coefficients are checked
independently of the float64 Remez that made them: in mpmath (50 digits) the error 1 - h(x) must
equioscillate at d + 2 points of [lo, hi] (its endpoints and the roots of h', found by mpmath) with
alternating signs and equal magnitude E, and |1 - h| <= E on a dense grid; by Chebyshev's alternation
theorem (the basis x^{1+jp} is a Chebyshev system on (0, inf)) that is the best approximation.
"""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
import torch
from _matmul_roots import check_accurate_or_reported
from _refs import spd_matrix

import matroots
from matroots.solvers import minimax

METHOD = "polar_express"
N = 16


@pytest.mark.parametrize("kappa", (1e1, 1e4, 1e8))
@pytest.mark.parametrize("p", (1, 2, 3, 4, 8))
def test_geometric_spectrum_fp64_converges_within_the_bound(kappa: float, p: int) -> None:
    A = spd_matrix(N, kappa, seed=p)
    assert check_accurate_or_reported(METHOD, A, p, torch.float64) == "converged"


@pytest.mark.parametrize("kappa", (1e2, 1e6))
@pytest.mark.parametrize("p", (2, 4))
def test_forward_root_fp64_fp32(kappa: float, p: int) -> None:
    A = spd_matrix(N, kappa, seed=4)
    for dt in (torch.float64, torch.float32):
        assert check_accurate_or_reported(METHOD, A, p, dt, inverse=False) == "converged"


@pytest.mark.parametrize("kappa", (1e1, 1e4, 1e8))
@pytest.mark.parametrize("p", (1, 2, 4, 8))
def test_sign_form_fp64_converges_within_the_bound(kappa: float, p: int) -> None:
    A = spd_matrix(N, kappa, seed=p)
    assert check_accurate_or_reported(METHOD, A, p, torch.float64, form="sign") == "converged"


@pytest.mark.parametrize("kappa", (1e1, 1e4, 1e8))
@pytest.mark.parametrize("p", (1, 2, 3, 4))
def test_factored_form_converges_within_the_bound(kappa: float, p: int) -> None:
    """The factored form (M = Z Y recomputed, one stage for any p) under the contract, fp64 and fp32
    (plain products there), and bf16 (split and plain products; converged only within the bound)."""
    A = spd_matrix(N, kappa, seed=p)
    assert check_accurate_or_reported(METHOD, A, p, torch.float64, form="factored") == "converged"
    assert check_accurate_or_reported(METHOD, A, p, torch.float32, form="factored") in (
        "converged",
        "reported",
    )
    if kappa < 1e8:
        status = check_accurate_or_reported(METHOD, A, p, torch.bfloat16, form="factored")
        assert status in ("converged", "reported", "refused")


def test_factored_form_batch_element_gets_its_own_arithmetic() -> None:
    """Split steps are decided per element (by its own schedule): in a batch of a kappa 1.5 and a kappa
    1e3 matrix (split steps or none) each element takes the split steps it takes alone, and its root
    agrees with the one it gets alone to fp32 accumulation-order level (a batched GEMM need not sum in
    the order of a single one: 1e-4 relative; a wrong split decision moves the root by ~1e-3)."""
    A = torch.stack([torch.from_numpy(spd_matrix(N, k, seed=7)) for k in (1.5, 1e3)]).to(torch.bfloat16)
    both = matroots.inverse_root(A, 4, method=METHOD, quiet=True)
    assert both.info["form"] == "factored"
    splits = [int(v) for v in both.info["split_steps"]]
    assert splits[0] != splits[1], splits
    for i in range(2):
        one = matroots.inverse_root(A[i], 4, method=METHOD, quiet=True)
        assert int(one.info["split_steps"][0]) == splits[i]
        rel = float(torch.linalg.matrix_norm(one.root - both.root[i]) / torch.linalg.matrix_norm(one.root))
        assert rel <= 1e-4, rel


def test_factored_form_resolvability_is_that_of_one_product() -> None:
    """bf16, n = 256, p = 8: coupled_newton's rule with p (p sqrt(n) u = 0.5, the coupled form's floor
    through P^8) would refuse; the factored form's residual is one product M = Z Y (as in the sign form),
    whose floor 2 sqrt(n) u = 0.125 is resolvable, so it runs and meets the contract."""
    A = spd_matrix(256, 10.0, seed=2)
    with pytest.raises(matroots.UnsupportedExponentError):
        matroots.inverse_root(torch.from_numpy(A), 8, method=METHOD, dtype=torch.bfloat16, form="coupled")
    assert check_accurate_or_reported(METHOD, A, 8, torch.bfloat16) == "converged"


def test_bf16_sign_form_beats_the_coupled_one() -> None:
    """bf16, kappa 1e2, n = 64, p = 4: the sign form's M_k = Z_k Y_k is recomputed each step; the
    coupled form's propagated M_k drifts. Both meet the (loose, cond u) contract; the sign form's error
    is the smaller."""
    A = spd_matrix(64, 1e2, seed=3)
    Ab = torch.from_numpy(A).to(torch.bfloat16)
    W = Ab.double().numpy()
    w, V = np.linalg.eigh(W)
    ref = (V * w**-0.25) @ V.T
    err = {}
    for form in ("sign", "coupled"):
        res = matroots.inverse_root(Ab, 4, method=METHOD, form=form)
        assert res.converged
        err[res.info["form"]] = np.linalg.norm(res.root.double().numpy() - ref) / np.linalg.norm(ref)
    assert err["sign"] < err["coupled"], err


def test_bf16_kappa_1e4_factored_form_with_split_steps_reaches_1e_2() -> None:
    """Issue 27's bf16 goal on a small case: kappa 1e4 (bench_solvers' matrix, shifted before the
    rounding so that the bf16 matrix is SPD at kappa ~1e4), n = 64, p = 4, error against float64 LAPACK
    eigh of the bf16 matrix itself (its own error ~kappa u_64, negligible here).

    "auto" takes the factored form (Z <- P Z, Y <- Y P^3, M = Z Y recomputed) with split (hi + lo)
    products in the steps whose interval has l_k^p < 0.02: measured 5.0e-3 (4.4e-3 when every product
    of those steps was split, at 57.5 GEMM-equivalents against 38.5 now). Rounding the state after the
    first polynomial step to bf16 is what costs the plain variants their accuracy (measured: sign form
    2.7e-2, factored without splitting 2.3e-2). The thresholds leave a factor 1.12 above the split
    form's error and >= 1.5 below the plain ones'; bf16 roundings are deterministic and the fp32
    accumulation order moves results by ~1e-6.
    converged is False: lambda_min / lambda_max = 1e-4 < u_bf16, the Lanczos estimate cannot determine
    lambda_min in the format (flag_undetermined), so the promise is not made; the error is measured.
    """
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from bench_solvers import matrix_in_format

    Ab, kappa, _shift = matrix_in_format(64, 1e4, torch.bfloat16, 4)
    assert 9e3 < kappa < 1.1e4
    w, V = np.linalg.eigh(Ab.double().numpy())
    ref = (V * w**-0.25) @ V.T

    def error(**kw) -> tuple[float, object]:
        res = matroots.inverse_root(Ab, 4, method=METHOD, quiet=True, **kw)
        return float(np.linalg.norm(res.root.double().numpy() - ref) / np.linalg.norm(ref)), res

    e_auto, res = error()
    assert res.info["form"] == "factored" and int(res.info["split_steps"][0]) >= 1
    assert e_auto <= 1e-2 / 1.8, e_auto
    e_sign, _ = error(form="sign")
    e_plain, res_plain = error(form="factored", split_below=0.0)
    assert int(res_plain.info["split_steps"][0]) == 0
    assert min(e_sign, e_plain) >= 1.8e-2 / 1.2, (e_sign, e_plain)


@pytest.mark.parametrize("n", (64, 128))
def test_bf16_kappa_1e4_reaches_1e_2_within_40_gemms_at_the_defaults(n: int) -> None:
    """Issue 27's bf16 goal in GEMM-equivalents (counted as bench_solvers.py --to-target counts them:
    the solver's ``matmuls``, split products 3 or 2 GEMMs, the Lanczos estimate included): kappa 1e4,
    p = 4, error against float64 LAPACK eigh of the bf16 matrix. At the defaults (what Shampoo and
    ``auto`` run) 1e-2 within 40 (measured: n = 64 38.5, 5.0e-3; n = 128 38.4, 4.6e-3; 5 steps, the
    5th the stagnation test's); capped at the 4 steps that reach the target, within 34 (32.5, 5.3e-3;
    32.4, 4.6e-3). Before the split products were chosen (every product of the two split steps split,
    and the defaults stopping 2 steps after the target's) these were 57.5 and 45.5; one step more
    costs 6 GEMMs, so the bounds fail then. The errors are asserted within 1e-2 / 1.8."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from bench_solvers import matrix_in_format

    Ab, kappa, _shift = matrix_in_format(n, 1e4, torch.bfloat16, 4)
    assert 9e3 < kappa < 1.1e4
    w, V = np.linalg.eigh(Ab.double().numpy())
    ref = (V * w**-0.25) @ V.T
    for max_iter, bound in ((None, 40.0), (4, 34.0)):
        res = matroots.inverse_root(Ab, 4, method=METHOD, quiet=True, max_iter=max_iter)
        err = float(np.linalg.norm(res.root.double().numpy() - ref) / np.linalg.norm(ref))
        assert res.info["form"] == "factored" and int(res.info["split_steps"][0]) == 2
        assert err <= 1e-2 / 1.8 and float(res.matmuls) <= bound, (max_iter, err, res.matmuls)
        assert not bool(res.converged)  # lambda_min is not determined in bf16 (flag_undetermined)


def test_split_products_skip_an_exact_operand_and_count_per_element() -> None:
    """A split product hi hi + hi lo + lo hi forms a term only where that lo is non-zero (an operand
    exact in bf16 has lo = 0): 3 GEMMs, or 2 with one exact operand, counted per element of a batch;
    the result is the product of the operands to ~u^2 (against float64), a plain product to ~u; the
    right-operand split hi_X (hi_Y + lo_Y) is the product of fl(X) and Y to ~u^2 (2 GEMMs, 1 if Y is
    exact)."""
    from matroots.solvers.polar_express import _Gemms

    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 32, 32, generator=g)
    Y = torch.randn(2, 32, 32, generator=g)
    Y[0] = Y[0].to(torch.bfloat16).float()  # element 0's Y is exact in bf16
    exact = (X.double() @ Y.double()).numpy()
    mm = _Gemms(torch.bfloat16, 2)
    split = mm(X, Y, split=True).double().numpy()
    assert mm.count.tolist() == [2.0, 3.0]
    plain = mm(X, Y).double().numpy()
    assert mm.count.tolist() == [3.0, 4.0]
    scale = np.linalg.norm(exact)
    assert np.linalg.norm(split - exact) / scale < 1e-4 < np.linalg.norm(plain - exact) / scale
    both = _Gemms(torch.bfloat16, 1)
    both(X[:1], Y[:1].to(torch.bfloat16).float(), split=True)
    both(X[:1].to(torch.bfloat16).float(), Y[:1].to(torch.bfloat16).float(), split=True)
    assert both.count.tolist() == [3.0]  # 2, then 1 (both exact)
    right = _Gemms(torch.bfloat16, 2)
    half = right(X, Y, split="right").double().numpy()  # hi_X (hi_Y + lo_Y): Y to ~u^2, X to ~u
    assert right.count.tolist() == [1.0, 2.0]
    Xh = X.to(torch.bfloat16).double()
    ref_half = (Xh @ Y.double()).numpy()
    assert np.linalg.norm(half - ref_half) / scale < 1e-4 < np.linalg.norm(half - exact) / scale


def test_schedule_ends_at_the_format_resolution() -> None:
    """resolution = u: the minimax steps end at the first whose error is <= u, then the highest-contact
    tail; the steps before are those of the full schedule. resolution 0 (fp32, fp64 and the other
    forms) is the full schedule. bf16, p = 4, l = 2^-3.5 (the kappa 1e4 start): errors 0.65, 0.36,
    0.079, 1.1e-3 (<= 2^-8), then the tail: 4 minimax steps, not 5. The factored solve reports the cut
    schedule in bf16 and the full one in fp32 (its stagnation test is armed at the tail)."""
    u = 2.0**-8
    lo = minimax.grid_floor(0.0884)
    full = minimax.schedule(lo, 4, 2, 1.01)
    cut = minimax.schedule(lo, 4, 2, 1.01, u)
    assert minimax.schedule(lo, 4, 2, 1.01, 0.0) == full
    k = next(i for i, st in enumerate(full) if st.err <= u)
    assert k == 3 and len(full) - 1 == 5 and len(cut) - 1 == 4
    assert cut[: k + 1] == full[: k + 1] and cut[-1] == full[-1]
    A = torch.from_numpy(spd_matrix(32, 1e2, seed=5)).to(torch.bfloat16)
    for dt, res_u in ((torch.bfloat16, u), (torch.float32, 0.0)):
        res = matroots.inverse_root(A.to(dt), 4, method=METHOD, quiet=True, form="factored")
        l0 = float(res.info["l0"][0])
        steps = len(minimax.schedule(l0, 4, 2, float(res.info["safety"]), res_u)) - 1
        assert int(res.info["schedule_steps"][0]) == steps
    assert steps == len(minimax.schedule(l0, 4, 2, 1.001)) - 1  # fp32: the full schedule
    assert len(minimax.schedule(l0, 4, 2, 1.01, u)) < len(minimax.schedule(l0, 4, 2, 1.01))


@pytest.mark.parametrize("degree", (1, 3))
def test_other_degrees(degree: int) -> None:
    A = spd_matrix(N, 1e6, seed=1)
    assert check_accurate_or_reported(METHOD, A, 4, torch.float64, degree=degree) == "converged"


@pytest.mark.parametrize("n", (1, 4))
@pytest.mark.parametrize("dtype", ("fp32", "fp64"))
@pytest.mark.parametrize("inverse", (False, True))
def test_a_scaled_identity_is_solved_not_returned_as_its_start(n: int, dtype: str, inverse: bool) -> None:
    """M_0 = (3.7 I)/lambda_max_upper = (1 - 1e-6) I is near I, and the first minimax step maps m = 1 to
    1 - E_1, so its residual does not halve: the stagnation test must wait for the schedule's tail.
    Before, the start was kept (every stage returned its input): fp64 unconverged at error 8.7e-7, fp32
    "converged" at 15 u. Closed form 3.7^(+-1/8) I; cond(f, A) = 1/p for a scalar function on a scaled
    identity, so the bound is the fuzz's 10 n (1 + 1/p) u."""
    A = 3.7 * torch.eye(n, dtype=torch.float64)
    fn = matroots.inverse_root if inverse else matroots.root
    res = fn(A, 8, method=METHOD, dtype=dtype)
    u = 2.0**-24 if dtype == "fp32" else 2.0**-53
    exact = 3.7 ** ((-1.0 if inverse else 1.0) / 8) * torch.eye(n, dtype=torch.float64)
    err = float((res.root.double() - exact).norm() / exact.norm())
    assert bool(torch.as_tensor(res.converged).all()) and err <= 10 * n * (1 + 1 / 8) * u


def test_refusals() -> None:
    G = torch.triu(torch.ones(4, 4, dtype=torch.float64)) + 3 * torch.eye(4, dtype=torch.float64)
    with pytest.raises(matroots.NotSymmetricError):
        matroots.inverse_root(G, 2, method=METHOD)
    with pytest.raises(matroots.UnsupportedExponentError, match="power of two"):
        matroots.root(torch.eye(4, dtype=torch.float64), 3, method=METHOD)
    with pytest.raises(matroots.UnsupportedExponentError, match="form='sign'"):
        matroots.root(torch.eye(4, dtype=torch.float64), 2, method=METHOD, form="coupled")
    with pytest.raises(matroots.UnsupportedExponentError, match="form='sign'"):
        matroots.root(torch.eye(4, dtype=torch.float64), 2, method=METHOD, form="factored")
    with pytest.raises(matroots.InvalidArgumentError, match="split_below"):
        matroots.solvers.get(METHOD, split_below=-1.0)
    with pytest.raises(matroots.UnsupportedExponentError):
        matroots.inverse_root(torch.eye(4, dtype=torch.float64), 17, method=METHOD)
    with pytest.raises(matroots.UnsupportedExponentError):
        matroots.inverse_root(torch.eye(4, dtype=torch.float64), 2.5, method=METHOD)
    with pytest.raises(matroots.InvalidArgumentError, match="degree"):
        matroots.solvers.get(METHOD, degree=5)
    with pytest.raises(matroots.NotPositiveDefiniteError):
        matroots.inverse_root(torch.diag(torch.tensor([1.0, -0.5], dtype=torch.float64)), 2, method=METHOD)


def _equioscillation(step: minimax.Step, p: int) -> None:
    """mpmath check of the minimax property of one schedule step (module docstring)."""
    d = len(step.coeffs) - 1
    with mpmath.workdps(50):
        c = [mpmath.mpf(v) for v in step.coeffs]
        lo, hi = mpmath.mpf(step.lo), mpmath.mpf(step.hi)

        def err(x):
            return 1 - sum(cj * x ** (1 + j * p) for j, cj in enumerate(c))

        def derr(x):
            return -sum(cj * (1 + j * p) * x ** (j * p) for j, cj in enumerate(c))

        grid = [lo + (hi - lo) * k / 4000 for k in range(4001)]
        vals = [err(x) for x in grid]
        inner = []
        for k in range(1, len(grid) - 1):  # sign changes of the derivative bracket the extrema
            a, b = derr(grid[k - 1]), derr(grid[k + 1])
            if a * b < 0 and abs(vals[k]) >= max(abs(vals[k - 1]), abs(vals[k + 1])):
                x = mpmath.findroot(derr, (grid[k - 1], grid[k + 1]), solver="anderson")
                if not inner or abs(x - inner[-1]) > (hi - lo) * 1e-6:
                    inner.append(x)
        pts = [lo, *inner, hi]
        e = [err(x) for x in pts]
        assert len(pts) == d + 2, (step, pts)
        E = mpmath.mpf(step.err)
        for v, s in zip(e, itertools.cycle((1, -1)), strict=False):
            # alternating signs, equal magnitude: the Remez stops at points settled to 1e-15 relative
            assert mpmath.sign(v) == s and abs(abs(v) - E) <= 1e-9 * E, (e, E)
        assert max(abs(v) for v in vals) <= E * (1 + 1e-9)


@pytest.mark.parametrize("p,d,lo", [(2, 2, 1e-3), (4, 2, 10**-1.5), (2, 1, 1e-2), (3, 2, 0.05), (8, 2, 0.2)])
def test_minimax_coefficients_equioscillate_in_mpmath(p: int, d: int, lo: float) -> None:
    steps = minimax.schedule(minimax.grid_floor(lo), p, d, 1.01)
    for st in steps[:-1]:
        _equioscillation(st, p)
    # the greedy intervals: each step's design interval is the image of the previous one, widened
    for a, b in itertools.pairwise(steps[:-1]):
        assert b.lo == pytest.approx(1 - a.err, rel=1e-15) and b.hi == pytest.approx((1 + a.err) * 1.01)
    # the tail has the highest contact with 1 at x = 1: h(1) = 1, h^(i)(1) = 0 (exact rationals for p = 2)
    if (p, d) == (2, 2):
        assert steps[-1].coeffs == pytest.approx((15 / 8, -10 / 8, 3 / 8), rel=1e-14)


def test_schedules_are_cached_per_interval_degree_and_dtype() -> None:
    a = minimax.schedule(minimax.grid_floor(1e-3), 4, 2, 1.001)
    assert minimax.schedule(minimax.grid_floor(1.1e-3), 4, 2, 1.001) is a  # same grid cell
    assert minimax.schedule(minimax.grid_floor(1e-3), 4, 2, 1.01) is not a  # the bf16 safety
    assert minimax.grid_floor(1e-3) <= 1e-3 < minimax.grid_floor(1e-3) * 2**0.25


def test_convergence_order_and_iteration_count() -> None:
    """kappa 10, p = 4, d = 2, fp64: the count is the scalar model's (x -> h_k(x) on the eigenvalues'
    normalised roots (lambda/c)^{1/4}, the reported schedule), and the tail is of order d + 1 = 3:
    h(x) - 1 = O((x - 1)^3), so ||M_{k+1} - I||_F <= ||M_k - I||_F^2 once the residual is small."""
    lam = np.geomspace(0.1, 1.0, N)
    Q = np.linalg.qr(np.random.default_rng(0).standard_normal((N, N)))[0]
    A = 0.5 * ((Q * lam) @ Q.T + ((Q * lam) @ Q.T).T)
    tol = 1e-9
    res = matroots.inverse_root(torch.from_numpy(A), 4, method=METHOD, tol=tol, record_history=True)
    assert res.converged
    c, lo = float(res.info["c"][0]), float(res.info["l0"][0])
    steps = minimax.schedule(lo, 4, 2, float(res.info["safety"]))
    x = (lam / c) ** 0.25
    k = 0
    while math.sqrt(float(((x**4 - 1) ** 2).sum())) > tol:
        x = minimax.evaluate(steps[min(k, len(steps) - 1)].coeffs, x, 4)
        k += 1
    assert res.iterations == k
    r = [float(h) for h in res.history]
    for a, b in itertools.pairwise(r):
        if 1e-8 < a < 1e-2:
            assert b <= a * a, r
    assert res.matmuls == pytest.approx(
        5 * res.iterations + min(24, N) / N + 1 / 6
    )  # Lanczos <= n matvecs; Cholesky


def test_fewer_products_than_coupled_newton_at_kappa_1e6() -> None:
    A = torch.from_numpy(spd_matrix(64, 1e6, seed=7)).float()
    pe = matroots.inverse_root(A, 4, method=METHOD)
    cn = matroots.inverse_root(A, 4, method="coupled_newton")
    assert pe.converged and cn.converged
    assert pe.matmuls < cn.matmuls


def test_kappa_1e6_schedule_reaches_1e_3_in_40_products() -> None:
    """Issue 27's goal, its algorithmic part: at kappa 1e6 (p = 4, fp64, so rounding ~1e-10 is far
    below the target) the minimax schedule is within 1e-3 of A^{-1/4} after 7 steps, 35 products plus
    the Lanczos estimate (< 1 GEMM-equivalent), i.e. within 40 GEMM-equivalents. The fp32 error there
    is rounding-limited (its floor, ~1e-3 at n = 256 to 1024, depends on the kernel's rounding) and is
    measured, not asserted, by ``experiments/bench_solvers.py --to-target``."""
    A = torch.from_numpy(spd_matrix(64, 1e6, seed=3))
    ref = matroots.reference.inverse_root(A.numpy(), 4).root

    def error(k: int) -> tuple[float, float]:
        res = matroots.inverse_root(A, 4, method=METHOD, max_iter=k, quiet=True)
        X = res.root.numpy()
        return float(np.linalg.norm(X - ref) / np.linalg.norm(ref)), float(res.matmuls)

    err7, mm7 = error(7)
    assert err7 <= 1e-4 and mm7 <= 40.0, (err7, mm7)
