"""The argument checks that the Shampoo configs share (:class:`~shampoo.errors.InvalidShampooArgumentError`,
a ValueError naming the argument, the value and what is allowed)."""

from __future__ import annotations

import math

from .errors import InvalidShampooArgumentError


def check_beta(b: float, name: str, *, allow_one: bool) -> None:
    hi_ok = b <= 1.0 if allow_one else b < 1.0
    if not (isinstance(b, int | float) and b >= 0.0 and hi_ok):
        raise InvalidShampooArgumentError(name, b, f"in [0, {'1]' if allow_one else '1)'}")


def check_eps(e: float, name: str) -> None:
    if not (isinstance(e, int | float) and math.isfinite(e) and e >= 0.0):
        raise InvalidShampooArgumentError(name, e, "a finite number >= 0")


__all__ = ["check_beta", "check_eps"]
