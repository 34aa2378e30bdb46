"""Schur-Newton method for A^{-1/p} of a general real matrix (Guo & Higham 2006, Algorithm 3.3;
Higham's Matrix Function Toolbox, ``rootpm_schur_newton``).

1. Real Schur form A = Q R Q^T (``scipy.linalg.schur``; for symmetric input the symmetric Schur form,
   i.e. the eigendecomposition, so R is diagonal).
2. Write p = 2^k0 q with q odd.
3. Take k1 >= k0 square roots of R by the real Schur recurrence (:mod:`.schur_sqrt`), with k1 the
   smallest value for which the eigenvalue modulus ratio of R^{1/2^k1} is <= 2 and every eigenvalue's
   argument is at most pi/4 (so the spectrum sits well inside the Newton convergence region).
4. Coupled Newton (:mod:`.newton_core`) on U = R^{1/2^k1} for U^{-1/q}, with c from U's eigenvalue moduli
   (Guo & Higham eq. 3.11).
5. Square the result k1 - k0 times: (U^{-1/q})^{2^(k1-k0)} = R^{-1/(2^k0 q)} = R^{-1/p}.
6. Back-transform: A^{-1/p} = Q R^{-1/p} Q^T.

Requires no eigenvalue on the closed negative real axis; the domain test (:mod:`.schur_domain`)
refuses a matrix solved that has one and computes, flagged ``"not_determined"``, the root of one that is
only within rounding of such a matrix (``info["not_determined"]`` says why; ``info["schur_fp64"]`` lists
the batch elements whose Schur form was computed in float64). Not batched (a loop over batch elements).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..core import arguments, precision
from ..core.errors import FormatRangeError
from ..core.inputs import Problem, is_symmetric
from .base import Capabilities, RawResult, SolverConfig
from .newton_checks import NewtonOutcome
from .newton_core import (
    check_resolvable_exponent,
    forward_backward_check,
    optimal_c_power,
)
from .newton_loop import coupled_newton_iterate
from .registry import register
from .schur_domain import (
    U64,
    SchurForm,
    general_domain,
    schur_form,
    stability_factor,
    symmetric_domain,
    symmetric_sign_unresolved,
)
from .schur_sqrt import sqrtm_quasi_triangular


def split_exponent(p: int) -> tuple[int, int]:
    """(k0, q) with p = 2^k0 q and q odd."""
    k0 = (p & -p).bit_length() - 1
    return k0, p >> k0


def _backward_threshold(base: float, alpha: float) -> float:
    """The backward-error threshold of a forward root: ``base`` (the acceptance of a normal matrix) times
    the stability factor alpha (:func:`.schur_domain.stability_factor`: the residual floor of the rounded
    root itself), at most 1/2. X = 0 has the relative residual 1, so a threshold of 1 or more would pass
    anything; the cap keeps the test a check for gross failures where alpha u is large (chebspec(10, 1)
    in fp32: alpha = 6e4, base alpha = 3, residual 1.4e-3 at forward error 4e-4 = 0.15 cond u)."""
    return min(base * alpha, 0.5)


MAX_K1 = 64
"""Cap on the number of square roots; the log-ratio of two floating-point numbers needs at most ~12."""


def choose_k1(eigs: np.ndarray, k0: int, max_arg: float = math.pi / 4, max_ratio: float = 2.0) -> int:
    """Smallest k1 >= k0 with modulus ratio^(1/2^k1) <= max_ratio and |arg|/2^k1 <= max_arg.

    The ratio is taken in logarithms: max|lambda| / min|lambda| overflows for a spectrum such as
    {1e10, 1e-300}, and inf ** (0.5 ** k1) stays inf until 0.5 ** k1 underflows (k1 ~ 1075, which
    rooted every eigenvalue to 1 and returned the identity as the root).
    """
    log_mod = np.log(np.abs(np.asarray(eigs, dtype=complex)))
    if not np.isfinite(log_mod).all():
        raise FormatRangeError(
            "schur_newton: an eigenvalue modulus is zero or infinite in the working format; "
            "no principal root exists or the matrix cannot be represented"
        )
    log_ratio = float(log_mod.max() - log_mod.min())
    arg = float(np.abs(np.angle(eigs)).max())
    k1 = k0
    while (log_ratio * 0.5**k1 > math.log(max_ratio) or arg * 0.5**k1 > max_arg) and k1 < MAX_K1:
        k1 += 1
    return k1


@dataclass
class _SchurRun:
    """What one schur_newton solve carries from matrix to matrix (:meth:`SchurNewtonConfig._run`)."""

    prob: Problem
    inverse: bool
    p: int
    k0: int
    q: int
    ldt: torch.dtype
    cdt: torch.dtype
    tol: float
    max_iter: int
    info: dict
    matmuls: float = 0.0
    roots: list[torch.Tensor] = field(default_factory=list)
    conv: list[bool] = field(default_factory=list)
    iters: list[int] = field(default_factory=list)
    resid: list[float] = field(default_factory=list)
    hist: list[list[torch.Tensor]] = field(default_factory=list)
    bwd: dict = field(default_factory=dict)

    def add(
        self, X: torch.Tensor, converged: bool, iterations: int, residual: float, history: list,
        k1: int, reason: str, sym: bool,
    ) -> None:  # fmt: skip
        """One matrix's root and what is reported of it."""
        self.roots.append(X)
        self.conv.append(converged)
        self.iters.append(iterations)
        self.resid.append(residual)
        self.hist.append(history)
        self.info["k1"].append(k1)
        self.info["stop_reason"].append(reason)
        self.info["symmetric"].append(sym)


@register
@dataclass(frozen=True, kw_only=True)
class SchurNewtonConfig(SolverConfig):
    """Schur-Newton solver for integer p >= 1 and general real matrices.

    Args:
        stagnation_accept: as for coupled_newton (multiple of tol accepted on stagnation).
        symmetry_tol: symmetry test that selects the symmetric Schur form.
    """

    name = "schur_newton"
    capabilities = Capabilities(general_input=True, batched=False, integer_p=True)
    stagnation_accept: float = 16.0
    symmetry_tol: float | None = None

    def __post_init__(self) -> None:  # typed InvalidArgumentError for every field (matroots.core.arguments)
        arguments.store(
            self,
            stagnation_accept=arguments.real(
                "stagnation_accept", self.stagnation_accept, minimum=1.0, what="a multiple of tol"
            ),
            symmetry_tol=arguments.real("symmetry_tol", self.symmetry_tol, minimum=0.0, allow_none=True),
        )

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        """Guo & Higham 2006, Algorithm 3.3, per batch element (module docstring, steps 1-6), then the
        batch's result."""
        run = self._setup(prob, inverse)
        for Ab in prob.A:
            self._element(run, Ab)
        return self._result(run)

    def _setup(self, prob: Problem, inverse: bool) -> _SchurRun:
        """p = 2^k0 q with q odd (step 2), the formats (the Schur form and square roots in a LAPACK
        format, the Newton products in the compute format), the stopping rule of the q-th root."""
        p = int(prob.p)
        k0, q = split_exponent(p)
        ldt = precision.lapack_dtype(prob.compute_dtype)
        cdt = prob.compute_dtype
        check_resolvable_exponent(q, cdt, prob.n, self.name)
        info: dict = {"k0": k0, "q": q, "k1": [], "stop_reason": [], "symmetric": [], "eps_abs": []}
        if ldt != cdt:
            info["compute_dtype_fallback"] = (
                f"Schur form and square roots in {precision.info(ldt).name} (LAPACK), Newton products in "
                f"{precision.info(cdt).name}"
            )
        return _SchurRun(
            prob=prob, inverse=inverse, p=p, k0=k0, q=q, ldt=ldt, cdt=cdt,
            tol=prob.tol if prob.tol is not None else precision.default_tol(cdt, prob.n, q),
            max_iter=prob.max_iter if prob.max_iter is not None else 100, info=info,
        )  # fmt: skip

    def _element(self, run: _SchurRun, Ab: torch.Tensor) -> None:
        """One matrix: its Schur form (step 1), the eps shift, the domain test, k1 square roots
        (step 3), coupled Newton on U = R^{1/2^k1} (step 4), squaring back and the back-transform
        (steps 5-6), the forward root's backward error and the domain's flag."""
        prob = run.prob
        a = Ab.to(run.ldt).numpy().astype(np.float64 if run.ldt == torch.float64 else np.float32)
        sym = prob.trusted or is_symmetric(Ab, prob.symmetry_tol(self.symmetry_tol))
        form = schur_form(a, sym)
        shift = self._shift(run, form)
        form, undetermined = self._domain(run, a, form, shift, sym)
        R, eigs = self._shifted_factor(run, form, shift)
        if run.p == 1 and not run.inverse:
            self._identity_root(run, a, shift, sym)
            return
        k1 = choose_k1(eigs, run.k0)
        U = self._square_roots(R, form.blocks, k1, sym)
        out = self._newton(run, U, eigs, k1)
        X = self._square_back(run, out, form.Q, k1)
        if not run.inverse:
            self._forward_check(run, X, a, shift, sym, out, k1)
        if undetermined is not None and bool(out.converged[0]):
            out.converged[0] = False
            out.reason[0] = "not_determined"
            run.info.setdefault("not_determined", []).append(
                f"batch element {len(run.roots)}: {undetermined}"
            )
            run.info["hint"] = (
                "info['not_determined']: the matrix solved is singular to working precision or within "
                "rounding of a matrix with an eigenvalue on the closed negative real axis, so its computed "
                "root has no promised digit; increase eps, or use a wider dtype"
            )
        run.add(X, bool(out.converged[0]), int(out.iterations[0]), float(out.residual[0]), out.history, k1,
                out.reason[0], sym)  # fmt: skip

    @staticmethod
    def _shift(run: _SchurRun, form: SchurForm) -> float:
        """eps_abs in the working scale: eps is in the user's units and the input was pre-scaled by
        prob.prescale (an absolute eps scales too); "relative" is relative to lambda_max, the largest
        eigenvalue modulus of the rounded matrix (:mod:`matroots.core.regularize`)."""
        prob = run.prob
        if prob.eps_mode == "absolute":
            shift = prob.eps * prob.prescale
        else:
            shift = prob.eps * float(np.abs(form.eigs).max())
        if not math.isfinite(shift) or not math.isfinite(shift + float(np.abs(form.eigs).max())):
            raise FormatRangeError(
                f"schur_newton: the eps shift {shift / prob.prescale:.3e} (plus the spectrum) overflows "
                "float64 at the working scale; use a smaller eps"
            )
        run.info["eps_abs"].append(shift / prob.prescale)
        return shift

    def _domain(
        self, run: _SchurRun, a: np.ndarray, form: SchurForm, shift: float, sym: bool
    ) -> tuple[SchurForm, str | None]:
        """The domain test of the matrix actually solved, the rounded, shifted matrix, whose computed
        eigenvalues are exact only for a nearby one (:mod:`matroots.solvers.schur_domain`): refused,
        or flagged (why, else None), the Schur form recomputed in float64 where the working format
        cannot decide."""
        prob = run.prob
        if sym:
            if form.u > U64 and symmetric_sign_unresolved(form, shift, prob.n):
                form = schur_form(a.astype(np.float64), sym=True)
                run.info.setdefault("schur_fp64", []).append(len(run.roots))
            return form, symmetric_domain(self.name, prob, a, form, shift, run.inverse)
        refined = form
        form, undetermined = general_domain(self.name, prob, a, form, shift)
        if form is not refined:
            run.info.setdefault("schur_fp64", []).append(len(run.roots))
        return form, undetermined

    @staticmethod
    def _shifted_factor(run: _SchurRun, form: SchurForm, shift: float) -> tuple[np.ndarray, np.ndarray]:
        """R + eps_abs I and its eigenvalues (the shift moves the triangular factor's diagonal exactly
        as it moves A's spectrum)."""
        R, eigs = form.R, form.eigs
        if shift:
            R = R + np.asarray(shift, dtype=R.dtype) * np.eye(len(R), dtype=R.dtype)
            eigs = eigs + shift
        if not np.isfinite(R).all():
            raise FormatRangeError(
                f"schur_newton: the eps-shifted Schur factor overflows {precision.info(run.ldt).name} "
                f"(eps_abs {shift / run.prob.prescale:.3e}); use a wider dtype or a smaller eps"
            )
        return R, eigs

    @staticmethod
    def _identity_root(run: _SchurRun, a: np.ndarray, shift: float, sym: bool) -> None:
        """A^{1/1} = A + eps_abs I itself: no square roots, whose squaring back would cost 2^k1 u. Symmetric
        input (within ``symmetry_tol``) is solved as its symmetric part (A + A^T)/2, as for every other p
        (the symmetric Schur form) and as ``info["symmetric"]`` reports: returning the unsymmetrised A here
        made the root disagree with the report (bf16, defect 0.60: 28% from the root of (A + A^T)/2)."""
        prob, cdt = run.prob, run.cdt
        if sym:
            a = 0.5 * (a + a.T)
        X = torch.from_numpy(np.ascontiguousarray(a)).to(cdt)
        if shift:
            X = X + torch.as_tensor(shift, dtype=cdt) * torch.eye(prob.n, dtype=cdt)
        history = [torch.zeros(1, dtype=torch.float64)] if prob.record_history else []
        run.add(X, True, 0, 0.0, history, 0, "identity_root", sym)

    @staticmethod
    def _square_roots(R: np.ndarray, blocks: Any, k1: int, sym: bool) -> np.ndarray:
        """U = R^{1/2^k1} by k1 square roots of the (quasi-)triangular factor: the real Schur recurrence
        (Higham 2008, Alg. 6.7; :mod:`matroots.solvers.schur_sqrt`), or elementwise for the diagonal
        factor of symmetric input (step 3)."""
        U = R
        for _ in range(k1):
            U = np.diag(np.sqrt(np.diag(U))).astype(R.dtype) if sym else sqrtm_quasi_triangular(U, blocks)
        return U

    def _newton(self, run: _SchurRun, U: np.ndarray, eigs: np.ndarray, k1: int) -> NewtonOutcome:
        """Coupled Newton for U^{-1/q} (Higham 2008, eq. (7.18)), c from U's eigenvalue moduli
        |lambda|^{1/2^k1} (Guo & Higham 2006, eq. (3.11); step 4)."""
        mod = np.exp(np.log(np.abs(eigs)) * 0.5**k1)
        cp = optimal_c_power(np.array([mod.min()]), np.array([mod.max()]), run.q)
        # U stays in the format of its square roots: M_0 = U / c^p is formed before the rounding to
        # the compute format (newton_loop._start_matrix), so a 16-bit run never rounds U itself,
        # whose entries may be subnormal there (fp16, a 1 x 1 matrix 8.7e-8: 1% error before)
        Ut = torch.from_numpy(np.ascontiguousarray(U)).unsqueeze(0)
        out = coupled_newton_iterate(
            Ut,
            run.q,
            torch.as_tensor(cp),
            tol=run.tol,
            max_iter=run.max_iter,
            stagnation_accept=self.stagnation_accept * run.tol,
            inverse=run.inverse,
            record_history=run.prob.record_history,
            compute_dtype=run.cdt,
        )
        run.info.update(out.notes)
        return out

    @staticmethod
    def _square_back(run: _SchurRun, out: NewtonOutcome, Q: np.ndarray, k1: int) -> torch.Tensor:
        """(U^{-1/q})^{2^(k1-k0)} = R^{-1/p} (step 5) and A^{-1/p} = Q R^{-1/p} Q^T (step 6)."""
        X = out.X[0]
        for _ in range(k1 - run.k0):
            X = X @ X
        Qt = torch.from_numpy(np.ascontiguousarray(Q)).to(X.dtype)
        X = Qt @ X @ Qt.T
        run.matmuls += out.matmuls + (k1 - run.k0) + 2
        if bool(out.converged[0]) and not bool(torch.isfinite(X).all()):
            raise FormatRangeError(
                f"schur_newton: the root overflows {precision.info(X.dtype).name} while squaring back "
                f"{k1 - run.k0} times; use a wider dtype"
            )
        return X

    def _forward_check(
        self,
        run: _SchurRun,
        X: torch.Tensor,
        a: np.ndarray,
        shift: float,
        sym: bool,
        out: NewtonOutcome,
        k1: int,
    ) -> None:
        """The forward root's backward error ||Y^p - (A + eps_abs I)|| / ||A + eps_abs I|| against its
        threshold (:func:`_backward_threshold`)."""
        prob, p = run.prob, run.p
        Xs = 0.5 * (X + X.T) if sym else X
        run.matmuls += forward_backward_check(
            Xs[None],
            torch.from_numpy(np.ascontiguousarray(a))[None],
            torch.tensor([shift], dtype=torch.float64),
            p,
            out,
            # A forward root with relative error d has backward error ~p d (scale with p, not q),
            # and squaring back k1 - k0 times multiplies the error of U^{1/q} by up to 2^(k1-k0).
            _backward_threshold(
                self.stagnation_accept
                * 2.0 ** (k1 - run.k0)
                * max(run.tol, precision.default_tol(run.cdt, prob.n, p)),
                stability_factor(Xs, a, shift, p),
            ),
            run.bwd,
        )
        run.info.setdefault("backward_error", []).append(float(run.bwd["backward_error"][0]))

    @staticmethod
    def _result(run: _SchurRun) -> RawResult:
        """The batch: roots stacked, per-element flags and info as tensors, the residual histories
        aligned (an element that stopped repeats its last residual)."""
        info = run.info
        info["eps_abs"] = torch.tensor(info["eps_abs"], dtype=torch.float64)
        if "backward_error" in info:
            info["backward_error"] = torch.tensor(info["backward_error"], dtype=torch.float64)
        hist = run.hist
        history = [
            torch.tensor([h[i][0] if i < len(h) else h[-1][0] for h in hist], dtype=torch.float64)
            for i in range(max((len(h) for h in hist), default=0))
        ]
        return RawResult(
            root=torch.stack(run.roots),
            converged=torch.tensor(run.conv),
            iterations=torch.tensor(run.iters),
            residual=torch.tensor(run.resid, dtype=torch.float64),
            matmuls=run.matmuls / len(run.roots),
            history=history,
            info=info,
        )
