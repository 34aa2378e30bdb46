"""Principal square root of an upper quasi-triangular matrix in real Schur form.

Higham, "Computing real square roots of a real matrix", Linear Algebra Appl. 88/89 (1987), §4: with
R = U^2 and U quasi-triangular of the same block structure,

* a 1x1 diagonal block r > 0 has U_jj = sqrt(r);
* a 2x2 diagonal block with eigenvalues theta +- i mu has U_jj = alpha I + (R_jj - theta I)/(2 alpha),
  where alpha + i beta is the principal square root of theta + i mu (eq. 4.5-4.7);
* the off-diagonal part follows block column by block column: U_{1:j-1, J} solves the Sylvester
  equation U_{1:j-1,1:j-1} X + X U_JJ = R_{1:j-1, J} (the blocked form of eq. 4.4), which we hand to
  LAPACK's ``?trsyl`` (both coefficients are already in Schur canonical form).
"""

from __future__ import annotations

import cmath
import math

import numpy as np
import scipy.linalg

from ..core.errors import NegativeRealEigenvalueError


def diagonal_blocks(R: np.ndarray) -> list[tuple[int, int]]:
    """(start, size) of each diagonal block of a real Schur form (size 1 or 2)."""
    n = R.shape[0]
    blocks = []
    j = 0
    while j < n:
        if j + 1 < n and R[j + 1, j] != 0.0:
            blocks.append((j, 2))
            j += 2
        else:
            blocks.append((j, 1))
            j += 1
    return blocks


def block_eigenvalues(R: np.ndarray, blocks: list[tuple[int, int]]) -> np.ndarray:
    """Eigenvalues of a real Schur form read off its diagonal blocks (complex array)."""
    out: list[complex] = []
    for j, s in blocks:
        if s == 1:
            out.append(complex(R[j, j]))
        else:
            out.extend(np.linalg.eigvals(R[j : j + 2, j : j + 2]).tolist())
    return np.asarray(out, dtype=complex)


def _sqrt_block(B: np.ndarray) -> np.ndarray:
    if B.shape[0] == 1:
        if B[0, 0] <= 0:
            raise NegativeRealEigenvalueError(
                f"real Schur form has the eigenvalue {B[0, 0]:.3e} on the closed negative real axis: "
                "no principal square root exists; shift the matrix (eps) or use another function"
            )
        return np.sqrt(B)
    theta = 0.5 * (B[0, 0] + B[1, 1])
    mu = math.sqrt(max(-(B[0, 1] * B[1, 0]) - 0.25 * (B[0, 0] - B[1, 1]) ** 2, 0.0))
    alpha = cmath.sqrt(complex(theta, mu)).real
    return alpha * np.eye(2, dtype=B.dtype) + (B - theta * np.eye(2, dtype=B.dtype)) / (2 * alpha)


def sqrtm_quasi_triangular(R: np.ndarray, blocks: list[tuple[int, int]] | None = None) -> np.ndarray:
    """Principal square root U of the upper quasi-triangular R (real Schur form), U^2 = R."""
    blocks = diagonal_blocks(R) if blocks is None else blocks
    U = np.zeros_like(R)
    (trsyl,) = scipy.linalg.get_lapack_funcs(("trsyl",), (R,))
    for j, s in blocks:
        J = slice(j, j + s)
        U[J, J] = _sqrt_block(R[J, J])
        if j == 0:
            continue
        x, scale, info = trsyl(U[:j, :j], U[J, J], R[:j, J], trana="N", tranb="N", isgn=1)
        if info < 0:
            raise RuntimeError(f"LAPACK trsyl failed with info={info}")
        U[:j, J] = x / scale
    return U
