"""The shared solve pipeline: validate, run the method, finalise and report honestly."""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .. import psd as psd_policy
from ..errors import ConvergenceError, ConvergenceWarning
from ..inputs import Problem, all_finite, check_root_range, prepare, scale_by_power_of_two
from ..result import RootResult

log = logging.getLogger("matroots")


@dataclass
class RawResult:
    """What a method returns on the flattened batch (b, n, n); finalised by :class:`SolverConfig`."""

    root: torch.Tensor
    converged: torch.Tensor  # (b,) bool
    iterations: torch.Tensor  # (b,) int64
    residual: torch.Tensor  # (b,) float64
    matmuls: float
    history: list[torch.Tensor] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SolverConfig:
    """Base of the frozen solver configs. Subclasses set ``name`` and implement ``_run``.

    Args:
        psd: rank-deficiency policy, one of :data:`matroots.psd.PSD_POLICIES` ("none", "shift",
            "meta"): which nearby matrix is solved when the input is only positive semidefinite.
            The same definition for every method (:mod:`matroots.psd`); ``solve(psd=...)`` overrides it.
    """

    name: ClassVar[str] = ""
    integer_p: ClassVar[bool] = False
    # True for methods that apply the "meta" psd shift to their own computed eigenvalues (eigh)
    psd_on_eigenvalues: ClassVar[bool] = False
    # True for methods whose root carries autograd to an input that requires grad (eigh)
    differentiable: ClassVar[bool] = False
    psd: str = "none"

    def solve(
        self,
        A: object,
        p: object,
        *,
        eps: float = 0.0,
        eps_mode: str = "absolute",
        dtype: object = None,
        compute_dtype: object = None,
        tol: float | None = None,
        max_iter: int | None = None,
        strict: bool = False,
        record_history: bool = False,
        inverse: bool = True,
        warm_start: object = None,
        psd: str | None = None,
        quiet: bool = False,
    ) -> RootResult:
        """Compute A^{-1/p} (``inverse=True``) or A^{1/p}. See :func:`matroots.inverse_root`.

        ``psd`` overrides the config's rank-deficiency policy (:mod:`matroots.psd`). ``quiet=True``
        reports non-convergence only in the result (``converged``, ``info``) and a DEBUG log line, no
        ConvergenceWarning: for callers that handle the failure themselves (Shampoo's failure policy).
        """
        t0 = time.perf_counter()
        policy = psd_policy.check_policy(self.psd if psd is None else psd)
        prob = prepare(
            A,
            p,
            integer_p=self.integer_p,
            method=self.name,
            eps=eps,
            eps_mode=eps_mode,
            dtype=dtype,
            compute_dtype=compute_dtype,
            tol=tol,
            max_iter=max_iter,
            strict=strict,
            record_history=record_history,
            differentiable=self.differentiable,
            warm_start=warm_start,
        )
        psd_policy.apply(prob, policy, on_eigenvalues=self.psd_on_eigenvalues)
        raw = self._run(prob, inverse=inverse, warm_start=warm_start)
        return self._finalise(prob, raw, inverse=inverse, seconds=time.perf_counter() - t0, quiet=quiet)

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        raise NotImplementedError

    def _finalise(
        self, prob: Problem, raw: RawResult, *, inverse: bool, seconds: float, quiet: bool = False
    ) -> RootResult:
        root = raw.root
        if prob.prescale != 1.0:
            # root of (sA): (sA)^{-1/p} = s^{-1/p} A^{-1/p}; undo with the factor s^e in float64, formed
            # in steps (s^e alone can overflow float64, e.g. s = 2^997 with e = 100 for p = 0.01).
            log2_factor = round(math.log2(prob.prescale)) * (1 / prob.p) * (1 if inverse else -1)  # exact
            check_root_range(root, prob.dtype, log2_factor=log2_factor)  # FormatRangeError, not inf or 0
            root = scale_by_power_of_two(root.double(), log2_factor)
        elif root.dtype != prob.dtype:
            check_root_range(root, prob.dtype)
        root = root.to(prob.dtype)
        if all_finite(root):
            finite = torch.ones(root.shape[0], dtype=torch.bool)
        else:
            finite = torch.isfinite(root).flatten(1).all(-1)
        converged = raw.converged & finite
        info = {**prob.info, **raw.info}
        psd_policy.report(info, root.shape[0])
        if not bool(finite.all()):
            info["non_finite_root"] = int((~finite).sum())
        n_bad = int((~converged).sum())
        if n_bad:
            reasons = info.get("stop_reason")
            msg = (
                f"{self.name}: {n_bad} of {converged.numel()} matrices did not converge "
                f"(stop reasons: {reasons}; non-finite roots: {info.get('non_finite_root', 0)}); "
                "the returned root may be inaccurate. Check res.converged and res.info."
            )
        bs = prob.batch_shape
        out = RootResult(
            root=root.reshape(*bs, prob.n, prob.n),
            converged=converged.reshape(bs) if bs else bool(converged[0]),
            iterations=raw.iterations.reshape(bs) if bs else int(raw.iterations[0]),
            residual=raw.residual.reshape(bs) if bs else float(raw.residual[0]),
            history=[h.reshape(bs) if bs else float(h[0]) for h in raw.history],
            matmuls=float(raw.matmuls),
            seconds=seconds,
            method=self.name,
            dtype=prob.dtype,
            info=info,
        )
        if n_bad:
            if prob.strict:
                raise ConvergenceError(msg, result=out)
            if quiet:
                log.debug(msg)
            else:
                warnings.warn(msg, ConvergenceWarning, stacklevel=3)
                log.warning(msg)
        return out


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
