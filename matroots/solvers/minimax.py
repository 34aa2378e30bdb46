"""Per-step minimax polynomials for the coupled root iterations of :mod:`matroots.solvers.polar_express`.

A step multiplies the normalised root variable x (-> 1) by q(x^p): h(x) = x q(x^p) = sum_j c_j x^{1+jp},
j = 0..d. Polar Express (Amsel, Persson, Musco & Gower 2025, "The Polar Express: optimal matrix sign
methods and their application to the Muon algorithm", §3-4; p = 2 is their odd-polynomial sign/polar
case, and Chen & Chow 2014 the scaled Newton-Schulz d = 1 case) chooses each step greedily:

    h_k = argmin_h max_{x in [l_k, u_k]} |1 - h(x)|,   l_{k+1} = 1 - E_k,   u_{k+1} = 1 + E_k,

with E_k the minimax error; the composition of the greedy steps is the optimal composition (their
Theorem 4.1, for the sign case; the same argument holds for any p, as it only uses that h is monotone on
[l, u] and maps it onto [1 - E, 1 + E]). The basis {x^{1+jp}} is a Chebyshev system on (0, inf)
(Descartes' rule of signs), so the best approximation is characterised by equioscillation at d + 2
points (Chebyshev's theorem) and is computed by the Remez exchange algorithm (float64): solve
h(x_i) + (-1)^i E = 1 at the points, move the interior points to the extrema of 1 - h (roots of h', a
degree-d polynomial in y = x^p), repeat until the points settle.

Safety (the paper's §4.4 for bf16): each polynomial is designed on [l_k, s u_k] with s > 1, so that
eigenvalues that rounding pushed slightly above the interval are still mapped into the next one; the
interval the next step sees is the image [1 - E_k, 1 + E_k] of the widened one.

Tail: once E_k < ``TAIL_E``, the Remez points crowd near 1 and float64 cannot resolve them; from there on
the step is the limit of the minimax polynomials on shrinking intervals about 1, the polynomial of
highest contact, h(1) = 1, h^{(i)}(1) = 0 for i = 1..d (order d + 1; d = 1 is Newton's
((p + 1) x - x^{1+p}) / p, d = 2, p = 2 the quintic Newton-Schulz (15 x - 10 x^3 + 3 x^5) / 8).

In a 16-bit format the factored form passes its unit roundoff as ``resolution``: the minimax steps end
at the first whose error is below it (:func:`schedule`).

Schedules are cached per (l, p, d, s, resolution) (:func:`schedule`); the solver rounds l down to a grid and picks s
from the compute dtype, so the cache key is (interval, steps' degree, dtype).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

TAIL_E = 1e-3
"""Minimax error below which the schedule switches to the highest-contact polynomial."""
MAX_SCHEDULE = 64


@dataclass(frozen=True)
class Step:
    """One polynomial h(x) = sum_j coeffs[j] x^{1+jp}, designed on [lo, hi] with minimax error ``err``
    (``err`` = 0 and lo = hi = 1 for the highest-contact tail polynomial)."""

    coeffs: tuple[float, ...]
    lo: float
    hi: float
    err: float


def evaluate(coeffs: np.ndarray | tuple[float, ...], x: np.ndarray, p: int) -> np.ndarray:
    """h(x) = sum_j coeffs[j] x^{1+jp}."""
    x = np.asarray(x, dtype=float)
    return sum(c * x ** (1 + j * p) for j, c in enumerate(coeffs))


def _interior_extrema(c: np.ndarray, p: int, a: float, b: float) -> np.ndarray:
    """Points in (a, b) where h'(x) = sum_j (1+jp) c_j x^{jp} = 0, ascending."""
    dc = np.array([(1 + j * p) * cj for j, cj in enumerate(c)])
    roots = np.roots(dc[::-1])  # a polynomial in y = x^p, highest power first
    y = np.sort(roots[np.abs(roots.imag) <= 1e-12 * np.maximum(np.abs(roots), 1.0)].real)
    x = np.power(y[y > 0], 1.0 / p)
    return x[(x > a) & (x < b)]


def remez(a: float, b: float, p: int, d: int, iters: int = 60) -> tuple[np.ndarray, float]:
    """Coefficients (d+1,) and error E of the best approximation of 1 by sum_j c_j x^{1+jp} on [a, b]."""
    k = np.arange(d + 2)
    x = 0.5 * (a + b) - 0.5 * (b - a) * np.cos(np.pi * k / (d + 1))
    sign = (-1.0) ** k
    c, E = np.zeros(d + 1), 0.0
    for _ in range(iters):
        V = np.column_stack([x ** (1 + j * p) for j in range(d + 1)] + [sign])
        sol = np.linalg.solve(V, np.ones(d + 2))
        c, E = sol[:-1], float(sol[-1])
        inner = _interior_extrema(c, p, a, b)
        if inner.shape[0] != d:  # the exchange left the interval: keep the last points' solution
            break
        new = np.concatenate([[a], inner, [b]])
        moved = float(np.max(np.abs(new - x)))
        x = new
        if moved <= 1e-15 * b:
            break
    return c, abs(E)


def highest_contact(p: int, d: int) -> np.ndarray:
    """c with h(1) = 1 and h^{(i)}(1) = 0, i = 1..d, for h(x) = sum_j c_j x^{1+jp}."""
    e = np.array([1 + j * p for j in range(d + 1)], dtype=float)
    V = np.empty((d + 1, d + 1))
    for i in range(d + 1):
        V[i] = [math.prod(ej - t for t in range(i)) for ej in e]  # i-th derivative of x^e at 1
    rhs = np.zeros(d + 1)
    rhs[0] = 1.0
    return np.linalg.solve(V, rhs)


@functools.lru_cache(maxsize=256)
def schedule(lo: float, p: int, d: int, safety: float, resolution: float = 0.0) -> tuple[Step, ...]:
    """The greedy minimax steps from [lo, 1] until the error falls below TAIL_E, then the tail step.

    ``resolution`` (> 0: the compute format's unit roundoff u): the minimax steps also end at the first
    whose error E is at most ``resolution`` (a later step's design interval [1 - E, 1 + E] is not
    resolved in the format; the highest-contact tail follows, which is where the solvers arm their
    stagnation test). The tail keeps degree d: a Newton (degree 1) tail would save a product per step
    but grows the eigenvalues left below the start interval by h'(0) = (p + 1)/p instead of c_0 (1.41
    at p = 4, d = 2), which cost bf16 kappa 1e6, n = 1024, p = 4 its 1e-2 (2.1e-2, against 7.1e-3
    with the degree-d tail).
    """
    if not 0.0 < lo <= 1.0:
        raise ValueError(f"the interval's lower end must be in (0, 1], got {lo!r}")
    steps: list[Step] = []
    a, b = lo, 1.0
    for _ in range(MAX_SCHEDULE):
        if 1.0 - a < TAIL_E and b - 1.0 < TAIL_E:
            break
        hi = b * safety
        c, E = remez(a, hi, p, d)
        steps.append(Step(tuple(float(v) for v in c), a, hi, E))
        a, b = 1.0 - E, 1.0 + E
        if resolution >= E:
            break
        if E < TAIL_E:
            break
    steps.append(Step(tuple(float(v) for v in highest_contact(p, d)), 1.0, 1.0, 0.0))
    return tuple(steps)


def grid_floor(lo: float) -> float:
    """lo rounded down to the grid 2^(-k/4) (so nearby intervals share a cached schedule)."""
    k = math.ceil(-4.0 * math.log2(lo))
    return 2.0 ** (-k / 4.0)
