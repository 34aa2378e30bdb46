"""At a kappa band edge, ``method="auto"`` decides without its float64 estimate only on the side of the
edge the exact kappa lies on (matroots.solvers.auto_first's band test, matroots.solvers.auto_certificate's
Rayleigh quotients, Kato-Temple and float64 Cholesky): swept across the edge at relative offsets down
to 1e-9, fp32 (edge 1e4, n = 128: eigh below, polar_express above) and fp64 (edge 1e6: eigh below,
coupled Newton above), randsvd, rank-deficient G G^T (baddbmm) with eps in the entries or as the
solve's option, matrices with an exactly known spectrum, and transposed views.

The exact kappa: for H diag(w) H^T / n (H a Sylvester Hadamard matrix, H H^T = n I; integer w small
enough that every entry is exact in the format) it is (w_n + eps) / (w_1 + eps) exactly (fractions);
otherwise numpy's float64 eigvalsh of the matrix given, with its error bound 2 (n + 2) u ||A||_2
(backward stability, Weyl), and a case whose interval straddles the edge is not judged."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.linalg
import torch

import matroots
from matroots.solvers import kappa_estimate
from matroots.solvers.auto import AutoConfig
from matroots.solvers.auto_first import SOURCE, SOURCE_CERTIFIED, SOURCE_ELSEWHERE, SOURCE_ELSEWHERE_CERTIFIED
from matroots.study import matrices

N = 128
U64 = 2.0**-53
EDGE = {torch.float32: 1e4, torch.float64: 1e6}
TARGET = {torch.float32: 1e-3, torch.float64: 1e-8}
CERTIFIED = (SOURCE_CERTIFIED, SOURCE_ELSEWHERE_CERTIFIED)
PROVED = (SOURCE, SOURCE_ELSEWHERE, *CERTIFIED)  # decided without the float64 estimate
# relative offsets of the exact kappa from the edge: fp32's Weyl interval is ~16% wide there, fp64's ~3e-8
OFFSETS = {
    torch.float32: [s * t for t in (1e-1, 3e-2, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7) for s in (-1, 1)],
    torch.float64: [s * t for t in (1e-7, 3e-8, 1.5e-8, 1e-8, 5e-9, 2e-9, 1e-9) for s in (-1, 1)],
}


def _hadamard_matrix(
    dtype: torch.dtype, kappa0: float, cluster: bool
) -> tuple[torch.Tensor, Fraction, Fraction]:
    """H diag(w) H^T / N, exact in ``dtype`` (integer w, every sum of N of them below 2^(mantissa)),
    and its exact extreme eigenvalues. ``cluster``: all but the top eigenvalue at the bottom (trace ~
    lambda_n: the float64 Cholesky's bound tau is small enough to certify fp64's narrow band);
    else a geometric spectrum."""
    top = 2**16 if dtype == torch.float32 else 2**40  # N * top < 2^24 (fp32) / 2^53 (fp64)
    low = max(1, round(top / kappa0))
    if cluster:
        w = np.full(N, low, dtype=np.int64)
        w[-1] = top
    else:
        w = np.unique(np.round(np.geomspace(low, top, N)).astype(np.int64))
        w = np.concatenate([np.full(N - len(w), low, dtype=np.int64), w])
    H = scipy.linalg.hadamard(N).astype(np.int64)
    A_int = (H * w) @ H.T  # exact integers (|entries| <= N top)
    A = torch.from_numpy(A_int.astype(np.float64) / N).to(dtype)  # exact: N is a power of two
    assert torch.equal(A, A.mT) and torch.equal(A.double() * N, torch.from_numpy(A_int).double())
    return A, Fraction(int(w.min())), Fraction(int(w.max()))


def _float64_ends(A: torch.Tensor) -> tuple[float, float, float]:
    w = np.linalg.eigvalsh(A.double().numpy())
    return float(w[0]), float(w[-1]), 2 * (N + 2) * U64 * max(abs(w[0]), abs(w[-1]))


def _eps_for(lo: float, hi: float, kappa: float) -> float:
    """The absolute eps with (hi + eps) / (lo + eps) = kappa (hi / lo > kappa)."""
    return (hi - kappa * lo) / (kappa - 1)


def _cases(dtype: torch.dtype):
    """(name, A, eps option, exact kappa interval [lo, hi]) across the edge."""
    K = EDGE[dtype]
    for cluster in (False, True):  # exactly known spectra; eps sets the offset
        A, w1, wn = _hadamard_matrix(dtype, 1.3 * K, cluster)
        for t in OFFSETS[dtype]:
            eps = _eps_for(float(w1), float(wn), K * (1 + t))
            k = (wn + Fraction(eps)) / (w1 + Fraction(eps))  # exact
            for view in ("", " (transposed view)"):
                B = A.mT if view else A
                yield f"hadamard cluster={cluster} t={t:g}{view}", B, eps, (float(k), float(k))
    G = torch.randn(1, N, N // 4, generator=torch.Generator().manual_seed(3), dtype=dtype)
    bare = torch.baddbmm(torch.zeros(1, N, N, dtype=dtype), G, G.mT)[0]
    rs = torch.from_numpy(matrices.generate("randsvd", N, 1.2 * K, np.random.default_rng(4))[0]).to(dtype)
    for family, A in (("randsvd", rs), ("G G^T, eps=", bare)):
        A = torch.maximum(A, A.mT)
        lo, hi, err = _float64_ends(A)
        for t in OFFSETS[dtype]:
            eps = _eps_for(lo, hi, K * (1 + t))
            if not eps > err:  # the offset is not reachable with eps >= 0 (rank-deficient: always is)
                continue
            span = ((hi - err + eps) / (lo + err + eps), (hi + err + eps) / (lo - err + eps))
            for view in ("", " (transposed view)"):
                yield f"{family} t={t:g}{view}", (A.mT if view else A), eps, span
    # eps in the fp32/fp64 entries (a Shampoo factor as it is accumulated): the offsets land where rounding puts them
    top = _float64_ends(bare)[1]
    for j, t in enumerate(OFFSETS[dtype]):
        eye = torch.eye(N, dtype=dtype).expand(1, N, N)
        F = torch.baddbmm(top / (K * (1 + t)) * eye, G, G.mT)[0]
        F = torch.maximum(F, F.mT)
        lo, hi, err = _float64_ends(F)
        span = ((hi - err) / (lo + err), (hi + err) / (lo - err))
        yield f"G G^T + eps I t~{t:g}", (F.mT if j % 2 else F), 0.0, span


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_a_decision_without_the_estimate_is_on_the_exact_kappas_side_of_the_edge(dtype, monkeypatch) -> None:
    """Whenever auto decides without the float64 estimate (Weyl's band test or the certificate), the
    configuration is the one the exact kappa's band names. fp32: the certificate decided cases on
    both sides of the edge (Cholesky below, Rayleigh above), so the sweep tests it. fp64: Weyl's
    interval is open only within ~2 (n + 2) u kappa = 3e-8 of the edge, where the Cholesky's own
    rounding bound (gamma_{n+1} tr(A) >= gamma_{n+1} lambda_n) is as wide and the Rayleigh quotient's
    too: the certificate declines there and the estimate decides; Weyl's test decided both sides."""
    estimates = [0]
    real = kappa_estimate.estimate_kappa

    def counted(*args, **kwargs):
        estimates[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(kappa_estimate, "estimate_kappa", counted)
    K = EDGE[dtype]
    auto = AutoConfig()

    def label(kappa: float) -> str:
        return auto.decide(device="cpu", dtype=dtype, n=N, kappa=kappa, p=4, target=TARGET[dtype]).label

    below, above = label(K * (1 - 1e-3)), label(K * (1 + 1e-3))
    assert below != above  # the edge is a real one in the shipped table
    certified = {"below": 0, "above": 0}
    proved = {"below": 0, "above": 0}
    judged = total = 0
    for name, A, eps, (k_lo, k_hi) in _cases(dtype):
        total += 1
        if k_lo < K <= k_hi:  # the reference cannot tell the side
            continue
        judged += 1
        want = below if k_hi < K else above
        res = matroots.inverse_root(A, 4, method="auto", eps=eps)
        a = res.info["auto"]
        side = "below" if k_hi < K else "above"
        if a["kappa_source"] in PROVED:
            assert a["chosen"] == [want], (name, k_lo, k_hi, a["kappa_estimate"], a["kappa_source"])
            proved[side] += 1
        if a["kappa_source"] in CERTIFIED:
            certified[side] += 1
    assert judged >= 0.6 * total and min(proved.values()) >= 8, (judged, total, proved)
    if dtype == torch.float32:
        assert min(certified.values()) >= 20, certified
    assert estimates[0] >= 1  # some cases are left to the estimate (kappa within rounding of the edge)
