"""The argument checks that the Shampoo configs share (:class:`~shampoo.errors.InvalidShampooArgumentError`,
a ValueError naming the argument, the value and what is allowed)."""

from __future__ import annotations

from matroots.core import arguments
from matroots.core.errors import InvalidArgumentError

from .errors import InvalidShampooArgumentError


def check_beta(b: float, name: str, *, allow_one: bool) -> None:
    hi_ok = b <= 1.0 if allow_one else b < 1.0
    if not (isinstance(b, int | float) and b >= 0.0 and hi_ok):
        raise InvalidShampooArgumentError(name, b, f"in [0, {'1]' if allow_one else '1)'}")


def check_eps(e: object, name: str) -> float:
    """``e`` as a float: matroots' own rule for eps (:func:`matroots.core.arguments.real`, minimum 0:
    Python, numpy and 0-d torch reals, finite, not a bool), the rule every solve applies to the
    group's eps again (:class:`matroots.SolveOptions`), so a value accepted here is accepted there."""
    try:
        v = arguments.real(name, e, minimum=0.0)
    except InvalidArgumentError:
        raise InvalidShampooArgumentError(
            name, e, "a finite number >= 0 (a real scalar, not a bool)"
        ) from None
    assert v is not None
    return v


__all__ = ["check_beta", "check_eps"]
