"""The shared solve pipeline: validate, run the method, finalise and report honestly."""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..core import precision
from ..core import psd as psd_policy
from ..core.errors import ConvergenceError, ConvergenceWarning, FormatRangeError, InvalidArgumentError
from ..core.inputs import Problem, all_finite, check_root_range, prepare, rescale_root
from ..core.options import SolveOptions
from ..core.result import RootResult

log = logging.getLogger("matroots")


@dataclass
class RawResult:
    """What a method returns on the flattened batch (b, n, n); finalised by :class:`SolverConfig`."""

    root: torch.Tensor
    converged: torch.Tensor | None  # (b,) bool; None: every element converged (a direct method)
    # None for a direct method (eigh): 0 iterations and no residual (NaN), built by _finalise only for
    # a batched result (a single matrix's are Python numbers: no tensor to build and read back)
    iterations: torch.Tensor | None  # (b,) int64
    residual: torch.Tensor | None  # (b,) float64
    matmuls: float
    history: list[torch.Tensor] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    # (b,) bool: where the method returned the root of a prescaled problem already in the caller's
    # units (None: nowhere; _finalise rescales the other elements)
    in_caller_units: torch.Tensor | None = None
    # True: the method proved every root finite (False or None: _finalise tests the root)
    finite: bool | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a solver method can do, declared by its config class (``capabilities``), never inferred
    from its name or from the ``info`` keys it writes.

    Args:
        warm_start: what a ``warm_start=`` must carry for the method to use it: ``"root"`` (a previous
            root or RootResult, coupled Newton), ``"eigenbasis"`` (a previous RootResult with its
            eigenvectors, eigh_warm), or None (ignored).
        forward_root: computes A^{1/p} (``inverse=False``, :func:`matroots.root`) as well as A^{-1/p}.
        general_input: accepts non-symmetric matrices (no eigenvalue on the closed negative real axis);
            False: symmetric (SPD/PSD) input only.
        batched: solves a (..., n, n) batch as one stacked computation (not a Python loop).
        integer_p: needs an integer p >= 1 (Newton methods); False: rational p > 0.
        differentiable: the root carries autograd to an input that requires grad.
    """

    warm_start: str | None = None
    forward_root: bool = True
    general_input: bool = False
    batched: bool = True
    integer_p: bool = False
    differentiable: bool = False

    def __post_init__(self) -> None:
        if self.warm_start not in (None, "root", "eigenbasis"):
            raise ValueError(
                f"Capabilities.warm_start must be None, 'root' or 'eigenbasis', got {self.warm_start!r}"
            )


@dataclass(frozen=True, kw_only=True)
class SolverConfig:
    """Base of the frozen solver configs. Subclasses set ``name`` and implement ``_run``.

    Args:
        psd: rank-deficiency policy, one of :data:`matroots.core.psd.PSD_POLICIES` ("none", "shift",
            "meta"): which nearby matrix is solved when the input is only positive semidefinite.
            The same definition for every method (:mod:`matroots.core.psd`); ``solve(psd=...)`` overrides it.
    """

    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    # the psd policies a method decides and applies on its own computed eigenvalues (eigh: both)
    psd_on_eigenvalues: ClassVar[frozenset[str]] = frozenset()
    # True: the method judges each root's range from the root's own eigenvalues (eigh), where it also
    # knows which zeros its rank policy put there; False: _finalise judges it from the root's entries
    range_on_eigenvalues: ClassVar[bool] = False
    psd: str = "none"

    def solve(self, A: object, p: object, options: SolveOptions | None = None, **kwargs: Any) -> RootResult:
        """Compute A^{-1/p} (``inverse=True``) or A^{1/p}. See :func:`matroots.inverse_root`.

        ``options`` (a :class:`matroots.SolveOptions`) and/or its fields as keywords (``eps=``,
        ``dtype=``, ``tol=``, ``inverse=``, ``warm_start=``, ``psd=``, ``quiet=``, ...; keywords override
        ``options``). ``psd`` overrides the config's rank-deficiency policy (:mod:`matroots.core.psd`).
        ``quiet=True`` reports non-convergence only in the result (``converged``, ``info``) and a DEBUG
        log line, no ConvergenceWarning: for callers that handle the failure themselves (Shampoo).
        """
        t0 = time.perf_counter()
        return self._solve(A, p, SolveOptions.build(options, **kwargs), t0)

    def _solve(self, A: object, p: object, opts: SolveOptions, t0: float) -> RootResult:
        """The template every method runs: :meth:`_prepare` -> :meth:`_run` -> :meth:`_finalise`
        (``t0``: when the call began, for ``seconds``)."""
        prob = self._prepare(A, p, opts)
        raw = self._run(prob, inverse=opts.inverse, warm_start=opts.warm_start)
        return self._finalise(
            prob, raw, inverse=opts.inverse, seconds=time.perf_counter() - t0, quiet=opts.quiet
        )

    def _prepare(self, A: object, p: object, opts: SolveOptions) -> Problem:
        """The problem the method solves: the call checked against the method's capabilities, the
        input validated, rounded and prescaled (:func:`matroots.core.inputs.prepare`), and the
        rank-deficiency policy applied (:mod:`matroots.core.psd`)."""
        if not opts.inverse and not self.capabilities.forward_root:
            raise InvalidArgumentError(
                f"method {self.name!r} computes inverse roots only (inverse=False given)"
            )
        policy = psd_policy.check_policy(self.psd if opts.psd is None else opts.psd)
        prob = prepare(
            A,
            p,
            integer_p=self.capabilities.integer_p,
            method=self.name,
            options=opts,
            differentiable=self.capabilities.differentiable,
        )
        psd_policy.apply(prob, policy, on_eigenvalues=policy in self.psd_on_eigenvalues)
        return prob

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        """The method itself, on the flattened batch of the prepared problem."""
        raise NotImplementedError

    def _finalise(
        self, prob: Problem, raw: RawResult, *, inverse: bool, seconds: float, quiet: bool = False
    ) -> RootResult:
        """The result in the caller's units and format: the prescale undone, the range checked, a
        non-finite root marked not converged (so ``converged`` promises a finite root for every
        method), the batch shape restored, non-convergence reported."""
        root = raw.root
        done = raw.in_caller_units
        if prob.prescale != 1.0 and (done is None or not bool(done.all())):
            # root of (sA): (sA)^{-1/p} = s^{-1/p} A^{-1/p}; undo with the factor s^e in float64, formed
            # in steps (s^e alone can overflow float64, e.g. s = 2^997 with e = 100 for p = 0.01).
            log2_factor = prob.root_log2_scale(inverse)  # exact
            # FormatRangeError, not inf or 0; then the exact rescaling, rounded to prob.dtype
            if done is None or not bool(done.any()):
                root = rescale_root(root, prob.dtype, log2_factor)
            else:  # only the elements the method left prescaled (it kept prob.dtype)
                rows = (~done).nonzero().flatten().to(root.device)
                fixed = rescale_root(root.index_select(0, rows), prob.dtype, log2_factor)
                root = root.index_copy(0, rows, fixed)  # not in place: raw.root need not be owned
        elif root.dtype != prob.dtype:
            check_root_range(root, prob.dtype)
        if root.dtype != prob.dtype:  # a no-op conversion is skipped (each call costs its dispatch)
            root = root.to(prob.dtype)
        amax = None
        every_finite = False  # known without another look: every root finite
        finite: torch.Tensor | None = None  # (b,) bool, where not every root is known finite
        if self.range_on_eigenvalues and raw.finite:
            every_finite = True
        elif self.range_on_eigenvalues:
            if all_finite(root):
                every_finite = True
            else:
                finite = torch.isfinite(root).flatten(1).all(-1)
        else:  # max|X| per matrix: the finiteness test (NaN and inf propagate) and the range check
            amax = root.detach().abs().flatten(1).amax(-1).double().cpu()
            finite = torch.isfinite(amax)
        b, bs = root.shape[0], prob.batch_shape
        converged = raw.converged
        if converged is None and (bs or not every_finite):  # a tensor is returned, or read with finite
            converged = torch.ones(b, dtype=torch.bool)
        if not every_finite:
            converged = converged & finite
        info = {**prob.info, **raw.info}
        psd_policy.report(info, root.shape[0])
        if amax is not None:
            check_root_range(root, prob.dtype, amax=amax)
            _check_zero_roots(self.name, prob, amax, info, inverse=inverse)
        if not every_finite and not bool(finite.all()):
            info["non_finite_root"] = int((~finite).sum())
        # one read serves the count and a single matrix's flag (None: every element converged)
        flags = [True] * b if converged is None else converged.tolist()
        n_bad = flags.count(False)
        if n_bad:
            reasons = info.get("stop_reason")
            msg = (
                f"{self.name}: {n_bad} of {b} matrices did not converge "
                f"(stop reasons: {reasons}; non-finite roots: {info.get('non_finite_root', 0)}); "
                "the returned root may be inaccurate. Check res.converged and res.info."
            )
        its, res = raw.iterations, raw.residual
        if bs:  # per-element tensors (a direct method's built here)
            its = (torch.zeros(b, dtype=torch.int64) if its is None else its).reshape(bs)
            res = (torch.full((b,), math.nan, dtype=torch.float64) if res is None else res).reshape(bs)
        else:  # a single matrix: Python numbers, one read each
            its = 0 if its is None else int(its.tolist()[0])
            res = math.nan if res is None else float(res.tolist()[0])
        out = RootResult(
            root=root.reshape(*bs, prob.n, prob.n),
            converged=converged.reshape(bs) if bs else bool(flags[0]),  # one read each
            iterations=its,
            residual=res,
            history=[h.reshape(bs) if bs else float(h[0]) for h in raw.history],
            matmuls=float(raw.matmuls),
            seconds=seconds,
            method=self.name,
            dtype=prob.dtype,
            info=info,
            finite_checked=True,
        )
        if n_bad:
            if prob.strict:
                raise ConvergenceError(msg, result=out)
            if quiet:
                log.debug(msg)
            else:
                warnings.warn(msg, ConvergenceWarning, stacklevel=4)  # the caller of solve()
                log.warning(msg)
        return out


def _check_zero_roots(name: str, prob: Problem, amax: torch.Tensor, info: dict, *, inverse: bool) -> None:
    """FormatRangeError where a root came out exactly 0 although the matrix solved is not 0.

    A p-th root X of M (X^p = M) is 0 only when M is: the forward root of a zero matrix with no shift.
    A zero root of any other matrix is an underflow to 0 (the same rule as eigh's root eigenvalues,
    :func:`~matroots.solvers.eigh._check_root_spectrum`), which :func:`check_root_range` cannot tell
    from a legitimate zero by the entries alone (e.g. the fp16 forward root of A + 1e-16 I with A = 0,
    in a batch whose other matrix sets the scale, is 0 and would read converged). ``amax``: the (b,)
    max|root| per matrix; ``info["regularisation_abs"]``: the whole shift of the matrix solved.
    """
    zero = (amax == 0).nonzero().flatten()
    if zero.numel() == 0:
        return
    if not inverse:
        shift = info.get("regularisation_abs")
        shifted = (
            torch.zeros(zero.numel(), dtype=torch.bool)
            if shift is None
            else (torch.as_tensor(shift).double().reshape(-1).expand(amax.numel())[zero] != 0)
        )
        nonzero_a = prob.A.index_select(0, zero.to(prob.A.device)).flatten(1).ne(0).any(-1).cpu()
        zero = zero[shifted | nonzero_a]
        if zero.numel() == 0:
            return
    fmt = precision.info(prob.dtype)
    raise FormatRangeError(
        f"{name}: the root of {zero.numel()} of {amax.numel()} matrices (batch positions "
        f"{zero.tolist()[:8]}) came out exactly 0, but the matrix solved is not 0, so its root is not: "
        f"its entries underflowed {fmt.name} (smallest normal {fmt.tiny:.3e}); use a wider dtype"
    )


def matmul_count_power(p: int) -> int:
    """Products used by :func:`matrix_power` (binary powering) for exponent p >= 1."""
    return max(p.bit_length() - 1 + bin(p).count("1") - 1, 0)


def matrix_power(T: torch.Tensor, p: int) -> torch.Tensor:
    """T^p for integer p >= 1 by binary powering (floor(log2 p) squarings + popcount(p) - 1 products)."""
    result: torch.Tensor | None = None
    base = T
    while True:
        if p & 1:
            result = base if result is None else result @ base
        p >>= 1
        if not p:
            break
        base = base @ base
    assert result is not None
    return result


def eye_like(A: torch.Tensor) -> torch.Tensor:
    """Identity of A's trailing size, dtype and device, broadcastable over the batch."""
    return torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
