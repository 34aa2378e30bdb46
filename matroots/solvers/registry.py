"""Name -> config-class registry of root solvers."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ..core.errors import InvalidArgumentError, MatrootsError

_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: register a solver config class under its ``name`` class attribute."""
    name = cls.name  # type: ignore[attr-defined]
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise MatrootsError(f"solver name {name!r} is already registered by {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls
    return cls


@functools.cache
def _default(cls: type) -> Any:
    """The default config of a solver class (frozen: one instance serves every call)."""
    return cls()


def available() -> list[str]:
    """Sorted names of the registered solvers."""
    return sorted(_REGISTRY)


def get(name: str, **options: Any) -> Any:
    """A config object for the solver registered as ``name``, built with ``options``."""
    if not isinstance(name, str):
        raise InvalidArgumentError(
            f"method must be a registry name or a solver config, got {type(name).__name__}"
        )
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown method {name!r}; available: {', '.join(available())} (or pass a solver config object)"
        ) from None
    if not options:
        return _default(cls)
    try:
        return cls(**options)
    except TypeError as exc:
        from ..core.options import SolveOptions

        raise InvalidArgumentError(
            f"bad options for method {name!r}: {exc}; its options are {field_names(cls)}; "
            f"the solve options are {', '.join(SolveOptions.names())}"
        ) from exc


def field_names(cls: type) -> list[str]:
    """The config fields a solver accepts as options."""
    if not dataclasses.is_dataclass(cls):
        return []
    return sorted(f.name for f in dataclasses.fields(cls) if f.init)  # ClassVars are not options
