"""A batched coupled Newton solve does not wait for its slowest element, and equals per-element solves.

Every element of a batch goes through the arithmetic of its own solve: the per-step scalars (c, the
dynamic scaling, the stopping tests) are per element, converged elements leave the active set, and the
last active element runs on 2-D tensors as a single solve does. The products are not the same kernel
calls, though: a batched product over a subset of rows and the 2-D product of one matrix alone are
bitwise equal on some CPUs (MKL on AVX-512 EPYC at n = 16, where each 16 x 16 fp64/fp32 element is
64-byte aligned) and not on others (n = 33 fp64 there, the Lanczos projections, 16-bit formats, other
BLAS builds: docs/design.md, "Across CPUs"). So the roots are compared with a bound, the accuracy
contract applied to both (triangle inequality: each is within B of the exact root of fl(A)),

    ||X_batch - X_solo||_F / ||X_solo||_F <= 2 B,   B = C_FWD sqrt(n) (1 + cond) u,

cond = kappa/p (inverse) or kappa^(1 - 1/p)/p (forward) of the element, C_FWD = 10 (tests/_refs.py),
and the integer outcomes (iterations, flags, stop reasons, products spent) must be equal: the
residuals of the two runs differ by rounding only, and they pass a threshold within rounding of it
only by a coincidence the quadratic phase makes negligible (it has not happened on either kernel path
of the CI). Bitwise equality is asserted only where it holds by construction: within one run (an
element's history after it stopped repeats its final residual) and for the same call on the same
bits (the reused work buffers).

The matrices are scaled by exact powers of two so that max|A| lies in [1, 2): the API pre-scales a
whole batch by one power of two when its magnitude leaves [1/4, 4] (matroots.core.inputs), and undoing a
fractional power of that factor rounds, which would make an element differ from its solve alone for a
reason that has nothing to do with batching.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from _refs import C_FWD, U, fwd_bound, haar_orthogonal, ref_inverse_root, ref_power, rel_err, spd_matrix

import matroots
from matroots.solvers.newton_loop import coupled_newton_iterate

N = 16
KAPPAS = np.logspace(1, 8, 6)  # mixed spectra: the elements stop 6..28 iterations apart


def _mixed_stack(n: int = N, kappas: np.ndarray = KAPPAS, seed: int = 10) -> np.ndarray:
    mats = [spd_matrix(n, k, seed=seed + i, lmax=10.0 ** (i % 3 - 1)) for i, k in enumerate(kappas)]
    A = np.stack(mats)
    return A * 2.0 ** -np.floor(np.log2(np.abs(A).max(axis=(1, 2))))[:, None, None]


def _solve(A: np.ndarray, p: int, inverse: bool, **kw):
    fn = matroots.inverse_root if inverse else matroots.root
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)  # fp32 at kappa 1e8 may not converge
        return fn(torch.from_numpy(A), p, method="coupled_newton", record_history=True, **kw)


def _cond(kappa: float, p: int, inverse: bool) -> float:
    """The root's relative condition number for an SPD matrix of condition number kappa."""
    return kappa / p if inverse else kappa ** (1 - 1 / p) / p


def _batch_bound(kappa: float, p: int, inverse: bool, u: float, n: int = N) -> float:
    """2 B: twice the accuracy contract C_FWD sqrt(n) (1 + cond) u (module doc)."""
    return 2.0 * C_FWD * math.sqrt(n) * (1.0 + _cond(kappa, p, inverse)) * u


def _assert_equals_per_element(A, p, inverse, u=None, **kw):
    """Integer outcomes equal; with ``u`` (the working format's unit roundoff), every root converged in
    both runs within 2 B of its solo root (module doc), kappa from the fp64 spectrum of A."""
    res = _solve(A, p, inverse, **kw)
    b = A.shape[0]
    singles = [_solve(A[i], p, inverse, **kw) for i in range(b)]
    for i, one in enumerate(singles):
        assert int(res.iterations[i]) == one.iterations, i
        assert bool(res.converged[i]) == one.converged, i
        assert res.info["stop_reason"][i] == one.info["stop_reason"][0], i
        if u is not None and one.converged:
            kappa = float(np.linalg.cond(A[i]))
            diff = rel_err(res.root[i].double().numpy(), one.root.double().numpy())
            assert diff <= _batch_bound(kappa, p, inverse, u), (i, diff)
        # by construction within the batch run: the history repeats an element's final residual once it
        # has stopped
        h_batch = [float(h[i]) for h in res.history]
        assert len(h_batch) >= len(one.history), i
        assert all(r == h_batch[len(one.history) - 1] for r in h_batch[len(one.history) :]), i
        assert float(res.info["newton_matmuls"][i]) == float(one.info["newton_matmuls"][0]), i
    # matmuls is per matrix: a batch costs b * matmuls, the sum of its elements' costs
    assert res.matmuls * b == pytest.approx(sum(one.matmuls for one in singles), rel=1e-12)
    assert max(res.iterations.tolist()) - min(res.iterations.tolist()) >= 3  # the spectra really are mixed
    return res, singles


@pytest.mark.parametrize("inverse", [True, False], ids=["inverse", "forward"])
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("scaling", ["auto", "dynamic"])
def test_batch_equals_per_element_solves(scaling, dtype, p, inverse):
    A = _mixed_stack()
    u = U["fp64" if dtype == torch.float64 else "fp32"]
    res, _ = _assert_equals_per_element(A, p, inverse, u=u, dtype=dtype, scaling=scaling)
    # and the roots are right: every converged one within the conditioning bound of the mpmath root
    solved = A.astype(np.float32).astype(np.float64) if dtype == torch.float32 else A  # fl(A)
    assert int(res.converged.sum()) >= 4
    for i in range(A.shape[0]):
        if not bool(res.converged[i]):
            continue
        ref = ref_inverse_root(solved[i], p) if inverse else ref_power(solved[i], Fraction(1, p))
        cond = _cond(KAPPAS[i], p, inverse)
        assert rel_err(res.root[i].double().numpy(), ref) <= 5 * math.sqrt(N) * (cond + 1) * u, i


def test_frobenius_scaling_and_the_retry_merge_equal_per_element():
    """fp32 with kappa up to 1e8: the dynamic scaling diverges on the worst elements and they are rerun
    with Frobenius's c (the retry/merge path); the merged batch still equals each element's solve."""
    A = _mixed_stack(seed=0)
    u = U["fp32"]
    _assert_equals_per_element(A, 4, True, u=u, dtype=torch.float32, scaling="frobenius")
    res, singles = _assert_equals_per_element(A, 4, True, u=u, dtype=torch.float32, scaling="dynamic")
    retried = res.info.get("retried_frobenius", [])
    assert 1 <= len(retried) < A.shape[0]  # (if dynamic scaling stops diverging here, pick another case)
    assert [i for i, one in enumerate(singles) if "retried_frobenius" in one.info] == retried


@pytest.mark.parametrize("inverse", [True, False], ids=["inverse", "forward"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16bit_batch_is_within_its_rounding(inverse, dtype):
    """Equal iteration counts, flags and stop reasons; each root within the iteration's rounding floor
    4 sqrt(n) (cond + 1) u of its solve alone (both are that close to the exact root of fl(A); cond the
    root's condition number, kappa/p inverse, kappa^(1 - 1/p)/p forward). kappa u < 1 in fp16 here; in
    bf16 the bound passes 1 from kappa ~ 30, where bf16 cannot resolve the root and the integer
    outcomes carry the test."""
    kappas = np.logspace(1, 3, 6)
    A = _mixed_stack(kappas=kappas)
    res, singles = _assert_equals_per_element(A, 2, inverse, dtype=dtype)
    key = "bf16" if dtype == torch.bfloat16 else "fp16"
    for i, one in enumerate(singles):
        cond = (kappas[i] / 2) if inverse else math.sqrt(kappas[i]) / 2
        diff = rel_err(res.root[i].double().numpy(), one.root.double().numpy())
        assert diff <= 4 * math.sqrt(N) * (cond + 1) * U[key], (i, diff)


def test_warm_start_batch_equals_per_element():
    """Warm starts (spectral interval from the previous root + dynamic scaling) are per element too."""
    kappas = np.logspace(1, 6, 5)
    A = _mixed_stack(kappas=kappas)
    prev = _solve(A, 4, True)
    E = np.random.default_rng(0).standard_normal(A.shape) / math.sqrt(N)
    lmin = np.linalg.eigvalsh(A)[:, 0]
    A2 = A + 0.1 * lmin[:, None, None] * (E @ E.transpose(0, 2, 1))  # a PSD, non-commuting change
    res = _solve(A2, 4, True, warm_start=prev)
    assert res.info["scaling"] == "warm"
    for i in range(A.shape[0]):
        one = _solve(A2[i], 4, True, warm_start=prev.root[i])
        assert int(res.iterations[i]) == one.iterations
        kappa = float(np.linalg.cond(A2[i]))
        assert rel_err(res.root[i].numpy(), one.root.numpy()) <= _batch_bound(kappa, 4, True, U["fp64"]), i


def test_products_executed_are_the_sum_of_the_elements():
    """Count the products actually executed (torch.matmul rows): the batch spends exactly what its
    elements spend alone, and once one element is left it runs on 2-D tensors (the single fast path)."""
    A = torch.from_numpy(_mixed_stack())
    b, p = A.shape[0], 4
    lmax = torch.linalg.eigvalsh(A)[:, -1]
    cp = 2.0 * lmax / (p + 1)
    calls: list[tuple[int, int]] = []
    real = torch.matmul

    def counting(x, y, *args, **kwargs):
        calls.append((x.dim(), x.shape[0] if x.dim() == 3 else 1))
        return real(x, y, *args, **kwargs)

    kw = {"tol": 1e-12, "max_iter": 100, "stagnation_accept": 16e-12}
    try:
        torch.matmul = counting
        out = coupled_newton_iterate(A, p, cp, **kw)
        batch_calls = list(calls)
        calls.clear()
        alone = [coupled_newton_iterate(A[i : i + 1], p, cp[i : i + 1], **kw) for i in range(b)]
        alone_calls = list(calls)
    finally:
        torch.matmul = real
    per_iter = 4  # X T, T^2, (T^2)^2, T^4 M
    executed = sum(rows for _, rows in batch_calls)
    assert executed == per_iter * int(out.iterations.sum())
    assert executed == sum(rows for _, rows in alone_calls)
    assert all(dim == 2 for dim, _ in alone_calls)  # single matrices: 2-D mm throughout
    its = sorted(out.iterations.tolist())
    assert sum(1 for dim, _ in batch_calls if dim == 2) == per_iter * (its[-1] - its[-2])
    assert out.matmuls == pytest.approx(per_iter * float(out.iterations.double().mean()), rel=1e-15)
    assert out.matmuls_each.tolist() == [per_iter * k for k in out.iterations.tolist()]
    assert out.compactions == len(set(its))
    for i, one in enumerate(alone):
        assert int(out.iterations[i]) == int(one.iterations[0])
        # X^ -> (A/c^p)^{-1/p}: the same relative bound as the root (module doc)
        kappa = float(np.linalg.cond(A[i].numpy()))
        assert rel_err(out.X[i].numpy(), one.X[0].numpy()) <= _batch_bound(kappa, p, True, U["fp64"]), i


def test_elements_done_at_the_start_never_iterate():
    """An element whose M_0 already meets tol (A = c^p I) keeps X_0 and costs no product."""
    A = torch.from_numpy(_mixed_stack(kappas=np.array([1e2, 1e4])))
    A = torch.cat([A, 2.0 * torch.eye(N, dtype=A.dtype)[None]])
    cp = torch.linalg.eigvalsh(A)[:, -1] * 2.0 / 3.0
    cp[-1] = 2.0
    out = coupled_newton_iterate(A, 2, cp, tol=1e-12, max_iter=100, stagnation_accept=16e-12)
    assert out.iterations.tolist()[-1] == 0 and out.reason[-1] == "tol" and bool(out.converged[-1])
    assert torch.allclose(out.X[-1], torch.eye(N, dtype=A.dtype) / math.sqrt(2.0), rtol=2.3e-16, atol=0)
    assert float(out.matmuls_each[-1]) == 0.0


def test_relative_eps_certifies_lambda_max_per_element():
    """A relative eps needs lambda_max certified to 1e-12: Lanczos is rerun with more steps only for the
    elements whose residual bound is not there yet (an arithmetic spectrum at n = 96), so the batch's
    costs are each element's own and its shifts and roots each element's up to rounding."""
    n = 96
    Q = haar_orthogonal(n, np.random.default_rng(1))
    arith = (Q * np.linspace(1e-3, 1.0, n)) @ Q.T
    A = np.stack([spd_matrix(n, 1e3, seed=3), 0.5 * (arith + arith.T), spd_matrix(n, 1e5, seed=4)])
    A = A * 2.0 ** -np.floor(np.log2(np.abs(A).max(axis=(1, 2))))[:, None, None]
    kw = {"eps": 1e-6, "eps_mode": "relative"}
    res = _solve(A, 4, True, **kw)
    singles = [_solve(A[i], 4, True, **kw) for i in range(A.shape[0])]
    assert len({one.matmuls for one in singles}) > 1  # the elements needed different Lanczos runs
    for i, one in enumerate(singles):
        # Lanczos projects in batched products, which round with a stack element's alignment on some
        # CPUs (MKL, AVX-512 EPYC: 1 ulp in element 1's eps_abs), so the shifts agree to their
        # certification: each within 1e-12 relative of the true lambda_max, so 2e-12 of each other.
        assert float(res.info["eps_abs"][i]) == pytest.approx(float(one.info["eps_abs"][0]), rel=2e-12)
        assert int(res.iterations[i]) == one.iterations
        # roots of A + eps I with eps 2e-12-relative apart: each within fwd_bound of its exact root,
        # and the shifts move the root by <= (1/p) 2e-12 eps / lambda_min ~ 2e-18 kappa, far below it
        kappa = float(np.linalg.cond(A[i]))
        assert rel_err(res.root[i].numpy(), one.root.numpy()) <= 2 * fwd_bound(kappa, 4, n, U["fp64"]), i
        # the shift is eps times the true lambda_max (the largest eigenvalue, LAPACK in float64)
        lam = float(np.linalg.eigvalsh(A[i])[-1])
        assert float(res.info["eps_abs"][i]) == pytest.approx(1e-6 * lam, rel=1e-11)
    assert res.matmuls * A.shape[0] == pytest.approx(sum(one.matmuls for one in singles), rel=1e-12)


@pytest.mark.parametrize("scaling", ["auto", "dynamic"])
def test_wide_batch_equals_per_element_too(scaling):
    """32 elements fill whole SIMD lanes of the per-element scalar arithmetic (c = (c^p)^(1/p) and the
    dynamic scale factors): equal integer outcomes, roots within 2 B of their solo roots (module doc)."""
    kappas = np.logspace(1, 6, 32)
    A = _mixed_stack(n=8, kappas=kappas)
    res = _solve(A, 4, True, scaling=scaling)
    for i in range(A.shape[0]):
        one = _solve(A[i], 4, True, scaling=scaling)
        kappa = float(np.linalg.cond(A[i]))
        assert rel_err(res.root[i].numpy(), one.root.numpy()) <= _batch_bound(
            kappa, 4, True, U["fp64"], n=8
        ), i
        assert int(res.iterations[i]) == one.iterations, i


def test_reused_work_buffers_never_leak_into_results():
    """The iteration's buffers are reused across calls (matroots.solvers.workspace): a result must stay
    what it was after later solves of the same shape, in this thread and in another one, and equal a
    solve with an empty buffer cache."""
    import threading

    from matroots.solvers import workspace

    A = torch.from_numpy(_mixed_stack())
    first = _solve(A.numpy(), 4, True)
    kept = first.root.clone()
    other = torch.from_numpy(_mixed_stack(seed=40))
    _solve(other.numpy(), 4, True)  # same shape: takes the cached set
    assert torch.equal(first.root, kept)
    seen: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: seen.append(_solve(A.numpy(), 4, True).root))
    worker.start()
    worker.join()
    workspace.clear_cache()
    fresh = _solve(A.numpy(), 4, True)
    assert torch.equal(seen[0], kept) and torch.equal(fresh.root, kept) and torch.equal(first.root, kept)
