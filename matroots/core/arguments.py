"""Validation of scalar arguments and config fields: one typed error, one message style, for all.

Every check raises :class:`~matroots.core.errors.InvalidArgumentError` (a :class:`MatrootsInputError`)
whose message names the argument, shows the bad value and says what is allowed. The same rules hold
everywhere (``inverse_root``'s keywords and every solver config's fields):

* numbers: Python ``int``/``float``, numpy scalars (``np.float32(0.1)``, ``np.int64(5)``) and 0-d
  real torch tensors are accepted and converted to ``float``/``int``; ``bool`` is refused (``True`` is
  not a tolerance), and so are strings, complex numbers and arrays with more than one element;
* integers must be integral types (``2.0`` is refused for ``max_iter``: a float count is a mistake);
* flags (``strict``, ``record_history``) must be ``bool`` or ``np.bool_``;
* choices (``eps_mode``, ``scaling``, ``rank_policy``) must be one of the listed strings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .errors import InvalidArgumentError


def _scalar(name: str, value: object, kind: str) -> object:
    """Unwrap numpy scalars and 0-d/1-element torch tensors and arrays; refuse bools and non-numbers."""
    if isinstance(value, bool | np.bool_):
        raise InvalidArgumentError(f"{name} must be {kind}, got the bool {value!r}")
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype.is_complex or value.dtype == torch.bool:
            raise InvalidArgumentError(
                f"{name} must be {kind}, got a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
            )
        if value.device.type == "meta":
            raise InvalidArgumentError(f"{name} must be {kind}, got a meta-device tensor (it has no value)")
        return value.item()
    if isinstance(value, np.ndarray):
        if value.size != 1 or value.dtype.kind not in "iuf":
            raise InvalidArgumentError(
                f"{name} must be {kind}, got an array of shape {value.shape} and dtype {value.dtype}"
            )
        return value.reshape(()).item()
    if isinstance(value, np.integer | np.floating):
        return value.item()
    return value


def real(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    exclusive_minimum: bool = False,
    maximum: float | None = None,
    exclusive_maximum: bool = False,
    allow_none: bool = False,
    what: str = "",
) -> float | None:
    """``value`` as a finite float within the given bounds, or None when ``allow_none``."""
    if value is None and allow_none:
        return None
    if minimum is not None and maximum is not None:
        bounds = f" in {'(' if exclusive_minimum else '['}{minimum:g}, {maximum:g}{')' if exclusive_maximum else ']'}"
    elif minimum is not None:
        bounds = f" {'>' if exclusive_minimum else '>='} {minimum:g}"
    elif maximum is not None:
        bounds = f" {'<' if exclusive_maximum else '<='} {maximum:g}"
    else:
        bounds = ""
    allowed = "a finite real number" + bounds
    allowed += " or None" if allow_none else ""
    allowed += f" ({what})" if what else ""
    v = _scalar(name, value, allowed)
    if not isinstance(v, int | float):
        raise InvalidArgumentError(f"{name} must be {allowed}, got {value!r} of type {type(value).__name__}")
    v = float(v)
    bad = not math.isfinite(v)
    if minimum is not None:
        bad = bad or (v <= minimum if exclusive_minimum else v < minimum)
    if maximum is not None:
        bad = bad or (v >= maximum if exclusive_maximum else v > maximum)
    if bad:
        raise InvalidArgumentError(f"{name} must be {allowed}, got {value!r}")
    return v


def integer(
    name: str, value: object, *, minimum: int | None = None, allow_none: bool = False, what: str = ""
) -> int | None:
    """``value`` as an int >= ``minimum`` (integral types only), or None when ``allow_none``."""
    if value is None and allow_none:
        return None
    allowed = (
        "an int" + (f" >= {minimum}" if minimum is not None else "") + (" or None" if allow_none else "")
    )
    allowed += f" ({what})" if what else ""
    v = _scalar(name, value, allowed)
    if not isinstance(v, int):
        raise InvalidArgumentError(f"{name} must be {allowed}, got {value!r} of type {type(value).__name__}")
    if minimum is not None and v < minimum:
        raise InvalidArgumentError(f"{name} must be {allowed}, got {value!r}")
    return int(v)


def flag(name: str, value: object) -> bool:
    """``value`` as a bool; only ``bool`` and ``np.bool_`` are accepted."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidArgumentError(
            f"{name} must be True or False, got {value!r} of type {type(value).__name__}"
        )
    return bool(value)


def choice(name: str, value: object, options: Sequence[str]) -> str:
    """``value`` as one of the strings ``options``."""
    if not isinstance(value, str) or value not in options:
        raise InvalidArgumentError(f"{name} must be one of {tuple(options)}, got {value!r}")
    return str(value)


def store(obj: object, **values: object) -> None:
    """Set validated (converted) values on a frozen dataclass, from its ``__post_init__``."""
    for key, value in values.items():
        object.__setattr__(obj, key, value)


__all__ = ["choice", "flag", "integer", "real", "store"]
