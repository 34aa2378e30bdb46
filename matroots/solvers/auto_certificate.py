"""Certified bounds on the kappa of the matrix ``method="auto"`` decomposed first, from the computed
eigenpairs, where Weyl's bound on the computed eigenvalues leaves its band uncertain
(:func:`matroots.solvers.auto_first.spectrum_estimate`; issue 29 item 7: fp32, n = 128, kappa within
~7.6e3-1.45e4 of the 1e4 band edge paid the float64 estimate besides the eigh).

What is bounded: the exact eigenvalues lambda_1 <= ... <= lambda_n of A, the working matrix eigh
decomposed -- the caller's entries exactly (fp32 and fp64 input are decomposed as given; fp16 input is
converted exactly and multiplied by its power-of-two prescale) -- and kappa = (lambda_n + s) /
(lambda_1 + s) with s = eps (absolute; eps * prescale in the working matrix's units) or
s = eps |lambda_n| (relative): the kappa of A + eps_abs I the selection table is keyed on, which the
float64 estimate computes to its own rounding. Everything below is formed in float64 from A's entries
and the computed eigenvectors (exact in float64), and its rounding is bounded: u = 2^-53,
gamma_k = k u / (1 - k u); |fl(A x) - A x| <= gamma_n |A| |x| and |fl(x^T y) - x^T y| <= gamma_n
|x|^T |y| for any order of summation, with or without FMA (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., 2002, §3.1, (3.4)-(3.11)).

1. Rayleigh quotients (Courant-Fischer). x: the computed eigenvector of the smallest (largest)
   eigenvalue; rho = x^T A x / x^T x and eta = ||A x - rho x|| / ||x||, exactly. Computed: y = fl(A x),
   S = fl(x^T x), rho^ = fl(fl(x^T y) / S), r = fl(y - rho^ x), N = fl(r^T r). With F >= ||A||_F
   (so || |A| |x| || <= F ||x|| and |rho| <= F):

   * |rho^ - rho| <= e_rho = 4 gamma_{n+1} F: |x^T y - x^T A x| <= gamma_n F S, the inner product
     adds gamma_n (1 + gamma_n) F S, S and the quotient (gamma_n + u) |rho|; the second-order terms
     fit in the factor 4 (3 gamma_n + u < 4 gamma_{n+1} - gamma_n for n u <= 1/100).
   * eta <= e_eta = sqrt(N / S) (1 + 2 gamma_{n+2}) + 2 gamma_{n+1} F: the Rayleigh quotient minimises
     ||A x - mu x|| over mu, so eta <= ||A x - rho^ x|| / ||x||, and ||r - (A x - rho^ x)|| <=
     gamma_n F ||x|| + u |rho^| ||x|| + u ||r|| / (1 - u); N and S are sums of squares, within gamma_n.

   Then lambda_1 <= rho_1 <= rho^_1 + e_rho and lambda_n >= rho_n >= rho^_n - e_rho.

2. Kato-Temple (T. Kato, J. Phys. Soc. Japan 4 (1949) 334-339; B. N. Parlett, *The Symmetric
   Eigenvalue Problem*, SIAM 1998, ch. 10, eigenvalue bounds): if lambda_2 >= beta > rho, then
   lambda_1 >= rho - eta^2 / (beta - rho). Proof: x^T (A - lambda_1 I)(A - beta I) x >= 0 (on each
   eigenvector the two factors have one sign, or one is zero) and it equals ||x||^2 (eta^2 +
   (rho - lambda_1)(rho - beta)). With the intervals of 1: lambda_1 >= rho^_1 - e_rho - e_eta^2 /
   (beta - rho^_1 - e_rho) where beta > rho^_1 + e_rho, beta = w_2 - delta: the computed lambda_2 less
   the band test's bound delta (backward stability, Weyl: auto_first's module docstring). Mirrored:
   lambda_n <= rho^_n + e_rho + e_eta^2 / (rho^_n - e_rho - alpha), alpha = w_{n-1} + delta. Where the
   gap at an end is within delta (clustered eigenvalues: rank-deficient factors plus eps) the
   condition fails and only Weyl's [w - delta, w + delta] stands there; each bound holds, so their
   intersection does. At n = 128, fp32, kappa ~1e4 the gap lambda_2 - lambda_1 is below delta
   (~1.6e-5 lambda_n) for the cases that matter: ~8e-6 lambda_n for randsvd (geometric spectrum),
   ~1e-6 lambda_n for rank-deficient G G^T + eps I (the eps cluster), so there Kato-Temple bounds only
   lambda_n, the Rayleigh quotient bounds lambda_1 from above (which proves kappa >= K), and 3 bounds
   it from below (which proves kappa < K).

3. Cholesky (a lower bound on lambda_1 where 1 and 2 leave the band open below an edge K). For a shift
   c, B = fl(A - c I) in float64 (the shift rounds on the diagonal only: |B_ii - (a_ii - c)| <=
   u |B_ii| / (1 - u)). If LAPACK's Cholesky of B runs to completion, R^T R = B + dB with |dB| <=
   gamma_{n+1} |R^T| |R| (Demmel, LAPACK Working Note 14, 1989; Higham 2002 Thm 10.3: any order of the
   inner products, no positive definiteness assumed), so ||dB||_2 <= gamma_{n+1} ||R||_F^2 =
   gamma_{n+1} tr(B + dB), ||dB||_2 <= gamma_{n+1} / (1 - gamma_{n+1}) tr(B), and R^T R >= 0 gives
   lambda_1(B) >= -||dB||_2 (Rump, "Verification of positive definiteness", BIT 46 (2006) 433-452,
   certifies positive definiteness the same way). Hence lambda_1 >= c - tau with tau =
   gamma_{n+1} / (1 - gamma_{n+1}) sum |B_ii| (1 + gamma_n) + u max |B_ii| / (1 - u) + 2 n^2 2^-1074
   (gradual underflow: at most 2^-1074 per rounding of an entry's n + 1 operations). c is placed just
   above the lambda_1 at which kappa = K, so a completed factorisation proves kappa < K. A
   factorisation that fails proves nothing (the float64 estimate then decides).

Order (:func:`certified_kappa`): where the computed eigenvalues put kappa below the edge K inside
Weyl's interval, the Cholesky runs first and alone decides it (one float64 copy of A and one potrf,
~60 us at n = 128 standalone, 60-100 us in situ after the eigh, against ~600 us for the float64
``eigvalsh`` it replaces, plus 40-80 us of Python and numpy around it); else 1-2 first (one
matrix-vector product with two vectors). At n = 128, p = 4, fp32 kappa 9e3, auto / chosen CPU time
1.51 -> 1.23 (randsvd), 1.55 -> 1.24 (G G^T + eps I) at load ~5; the float64 Cholesky keeps it above
1.2 (``experiments/bench_auto_first.py --certificate-parts``, docs/design.md §7).

What rests on what: the bounds of 1 and 3 (lambda_1 <= rho^_1 + e_rho, lambda_n >= rho^_n - e_rho,
lambda_1 >= c - tau) follow from A's entries and float64 rounding alone; Weyl's intervals, beta,
alpha, and so the upper bound on lambda_n, rest on the backward-stability bound delta of the band
test itself (auto_first), as every band decision of decomposing first does. Proving kappa < K uses
the upper bound on lambda_n: a second Cholesky, of c' I - A, would make that end independent of delta
too, at the cost of the first.

Every bound is evaluated in float64 with a few more roundings, each within u of a quantity of size
<= 2F: each is widened by pad = 64 u F, more than their sum (plus 2 n^2 2^-1074 for products that
underflow: the gamma bounds assume none does). kappa's interval is then formed from the
eigenvalue intervals at the corners (kappa increases with lambda_n and decreases with lambda_1 while
lambda_1 + s > 0), each end widened by 8 u of its terms.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.linalg import lapack as _lapack

_U = 2.0**-53  # float64 unit roundoff
_TINY = 2.0**-1074  # the smallest subnormal float64


def _gamma(k: int) -> float:
    return k * _U / (1.0 - k * _U)


@dataclass(frozen=True, slots=True)
class EigenBox:
    """Certified intervals of one matrix's extreme eigenvalues (module docstring, 1-2; working units):
    lambda_1 in [m_lo, m_hi], lambda_n in [L_lo, L_hi]; ``rho``: the two Rayleigh quotients (computed),
    ``F`` >= ||A||_F, ``pad`` the evaluation slack, ``kato_temple``: which ends Kato-Temple bounded
    (False: the gap at that end is not proved, Weyl's bound stands there)."""

    m_lo: float
    m_hi: float
    L_lo: float
    L_hi: float
    rho: tuple[float, float]
    F: float
    pad: float
    kato_temple: tuple[bool, bool]


def extreme_bounds(
    A: torch.Tensor, Q: torch.Tensor, w: torch.Tensor, delta_rate: float
) -> list[EigenBox | None]:
    """:class:`EigenBox` per matrix of the batch ``A`` (b, n, n; CPU), from its computed eigenvectors
    ``Q`` and ascending eigenvalues ``w``; None where a computed number is not finite.
    ``delta_rate``: the band test's Weyl bound per unit of max |w| (2 (n + 2) u of the format eigh
    ran in: auto_first's module docstring)."""
    An, Qn, wn = (t.detach().numpy() for t in (A, Q, w))
    return [_bounds(An[j].astype(np.float64), Qn[j], wn[j], delta_rate) for j in range(An.shape[0])]


def _bounds(a: np.ndarray, q: np.ndarray, w: np.ndarray, delta_rate: float) -> EigenBox | None:
    """:func:`extreme_bounds` of one matrix ``a`` (float64, its entries exactly): numpy's 2-D products
    are one BLAS call each, fewer and cheaper than a batched torch pass at these sizes."""
    n = a.shape[-1]
    x = q[:, [0, n - 1]].astype(np.float64)  # (n, 2): exact
    y = a.dot(x)
    S = (x * x).sum(axis=0)
    rho = (x * y).sum(axis=0) / S
    r = y - rho * x
    N = (r * r).sum(axis=0)
    flat = a.ravel()
    F = math.sqrt(float(flat.dot(flat))) * (1.0 + _gamma(n * n + 2))  # >= ||A||_F
    W = w[[0, min(1, n - 1), max(n - 2, 0), n - 1]].astype(np.float64).tolist()
    return _box(W, rho.tolist(), N.tolist(), S.tolist(), F, n, delta_rate)


def _box(
    W: list[float], rho: list[float], N: list[float], S: list[float], F: float, n: int, delta_rate: float
) -> EigenBox | None:
    if not all(math.isfinite(v) for v in (*W, *rho, *N, *S, F)) or min(S) <= 0:
        return None
    pad = 64.0 * _U * F + 2 * n * n * _TINY  # the evaluation's roundings; gradual underflow
    e_rho = 4.0 * _gamma(n + 1) * F + pad
    e_eta = [
        math.sqrt(max(N[k], 0.0) / S[k]) * (1.0 + 2.0 * _gamma(n + 2)) + 2.0 * _gamma(n + 1) * F + pad
        for k in (0, 1)
    ]
    w1, w2, wm, wn = W
    delta = delta_rate * max(abs(w1), abs(wn)) + pad
    # lambda_1: Weyl, the Rayleigh quotient above, Kato-Temple below where the gap is proved
    m_lo, m_hi = w1 - delta, min(w1 + delta, rho[0] + e_rho)
    beta = w2 - delta if n > 1 else math.inf  # <= lambda_2 (Weyl); none for n = 1
    kt = [False, False]
    if beta > rho[0] + e_rho:
        q = e_eta[0] ** 2 / (beta - rho[0] - e_rho) if math.isfinite(beta) else 0.0
        if q <= F:
            m_lo, kt[0] = max(m_lo, rho[0] - e_rho - q - pad), True
    # lambda_n: Weyl, the Rayleigh quotient below, Kato-Temple above
    L_lo, L_hi = max(wn - delta, rho[1] - e_rho), wn + delta
    alpha = wm + delta if n > 1 else -math.inf  # >= lambda_{n-1}
    if rho[1] - e_rho > alpha:
        q = e_eta[1] ** 2 / (rho[1] - e_rho - alpha) if math.isfinite(alpha) else 0.0
        if q <= F:
            L_hi, kt[1] = min(L_hi, rho[1] + e_rho + q + pad), True
    return EigenBox(m_lo, m_hi, L_lo, L_hi, (rho[0], rho[1]), F, pad, (kt[0], kt[1]))


def _tau(d: np.ndarray, n: int) -> float:
    """tau of the module docstring (3) for B's diagonal ``d`` = fl(a_ii - c), with max |B_ii| <=
    sum |B_ii| (one reduction; u sum |B_ii| is 1 / (n + 1) of the first term)."""
    g1 = _gamma(n + 1) / (1.0 - _gamma(n + 1))
    return (g1 * (1.0 + _gamma(n)) + _U / (1.0 - _U)) * float(np.abs(d).sum()) + 2 * n * n * _TINY


def cholesky_lower_bound(
    a: np.ndarray, c: float, overwrite: bool = False, diag: np.ndarray | None = None
) -> float | None:
    """A lower bound c - tau (less its evaluation's rounding) on lambda_1 of the symmetric float64
    matrix ``a`` (n, n) when LAPACK's Cholesky of fl(a - c I) runs to completion, else None (module
    docstring, 3). ``overwrite``: factorise ``a`` itself (C-contiguous), not a copy; ``diag``: a's
    diagonal when the caller has it (a strided pass fewer)."""
    n = a.shape[-1]
    B = a if overwrite else a.copy()  # C order; symmetric, so B.T is the same matrix in Fortran order
    d = (np.diagonal(a) if diag is None else diag) - c  # fl(a_ii - c): B's diagonal (a new array)
    np.fill_diagonal(B, d)
    tau = _tau(d, n)
    _, info = _lapack.dpotrf(B.T, lower=0, clean=0, overwrite_a=1)
    return (c - tau) - 8 * _U * (abs(c) + tau) if info == 0 else None


def certified_kappa(
    plan: Any,
    A: torch.Tensor,
    Q: torch.Tensor,
    w: torch.Tensor,
    rows: list[int],
    *,
    eps: float,
    eps_mode: str,
    prescale: float,
    delta_rate: float,
) -> list[float | None]:
    """kappa per element of ``rows`` whose band the certificate (module docstring) proves, else None.

    ``A`` (b, n, n): the working matrices eigh decomposed; ``Q``, ``w``: their computed eigenvectors
    and ascending eigenvalues; ``delta_rate`` as in :func:`extreme_bounds`. Per element, from Weyl's
    interval: where the computed kappa lies below the edge K inside it, the Cholesky (3) first (it
    proves kappa < K alone), else the Rayleigh quotients and Kato-Temple (1-2: they prove kappa >= K
    through lambda_1 <= rho_1); the other where the first does not decide. The kappa returned is the
    computed eigenvalues' (Cholesky) or the Rayleigh quotients', clamped into the proved interval.
    CPU tensors only (elsewhere: None, and the float64 estimate decides)."""
    if not rows or A.device.type != "cpu":
        return [None] * len(rows)
    shift = _shift(eps, eps_mode, prescale)
    An, Qn, wn = (t.detach().numpy() for t in (A, Q, w))
    n = An.shape[-1]
    out: list[float | None] = []
    for i in rows:
        w1, wn_ = float(wn[i][0]), float(wn[i][n - 1])
        if not (math.isfinite(w1) and math.isfinite(wn_)):
            out.append(None)
            continue
        top = max(abs(w1), abs(wn_))
        delta = delta_rate * top * (1 + 4 * _U) + 4 * _U * top  # Weyl's, and the roundings of w -+ delta
        box = [w1 - delta, w1 + delta, wn_ - delta, wn_ + delta]  # m_lo, m_hi, L_lo, L_hi
        span = _kappa_range(shift, box[2], box[3], box[0], box[1])
        if span is None:
            out.append(None)
            continue
        s_n = shift(wn_)
        guess = (wn_ + s_n) / (w1 + s_n) if w1 + s_n > 0 else math.inf
        edge = _edge_above(plan, span[0])
        steps = ("cholesky", "rayleigh") if edge is not None and guess < edge else ("rayleigh", "cholesky")
        kappa, a = guess, None
        for step in steps:
            if plan.band(span[0]) == plan.band(span[1]):
                break
            if a is None:
                a = An[i].astype(np.float64)  # exact
            if step == "rayleigh":
                eb = _bounds(a, Qn[i], wn[i], delta_rate)
                if eb is None:
                    break
                box = [max(box[0], eb.m_lo), min(box[1], eb.m_hi), max(box[2], eb.L_lo), min(box[3], eb.L_hi)]
                r1, rn = eb.rho
                s_n = shift(rn)
                kappa = (rn + s_n) / (r1 + s_n) if r1 + s_n > 0 else kappa
            else:
                m_star = _lambda_min_for(plan, shift, box, span[0])
                if m_star is None or not m_star < box[1]:  # lambda_1 may be below: the factorisation fails
                    continue
                # c: m_star plus twice tau there (sum |a_ii - m_star| <= |tr A| + n |m_star| for the
                # a_ii >= lambda_1 > m_star of a matrix the factorisation can succeed on); rigour is
                # cholesky_lower_bound's: a c too small only leaves the band open
                diag = np.diagonal(a).copy()
                est = (abs(float(diag.sum())) + n * abs(m_star)) * 2 * _gamma(n + 1)
                c = m_star + 2.0 * est + 16 * _U * abs(m_star)
                bound = cholesky_lower_bound(a, c, overwrite=True, diag=diag)
                a = None  # factorised in place
                if bound is None:
                    continue
                box[0] = max(box[0], bound)
            span = _kappa_range(shift, box[2], box[3], box[0], box[1])
            if span is None:
                break
        if span is None or plan.band(span[0]) != plan.band(span[1]):
            out.append(None)
            continue
        out.append(min(max(kappa, span[0]), span[1]))  # inside the proved interval
    return out


def _edge_above(plan: Any, k: float) -> float | None:
    """The first band edge above ``k`` (bisect_right, as :meth:`Plan.band` counts them), or None."""
    edges = plan.edge_list if plan.edge_list is not None else [float(x) for x in plan.edges]
    i = bisect.bisect_right(edges, k)
    return edges[i] if i < len(edges) else None


def _lambda_min_for(plan: Any, shift, box: list[float], k_lo: float) -> float | None:
    """The lambda_1 above which kappa < K (K: the first band edge above ``k_lo``) for every lambda_n in
    [L_lo, L_hi], rounded up; None where no edge is above."""
    K = _edge_above(plan, k_lo)
    if K is None:
        return None
    # kappa < K  <=>  lambda_1 > (L + s(L)) / K - s(L): linear in L, largest at an end of [L_lo, L_hi]
    return max((L + shift(L)) / K - shift(L) + 8 * _U * (L + shift(L)) for L in (box[2], box[3]))


def _shift(eps: float, eps_mode: str, prescale: float):
    """s(lambda_n) in the working matrix's units (module docstring)."""
    if eps <= 0:
        return lambda L: 0.0
    if eps_mode == "relative":
        return lambda L: eps * abs(L)
    return lambda L: eps * prescale  # a power of two: exact


def _kappa_range(shift, L_lo: float, L_hi: float, m_lo: float, m_hi: float) -> tuple[float, float] | None:
    """[k_lo, k_hi] containing (L + s(L)) / (m + s(L)) over the box (k_hi = inf where lambda_1 + s
    may be <= 0), or None where even the upper end m_hi + s (or lambda_n) is not positive."""
    if not (L_lo > 0 and L_lo <= L_hi and m_lo <= m_hi):
        return None
    k_lo, k_hi = math.inf, 0.0
    for L in (L_lo, L_hi):
        s = shift(L)  # relative: within u of eps L
        num = L + s
        num_lo, num_hi = num - 8 * _U * num, num + 8 * _U * num
        den_lo = (m_lo + s) - 8 * _U * (abs(m_lo) + s)  # <= lambda_1 + s
        den_hi = (m_hi + s) + 8 * _U * (abs(m_hi) + s)  # >= lambda_1 + s
        if not (m_hi + s) - 8 * _U * (abs(m_hi) + s) > 0:
            return None
        k_hi = max(k_hi, num_hi / den_lo * (1 + 4 * _U) if den_lo > 0 else math.inf)
        k_lo = min(k_lo, num_lo / den_hi * (1 - 4 * _U))
    return max(k_lo, 1.0), k_hi


__all__ = ["EigenBox", "certified_kappa", "cholesky_lower_bound", "extreme_bounds"]
