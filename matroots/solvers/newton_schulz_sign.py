"""Coupled Newton-Schulz iteration for A^{1/2} and A^{-1/2} through the matrix sign function, composed
for p = 2^k (Higham, *Functions of Matrices*, 2008, §5.3 and §6.7; Higham 1997, "Stable iterations for
the matrix square root", Numer. Algorithms 15).

sign([[0, A], [I, 0]]) = [[0, A^{1/2}], [A^{-1/2}, 0]], and the Newton-Schulz iteration for the sign
function, X <- X (3I - X^2)/2, applied to that block matrix keeps its off-diagonal form; its blocks are
the coupled iteration (Higham 2008, eq. (6.35) with the Newton-Schulz map of eq. (5.22)):

    Y_0 = A/c,  Z_0 = I,  M_k = Z_k Y_k,  Y_{k+1} = Y_k (3I - M_k)/2,  Z_{k+1} = (3I - M_k) Z_k / 2,

with Y_k -> (A/c)^{1/2}, Z_k -> (A/c)^{-1/2} and M_k -> I. Y_k = (A/c) Z_k holds as an identity (both are
polynomials in A), so M_k = Z_k^2 A/c, and ||M_k - I|| is coupled_newton's residual for p = 2
(:mod:`matroots.solvers.coupled_loop` applies its stopping contract; M_k is recomputed from the two
factors, so a stagnated residual is accepted relative to its floor ~u ||Y_k|| ||Z_k||). Each eigenvalue follows the
scalar map m -> m (3 - m)^2 / 4 of M, which converges to 1 for 0 < m < 3; the scaling c = lambda_max
(an upper bound, :mod:`matroots.solvers.spd_start`) puts the spectrum in (0, 1], i.e. ||I - A/c||_2 < 1,
the condition of Higham's Theorem 6.9 (convergence region of the Newton-Schulz sign iteration). Small
eigenvalues grow by 9/4 per step until the quadratic phase: about log(kappa)/log(9/4) + 5 steps. The
iteration is stable (Higham 2008, Theorem 6.12: the Fréchet derivative of the coupled map at the fixed
point is idempotent).

p = 2^k: k square-root stages; stage j takes the scaled square root Y of stage j - 1 (spectrum in
(0, 1] again) as its input, so (A/c)^{±1/2^k} is read off the last stage's Y or Z and unscaled by
c^{±1/2^k} (float64). p = 1: Z^2 of the first stage (inverse), or A + eps_abs I itself (forward).
Other p are refused (UnsupportedExponentError): use polar_express, halley or coupled_newton.

Domain: SPD (symmetric input with a positive spectrum after eps; non-symmetric input is refused with
NotSymmetricError, see :mod:`~matroots.solvers.spd_start`). Cost: 3 GEMMs per iteration (Z Y, Y P, P Z),
matmul-only; the Lanczos estimate (24 matrix-vector products) is counted too. Warm start: none (like
coupled_newton's cold start, Y_0 and Z_0 must be functions of A; a previous root does not commute with A
in floating point). Each stage runs in the compute dtype (bf16 included: products only). The returned
root is symmetrised, (X + X^T)/2.

``info``: ``stages`` (square-root stages), ``stage_iterations`` (per stage, per element),
``stop_reason`` (the first failed stage's, else the last's), ``c`` (the scaling, user units), ``tol``,
``eps_abs`` and the Lanczos estimates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core import arguments, precision
from ..core.errors import UnsupportedExponentError
from ..core.inputs import Problem
from .base import Capabilities, RawResult
from .coupled_loop import LoopOutcome, check_resolvable, default_tol, run_coupled
from .newton_loop import _start_matrix
from .registry import register
from .spd_start import SpdIterationConfig, flag_undetermined, not_positive_definite, spd_start

MAX_STAGES = 10
"""p = 2^k is accepted up to k = 10 (p = 1024): each stage halves the log-spread of the spectrum."""


def _ns_step(k: int, rows: torch.Tensor, state, M: torch.Tensor):
    """One coupled Newton-Schulz step on (Y, Z) with M = Z Y: 3 GEMMs."""
    Y, Z = state
    P = torch.add(torch.eye(M.shape[-1], dtype=M.dtype, device=M.device), M, alpha=-1.0 / 3.0).mul_(1.5)
    Y_new = Y @ P
    Z_new = P @ Z
    return (Y_new, Z_new), Z_new @ Y_new


def sqrt_stage(
    B: torch.Tensor, *, tol: float, max_iter: int, accept: float, record_history: bool
) -> LoopOutcome:
    """(B^{1/2}, B^{-1/2}) by the coupled Newton-Schulz iteration from Y_0 = B, Z_0 = I (spectrum of B in
    (0, 1], in the compute dtype)."""
    I = torch.eye(B.shape[-1], dtype=B.dtype, device=B.device).expand_as(B)
    return run_coupled(
        (B, I.clone()),
        B,
        _ns_step,
        tol=tol,
        max_iter=max_iter,
        accept=accept,
        per_iter=3.0,
        record_history=record_history,
        floor_scale=product_floor,
    )


def product_floor(state) -> list[float]:
    """||Y||_F ||Z||_F / n per element: the rounding floor of M = Z Y relative to that of I."""
    Y, Z = state
    ny = torch.linalg.matrix_norm(Y.double() if Y.dtype != torch.float64 else Y)
    nz = torch.linalg.matrix_norm(Z.double() if Z.dtype != torch.float64 else Z)
    return (ny * nz / Y.shape[-1]).reshape(-1).tolist()


@dataclass
class Composed:
    """The last stage's outcome and the record of all stages (per element)."""

    out: LoopOutcome
    converged: torch.Tensor
    iterations: torch.Tensor
    matmuls: torch.Tensor
    reason: list[str]
    stage_iterations: list[torch.Tensor]
    history: list[torch.Tensor]


def compose_stages(
    B: torch.Tensor, stages: int, stage: Callable[[int, torch.Tensor], LoopOutcome]
) -> Composed:
    """Run ``stage(j, B_j)`` for j < ``stages``, each on the symmetrised Y of the one before (B_0 = B).

    An element converges when every stage does; its stop reason is that of its first failed stage (else
    the last's); iterations and products add up.
    """
    b = B.shape[0]
    conv = torch.ones(b, dtype=torch.bool)
    iters = torch.zeros(b, dtype=torch.int64)
    matmuls = torch.zeros(b, dtype=torch.float64)
    reason = ["tol"] * b
    stage_iters: list[torch.Tensor] = []
    history: list[torch.Tensor] = []
    out = None
    for j in range(stages):
        out = stage(j, B)
        for i in range(b):
            if bool(conv[i]):  # the first failed stage's reason stays
                reason[i] = out.reason[i]
        conv &= out.converged
        iters += out.iterations
        matmuls += out.matmuls_each
        stage_iters.append(out.iterations)
        history.extend(out.history)
        B = symmetrise(out.state[0])
    assert out is not None
    return Composed(out, conv, iters, matmuls, reason, stage_iters, history)


def power_of_two_stages(p: int, method: str) -> int:
    """k with p = 2^k (0 for p = 1); UnsupportedExponentError otherwise."""
    if p < 1 or p & (p - 1) or p.bit_length() - 1 > MAX_STAGES:
        raise UnsupportedExponentError(
            f"{method} computes A^(+-1/p) for p a power of two up to 2^{MAX_STAGES} (repeated square roots), "
            f"got p = {p}; use method='polar_express', 'halley' or 'coupled_newton' for other integer p"
        )
    return p.bit_length() - 1


def symmetrise(X: torch.Tensor) -> torch.Tensor:
    """(X + X^T)/2 in one fresh tensor."""
    return torch.add(X, X.mT).mul_(0.5)


def scalar_powers(v: torch.Tensor, e: float) -> torch.Tensor:
    """v^e per element by the C library's pow (float64): a batch element gets the factor of its own
    solve (torch's vectorised pow can round differently inside a SIMD lane, see newton_core)."""
    return torch.tensor([math.pow(x, e) for x in v.tolist()], dtype=torch.float64)


def unscale(X: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """X * factor per element (float64 factors): in X's format for fp32/fp64, in fp32 for 16-bit X."""
    W = X if X.dtype in (torch.float32, torch.float64) else X.float()
    return W * factor.to(W.dtype)[:, None, None]


@register
@dataclass(frozen=True, kw_only=True)
class NewtonSchulzSignConfig(SpdIterationConfig):
    """Coupled Newton-Schulz (sign function) solver for A^{+-1/p}, p a power of two, SPD input.

    Args:
        lanczos_steps: Lanczos steps for the lambda_max bound (capped at n).
        stagnation_accept: a stage stopped by stagnation counts as converged when its residual is at most
            this many times ``tol``.
        symmetry_tol: tolerance of the symmetry test (non-symmetric input is refused).
    """

    name = "newton_schulz"
    capabilities = Capabilities(forward_root=True, integer_p=True)

    def __post_init__(self) -> None:
        arguments.store(
            self,
            **self._spd_options(),
        )

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        p = int(prob.p)
        stages = power_of_two_stages(p, self.name)
        cdt = prob.compute_dtype
        n, b = prob.n, prob.A.shape[0]
        check_resolvable(2, cdt, n, self.name)
        st = spd_start(prob, self.name, self.lanczos_steps, self.symmetry_tol)
        info = dict(st.info)
        tol = prob.tol if prob.tol is not None else default_tol(cdt, n, 2)
        max_iter = prob.max_iter if prob.max_iter is not None else 100
        accept = self.stagnation_accept * tol
        c = st.lmax
        info.update(stages=max(stages, 1), c=c / prob.prescale, tol=tol)
        if stages == 0 and not inverse:  # A^{1/1}: the shifted matrix itself
            root = st.A.to(cdt if cdt in (torch.float32, torch.float64) else torch.float32).clone()
            root.diagonal(dim1=-2, dim2=-1).add_(st.shift.to(root.dtype)[:, None])
            info["stop_reason"] = ["identity_root"] * b
            zeros = torch.zeros(b, dtype=torch.int64)
            return RawResult(
                root, torch.ones(b, dtype=torch.bool), zeros, zeros.double(), st.matmuls, info=info
            )
        B = _start_matrix(st.A, c, st.shift, cdt)

        def stage(j: int, B: torch.Tensor) -> LoopOutcome:
            return sqrt_stage(
                B, tol=tol, max_iter=max_iter, accept=accept, record_history=prob.record_history
            )

        comp = compose_stages(B, max(stages, 1), stage)
        if "divergence" in comp.reason:
            not_positive_definite(self.name, prob, st.A, st.shift)
        Y, Z = comp.out.state
        matmuls = comp.matmuls
        if stages == 0:  # p = 1, inverse: A^{-1} = (A^{-1/2})^2
            X, matmuls = Z @ Z, matmuls + 1
        else:
            X = Z if inverse else Y
        conv, iters, reason, out, stage_iters, history = (
            comp.converged,
            comp.iterations,
            comp.reason,
            comp.out,
            comp.stage_iterations,
            comp.history,
        )
        if inverse:
            flag_undetermined(st.undetermined, conv, reason, info, prob, st.lmax)
        factor = scalar_powers(c, (-1.0 if inverse else 1.0) / p)
        root = symmetrise(unscale(X, factor))
        info.update(stop_reason=reason, stage_iterations=stage_iters)
        if cdt not in (torch.float32, torch.float64):
            info["compute_dtype_note"] = (
                f"products in {precision.info(cdt).name}; residual norms and the final c^(+-1/p) scaling in fp32"
            )
        return RawResult(
            root=root,
            converged=conv,
            iterations=iters,
            residual=out.residual,
            matmuls=st.matmuls + float(matmuls.mean()),
            history=history,
            info=info,
        )
