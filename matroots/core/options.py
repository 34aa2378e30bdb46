"""The solve options: one frozen definition of every per-call argument of a root solve.

:class:`SolveOptions` is the single source of the keywords that :func:`matroots.inverse_root`,
:func:`matroots.root` and every ``SolverConfig.solve`` accept besides the matrix and the exponent
(method options are fields of the solver's config instead). Each field is validated once, in
``__post_init__``, with the rules of :mod:`matroots.core.arguments`; :func:`matroots.core.inputs.prepare` reads the
validated object. ``SolveOptions.build(options, **kwargs)`` turns keywords (and an optional base object)
into one, refusing unknown names with the list of allowed ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import arguments, precision
from .errors import InvalidArgumentError
from .psd import check_policy
from .regularize import EPS_MODES  # the eps modes every solver accepts (docs/design.md §3)
from .result import RootResult


def check_warm_start(warm_start: object, shape: tuple[int, ...] | None = None) -> None:
    """Refuse a warm start that is not None, a RootResult, a torch tensor or a float numpy array, or
    (given the input's ``shape``) whose root does not hold one n x n matrix per input matrix."""
    if warm_start is None:
        return
    root = warm_start
    if isinstance(warm_start, RootResult) and isinstance(warm_start.root, torch.Tensor):
        root = warm_start.root
    ok = isinstance(root, torch.Tensor) or (isinstance(root, np.ndarray) and root.dtype.kind == "f")
    if not ok:
        raise InvalidArgumentError(
            f"warm_start must be None, a previous RootResult, or its root as a torch tensor or float numpy "
            f"array; got {type(warm_start).__name__}"
        )
    rs = tuple(root.shape)
    if shape is not None and (rs[-2:] != tuple(shape[-2:]) or math.prod(rs) != math.prod(shape)):
        raise InvalidArgumentError(
            f"warm_start root has shape {rs}, but the input has shape {tuple(shape)}; pass the previous "
            "result for the same (batch of) matrices"
        )


def check_kappa_hint(kappa_hint: object) -> None:
    """Refuse a ``kappa_hint`` that is not None, a real number, or a sequence, tensor or array of them
    (its entries and their count are checked by the auto solver, which knows the batch)."""
    ok = kappa_hint is None or isinstance(kappa_hint, torch.Tensor | np.ndarray | list | tuple)
    ok = ok or (
        isinstance(kappa_hint, int | float | np.integer | np.floating) and not isinstance(kappa_hint, bool)
    )
    if not ok:
        raise InvalidArgumentError(
            "kappa_hint must be None or a condition number >= 1 per matrix (a real, or one per matrix; "
            f"nan or inf for unknown), got {kappa_hint!r}"
        )


@dataclass(frozen=True, kw_only=True)
class SolveOptions:
    """Per-call options of a root solve (see :func:`matroots.inverse_root` for their meaning).

    Args:
        eps, eps_mode: regularisation A + eps_abs I, eps_abs = eps ("absolute") or eps lambda_max
            ("relative"); eps >= 0.
        dtype: working precision (a torch dtype or a name such as "bf16"); None: the input's dtype.
        compute_dtype: precision of the arithmetic when it differs from ``dtype``; None: ``dtype``.
        tol: Newton stopping tolerance on ||M_k - I||_F in (0, 1); None: 4 p sqrt(n) u.
        max_iter: iteration cap, an int >= 1; None: the method's default.
        strict: raise ConvergenceError instead of warning on non-convergence.
        record_history: keep the per-iteration residuals in ``result.history``.
        inverse: A^{-1/p} (True) or the forward root A^{1/p} (False; :func:`matroots.root`).
        warm_start: a previous RootResult or root, for methods that declare ``warm_start`` support.
        psd: override of the config's rank-deficiency policy (:mod:`matroots.core.psd`); None keeps it.
        quiet: report non-convergence only in the result and a DEBUG log line, no ConvergenceWarning
            (for callers that handle failures themselves, e.g. Shampoo's failure policy), instead of
            a warnings filter around the call.
        trusted: the caller guarantees that ``A`` is a torch tensor of shape (..., n, n), n >= 1, in a
            supported float format, with finite entries and **exactly** symmetric (``A == A.mT``
            bitwise), as Shampoo's own factors are (their upper triangle is the statistic and
            :func:`shampoo.state.mirror_upper_` mirrors it bitwise). The solver then skips the
            re-validation such input cannot fail: the symmetry test and symmetrisation (the matrix is
            used as given), and the finiteness scans whose outcome is implied by the max|A| pass that
            prescaling needs anyway. A non-finite input still raises NonFiniteInputError (from that
            pass, at no cost); a non-symmetric one is **not** detected and is solved as the method
            reads it (eigh: its lower triangle, as ``torch.linalg.eigh``; the Newton methods: the
            matrix itself, with the symmetric-input scaling). Never skipped: argument validation of
            this object, the exponent and shape checks, the psd policy, and every check of the
            result (a non-finite root is reported as not converged, range checks raise
            FormatRangeError, convergence flags are the method's own). For exactly symmetric finite
            input the result is bitwise the same as with ``trusted=False``. Default False: a user
            calling matroots directly gets full validation.
        kappa_hint: per-matrix estimates of kappa(A + eps I) for ``method="auto"`` (a real number or
            one per matrix; nan or inf: unknown), used instead of its own estimate (Shampoo passes the
            previous round's); checked by the auto solver, which knows the batch size; the other
            methods ignore it.
    """

    eps: float = 0.0
    eps_mode: str = "absolute"
    dtype: torch.dtype | None = None
    compute_dtype: torch.dtype | None = None
    tol: float | None = None
    max_iter: int | None = None
    strict: bool = False
    record_history: bool = False
    inverse: bool = True
    warm_start: Any = field(default=None, compare=False)
    psd: str | None = None
    quiet: bool = False
    trusted: bool = False
    kappa_hint: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        arguments.store(
            self,
            eps=arguments.real("eps", self.eps, minimum=0.0, what="the regularisation shift"),
            eps_mode=arguments.choice("eps_mode", self.eps_mode, EPS_MODES),
            dtype=precision.as_dtype(self.dtype) if self.dtype is not None else None,
            compute_dtype=precision.as_dtype(self.compute_dtype) if self.compute_dtype is not None else None,
            tol=arguments.real(
                "tol",
                self.tol,
                minimum=0.0,
                exclusive_minimum=True,
                maximum=1.0,
                exclusive_maximum=True,
                allow_none=True,
                what="a bound on the Newton residual ||M_k - I||_F; None means 4 p sqrt(n) u",
            ),
            max_iter=arguments.integer("max_iter", self.max_iter, minimum=1, allow_none=True),
            strict=arguments.flag("strict", self.strict),
            record_history=arguments.flag("record_history", self.record_history),
            inverse=arguments.flag("inverse", self.inverse),
            psd=check_policy(self.psd) if self.psd is not None else None,
            quiet=arguments.flag("quiet", self.quiet),
            trusted=arguments.flag("trusted", self.trusted),
        )
        check_warm_start(self.warm_start)
        check_kappa_hint(self.kappa_hint)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in definition order."""
        return _field_names(cls)

    @classmethod
    def build(cls, options: SolveOptions | None = None, /, **kwargs: Any) -> SolveOptions:
        """``options`` (default: all defaults) with ``kwargs`` overriding its fields, validated.

        Raises InvalidArgumentError for a name that is not an option (with the closest match).
        """
        if options is not None and not isinstance(options, SolveOptions):
            raise InvalidArgumentError(f"options must be a matroots.SolveOptions or None, got {options!r}")
        unknown = [k for k in kwargs if k not in cls.names()]
        if unknown:
            close = difflib.get_close_matches(unknown[0], cls.names(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidArgumentError(
                f"unknown solve option {unknown[0]!r}{hint}; the options are {', '.join(cls.names())}"
            )
        if options is None:
            return cls(**kwargs) if kwargs else _defaults(cls)
        return dataclasses.replace(options, **kwargs) if kwargs else options

    def with_warm_start(self, warm_start: Any = None, psd: str | None = None) -> SolveOptions:
        """This object with ``warm_start`` (and ``psd``, when given) replaced, without validating the
        other fields again: they were validated when this object was built, so only the two new values
        are checked (the same rules as ``__post_init__``). ``dataclasses.replace`` would validate all
        of them again (``method="auto"`` hands its chosen solver such a copy on every call)."""
        check_warm_start(warm_start)
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        object.__setattr__(new, "warm_start", warm_start)
        if psd is not None:
            object.__setattr__(new, "psd", check_policy(psd))
        return new

    def trusting(self) -> SolveOptions:
        """This object with ``trusted=True``, the other fields not validated again (as
        :meth:`with_warm_start`): for a caller that has itself proved the input finite and exactly
        symmetric (``method="auto"``), so that the solver does not repeat that test."""
        if self.trusted:
            return self
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        object.__setattr__(new, "trusted", True)
        return new

    def changed(self) -> dict[str, Any]:
        """The fields that differ from their defaults, as keywords (for a call that takes keywords)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not f.default and not (f.compare and value == f.default):
                out[f.name] = value
        return out

    @classmethod
    def split(cls, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``kwargs`` split into (solve options, the rest: fields of a solver config)."""
        names = _field_set(cls)
        return {k: v for k, v in kwargs.items() if k in names}, {
            k: v for k, v in kwargs.items() if k not in names
        }


# Per-call constants of a solve, computed once (the options are frozen, so one default instance serves
# every call that passes none).
@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _field_set(cls: type) -> frozenset[str]:
    return frozenset(_field_names(cls))


@functools.cache
def _defaults(cls: type) -> SolveOptions:
    return cls()


__all__ = ["SolveOptions"]
