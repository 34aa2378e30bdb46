"""Errors and warnings raised by the Shampoo optimizer."""

from __future__ import annotations

import pickle

from matroots.core.errors import InvalidArgumentError


class ShampooError(RuntimeError):
    """Base class of errors raised by :class:`shampoo.Shampoo` while stepping or loading state."""


class RootComputationError(ShampooError):
    """A block's inverse-root computation failed too many times in a row (see ``FailurePolicy``)."""


class RootRoundTimeoutError(ShampooError):
    """A background root round (``root_schedule="async"``) was still running after its timeout."""


class StateDictError(ShampooError, ValueError):
    """A state dict does not fit this optimizer (missing parameters, different blocking, ...)."""


class InconsistentPickleError(StateDictError, pickle.UnpicklingError):
    """An unpickled optimizer's stacked state and its per-block views disagree (a view names a stack
    the bucket does not have, lies outside it, or holds other dtype, shape or bits than the stack at
    that place). A :class:`StateDictError` and a :class:`pickle.UnpicklingError`; the message names
    the block, the tensor and what mismatched."""


class InvalidShampooArgumentError(InvalidArgumentError):
    """An argument of Shampoo or of one of its configs has a wrong type or value (a ValueError, as
    matroots' InvalidArgumentError); the message names the argument, the value and what is allowed."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        super().__init__(f"{name} must be {allowed}, got {value!r}")
        self.name, self.value, self.allowed = name, value, allowed


class UnknownOptionError(InvalidArgumentError, TypeError):
    """A keyword that is not an option of :class:`shampoo.Shampoo` (a TypeError, as Python raises for
    an unexpected keyword, and a matroots input error, so the CLI reports it in one line)."""


class NonFiniteGradientWarning(RuntimeWarning):
    """A parameter's gradient (or its computed update) had NaN/Inf entries; its update was skipped."""


class FactorResetWarning(RuntimeWarning):
    """A Kronecker factor's statistics became NaN/Inf (e.g. G G^T overflowed); they were reset to zero."""


class RootFailureWarning(RuntimeWarning):
    """A root computation failed; the previous root (or the fallback solver's) is used instead."""


__all__ = [
    "FactorResetWarning",
    "InconsistentPickleError",
    "InvalidShampooArgumentError",
    "NonFiniteGradientWarning",
    "RootComputationError",
    "RootFailureWarning",
    "RootRoundTimeoutError",
    "ShampooError",
    "StateDictError",
    "UnknownOptionError",
]
