"""coupled_newton warm starts are judged on the result: a previous root of another matrix never makes a
converged answer worse than the cold solve's bound (issue 22, class 1), and a bad warm start is refused.

Yardstick: the forward error against :mod:`matroots.truth.reference` (flint/mpmath, from the exact matrix
solved: the input rounded to the working format and symmetrised), relative to the condition number of
the root asked for, cond(f, A) = max |f[lambda_i, lambda_j]| ||A||_F / ||f(A)||_F (Higham, *Functions of
Matrices*, 2008, Cor. 3.16), computed here from the reference's eigenvalues:

    ||X - X_ref||_F / ||X_ref||_F <= C_FWD sqrt(n) (1 + cond(f, A)) u,   C_FWD = 10,

the accuracy tests' bound (tests/_refs.py, tests/test_solvers_accuracy.py). A converged result outside
it is a silent wrong answer. The cold solves of every case below are inside it (max 6 (1 + cond) u
measured); the warm starts before the fix reached 1e3..1e10 (1 + cond) u.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from _refs import haar_orthogonal

import matroots
from matroots.truth import reference

C_FWD = 10.0
UNIT = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}


def cond_power(lam: np.ndarray, q: float) -> float:
    """Relative condition number of A^q for SPD A with eigenvalues ``lam`` (divided differences of
    x^q, f[a, b] = b^(q-1) expm1(q log r) / expm1(log r) with r = a/b, stable for a ~ b)."""
    lam = np.asarray(lam, dtype=float)
    a, b = lam[:, None], lam[None, :]
    lr = np.log(a / b)
    with np.errstate(invalid="ignore", divide="ignore"):
        dd = np.where(np.abs(lr) < 1e-12, q * b ** (q - 1), b ** (q - 1) * np.expm1(q * lr) / np.expm1(lr))
    return float(np.abs(dd).max() * np.linalg.norm(lam) / np.linalg.norm(lam**q))


def solved_matrix(A: torch.Tensor) -> np.ndarray:
    """The matrix coupled_newton solves: the input in its working format, symmetrised (exact in fp64)."""
    A64 = A.double().numpy()
    return 0.5 * (A64 + A64.T)


def error_and_bound(res, A: torch.Tensor, p: int, inverse: bool) -> tuple[float, float]:
    As = solved_matrix(A)
    ref = (reference.inverse_root if inverse else reference.root)(As, p, cache=False)
    X_ref = np.asarray(ref.root, dtype=float)
    err = float(np.linalg.norm(res.root.double().numpy() - X_ref) / np.linalg.norm(X_ref))
    cond = cond_power(np.asarray(ref.eigenvalues, dtype=float).real, (-1.0 if inverse else 1.0) / p)
    n = A.shape[-1]
    return err, C_FWD * math.sqrt(n) * (1.0 + cond) * UNIT[A.dtype]


def spd(n: int, log10_kappa: float, rng: np.random.Generator, kind: str = "geometric", scale: float = 1.0):
    Q = haar_orthogonal(n, rng)
    if kind == "geometric":
        lam = np.logspace(-log10_kappa, 0.0, n)
    elif kind == "clustered":  # two clusters at the ends
        lam = np.where(np.arange(n) < n // 2, 10.0**-log10_kappa, 1.0) * (1 + 0.01 * rng.random(n))
    else:  # log-uniform interior, both ends present
        lam = 10.0 ** (-log10_kappa * rng.random(n))
        lam[0], lam[-1] = 1.0, 10.0**-log10_kappa
    A = (Q * (scale * lam)) @ Q.T
    return 0.5 * (A + A.T)


def issue_pair():
    """The repro of issue 22 class 1: the previous factor has kappa 1e6, the current one kappa 10."""

    def make(seed: int, k: int) -> torch.Tensor:
        q = torch.tensor(np.linalg.qr(np.random.default_rng(seed).standard_normal((32, 32)))[0])
        A = (q * torch.logspace(0, -k, 32, dtype=torch.float64)) @ q.T
        return ((A + A.T) / 2).float()

    return make(1, 6), make(2, 1)


def test_warm_start_from_a_differently_conditioned_root_keeps_the_bound():
    A0, A1 = issue_pair()
    prev = matroots.inverse_root(A0, 4, method="coupled_newton")
    warm = matroots.inverse_root(A1, 4, method="coupled_newton", warm_start=prev)
    cold = matroots.inverse_root(A1, 4, method="coupled_newton")
    assert warm.all_converged and cold.all_converged
    err_w, bound = error_and_bound(warm, A1, 4, True)
    err_c, _ = error_and_bound(cold, A1, 4, True)
    assert err_c <= bound
    assert err_w <= bound, (err_w, err_c, bound)  # before: 5.1e-4 (cold 2.8e-7, bound 1.1e-5)
    assert warm.info["warm_start_fallback"] == [0]  # lambda_min(A0) is 1e5 x below lambda_min(A1)


def test_a_warm_start_that_falls_back_is_the_cold_solve():
    """Bitwise by construction: the same Lanczos run, the same scaling, the same iteration (no spectral
    interval is passed once every element falls back), on the same machine."""
    A0, A1 = issue_pair()
    for p, inverse in ((2, True), (4, True), (3, False)):
        fn = matroots.inverse_root if inverse else matroots.root
        warm = fn(A1, p, method="coupled_newton", warm_start=fn(A0, p, method="coupled_newton"))
        cold = fn(A1, p, method="coupled_newton")
        assert warm.info["warm_start_fallback"] == [0] and warm.info["scaling"] == cold.info["scaling"]
        assert torch.equal(warm.root, cold.root) and warm.iterations == cold.iterations


def test_a_warm_start_that_overflows_the_working_format_is_the_cold_solve():
    """A finite previous root of 1e39 I overflows fp32 (max 3.4e38) once rounded to the working format:
    it is not used (before the fix, Lanczos on its Inf entries ended in torch's raw LinAlgError), and the
    solve is the cold one bitwise by construction (the same code path with no warm start)."""
    q = np.linalg.qr(np.random.default_rng(0).standard_normal((5, 5)))[0]
    A = torch.tensor((q * np.logspace(0, -2, 5)) @ q.T)
    A = (A + A.T) / 2
    huge = 1e39 * torch.eye(5, dtype=torch.float64)
    for p, fn in ((2, matroots.root), (2, matroots.inverse_root), (1, matroots.inverse_root)):
        warm = fn(A, p, method="coupled_newton", dtype="fp32", warm_start=huge)
        cold = fn(A, p, method="coupled_newton", dtype="fp32")
        assert (
            "overflows fp32" in warm.info["warm_start_note"] and warm.info["scaling"] == cold.info["scaling"]
        )
        assert torch.equal(warm.root, cold.root) and warm.iterations == cold.iterations


def test_batch_mixes_warm_and_cold_elements():
    """Per element: an element whose previous root fits keeps its warm start; the other falls back."""
    A0, A1 = issue_pair()
    rng = np.random.default_rng(5)
    E = torch.tensor(rng.standard_normal((32, 32)) * 1e-4, dtype=torch.float32)
    A1b = A1 + 0.5 * (E + E.T)  # a small change of A1: A1's root fits it
    prev = matroots.inverse_root(torch.stack([A0, A1]), 4, method="coupled_newton")
    res = matroots.inverse_root(torch.stack([A1, A1b]), 4, method="coupled_newton", warm_start=prev)
    assert res.info["warm_start_fallback"] == [0] and res.info["scaling"] == "warm"
    for i, A in enumerate((A1, A1b)):
        one = matroots.inverse_root(A, 4, method="coupled_newton")
        err, bound = error_and_bound(one, A, 4, True)
        err_b = float(np.linalg.norm(res.root[i].double().numpy() - one.root.double().numpy()))
        assert err <= bound and err_b / float(np.linalg.norm(one.root.double().numpy())) <= 2 * bound


KINDS = ("conditioning", "rank", "scale", "near", "same")


def _previous_matrix(A1: np.ndarray, how: str, rng: np.random.Generator) -> np.ndarray:
    n = A1.shape[0]
    if how == "conditioning":  # another matrix, kappa 1 .. 1e12
        return spd(n, rng.uniform(0, 12), rng, str(rng.choice(["geometric", "uniform"])))
    if how == "rank":  # a Gram matrix of rank r < n plus a tiny eps (a young Shampoo factor)
        r = int(rng.integers(1, n))
        G = rng.standard_normal((n, r))
        B = G @ G.T / r
        return 0.5 * (B + B.T) + 10.0 ** rng.uniform(-8, -2) * np.eye(n)
    if how == "scale":  # the same matrix at another scale
        return A1 * 10.0 ** rng.uniform(-6, 6)
    if how == "near":  # a small non-commuting change (the optimizer's usual case)
        S = np.eye(n) + 1e-3 * rng.standard_normal((n, n))
        B = S @ A1 @ S.T
        return 0.5 * (B + B.T)
    return A1.copy()


def _fuzz_case(rng: np.random.Generator) -> dict:
    dtype = torch.float32 if rng.random() < 0.5 else torch.float64
    return dict(
        dtype=dtype,
        n=int(rng.choice([8, 16, 24])),
        p=int(rng.choice([1, 2, 3, 4, 6, 8, 16])),
        inverse=bool(rng.random() < 0.75),
        log10_kappa=float(rng.uniform(0, 5 if dtype == torch.float32 else 11)),
        kind=str(rng.choice(["geometric", "clustered", "uniform"])),
        scale=float(10.0 ** rng.uniform(-3, 3)),
        how=KINDS[int(rng.integers(len(KINDS)))],
    )


FUZZ_CASES = 200


def test_warm_start_fuzz_has_no_silent_wrong_answer():
    """Previous matrices of another conditioning, another rank, another scale, a nearby and the same
    matrix; fp32 and fp64; inverse and forward roots, p = 1 .. 16. Every converged warm result is within
    the bound (before the fix: 3 of these 60 were converged and 10^2..10^4 (1 + cond) u off)."""
    rng = np.random.default_rng(20261201)
    silent, checked = [], 0
    for k in range(FUZZ_CASES):
        c = _fuzz_case(rng)
        A1 = spd(c["n"], c["log10_kappa"], rng, c["kind"], c["scale"])
        A0 = _previous_matrix(A1, c["how"], rng)
        fn = matroots.inverse_root if c["inverse"] else matroots.root
        A1t = torch.tensor(A1, dtype=c["dtype"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", matroots.ConvergenceWarning)
            try:  # a previous matrix not positive definite in the format has no root to start from
                prev = fn(torch.tensor(A0, dtype=c["dtype"]), c["p"], method="coupled_newton")
            except matroots.core.errors.MatrootsNumericalError:
                continue
            warm = fn(A1t, c["p"], method="coupled_newton", warm_start=prev)
        checked += 1
        if not warm.all_converged:
            continue  # flagged: not silent
        err, bound = error_and_bound(warm, A1t, c["p"], c["inverse"])
        if not err <= bound:
            silent.append((k, c, err, bound))
    assert not silent, silent
    assert checked >= FUZZ_CASES // 2


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_warm_start_is_a_typed_input_error(p, bad):
    """Issue 28, item 9: was a bare AssertionError (p >= 2) deep in the scaling code."""
    A = torch.tensor(spd(8, 2, np.random.default_rng(0)))
    Z = matroots.inverse_root(A, p, method="coupled_newton").root.clone()
    Z[3, 5] = bad
    with pytest.raises(matroots.NonFiniteInputError, match="warm_start"):
        matroots.inverse_root(A, p, method="coupled_newton", warm_start=Z)
    batch = torch.stack([A, A])
    Zb = torch.stack([Z.nan_to_num(0.0), Z])
    with pytest.raises(matroots.NonFiniteInputError, match=r"warm_start.*\[1\]"):
        matroots.inverse_root(batch, p, method="coupled_newton", warm_start=Zb)


def test_fp16_warm_start_with_a_frobenius_retry_merges_its_roots():
    """The warm fuzz (experiments/robustness.py --warm --seed 20261203) crashed here: fp16, p = 1, a
    batch of two exact diagonal matrices at kappa 10^13.2 warm-started from the roots of kappa-10 ones.
    The dynamic scaling diverged on both and the Frobenius retry ended in another format than the first
    run (RuntimeError "Index put requires the source and destination dtypes match" in the merge). Now
    the merge keeps the wider format and the outcome is a flagged root or a typed refusal."""

    def diag(log_kappa):
        d = np.logspace(0, -log_kappa, 6)
        return torch.tensor(np.stack([np.diag(d), np.diag(d[::-1])]))

    kw = {"method": "coupled_newton", "eps": 4.15e-7, "eps_mode": "relative", "dtype": torch.float16}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", matroots.ConvergenceWarning)
        prev = matroots.inverse_root(diag(1.03), 1, **kw)
        try:
            res = matroots.inverse_root(diag(13.2), 1, warm_start=prev, **kw)
        except matroots.core.errors.MatrootsNumericalError:
            return
    # kappa u_16 ~ 8e9: no digit of the inverse is promised in fp16, so it is never "converged"
    assert not bool(res.converged.any())
    assert res.root.dtype == torch.float16
