"""The eigenpairs' certificate of ``method="auto"`` decomposing first (matroots.solvers.auto_certificate):
where Weyl's bound on the computed eigenvalues leaves a band open (fp32, n = 128, kappa ~7.6e3-1.45e4
around the shipped table's 1e4 edge), Rayleigh quotients, Kato-Temple and one float64 Cholesky
decide it without the float64 estimate -- and never on the wrong side of the exact kappa of the matrix
given (its fp32 entries, plus eps I)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

import matroots
from matroots.solvers import kappa_estimate
from matroots.solvers.auto import AutoConfig
from matroots.solvers.auto_candidates import candidate
from matroots.solvers.auto_certificate import cholesky_lower_bound, extreme_bounds
from matroots.solvers.auto_first import (
    MAX_CERTIFIED,
    SOURCE,
    SOURCE_CERTIFIED,
    SOURCE_ELSEWHERE,
    SOURCE_ELSEWHERE_CERTIFIED,
    spectrum_estimate,
)
from matroots.solvers.auto_plan import plan_for
from matroots.solvers.auto_table import load_table
from matroots.study import matrices

N = 128
U64 = 2.0**-53
DECIDED = (SOURCE, SOURCE_CERTIFIED, SOURCE_ELSEWHERE, SOURCE_ELSEWHERE_CERTIFIED)


def _randsvd(kappa: float, n: int = N, seed: int = 5, mode: int = 3) -> torch.Tensor:
    A = torch.from_numpy(matrices.generate("randsvd", n, kappa, np.random.default_rng(seed), mode=mode)[0])
    return torch.maximum(A, A.mT)  # exactly symmetric


def _shampoo_factor(kappa: float, rank: int, seed: int) -> tuple[torch.Tensor, float]:
    """A rank-deficient fp32 Shampoo-like factor G G^T (G: n x rank, fp32, baddbmm) and the eps that
    puts kappa(G G^T + eps I) near ``kappa``."""
    G = torch.randn(1, N, rank, generator=torch.Generator().manual_seed(seed))
    top = float(np.linalg.eigvalsh((G @ G.mT).double().numpy())[0, -1])
    return G, top / kappa


def _cases(kappa: float) -> dict[str, tuple[torch.Tensor, dict]]:
    G, eps = _shampoo_factor(kappa, 32, seed=int(kappa) % 97)
    eye = torch.eye(N).expand(1, N, N)
    in_entries = torch.baddbmm(eps * eye, G, G.mT)[0]  # the eps in the factor's fp32 entries
    bare = torch.baddbmm(torch.zeros(1, N, N), G, G.mT)[0]  # eps as the solve's option
    return {
        "randsvd": (_randsvd(kappa).float(), {}),
        "GGt+eps": (torch.maximum(in_entries, in_entries.mT), {}),
        "GGt,eps=": (torch.maximum(bare, bare.mT), {"eps": eps}),
    }


def _exact_kappa(A: torch.Tensor, eps: float) -> float:
    """kappa(A + eps I) of the matrix given (its entries exactly), from numpy's float64 eigvalsh."""
    w = np.linalg.eigvalsh(A.double().numpy())
    return (w[-1] + eps) / (w[0] + eps)


@pytest.fixture
def estimates(monkeypatch) -> list[int]:
    """How often auto takes its float64 kappa estimate."""
    calls = [0]
    real = kappa_estimate.estimate_kappa

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(kappa_estimate, "estimate_kappa", counted)
    return calls


@pytest.mark.parametrize("family", ["randsvd", "GGt+eps", "GGt,eps="])
@pytest.mark.parametrize("kappa", [8e3, 9e3, 1.1e4, 1.3e4])
def test_near_the_1e4_edge_the_decision_is_the_exact_kappas_without_the_estimate(
    kappa: float, family: str, estimates: list[int]
) -> None:
    """fp32, n = 128, p = 4, shipped table (eigh below kappa 1e4, polar_express above): the choice is
    the one the exact kappa's band names (numpy float64 eigvalsh: its error, ~1e-12 relative here, is
    far inside the 10% to the edge), no float64 estimate runs, and the root is bitwise the chosen
    configuration's own solve."""
    A, opts = _cases(kappa)[family]
    exact = _exact_kappa(A, opts.get("eps", 0.0))
    assert 0.75 < exact / kappa < 1.25  # the case is near the edge it is meant to test
    want = AutoConfig().decide(device="cpu", dtype=torch.float32, n=N, kappa=exact, p=4, target=1e-3)
    res = matroots.inverse_root(A, 4, method="auto", **opts)
    a = res.info["auto"]
    assert a["chosen"] == [want.label], (exact, a["kappa_source"])
    assert estimates[0] == 0 and a["kappa_source"] in DECIDED
    cfg, sopts = candidate(load_table(), want.label)
    assert torch.equal(res.root, cfg.solve(A, 4, **opts, **sopts).root)
    # the reported kappa: the computed eigenvalues' or the Rayleigh quotients', inside Weyl's interval
    # (2 (n + 2) u32 kappa relative to first order, u32 = 2^-24)
    rate = 2 * (N + 2) * 2.0**-24 * exact
    assert a["kappa_estimate"][0] == pytest.approx(exact, rel=1.01 * rate / (1 - rate))


def test_a_batch_of_both_sides_of_the_edge_is_certified_without_the_estimate(estimates: list[int]) -> None:
    """kappa 10 (Weyl decides), 9e3 and 1.3e4 (the certificate decides): eigh for the first two as one
    group, polar_express for the third, no float64 estimate."""
    A = torch.stack([_randsvd(10.0, seed=1), _randsvd(9e3, seed=2), _randsvd(1.3e4, seed=3)]).float()
    res = matroots.inverse_root(A, 4, method="auto")
    a = res.info["auto"]
    exact = [_exact_kappa(x, 0.0) for x in A]
    want = [
        AutoConfig().decide(device="cpu", dtype=torch.float32, n=N, kappa=k, p=4, target=1e-3).label
        for k in exact
    ]
    assert a["chosen"] == want and want[0] == want[1] != want[2]
    assert a["kappa_source"] == SOURCE_ELSEWHERE_CERTIFIED and estimates[0] == 0


# ---------------------------------------------------------------------------------------- the bounds
def _exact_ends(A: torch.Tensor) -> tuple[float, float, float]:
    """(lambda_1, lambda_n, err) of the matrix given: mpmath (60 digits, err ~0) up to n = 8, else
    numpy's float64 eigvalsh with its error bound 2 (n + 2) u ||A||_2 (backward stability, Weyl)."""
    n = A.shape[-1]
    if n <= 8:
        with mpmath.workdps(60):
            w = mpmath.eigsy(mpmath.matrix(A.double().tolist()), eigvals_only=True)
            w = sorted(float(x) for x in w)
        return w[0], w[-1], 1e-40 * max(abs(w[0]), abs(w[-1]))
    w = np.linalg.eigvalsh(A.double().numpy())
    return float(w[0]), float(w[-1]), 2 * (n + 2) * U64 * max(abs(w[0]), abs(w[-1]))


def _clustered(n: int, gap: float, kappa: float, seed: int) -> torch.Tensor:
    """Geometric spectrum in [1/kappa, 1] whose two smallest eigenvalues are ``gap`` (relative) apart."""
    rng = np.random.default_rng(seed)
    w = kappa ** (-np.arange(n)[::-1] / max(n - 1, 1))
    if n > 1:
        w[1] = w[0] * (1 + gap)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = torch.from_numpy((Q * w) @ Q.T)
    return torch.maximum(A, A.mT)


def _matrices():
    """(name, matrix) over families, formats and sizes, seeded: randsvd modes 1-5, clustered smallest
    eigenvalues (relative gaps 1e-12 .. 1e-2, inside Weyl's bound), rank-deficient G G^T + eps."""
    rng = np.random.default_rng(2026)
    for i in range(60):
        n = int(rng.choice([1, 2, 3, 5, 8, 16, 48, 128]))
        dtype = torch.float32 if i % 2 else torch.float64
        kappa = float(10 ** rng.uniform(0, 7))
        mode = int(rng.integers(1, 6))
        yield f"randsvd{mode} n={n} k={kappa:.2g} {dtype}", _randsvd(kappa, n, seed=i, mode=mode).to(dtype)
        gap = float(10 ** rng.uniform(-12, -2))
        yield f"clustered n={n} gap={gap:.1e} {dtype}", _clustered(n, gap, kappa, seed=i).to(dtype)
        if n >= 8:
            G = torch.randn(1, n, n // 4, generator=torch.Generator().manual_seed(i), dtype=dtype)
            eps = float(10 ** rng.uniform(-6, -1))
            F = torch.baddbmm(eps * torch.eye(n, dtype=dtype).expand(1, n, n), G, G.mT)[0]
            yield f"GGt n={n} eps={eps:.1e} {dtype}", torch.maximum(F, F.mT)


def test_the_certified_intervals_hold_the_exact_extreme_eigenvalues() -> None:
    """Over ~170 seeded matrices (fp32 and fp64, n = 1 .. 128, clustered ends included) the intervals
    of extreme_bounds hold the exact lambda_1 and lambda_n, from the computed eigenpairs and from
    eigenvectors perturbed by 1e-3 (the bounds hold for any vector: Rayleigh, Kato-Temple); where the
    gap lambda_2 - lambda_1 is inside Weyl's bound, Kato-Temple claims nothing (Weyl's interval
    stands)."""
    used_kt = fell_back = 0
    for name, A in _matrices():
        n = A.shape[-1]
        u = 2.0**-24 if A.dtype == torch.float32 else U64
        w, Q = torch.linalg.eigh(A)
        lo, hi, err = _exact_ends(A)
        gen = torch.Generator().manual_seed(n)
        noisy = Q + 1e-3 * torch.randn(Q.shape, generator=gen, dtype=Q.dtype)
        for vecs in (Q, noisy):
            (box,) = extreme_bounds(A[None], vecs[None], w[None], 2 * (n + 2) * u)
            assert box is not None, name
            assert box.m_lo <= lo + err and lo - err <= box.m_hi, (name, box, lo)
            assert box.L_lo <= hi + err and hi - err <= box.L_hi, (name, box, hi)
        (box,) = extreme_bounds(A[None], Q[None], w[None], 2 * (n + 2) * u)
        delta = 2 * (n + 2) * u * float(w.abs().max())
        if n > 1 and name.startswith("clustered"):  # gap <= 1e-2 lambda_1: inside delta unless kappa ~1
            gap = float(np.diff(np.linalg.eigvalsh(A.double().numpy())[:2])[0])
            if gap < 0.5 * delta:
                assert not box.kato_temple[0], name
                assert box.m_lo == pytest.approx(float(w[0]) - delta, rel=1e-6, abs=1e-300), name
                fell_back += 1
        used_kt += box.kato_temple[0]
    assert used_kt >= 10 and fell_back >= 10  # both branches ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_completed_cholesky_bounds_lambda_min_from_below(dtype: torch.dtype) -> None:
    """cholesky_lower_bound(A, c) is c - tau (Demmel's bound on the computed factor) where the float64
    factorisation of A - c I completes: at most the exact lambda_1, for c on both sides of it; and it
    completes a relative 1e-6 below lambda_1 (tau ~ gamma_{n+1} tr(A) is ~1e-12 lambda_n here)."""
    rng = np.random.default_rng(7)
    for i in range(20):
        n = int(rng.choice([2, 8, 33, 128]))
        A = _randsvd(float(10 ** rng.uniform(1, 6)), n, seed=i).to(dtype)
        lo, _, err = _exact_ends(A)
        a = A.double().numpy()
        for rel in (-1e-2, -1e-6, -1e-9, 0.0, 1e-9, 1e-6, 1e-2):
            bound = cholesky_lower_bound(a, lo * (1 + rel))
            assert bound is None or bound <= lo + err, (n, rel, bound, lo)
            if rel <= -1e-6:
                assert bound is not None and bound > lo * (1 + 2 * rel), (n, rel)


def test_a_cholesky_that_completes_above_lambda_min_claims_nothing_above_it() -> None:
    """Shifts c just above the exact lambda_1 (mpmath, n <= 8), within the factorisation's rounding
    (fractions of gamma_{n+1} tr(A)): the float64 Cholesky of A - c I often completes there, and the
    bound it gives, c - tau, is still at most lambda_1 (tau is what rounding can hide)."""
    rng = np.random.default_rng(11)
    completed = 0
    for i in range(40):
        n = int(rng.choice([2, 3, 5, 8]))
        dtype = torch.float32 if i % 2 else torch.float64
        A = _randsvd(float(10 ** rng.uniform(2, 8)), n, seed=100 + i).to(dtype)
        lo, _, err = _exact_ends(A)
        a = A.double().numpy()
        scale = (n + 1) * U64 * float(np.trace(a))
        for t in (1e-3, 1e-2, 1e-1, 0.3):
            bound = cholesky_lower_bound(a, lo + t * scale)
            if bound is not None:
                completed += 1
                assert bound <= lo + err, (n, t, bound, lo)
    assert completed >= 10  # the factorisation did complete above lambda_1: the check ran


def test_an_indefinite_matrix_near_the_edge_keeps_the_usual_path() -> None:
    """No finite kappa: an indefinite fp32 matrix near the edge keeps the usual path (the estimate
    says kappa = inf, outside the table, the safe choice), as before the certificate."""
    A = _randsvd(9e3).float()
    A[0, 0] = -1.0
    res = AutoConfig(fallback=matroots.EighConfig(rank_policy="clamp")).solve(A, 4)
    a = res.info["auto"]
    assert a["kappa_source"] == "eigenvalues (float64 eigvalsh)" and a["kappa_estimate"] == [math.inf]


def test_past_a_few_open_elements_the_batched_estimate_decides() -> None:
    """The certificate runs per element: with more than MAX_CERTIFIED elements open, spectrum_estimate
    leaves the batch to the float64 estimate (None) without calling it; with fewer it is asked for
    exactly the open ones."""
    plan = plan_for(object(), None, matroots.EighConfig(), "cpu", torch.float32, N, 4, 1e-3, True)
    asked: list[list[int]] = []

    def certify(rows: list[int]) -> list[float]:
        asked.append(rows)
        return [9e3] * len(rows)

    def info(b: int) -> dict:  # kappa 1e4 - 1: Weyl's interval straddles the edge; element 0 kappa 10
        lo = [0.1] + [1.0 / (1e4 - 1)] * (b - 1)
        return {"lambda_min": lo, "lambda_max": [1.0] * b, "eps_abs": [0.0] * b}

    assert spectrum_estimate(plan, info(MAX_CERTIFIED + 2), N, torch.float32, certify) is None and not asked
    est = spectrum_estimate(plan, info(MAX_CERTIFIED + 1), N, torch.float32, certify)
    assert asked == [list(range(1, MAX_CERTIFIED + 1))] and est.source == SOURCE_CERTIFIED
    assert est.kappa == [10.0] + [9e3] * MAX_CERTIFIED
