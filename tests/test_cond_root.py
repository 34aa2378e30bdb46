"""cond_root against finite differences of an independent root, at extreme scales (issue 22, class 3).

The yardstick of the accuracy contract, :func:`matroots.core.conditioning.cond_root`, is checked against
the Kronecker form of the Fréchet derivative built column by column from central differences of
mpmath's ``powm`` (sqrtm for p = 2, expm(r logm) otherwise: no eigenvectors, no Schur form) at 40
digits, on normal, non-normal, nearly defective and exactly defective matrices. The relative
condition number of A -> A^{+-1/p} is invariant under A -> cA, so cA must give cond(f, A) for c from
1e-300 to 1e300 (before: 0.0 for diag(1, .1, .01) scaled either way, and up to 1e14x off on
Jordan-like matrices, whose eigenvectors were used).

Tolerances. The differences: step h = 1e-20 ||A||_F at 40 digits, so truncation (~h^2 ||f'''||) and
cancellation (~1e-40 / h) are below 1e-18 relative. cond_root: the Schur form and the root
recurrence are backward stable, so the computed K_f is that of a matrix within ~n u ||A|| of A; the
relative change of ||L_f|| under that perturbation is about n u times the condition number of
L_f itself, which for z^q is ~cond(f, A) (f''/f' = (q-1)/z against f'/f = q/z). Hence
rel <= 10 n (cond + 1) u, the factor 10 for the constants of the backward errors.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from matroots.core import conditioning

U = 2.0**-53
DPS = 40
SCALES = (1e-300, 1.0, 1e300)

CASES = {
    "normal symmetric diag(1, .1, .01)": np.diag([1.0, 0.1, 0.01]),
    "normal rotation-scaling": np.array([[1.0, -0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 0.2]]),
    "non-normal triangular": np.array([[1.0, 100.0, 1e4], [0.0, 0.5, 100.0], [0.0, 0.0, 0.25]]),
    "nearly defective (gap 1e-9)": np.array([[1.0, 1.0], [0.0, 1.0 + 1e-9]]),
    "nearly defective, rotated": None,  # built below: Q J Q^T with a Jordan-like J, not triangular
    "defective 3x3 Jordan block": np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]),
}
_Q = np.linalg.qr(np.random.default_rng(22).standard_normal((3, 3)))[0]
CASES["nearly defective, rotated"] = (
    _Q @ np.array([[0.5, 1.0, 0.0], [0.0, 0.5 + 1e-8, 1.0], [0.0, 0.0, 0.5]]) @ _Q.T
)


def _cond_by_differences(A: np.ndarray, p: int, inverse: bool) -> float:
    """||K_f|| ||A||_F / ||f(A)||_F with K_f from central differences of mpmath.powm (40 digits)."""
    n = A.shape[0]
    with mpmath.workdps(DPS):
        M = mpmath.matrix(A.tolist())
        r = mpmath.mpf(-1 if inverse else 1) / p
        nrm = mpmath.mnorm(M, "f")
        h = nrm * mpmath.mpf(10) ** -20
        K = np.zeros((n * n, n * n))
        for j in range(n * n):
            E = mpmath.zeros(n, n)
            E[j % n, j // n] = h
            D = (mpmath.powm(M + E, r) - mpmath.powm(M - E, r)) / (2 * h)
            K[:, j] = [float(mpmath.re(D[i % n, i // n])) for i in range(n * n)]
        return float(np.linalg.norm(K, 2) * nrm / mpmath.mnorm(mpmath.powm(M, r), "f"))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize(("p", "inverse"), ((2, True), (2, False), (3, True)))
def test_cond_root_matches_differences_of_an_independent_root_at_every_scale(name, p, inverse):
    A = CASES[name]
    n = A.shape[0]
    # cond(f, cA) = cond(f, A) in exact arithmetic (f(cA) = c^q f(A), L_f(cA) = c^{q-1} L_f(A)), so the
    # reference of A serves every scale (mpmath's sqrtm also refuses entries ~1e-300 as "singular")
    ref = _cond_by_differences(A, p, inverse)
    for scale in SCALES:
        got = conditioning.cond_root(A * scale, p, inverse=inverse)
        assert got == pytest.approx(ref, rel=10 * n * (ref + 1) * U), (name, scale)


def test_cond_root_is_scale_invariant_for_the_issue_example():
    A = np.diag([1.0, 0.1, 0.01])
    base = conditioning.cond_root(A, 2)
    assert base == pytest.approx(47.69696007084727, rel=1e-14)  # closed form: symmetric, diagonal
    for scale in (1e-300, 1e300, 2.0**-1070 * 2**60):
        # a symmetric spectrum is evaluated in logarithms after an exact power-of-two scaling
        assert conditioning.cond_root(A * scale, 2) == pytest.approx(base, rel=1e-14)


def test_the_power_estimate_matches_the_exact_norm_on_a_nearly_defective_matrix():
    A = CASES["nearly defective, rotated"]
    for inverse in (True, False):
        exact = conditioning.cond_root(A, 3, inverse=inverse)
        # the Lanczos estimate is converged to 1e-10 relative (svds tol); both see the same K_f
        assert conditioning.cond_root(A, 3, inverse=inverse, kron_max_n=0) == pytest.approx(exact, rel=1e-8)


def test_an_eigenvalue_on_the_negative_axis_is_infinite_at_every_scale():
    A = np.array([[-1.0, 1.0], [0.0, 2.0]])
    for scale in SCALES:
        assert conditioning.cond_root(A * scale, 2) == math.inf
