"""The argument checks that the Shampoo configs share (ValueError with the name, the value and what
is allowed)."""

from __future__ import annotations

import math


def check_beta(b: float, name: str, *, allow_one: bool) -> None:
    hi_ok = b <= 1.0 if allow_one else b < 1.0
    if not (isinstance(b, int | float) and b >= 0.0 and hi_ok):
        raise ValueError(f"{name} must be in [0, {'1]' if allow_one else '1)'}, got {b!r}")


def check_eps(e: float, name: str) -> None:
    if not (isinstance(e, int | float) and math.isfinite(e) and e >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {e!r}")


__all__ = ["check_beta", "check_eps"]
