"""Name -> config-class registry of root solvers."""

from __future__ import annotations

from typing import Any

from ..errors import MatrootsError

_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: register a solver config class under its ``name`` class attribute."""
    name = cls.name  # type: ignore[attr-defined]
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise MatrootsError(f"solver name {name!r} is already registered by {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls
    return cls


def available() -> list[str]:
    """Sorted names of the registered solvers."""
    return sorted(_REGISTRY)


def get(name: str, **options: Any) -> Any:
    """A config object for the solver registered as ``name``, built with ``options``."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise MatrootsError(f"unknown method {name!r}; available: {', '.join(available())}") from None
    try:
        return cls(**options)
    except TypeError as exc:
        raise MatrootsError(f"bad options for method {name!r}: {exc}") from exc
