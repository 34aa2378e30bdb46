"""Minimax polynomial (Polar Express) iterations for A^{-1/p} of SPD matrices, and A^{1/2}, matmul-only.

Amsel, Persson, Musco & Gower, "The Polar Express: optimal matrix sign methods and their application to
the Muon algorithm" (2025), which names Shampoo's square and quarter roots as targets; Chen & Chow,
"A stable scaling of Newton-Schulz for improving the sign function computation of a Hermitian matrix"
(2014), the per-step scaled cubic case; Nakatsukasa & Freund (2016, SIAM Review 58), Zolotarev's
optimal rational sign approximants composed step by step. Those papers compute sign/polar factors;
here the same greedy minimax construction is applied to the coupled root iteration (Guo & Higham 2006,
eq. (3.9), with the Newton polynomial replaced by a per-step minimax one):

    X_0 = I,  M_0 = A/c,  P_k = q_k(M_k),  X_{k+1} = X_k P_k,  M_{k+1} = P_k^p M_k,

with c >= lambda_max (:mod:`~matroots.solvers.spd_start`). M_k = X_k^p A/c holds as an identity (all
are polynomials in A), so ||M_k - I|| is coupled_newton's residual and the same stopping contract
applies (:mod:`~matroots.solvers.coupled_loop`); X_k -> (A/c)^{-1/p}, unscaled by c^{-1/p} (float64).
For an eigenvalue lambda of A the normalised variable x = (lambda/c)^{1/p} x_k-scaled follows
x <- h_k(x) = x q_k(x^p), and h_k is the best approximation of 1 on the current interval [l_k, u_k]
among sum_{j<=d} c_j x^{1+jp} (:mod:`~matroots.solvers.minimax`: Remez, greedy intervals, the
highest-contact tail of order d + 1, coefficients cached per (interval, p, degree, dtype)). For p = 2 this
is exactly Polar Express on the singular values sqrt(lambda/c) of the sign iteration for
[[0, A], [I, 0]] (Higham 2008, §6.7); for p = 4 the interval is [(lambda_min/c)^{1/4}, 1], so the
quarter root needs no square roots first. d = 1 is Chen & Chow's scaled Newton-Schulz (p = 2) and a
minimax-scaled coupled Newton step (any p).

The start interval: l_0 = (lambda_min_est / (4 c))^{1/p}, rounded down to the grid 2^(-k/4), where
lambda_min_est is the smallest Lanczos Ritz value (an upper estimate of lambda_min; the factor 4 keeps
l_0 below the true end in the usual case). An eigenvalue below l_0 still grows (h'(0) = c_0 > 1 at every
step) and only lags; convergence is decided by the residual, never by the schedule. Safety
(bf16-safe variant, the paper's §4.4): each polynomial is designed on [l_k, s u_k]; s = ``safety``, by
default 1.01 in 16-bit compute formats (the paper's value for bf16) and 1.001 otherwise.

Two forms (``form``):

* ``"coupled"`` (above; any p <= ``MAX_P``, inverse roots): M_k is propagated, M_{k+1} = P_k^p M_k, so
  its rounding errors accumulate over the steps; in fp32/fp64 that stays far below cond(f, A) u, but
  in bf16 the early polynomials' large coefficients (|c_j| ~ 25 at l = 1e-3) cancel in q_k(M) and the
  drift of M from X^p A shows (kappa 1e2, n = 128, p = 2: error 4e-2 against 5e-3 in the sign form).
* ``"sign"`` (p = 2^k, inverse and forward roots): the sign-function form of
  :mod:`~matroots.solvers.newton_schulz_sign` with the same minimax polynomials, Y_{k+1} = Y_k P_k,
  Z_{k+1} = P_k Z_k, P_k = q_k(Z_k Y_k) (Y_0 = A/c, Z_0 = I), in k square-root stages; M_k = Z_k Y_k is
  recomputed from the two factors each step, so it does not drift (a stagnated residual is accepted
  relative to its floor ~u ||Y|| ||Z||). Stage j uses the schedule of the sign case (p = 2) on
  [l_0^{(j)}, 1], l_0^{(j)} = (lambda_min_est/(4c))^{1/2^(j+1)}. This is Polar Express on the block
  matrix [[0, A], [I, 0]] itself. Cost: d + 2 GEMMs per iteration.
* ``"factored"`` (any p <= ``MAX_P``, inverse roots; the 16-bit default): the sign form's recomputed
  residual in one stage for any p, Z_0 = I, Y_0 = A/c, P_k = q_k(M_k),

      Z_{k+1} = P_k Z_k,   Y_{k+1} = Y_k P_k^{p-1},   M_{k+1} = Z_{k+1} Y_{k+1},

  Z_k -> (A/c)^{-1/p}, Y_k = Z_k^{p-1} A/c -> (A/c)^{1/p} (p = 2: the sign form's step). The same
  schedules as the coupled form on [kappa^{-1/p}, 1]. P multiplies Z from the left and Y from the right,
  so M_{k+1} = P M P^{p-1}: linearised at the fixed point, the errors (E in Z, F in Y) enter M as
  u1 + u2 (u1 = E_ij y_j, u2 = z_i F_ij) and the step maps (u1, u2) by I - [1/p; (p-1)/p][1, 1], which
  is idempotent for every pair of eigenvalues (bounded error propagation, as Higham 2008, Thm 6.12,
  for the sign form; P on the same side of both would give the eigenvalue 1 - (lambda_j/lambda_i)^{1/p},
  unstable past kappa = 2^p). The floor of M = Z Y is ~u ||Z|| ||Y|| ~ u kappa^{1/p}, against
  u kappa^{1/2} in the first square-root stage of the sign form. Cost: d + 2 + (the products of
  P^{p-1}) GEMMs per step, one fewer at the first (Z_0 = I): 6 at p = 4, d = 2.

  In a 16-bit compute format the iterates, the polynomial sums and the residual are fp32 and each GEMM
  takes its operands rounded to the format with fp32 accumulation and result (a tensor-core GEMM; on
  CPU an fp32 GEMM of the rounded operands, whose products are exact), and c is a power of two (A/c as
  exact as A). Where the rounding of the state still hurts, in the first steps, which act on the widest
  interval, steps with l_k^p < ``split_below`` (default 0.02) take split products: each operand as
  hi + lo in the format, X Y ~ hi hi + hi lo + lo hi (3 GEMMs, counted so; 2 where an operand is exact
  in the format, as M_0 = A/c and Y_0 are, and q_0(M_0)'s M_0 M_0 is one exact GEMM). Measured (bf16,
  p = 4, n = 256, bench_solvers' kappa 1e4 matrix; rounding the *exact* state of the fp64 iteration to
  bf16 once, after step k, and iterating on exactly): k = 1 costs 8.3e-3 in the final root here
  (2.2e-2 in the sign form, its whole measured error), k = 2 1.6e-3, later steps ~1.3e-3 each, so no
  variant that stores that state in bf16 reaches 1e-2: factored without splitting 2.0e-2 (4 steps).
  Not every product of a split step needs it; the error after 4 steps with both split steps split
  except one product (all split: 3.8e-3): first step P P 4.4e-3, P P^2 8.6e-3, Y P^3 8.8e-3, Z Y
  5.1e-3 (q(M) exact); second step q(M)'s 4.9e-3, P Z 4.1e-3, P P 4.1e-3, P P^2 5.9e-3, Y P^3 1.8e-2,
  Z Y 3.7e-3; and of an operand's lo: P's in P P^2 and both in Y P^3 (Y P^3 with Y's lo alone 1.0e-2,
  P^3's alone 1.7e-2), M's in q(M). So a split step splits both operands of Y's update (P^(p-1)'s
  accumulating products, not its squarings, and Y P^(p-1)) and the right operand of q_k(M_k)'s
  products and, at the first step, of M_1 = Z_1 Y_1: 4.3e-3 in 32 GEMM-equivalents (4 steps; 4.5e-3
  at the defaults, 38; splitting every product of those steps: 3.7e-3 in 42; before the exact-operand
  count and this choice, 4.1e-3 in 45 and 57 at the defaults; ``bench_solvers.py --to-target``).
  Past the format's resolution the schedule ends (:func:`~matroots.solvers.minimax.schedule`'s
  ``resolution`` = u): the highest-contact tail follows the first step whose minimax error is below u,
  and the stagnation test is armed there, so the defaults stop one step after the target's step
  instead of two (kappa 1e4: the 5th minimax step, E_4 = 4e-7, resolved nothing in bf16).
* ``"auto"`` (default): ``"factored"`` for inverse roots (p >= 2) in 16-bit compute formats, ``"sign"``
  for forward roots (and p = 1 in 16-bit formats), ``"coupled"`` otherwise (fewer products in fp32/fp64
  at p = 4: 5 GEMMs per step against 6).

Domain: SPD (non-symmetric input: NotSymmetricError); integer 1 <= p <= ``MAX_P`` (coupled and
factored forms) or p = 2^k (sign form). Cost per iteration of the coupled form: (d - 1) GEMMs for q_k(M) by Horner, 1 for
X P, the binary powering of P^p, 1 for P^p M: 5 at p = 4, d = 2; 4 at p = 2. Warm start: none (X_0 must be a function of A). Odd p: a converged root is
certified positive definite by a float64 Cholesky (not counted in ``matmuls``;
:func:`~matroots.solvers.spd_start.require_positive_root`). The returned
root is symmetrised.

bf16 limits (what the format permits, against the root of the bf16 matrix itself): a worst-case
perturbation of A of u_bf16 per entry changes A^{-1/4} by cond(f, A) u ~ (kappa/4) u = 9.8 at kappa
1e4, and a random one of that size already makes bench_solvers' kappa 1e4 matrix indefinite, so no
backward-error argument promises 1e-2 there; what is reached depends on which intermediates are
rounded (above). Past kappa ~ 1/u_bf16 ~ 256 the Lanczos estimate of lambda_min is not determined in
the format either (``flag_undetermined``): such runs report converged=False even when accurate (4.5e-3
at kappa 1e4), and at kappa 1e6 the schedule, designed on the interval Lanczos sees, leaves the
smallest eigenvalues behind (n = 256: error 7.3e-2, not converged; 0.23 before the choice of split
products above; n = 1024: 7.1e-3, before 9.9e-3).

``info``: ``form``, ``degree``, ``safety``, ``l0`` (per element), ``schedule_steps`` (minimax steps before the tail,
per element, and per stage in the sign form), ``stage_iterations`` (sign form), ``split_below`` and
``split_steps`` (per element; factored form), ``c`` (user units), ``tol``, ``stop_reason``, ``eps_abs`` and the Lanczos estimates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core import arguments, precision
from ..core.errors import InvalidArgumentError, UnsupportedExponentError
from ..core.inputs import Problem
from .base import Capabilities, RawResult, matmul_count_power, matrix_power
from .coupled_loop import check_resolvable, default_tol, run_coupled
from .minimax import Step, grid_floor, schedule
from .newton_loop import _start_matrix
from .newton_schulz_sign import (
    MAX_STAGES,
    compose_stages,
    power_of_two_stages,
    product_floor,
    scalar_powers,
    symmetrise,
    unscale,
)
from .registry import register
from .spd_start import (
    SpdIterationConfig,
    SpdStart,
    flag_undetermined,
    not_positive_definite,
    require_positive_root,
    spd_start,
)

MAX_P = 16
"""Largest p: the basis x^{1 + jp} becomes too ill-conditioned for the float64 Remez beyond it."""
MIN_L0 = 1e-10
FORMS = ("auto", "coupled", "sign", "factored")
SPLIT_BELOW = 0.02
"""Default ``split_below`` in 16-bit formats: split products while the step's l_k^p < 0.02 (module
docstring, "factored")."""


def _polynomial(M: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """q(M) = sum_j C[:, j] M^j by Horner (d - 1 GEMMs); C is (b, d + 1) float64."""
    I = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    cm = C.to(M.dtype)[:, :, None, None]
    d = C.shape[1] - 1
    P = cm[:, d] * M + cm[:, d - 1] * I
    for j in range(d - 2, -1, -1):
        P = P @ M + cm[:, j] * I
    return P


class _Gemms:
    """X @ Y with operands in ``low`` and fp32 accumulation and result (None: plain X @ Y), counted per
    element of the batch (``count``, GEMMs).

    The operands' values are rounded to ``low`` and multiplied by an fp32 GEMM: the products of two
    16-bit values are exact in fp32, so this is a 16-bit GEMM with fp32 accumulation (what a tensor-core
    kernel computes, up to the order of summation). ``split=True``: each operand as hi + lo, hi = fl(X),
    lo = fl(X - hi), and X Y ~ hi_X hi_Y + (hi_X lo_Y + lo_X hi_Y), operands good to ~u^2 (the bf16x3
    product; Henry, Tang & Heinecke 2019, "Leveraging the bfloat16 artificial intelligence datatype for
    higher-precision computations"); ``split="right"``: only the right operand's lo, hi_X (hi_Y + lo_Y)
    (2 GEMMs). A term whose lo is zero (an operand exact in the format, as M_0 = A/c and Y_0 are) is not
    formed, so a split product counts 3 GEMMs, or 2 with an exact operand. The counts are per element
    (an element whose lo is zero takes the GEMM it takes alone: none).
    """

    def __init__(self, low: torch.dtype | None, rows: int) -> None:
        self.low = low
        self.count = torch.zeros(rows, dtype=torch.float64)

    def __call__(self, X: torch.Tensor, Y: torch.Tensor, split: bool | str = False) -> torch.Tensor:
        self.count += 1.0
        if self.low is None:
            return X @ Y
        Xh, Yh = X.to(self.low).to(X.dtype), Y.to(self.low).to(Y.dtype)
        out = Xh @ Yh
        if split:
            Xl, Yl = (X - Xh).to(self.low).to(X.dtype), (Y - Yh).to(self.low).to(Y.dtype)
            terms = ((Yl, Xh, Yl),) if split == "right" else ((Xl, Xl, Yh), (Yl, Xh, Yl))
            for lo, a, b in terms:
                nonzero = lo.flatten(-2).ne(0).any(-1).reshape(-1)
                if bool(nonzero.any()):
                    out = out + a @ b
                    self.count += nonzero.to(torch.float64)
        return out


def _polynomial_mm(
    M: torch.Tensor, C: torch.Tensor, mm, split: bool | str, square_first: bool
) -> torch.Tensor:
    """q(M) = sum_j C[:, j] M^j by Horner with the product ``mm`` (d - 1 products); ``square_first``
    (16-bit formats): the innermost product is M M, q = (c_d M^2 + c_{d-1} M + c_{d-2} I) M ... (the same
    count; M M is exact in fp32 where M is exact in the format, as M_0 = A/c is)."""
    I = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    cm = C.to(M.dtype)[:, :, None, None]
    d = C.shape[1] - 1
    if d == 1:
        return cm[:, 1] * M + cm[:, 0] * I
    if square_first:
        P = cm[:, d] * mm(M, M, split) + cm[:, d - 1] * M + cm[:, d - 2] * I
        first = d - 3
    else:
        P = cm[:, d] * M + cm[:, d - 1] * I
        first = d - 2
    for j in range(first, -1, -1):
        P = mm(P, M, split) + cm[:, j] * I
    return P


def _power_mm(P: torch.Tensor, e: int, mm, split: bool) -> torch.Tensor:
    """P^e (e >= 1) by binary powering with the product ``mm``; ``split`` applies to the accumulating
    products (result base), not to the squarings (base base)."""
    result, base = None, P
    while True:
        if e & 1:
            result = base if result is None else mm(result, base, split)
        e >>= 1
        if not e:
            return result
        base = mm(base, base)


def _coefficients(scheds: list[tuple[Step, ...]], k: int, rows: torch.Tensor) -> torch.Tensor:
    """(r, d + 1): step k of each active row's schedule (the tail step after its end)."""
    return torch.tensor(
        [scheds[i][min(k, len(scheds[i]) - 1)].coeffs for i in rows.tolist()], dtype=torch.float64
    )


def _run_factored(
    M0: torch.Tensor,
    I: torch.Tensor,
    scheds: list[tuple[Step, ...]],
    p: int,
    *,
    low: torch.dtype | None,
    split_below: float,
    tol: float,
    max_iter: int,
    accept: float,
    record_history: bool,
):
    """The factored form: Z_0 = I, Y_0 = M_0 = A/c, P_k = q_k(M_k), Z <- P Z, Y <- Y P^(p-1), M = Z Y.

    Returns the loop's outcome, the GEMMs per element (:class:`_Gemms`) and the number of split steps
    per element. An element's step is split when its design interval has l_k^p < ``split_below``
    (decided per element, so an element gets the arithmetic it gets alone). A split step splits the
    products that measurably carry its rounding into the root (module docstring, "factored"): both
    operands in Y's update (the accumulating products of P^(p-1), not its squarings, and Y P^(p-1)),
    the right operand in q_k(M_k)'s products (M's lo) and, at the first step (Z_1 = P_0), in
    M_1 = Z_1 Y_1 (Y_1's lo); Z's update P Z never.
    """
    count = torch.zeros(M0.shape[0], dtype=torch.float64)

    def is_split(i: int, k: int) -> bool:
        return low is not None and scheds[i][min(k, len(scheds[i]) - 1)].lo ** p < split_below

    def advance(k: int, rows: torch.Tensor, Z: torch.Tensor, Y: torch.Tensor, M: torch.Tensor, split: bool):
        mm = _Gemms(low, rows.numel())
        right = "right" if split else False
        P = _polynomial_mm(M, _coefficients(scheds, k, rows), mm, right, low is not None)
        Z_new = P if k == 0 else mm(P, Z)  # Z_0 = I
        Y_new = Y if p == 1 else mm(Y, _power_mm(P, p - 1, mm, split), split)
        M_new = mm(Z_new, Y_new, right if k == 0 else False)
        count.index_add_(0, rows, mm.count)
        return Z_new, Y_new, M_new

    def step(k: int, rows: torch.Tensor, state, M: torch.Tensor):
        Z, Y = state
        flags = [is_split(i, k) for i in rows.tolist()]
        if len(set(flags)) == 1:
            Z, Y, M = advance(k, rows, Z, Y, M, flags[0])
            return (Z, Y), M
        Zo, Yo, Mo = torch.empty_like(Z), torch.empty_like(Y), torch.empty_like(M)
        for flag in (False, True):
            sel = torch.tensor([j for j, f in enumerate(flags) if f == flag], dtype=torch.long)
            z, y, m = advance(k, rows[sel], Z[sel], Y[sel], M[sel], flag)
            Zo.index_copy_(0, sel, z)
            Yo.index_copy_(0, sel, y)
            Mo.index_copy_(0, sel, m)
        return (Zo, Yo), Mo

    d = len(scheds[0][0].coeffs) - 1
    per_iter = (d - 1) + 1 + (0 if p == 1 else matmul_count_power(p - 1) + 1) + 1
    out = run_coupled(
        (I, M0), M0, step, tol=tol, max_iter=max_iter, accept=accept, per_iter=per_iter,
        record_history=record_history, floor_scale=product_floor,
        stagnation_from=[len(s) - 1 for s in scheds],
    )  # fmt: skip
    n_split = [sum(is_split(i, k) for k in range(it)) for i, it in enumerate(out.iterations.tolist())]
    return out, count, torch.tensor(n_split)


@dataclass
class _Setup:
    """What each form's iteration reads (:meth:`PolarExpressConfig._setup`)."""

    p: int
    cdt: torch.dtype
    sixteen: bool  # a 16-bit compute format
    form: str  # "coupled", "factored" or "sign"
    stages: int  # the sign form's square-root stages (p = 2^stages); 0 for the other forms
    st: SpdStart
    info: dict
    safety: float
    tol: float
    max_iter: int
    accept: float  # the stagnation acceptance level
    c: torch.Tensor  # the scale, c >= lambda_max
    ratio: list[float]  # per matrix, (lambda_min_est / (4 c)) clamped: the start interval's lower end^p


@dataclass
class _Iterated:
    """The outcome of a form's iteration: the unscaled root X of A/c and how it stopped."""

    X: torch.Tensor
    converged: torch.Tensor
    iterations: torch.Tensor
    reason: list[str]
    history: Any
    residual: torch.Tensor
    matmuls: torch.Tensor
    l0: list[float]


@register
@dataclass(frozen=True, kw_only=True)
class PolarExpressConfig(SpdIterationConfig):
    """Minimax polynomial coupled iteration (Polar Express) for A^{-1/p}, SPD input.

    Args:
        form: "coupled" (X_k, M_k; any p), "sign" (Y_k, Z_k by square-root stages; p = 2^k, forward roots
            too), "factored" (Z_k, Y_k, M_k = Z_k Y_k recomputed; any p, one stage), or "auto":
            "factored" for inverse roots (p >= 2) in 16-bit compute formats, "sign" for forward roots,
            else "coupled" (module docstring).
        degree: d, the degree of q_k in M (the step polynomial has degree 1 + d p in x); 2 is the
            paper's quintic for p = 2.
        safety: interval widening s >= 1 of each design (None: 1.01 in 16-bit formats, else 1.001).
        split_below: form "factored" in a 16-bit format: steps whose design interval has
            l_k^p < split_below take split (hi + lo, 3-GEMM) products (None: 0.02 in 16-bit formats;
            0 turns splitting off; ignored in fp32/fp64).
        lanczos_steps, stagnation_accept, symmetry_tol: see :class:`~matroots.solvers.spd_start.SpdIterationConfig`.
    """

    name = "polar_express"
    capabilities = Capabilities(forward_root=True, integer_p=True)
    form: str = "auto"
    degree: int = 2
    safety: float | None = None
    split_below: float | None = None

    def __post_init__(self) -> None:
        arguments.store(
            self,
            form=arguments.choice("form", self.form, FORMS),
            degree=arguments.integer("degree", self.degree, minimum=1),
            safety=arguments.real("safety", self.safety, minimum=1.0, maximum=1.5, allow_none=True),
            split_below=arguments.real(
                "split_below", self.split_below, minimum=0.0, maximum=1.0, allow_none=True
            ),
            **self._spd_options(),
        )

        if self.degree > 4:
            raise InvalidArgumentError(
                f"degree must be 1, 2, 3 or 4 (the degree of q_k in M), got {self.degree}"
            )

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        """The phases: form and start (:meth:`_setup`), the iteration of the form (one stage,
        :meth:`_one_stage`, or the sign form's square-root stages, :meth:`_sign_stages`), and the checks
        and unscaling of the result (:meth:`_result`)."""
        s = self._setup(prob, inverse)
        if s.form == "sign" and s.stages == 0 and not inverse:  # A^{1/1}: the shifted matrix itself
            root = s.st.A.to(torch.float32 if s.sixteen else s.cdt).clone()
            root.diagonal(dim1=-2, dim2=-1).add_(s.st.shift.to(root.dtype)[:, None])
            b = prob.A.shape[0]
            s.info["stop_reason"] = ["identity_root"] * b
            zeros = torch.zeros(b, dtype=torch.int64)
            return RawResult(
                root, torch.ones(b, dtype=torch.bool), zeros, zeros.double(), s.st.matmuls, info=s.info
            )
        wdt = torch.float32 if s.sixteen and s.form == "factored" else s.cdt  # the iterates' format
        M0 = _start_matrix(s.st.A, s.c, s.st.shift, wdt)
        I = torch.eye(prob.n, dtype=wdt).expand(prob.A.shape[0], prob.n, prob.n).clone()
        it = (
            self._sign_stages(prob, s, M0, I, inverse)
            if s.form == "sign"
            else self._one_stage(prob, s, M0, I)
        )
        return self._result(prob, s, it, inverse)

    def _form(self, p: int, sixteen: bool, inverse: bool) -> tuple[str, int]:
        """(form, square-root stages of the sign form, 0 otherwise): ``form="auto"`` resolved, and the
        refusals of a form that cannot compute the root asked for."""
        two_k = p & (p - 1) == 0 and p.bit_length() - 1 <= MAX_STAGES
        form = self.form
        if form == "auto":
            if sixteen and inverse and p >= 2:
                form = "factored"
            else:
                form = "sign" if two_k and (sixteen or not inverse) else "coupled"
        if form == "factored" and not inverse:
            raise UnsupportedExponentError(
                f"{self.name}: forward roots A^(1/p) need form='sign' (p = 2^k); got form='factored'"
            )
        if p > MAX_P and form in ("coupled", "factored"):
            raise UnsupportedExponentError(
                f"{self.name}: the coupled form takes integer 1 <= p <= {MAX_P}, got p = {p}; "
                "use form='sign' for p = 2^k, or method='coupled_newton'"
            )
        stages = 0
        if form == "sign" or not inverse:
            stages = power_of_two_stages(p, self.name)  # the sign form: p = 2^k (refused otherwise)
            if not inverse and form == "coupled":
                raise UnsupportedExponentError(
                    f"{self.name}: forward roots A^(1/p) need form='sign' (p = 2^k); got form='coupled'"
                )
        return form, stages

    def _setup(self, prob: Problem, inverse: bool) -> _Setup:
        """The form, the SPD start (shift, lambda bounds, c >= lambda_max) and the stopping numbers."""
        p = int(prob.p)
        cdt = prob.compute_dtype
        sixteen = cdt not in (torch.float32, torch.float64)
        form, stages = self._form(p, sixteen, inverse)
        # the residual's rounding floor: propagated through P^p in the coupled form (coupled_newton's
        # rule with p); one product M = Z Y of two rounded operands in the sign and factored forms
        check_resolvable(p if form == "coupled" else 2, cdt, prob.n, self.name)
        st = spd_start(prob, self.name, self.lanczos_steps, self.symmetry_tol)
        info = dict(st.info)
        safety = self.safety if self.safety is not None else (1.01 if sixteen else 1.001)
        q = 2 if form == "sign" else p  # the root each iteration computes
        tol = prob.tol if prob.tol is not None else default_tol(cdt, prob.n, q)
        max_iter = prob.max_iter if prob.max_iter is not None else 100
        c = st.lmax
        if form == "factored" and sixteen:  # a power of two: A / c is as exact as A in the 16-bit format
            c = torch.exp2(torch.ceil(torch.log2(c)))
        ratio = (st.lmin / (4.0 * c)).clamp(min=MIN_L0**p, max=1.0).tolist()
        info.update(form=form, degree=self.degree, safety=safety, c=c / prob.prescale, tol=tol)
        return _Setup(
            p,
            cdt,
            sixteen,
            form,
            stages,
            st,
            info,
            safety,
            tol,
            max_iter,
            self.stagnation_accept * tol,
            c,
            ratio,
        )

    def _one_stage(self, prob: Problem, s: _Setup, M0: torch.Tensor, I: torch.Tensor) -> _Iterated:
        """The factored and coupled forms: one stage, the p-th root's schedule on the start's ratio."""
        p, d = s.p, self.degree
        l0 = [max(grid_floor(r ** (1.0 / p)), MIN_L0) for r in s.ratio]
        # 16-bit factored form: the minimax steps end where their error reaches the format's unit
        # roundoff (minimax.schedule's resolution); the stagnation test is armed at the tail
        res = precision.info(s.cdt).unit_roundoff if s.sixteen and s.form == "factored" else 0.0
        scheds = [schedule(lo, p, d, s.safety, res) for lo in l0]
        if s.form == "factored":
            split_below = self.split_below
            if split_below is None:
                split_below = SPLIT_BELOW if s.sixteen else 0.0
            out, matmuls, n_split = _run_factored(
                M0, I, scheds, p, low=s.cdt if s.sixteen else None, split_below=split_below, tol=s.tol,
                max_iter=s.max_iter, accept=s.accept, record_history=prob.record_history,
            )  # fmt: skip
            s.info.update(split_below=split_below, split_steps=n_split)
        else:

            def step(k: int, rows: torch.Tensor, state, M: torch.Tensor):
                P = _polynomial(M, _coefficients(scheds, k, rows))
                return (state[0] @ P,), matrix_power(P, p) @ M

            out = run_coupled(
                (I,), M0, step, tol=s.tol, max_iter=s.max_iter, accept=s.accept,
                per_iter=d + 1 + matmul_count_power(p), record_history=prob.record_history,
                stagnation_from=[len(sc) - 1 for sc in scheds],
            )  # fmt: skip
            matmuls = out.matmuls_each
        s.info["schedule_steps"] = torch.tensor([len(sc) - 1 for sc in scheds])
        return _Iterated(out.state[0], out.converged, out.iterations, out.reason, out.history, out.residual,
                         matmuls, l0)  # fmt: skip

    def _sign_stages(
        self, prob: Problem, s: _Setup, M0: torch.Tensor, I: torch.Tensor, inverse: bool
    ) -> _Iterated:
        """The sign form: stage j takes the square root of (A/c)^{1/2^j}; its singular-value variable
        is x = (lambda/c)^{1/2^(j+1)}, whose lower end is the start's ratio to that power."""
        d, b = self.degree, prob.A.shape[0]
        l0 = [max(grid_floor(r**0.5), MIN_L0) for r in s.ratio]
        stage_scheds: dict[int, list] = {}

        def stage(j: int, B: torch.Tensor):
            sch = [schedule(max(grid_floor(r ** (0.5 ** (j + 1))), MIN_L0), 2, d, s.safety) for r in s.ratio]
            stage_scheds[j] = sch

            def step(k: int, rows: torch.Tensor, state, M: torch.Tensor):
                Y, Z = state
                P = _polynomial(M, _coefficients(sch, k, rows))
                Y_new, Z_new = Y @ P, P @ Z
                return (Y_new, Z_new), Z_new @ Y_new

            return run_coupled(
                (B, I), B, step, tol=s.tol, max_iter=s.max_iter, accept=s.accept, per_iter=d + 2,
                record_history=prob.record_history, floor_scale=product_floor,
                stagnation_from=[len(sc) - 1 for sc in sch],
            )  # fmt: skip

        comp = compose_stages(M0, max(s.stages, 1), stage)
        Y, Z = comp.out.state
        matmuls = comp.matmuls
        if s.stages == 0:  # p = 1, inverse: A^{-1} = (A^{-1/2})^2
            X, matmuls = Z @ Z, matmuls + 1
        else:
            X = Z if inverse else Y
        s.info["stage_iterations"] = comp.stage_iterations
        s.info["schedule_steps"] = torch.tensor(
            [[len(sc[i]) - 1 for sc in stage_scheds.values()] for i in range(b)]
        )
        return _Iterated(X, comp.converged, comp.iterations, comp.reason, comp.history, comp.out.residual,
                         matmuls, l0)  # fmt: skip

    def _result(self, prob: Problem, s: _Setup, it: _Iterated, inverse: bool) -> RawResult:
        """Refuse a diverged or non-positive result, flag what the precision cannot determine, unscale."""
        info, st = s.info, s.st
        info["l0"] = torch.tensor(it.l0, dtype=torch.float64)
        if "divergence" in it.reason:
            not_positive_definite(self.name, prob, st.A, st.shift)
        require_positive_root(self.name, prob, it.X, it.converged, s.p)
        if inverse:
            flag_undetermined(st.undetermined, it.converged, it.reason, info, prob, st.lmax)
        root = symmetrise(unscale(it.X, scalar_powers(s.c, (-1.0 if inverse else 1.0) / s.p)))
        info["stop_reason"] = it.reason
        if s.sixteen and s.form == "factored":
            info["compute_dtype_note"] = (
                f"GEMM operands in {precision.info(s.cdt).name} with fp32 accumulation and result (split "
                "hi + lo operands, up to 3 GEMMs, in the steps with l_k^p < split_below); iterates, polynomial sums, residual "
                "norms and the final scaling in fp32"
            )
        elif s.sixteen:
            info["compute_dtype_note"] = (
                f"products in {precision.info(s.cdt).name}; residual norms and the final scaling in fp32"
            )
        return RawResult(
            root=root,
            converged=it.converged,
            iterations=it.iterations,
            residual=it.residual,
            matmuls=st.matmuls + float(it.matmuls.mean()),
            history=it.history,
            info=info,
        )
