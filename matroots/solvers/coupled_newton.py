"""Coupled Newton iteration for the inverse p-th root (Guo & Higham 2006; Higham 2008, eq. 7.18).

Scalings (the choice of c in X_0 = I/c, M_0 = A/c^p):

* ``"frobenius"``: c^p = 2||A||_F/(p+1). Safe for any matrix with spectral radius <= ||A||_F, as the
  spectrum of M_0 then lies in (0, (p+1)/2]; costs extra iterations.
* ``"power"``: c^p = 2 lambda_max/(p+1) with lambda_max from 20 power-iteration steps (symmetric input).
* ``"optimal"``: Guo & Higham's c^p for the spectrum [lambda_min, lambda_max] (eq. 3.11), from Lanczos
  estimates; lambda_max is the top Ritz value plus its residual bound, so M_0 stays in the convergence
  region (0, p+1) (symmetric input). That c minimises the worst eigenvalue after the first step, not the
  total count, so Frobenius's c is taken instead where the scalar model on the Ritz values predicts
  strictly fewer iterations (exact for n <= lanczos_steps): "optimal" never needs more than "frobenius".
* ``"dynamic"``: the optimal start plus a per-step rescaling that tracks the spectral interval of M_k
  (see :mod:`matroots.solvers.newton_core`).
* ``"auto"`` (default): ``"optimal"`` for symmetric input, ``"frobenius"`` otherwise.

Forward roots A^{1/p} (Y_k = X_k^{-1}), and inverse roots with p > 8, use a *capped* start instead: the
spectrum of M_0 stays in (0, beta_p] with f(beta_p) = 1/2 (c^p = lambda_max/beta_p for "optimal"/"auto",
||A||_F / min((p+1)/2, beta_p) for "frobenius"; the dynamic scaling keeps its top below beta_p).
Guo & Higham's start puts lambda_max(M_0) near p+1, where one step makes the largest and the smallest
eigen-directions both small and their rounding errors couple with weight ~kappa: harmless for A^{-1/p}
at small p (cond ~ kappa/p), but the forward root's condition number is only ~kappa^{1-1/p}/p, and that
start made it ~kappa u instead (hilb(10), p = 2, fp64: 1e-5 flagged converged; now 3e-12; details in
:mod:`matroots.solvers.newton_core`). Every forward root is then checked a posteriori: eta =
||Y^p - (A + eps_abs I)||_F / ||A + eps_abs I||_F (float64, ``info["backward_error"]``) above
``stagnation_accept * tol`` marks it not converged (stop reason ``"backward_error"``); Y is the exact
root of a matrix within eta of A, so its error is at most ~cond(A^{1/p}) eta.

The spectral estimates' matrix-vector products are counted in ``matmuls`` (n of them = one GEMM), and so
are the forward root's solves (4/3 each) and its backward-error check. For a batch, ``matmuls`` is per
matrix: the n x n products executed divided by the batch size. Converged elements leave the Newton loop's
active set (:func:`~matroots.solvers.newton_loop.coupled_newton_iterate`), so the loop's share is the
mean of ``info["newton_matmuls"]``, each element's own products, which equal those of its solve alone;
a batch costs b * matmuls, the sum of its elements' costs. An element's root is that of its solve alone
up to perturbations of size u in its start (the batch's common power-of-two prescale, BLAS rounding by
stack alignment), which the iteration propagates like rounding errors: the two differ by at most the
sum of their errors, <= 2 C (1 + cond) u, and by that order where cond is large (fp64, kappa 1e13:
~1e-5; tests/test_coupled_newton_batch_bound.py), not bitwise.

Regularisation: M_0 = (A + eps_abs I)/c^p is formed before rounding to the compute format, so neither the
shift nor c has to fit it (fp16). A relative eps is eps times lambda_max of the rounded matrix: the top
Lanczos Ritz value (symmetric; extended until its residual bound certifies it to 1e-12 relative, so it
is eigh's lambda_max to rounding; the same run serves the scaling) or the largest LAPACK eigenvalue
modulus (general input), see :mod:`matroots.core.regularize`; ``info["eps_abs"]`` is the shift applied (user
units, per element). p so large that 4 p sqrt(n) u >= 1 is refused (UnsupportedExponentError): the
residual M_k - I can then not be resolved and X_0 itself would pass the stopping test.

Warm start (``warm_start=`` a previous RootResult or a previous root tensor, symmetric input): starting
the coupled iteration at X_0 = previous root Z is wrong, because M_k = X_k^p A holds only while X_0
commutes with A; from a non-commuting X_0, M_k -> I while X_k converges to Z (Z^p A)^{-1/p}, which differs
from A^{-1/p} to first order in the commutator [Z, A]. Nor can Newton's iteration with the true residual,
X <- X((p+1)I - A X^p)/p, correct Z for p >= 2: linearised about the root, in the eigenbasis, it multiplies
the (i, j) error entry by 1 - (1 + s + ... + s^{p-1})/p with s = x_j/x_i a ratio of root eigenvalues,
which exceeds 1 in modulus as soon as s > 3 (p = 2), i.e. kappa(A) > 9. So:

* p = 1: the Newton-Schulz iteration X <- X(2I - A X) from X_0 = Z. Its true residual R = I - A X
  squares exactly each step (R_{k+1} = R_k^2) for any X_0, so it converges to A^{-1} whenever
  ||I - A Z||_F < 1/2 (checked first), quadratically from the first step.
* p >= 2 (and p = 1 when Z is not close enough): the spectral interval of A from the previous root
  and the dynamically scaled iteration from X_0 = I/c. X_0 stays a function of A, so the iteration
  converges to the true root; the tight interval removes about half of the linear phase (the
  quadratic phase remains). lambda_max is Lanczos on A with its residual bound (an upper bound).
  The lower end is the previous root's guess, zmax^{-p} (inverse; zmax its largest eigenvalue, Lanczos
  upper estimate) or zmin^p (forward), where that is below the smallest Ritz value of A (an upper
  bound of lambda_min). A guess that is too high only makes the small eigenvalues lag; one far too
  low is wrong in the other way: the dynamic scaling then pushes the whole true spectrum towards p + 1,
  where one step maps it to tiny values of M and the rounding errors couple with the weight of the
  interval's kappa instead of A's (issue 22: a root of a kappa-1e6 matrix as the warm start of a
  kappa-10 one, fp32, p = 4: error 5.1e-4 against the cold 2.8e-7, converged). So the guess is checked
  on the matrix: a Cholesky factorisation of A + (shift - 4 lmin) I in float64 that *fails* shows
  lambda_min < 4 lmin (:data:`WARM_LMIN_FACTOR`; the interval's kappa is then < 4 kappa(A), measured
  error growth <= 3x the exact interval's), and an element whose factorisation succeeds starts cold
  (``info["warm_start_fallback"]``, the indices; bitwise the cold solve when every element falls back).
  If the iteration diverges (an estimate was wrong), it is rerun with Frobenius scaling and ``info``
  says so.

A warm start with NaN or Inf entries is refused (NonFiniteInputError), as is one of the wrong shape
(InvalidArgumentError); on general input a valid warm start is not used. A finite one that overflows the
working format once brought to the pre-scaled units of this matrix (the root of a matrix at a very
different scale) is not used either: the batch starts cold (``info["warm_start_note"]``), so it ends
as the cold solve does (a FormatRangeError where the root is out of range).

The forward root with p = 1 is (A + eps_abs I) itself, returned without iterating (stop reason
``"identity_root"``, as schur_newton).

Failure is never silent: symmetric input that is not positive definite raises NotPositiveDefiniteError
(from the Lanczos estimate when it proves it, after a diverged run by a Cholesky test, or, for an inverse
root that converged although the smallest Ritz value does not exclude lambda_min <= 100 n u_64 lambda_max,
by a float64 Cholesky test: a rounding-level eigenvalue can be "resolved" within max_iter); general input
is checked for eigenvalues on the closed negative real axis (NegativeRealEigenvalueError, from LAPACK's
eigenvalues of the matrix actually solved, with their condition numbers: an eigenvalue whose rounding
uncertainty reaches the axis is decided by the distance sigma_min(A - zI) to a matrix with an eigenvalue
z <= 0, :func:`~matroots.solvers.newton_checks.negative_axis_status`) and, after the run, for convergence to a non-principal root (complex eigenvalues far from
the positive axis can be drawn to another p-th root): the eigenvalues of X_k are the scalar iteration
applied to those of A (:func:`~matroots.solvers.newton_core.scalar_limits`), and a non-principal limit
is reported as ``converged=False`` with stop reason ``"non_principal_root"``.

``info`` holds: ``scaling``, ``c_power`` (c^p used, per element), ``c_choice`` ("optimal"), ``tol``,
``stop_reason`` (per element: tol, stagnation, divergence, max_iter, non_principal_root, backward_error),
``eps_abs`` (and ``eps_lambda_max`` for a relative eps), ``backward_error`` (forward roots),
``solve_dtype`` / ``compute_dtype_note`` (16-bit formats), the Lanczos estimates, ``warm_start`` / ``retried_frobenius`` (indices rerun) when they apply, ``eigvals_calls``
(general input: one LAPACK eigenvalue computation, not counted in ``matmuls``) and
``iteration_seconds`` / ``iteration_cpu_seconds`` (wall / process CPU time of the Newton loop alone),
``newton_matmuls`` (per element: the products its Newton iterations executed). For symmetric input the returned root is
symmetrised, (X + X^T)/2: X_k is a polynomial in A, symmetric in exact arithmetic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..core import arguments, precision
from ..core.errors import (
    FormatRangeError,
    NotSymmetricError,
)
from ..core.inputs import Problem, symmetric_input
from ..core.regularize import working_shift
from ..core.spectral import SpectrumEstimate
from .base import Capabilities, RawResult, SolverConfig
from .coupled_newton_checks import (
    check_principal,
    check_root_sector,
    check_true_residual,
    general_spectrum,
)
from .coupled_newton_domain import check_domain, diagnose_divergence, refuse_indefinite, refuse_negative_real
from .coupled_newton_results import identity_root, merge_rerun
from .coupled_newton_scaling import cold_scaling
from .coupled_newton_warm import (
    WARM_CHECK_MATMULS,
    WARM_LMIN_FACTOR,
    lower_end_holds,
    warm_root,
    warm_scaling,
)
from .newton_core import (
    NewtonOutcome,
    capped_start,
    check_resolvable_exponent,
    forward_backward_check,
    forward_top,
)
from .newton_loop import coupled_newton_iterate, materialise, shifted_fro
from .newton_schulz import newton_schulz_inverse
from .registry import register
from .spd_start import lanczos_lambda_max, shifted_estimate

SCALINGS = ("auto", "frobenius", "power", "optimal", "dynamic")


@dataclass
class _Solve:
    """What one coupled_newton solve carries from phase to phase (:meth:`CoupledNewtonConfig._run`)."""

    prob: Problem
    inverse: bool
    p: int
    cdt: torch.dtype
    A: torch.Tensor
    sym: bool
    scaling: str
    info: dict
    matmuls: float = 0.0
    Z: torch.Tensor | None = None  # the previous root, in this problem's pre-scaled units
    est: SpectrumEstimate | None = None  # Lanczos on A (+ shift I once regularised)
    eigs: np.ndarray | None = None  # general input: LAPACK eigenvalues (+ shift) ...
    kappas: np.ndarray | None = None  # ... and their condition numbers
    shift: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    tol: float = 0.0
    max_iter: int = 0
    accept: float = 0.0
    capped: bool = False
    top: float | None = None
    cp: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    interval: tuple[np.ndarray, np.ndarray] | None = None
    dynamic: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))


@register
@dataclass(frozen=True, kw_only=True)
class CoupledNewtonConfig(SolverConfig):
    """Coupled Newton solver for integer p >= 1.

    Args:
        scaling: one of "auto", "frobenius", "power", "optimal", "dynamic" (see the module docstring).
        lanczos_steps: Lanczos steps for the "optimal"/"dynamic" estimates (capped at n).
        power_iters: power-iteration steps for "power" and for warm starts.
        stagnation_accept: a run stopped by stagnation counts as converged when its residual is at most
            this many times ``tol``.
        symmetry_tol: tolerance of the symmetry test that selects the SPD scalings.
    """

    name = "coupled_newton"
    capabilities = Capabilities(warm_start="root", general_input=True, integer_p=True)
    scaling: str = "auto"
    lanczos_steps: int = 24
    power_iters: int = 20
    stagnation_accept: float = 16.0
    symmetry_tol: float | None = None

    def __post_init__(self) -> None:  # typed InvalidArgumentError for every field (matroots.core.arguments)
        arguments.store(
            self,
            scaling=arguments.choice("scaling", self.scaling, SCALINGS),
            lanczos_steps=arguments.integer("lanczos_steps", self.lanczos_steps, minimum=2),
            power_iters=arguments.integer("power_iters", self.power_iters, minimum=1),
            stagnation_accept=arguments.real(
                "stagnation_accept", self.stagnation_accept, minimum=1.0, what="a multiple of tol"
            ),
            symmetry_tol=arguments.real("symmetry_tol", self.symmetry_tol, minimum=0.0, allow_none=True),
        )

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        """The phases of a solve (module docstring): input and scaling, warm start, spectrum, shift,
        the direct cases, the start, the iteration with its retry, the checks of the result."""
        run = self._setup(prob, inverse)
        self._warm_start(run, warm_start)
        self._spectrum(run)
        self._regularise(run)
        direct = self._direct(run)
        if direct is not None:
            return direct
        self._start(run)
        out = self._iterate(run)
        root = self._verify(run, out)
        run.info.update(stop_reason=out.reason, tol=run.tol, c_power=run.cp / prob.prescale)
        return RawResult(
            root=root,
            converged=out.converged,
            iterations=out.iterations,
            residual=out.residual,
            matmuls=run.matmuls,
            history=out.history,
            info=run.info,
        )

    def _setup(self, prob: Problem, inverse: bool) -> _Solve:
        """The matrix iterated on (symmetrised where the input is symmetric to ``symmetry_tol``, kept in
        the working format, fp32 for the 16-bit ones) and the scaling that applies to it."""
        p = int(prob.p)
        cdt = prob.compute_dtype
        check_resolvable_exponent(p, cdt, prob.n, self.name)
        A_sym, defect = symmetric_input(prob)  # trusted input (SolveOptions.trusted) is used as given
        sym_tol = prob.symmetry_tol(self.symmetry_tol)
        sym = bool((defect <= sym_tol).all())
        # A stays in the working format (fp32 for the 16-bit ones); M_0 = (A + shift I)/c^p is rounded
        # to the compute format inside the iteration, so neither the shift nor c must fit it.
        A = A_sym if sym else prob.A
        if A.dtype not in (torch.float32, torch.float64):
            A = A.float()
        scaling = self.scaling
        if scaling == "auto":
            scaling = "optimal" if sym else "frobenius"
        if scaling != "frobenius" and not sym:
            raise NotSymmetricError(
                f"scaling={scaling!r} needs symmetric input (it estimates lambda_min/lambda_max); "
                "use scaling='frobenius' for general matrices"
            )
        info: dict = {"symmetric": sym}
        if cdt != A.dtype and cdt not in (torch.float32, torch.float64):
            info["compute_dtype_note"] = (
                f"M_0 = (A + eps_abs I)/c^p formed in fp32/fp64 and rounded to {precision.info(cdt).name}"
            )
        return _Solve(prob=prob, inverse=inverse, p=p, cdt=cdt, A=A, sym=sym, scaling=scaling, info=info)

    def _warm_start(self, run: _Solve, warm_start: object) -> None:
        """The previous root in this problem's pre-scaled units (symmetric input only), or None where
        there is none or it overflows the working format there (module docstring, warm start)."""
        if warm_start is None:
            return
        Z = warm_root(warm_start, run.A, run.p, run.prob, run.inverse)
        Z = Z if run.sym else None  # general input: a (valid) warm start is not used
        if Z is not None and not bool(torch.isfinite(Z).all()):
            # the previous root, brought to this problem's pre-scaled units, overflows the working
            # format (a root of a matrix at a very different scale): start cold, bitwise the cold solve
            bad = (~torch.isfinite(Z)).flatten(1).any(-1).nonzero().flatten().tolist()
            run.info["warm_start_note"] = (
                f"the previous root overflows {precision.info(run.A.dtype).name} in this matrix's pre-scaled "
                f"units (batch elements {bad}): the whole batch starts cold"
            )
            Z = None
        run.Z = Z

    def _spectrum(self, run: _Solve) -> None:
        """Spectral estimates of the unshifted matrix: Lanczos on symmetric input where a relative eps
        or a cold "optimal"/"dynamic" scaling needs them (Golub & Van Loan §10.1), LAPACK eigenvalues
        and their condition numbers on general input (Golub & Van Loan §7.2.2)."""
        relative = run.prob.eps > 0 and run.prob.eps_mode == "relative"
        if run.sym and (relative or (run.Z is None and run.scaling in ("optimal", "dynamic"))):
            # a relative eps needs lambda_max itself: Lanczos is extended until its top Ritz value is
            # certified to 1e-12 (residual bound), so the shift is eigh's to ~1e-12 relative
            run.est = lanczos_lambda_max(run.A, self.lanczos_steps, 1e-12 if relative else None)
            run.matmuls += run.est.matvecs / run.prob.n
        if not run.sym:
            run.eigs, run.kappas = general_spectrum(run.A, run.info)

    def _regularise(self, run: _Solve) -> None:
        """The eps shift A + eps_abs I (:mod:`matroots.core.regularize`); "relative" is relative to
        lambda_max of the matrix as rounded to the working format: the certified top Lanczos Ritz value
        (symmetric) or the largest eigenvalue modulus from LAPACK (general input). The shift moves every
        estimate exactly; general input is then refused near the closed negative real axis."""
        prob, b = run.prob, run.A.shape[0]
        shift = torch.zeros(b, dtype=torch.float64)
        if prob.eps > 0:
            if prob.eps_mode == "relative":
                assert run.est is not None or not run.sym
                lam = run.est.lmax if run.sym else torch.as_tensor(np.abs(run.eigs).max(axis=-1))
                run.info["eps_lambda_max"] = lam / prob.prescale
            else:
                lam = torch.zeros(b, dtype=torch.float64)
            shift = working_shift(prob.eps, prob.eps_mode, lam, prob.prescale)
            if not bool(torch.isfinite(shift).all()):
                raise FormatRangeError(
                    f"coupled_newton: the eps shift {float(shift.max()) / prob.prescale:.3e} overflows float64 "
                    "at the working scale; use a smaller eps"
                )
        run.info["eps_abs"] = shift / prob.prescale
        if run.est is not None:
            run.est = shifted_estimate(run.est, shift)
        if run.eigs is not None:
            run.eigs = run.eigs + shift.numpy()[:, None]
            run.eigs = refuse_negative_real(run.A, run.eigs, run.kappas, shift, prob, run.info)
        run.shift = shift
        run.tol = prob.tol if prob.tol is not None else precision.default_tol(run.cdt, prob.n, run.p)
        run.max_iter = prob.max_iter if prob.max_iter is not None else 100
        run.accept = self.stagnation_accept * run.tol

    def _direct(self, run: _Solve) -> RawResult | None:
        """The cases without the coupled iteration: the forward root with p = 1 (the matrix itself),
        and the inverse with p = 1 from a previous inverse by Newton-Schulz, X <- X(2I - A X), whose
        residual I - A X squares each step (Higham 2008, eq. (7.12)), when ||I - A Z||_F < 1/2."""
        if run.p == 1 and not run.inverse:
            return identity_root(run.A, run.shift, run.cdt, run.prob, run.info, run.tol, run.matmuls)
        if run.Z is None or run.p != 1 or not run.inverse:
            return None
        ns = newton_schulz_inverse(
            materialise(run.A, run.shift).to(run.cdt),
            run.Z.to(run.cdt),
            tol=run.tol,
            max_iter=run.max_iter,
            stagnation_accept=run.accept,
            record_history=run.prob.record_history,
        )
        if ns is None:
            run.info["warm_start_note"] = "||I - A Z||_F >= 1/2: previous inverse too far for Newton-Schulz"
            return None
        run.info.update(
            warm_start="newton_schulz from the previous inverse",
            scaling="warm",
            stop_reason=ns.reason,
            tol=run.tol,
        )
        return RawResult(
            root=ns.X,
            converged=ns.converged,
            iterations=ns.iterations,
            residual=ns.residual,
            matmuls=run.matmuls + ns.matmuls,
            history=ns.history,
            info=run.info,
        )

    def _start(self, run: _Solve) -> None:
        """c^p per element and the dynamic scaling's interval: from the previous root where its lower end
        holds (:func:`~matroots.solvers.coupled_newton_warm.warm_scaling`, :func:`~matroots.solvers.coupled_newton_warm.lower_end_holds`), else the cold scaling
        (:func:`~matroots.solvers.coupled_newton_scaling.cold_scaling`; Guo & Higham 2006, eq. (3.11)). Forward roots, and inverse roots with
        p > GH_MAX_P, keep M_0's spectrum in (0, beta_p] (newton_core module docstring)."""
        A, shift, p, info = run.A, run.shift, run.p, run.info
        b = A.shape[0]
        # Forward roots, and inverse roots with p > GH_MAX_P, keep M_k's spectrum in (0, beta_p]
        # (newton_core docstring: the rounding errors of a start near p+1 couple with weight ~kappa).
        run.capped = capped_start(p, run.inverse)
        run.top = forward_top(p) if run.capped else None
        # elements given a spectral interval (dynamic scaling; the Frobenius retry after a divergence)
        dynamic = torch.zeros(b, dtype=torch.bool)
        interval = None
        warm = torch.zeros(b, dtype=torch.bool)
        if run.Z is not None:
            cp_w, interval_w, lmin_w, mv, est_w = warm_scaling(
                A, shift, p, run.Z, run.inverse, self.lanczos_steps
            )
            warm = lower_end_holds(A, shift, lmin_w)
            run.matmuls += mv / run.prob.n + WARM_CHECK_MATMULS
            run.est = run.est if run.est is not None else est_w
            if bool(warm.any()):
                info["warm_start"] = "spectral interval from the previous root + dynamic scaling"
            if not bool(warm.all()):
                info["warm_start_fallback"] = [i for i in range(b) if not bool(warm[i])]
                info["warm_start_note"] = (
                    f"the previous root puts lambda_min more than {WARM_LMIN_FACTOR:g}x below that of this "
                    "matrix (Cholesky test): those elements start cold"
                )
        if not bool(warm.all()):
            cp, interval, mv = cold_scaling(
                A,
                shift,
                run.est,
                run.scaling,
                p,
                run.capped,
                run.tol,
                run.max_iter,
                info,
                run.prob,
                self.power_iters,
            )
            run.matmuls += mv
            if interval is not None:
                dynamic[:] = True
        if bool(warm.any()):
            if bool(warm.all()):
                cp, interval = cp_w, interval_w
            else:
                # cold elements without an interval get (1, 1): never rescaled (s = 1 exactly)
                lo = np.ones(b) if interval is None else np.array(interval[0], dtype=float, copy=True)
                hi = np.ones(b) if interval is None else np.array(interval[1], dtype=float, copy=True)
                wi = warm.numpy()
                lo[wi], hi[wi] = interval_w[0][wi], interval_w[1][wi]
                cp = torch.where(warm, cp_w, cp)
                interval = (lo, hi)
            dynamic |= warm
        if run.est is not None:
            refuse_indefinite(run.est, run.prob)
        info["scaling"] = "warm" if bool(warm.any()) else run.scaling
        run.cp = torch.where(cp > 0, cp, torch.ones_like(cp))
        run.interval, run.dynamic = interval, dynamic

    def _iterate(self, run: _Solve) -> NewtonOutcome:
        """The coupled iteration (Higham 2008, eq. (7.18); :func:`~matroots.solvers.newton_loop.coupled_newton_iterate`),
        and the rerun with the always-safe Frobenius scaling of the elements given a spectral interval
        that diverged (a wrong estimate)."""
        A, shift, p, info = run.A, run.shift, run.p, run.info
        t_loop, c_loop = time.perf_counter(), time.process_time()
        out = coupled_newton_iterate(
            A,
            p,
            run.cp,
            tol=run.tol,
            max_iter=run.max_iter,
            stagnation_accept=run.accept,
            inverse=run.inverse,
            interval=run.interval,
            record_history=run.prob.record_history,
            shift=shift,
            compute_dtype=run.cdt,
            top=run.top,
        )
        # The Newton loop alone, wall and process CPU time (benchmarks)
        info["iteration_seconds"] = time.perf_counter() - t_loop
        info["iteration_cpu_seconds"] = time.process_time() - c_loop
        run.matmuls += out.matmuls
        idx = [i for i, r in enumerate(out.reason) if r == "divergence" and bool(run.dynamic[i])]
        if idx:
            # A wrong spectral estimate: redo those problems with the always-safe Frobenius scaling.
            fwd_fro = min((p + 1) / 2, forward_top(p)) if run.capped else 1.0
            fro = shifted_fro(A[idx], shift[idx])
            cp_f = fro / fwd_fro if run.capped else 2.0 * fro / (p + 1)
            retry = coupled_newton_iterate(
                A[idx],
                p,
                cp_f,
                tol=run.tol,
                max_iter=run.max_iter,
                stagnation_accept=run.accept,
                inverse=run.inverse,
                record_history=run.prob.record_history,
                shift=shift[idx],
                compute_dtype=run.cdt,
                top=run.top,
            )
            run.matmuls += retry.matmuls * len(idx) / A.shape[0]  # per matrix of the whole batch
            info["retried_frobenius"] = idx
            run.cp = run.cp.clone()
            run.cp[idx] = cp_f
            out = merge_rerun(out, retry, idx)
        info.update(out.notes)
        info["newton_matmuls"] = out.matmuls_each
        return out

    def _verify(self, run: _Solve, out: NewtonOutcome) -> torch.Tensor:
        """The checks of the result (module docstring, failure is never silent): a divergence on
        symmetric input proven indefinite, the SPD domain test, the principal branch and true residual
        on general input; the root symmetrised on symmetric input; the forward root's backward error."""
        A, shift, p, info = run.A, run.shift, run.p, run.info
        if run.sym and "divergence" in out.reason:
            diagnose_divergence(A, shift, out, run.prob, self.lanczos_steps)
        if run.sym and run.inverse:
            run.matmuls += check_domain(self.name, A, shift, run.est, out, run.prob, info)
        if run.eigs is not None:
            check_principal(run.eigs, p, run.cp, out, info)
            check_root_sector(out, p, info)
            if run.inverse:
                check_true_residual(out, A, shift, p, precision.unit_roundoff(run.cdt), info)
        # X_k commutes with A only up to rounding; (X + X^T) * 0.5 in one fresh tensor
        root = torch.add(out.X, out.X.mT).mul_(0.5) if run.sym else out.X
        if not run.inverse:
            run.matmuls += forward_backward_check(root, A, shift, p, out, run.accept, info)
        return root
