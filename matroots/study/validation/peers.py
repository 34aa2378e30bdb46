"""Other packages' Shampoo-family optimizers, built for a validation unit through the same harness.

* ``heavyball_soap``: heavyball's ``SOAP`` (the ``peers`` extra: ``pip install -e '.[peers]'``), eager
  (its torch.compile path off, as every optimizer here runs eagerly), blocks of at most 256;
* ``meta_shampoo``: Meta's ``distributed_shampoo.DistributedShampoo`` (facebookresearch/optimizers; not
  on PyPI: install it from its repository), Adam grafting, blocks of at most 256, its default eigh
  roots with ``epsilon=1e-12``.

A peer whose package does not import raises :class:`PeerUnavailableError`; the unit records it as the
failure ``"Unavailable"`` and the report lists the peer as absent (never dropped silently). A peer that
gives up on the numbers mid-run raises its own exception type (Meta's ``PreconditionerValueError`` on a
non-finite factor, what our Shampoo reports as ``RootComputationError``): :func:`gives_up` names those
types, and the unit records them as its outcome (a failed trial), like a diverged loss. Anything else a
peer raises is a bug of the harness or of the peer, and stops the run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...core.errors import MatrootsError


class PeerUnavailableError(MatrootsError):
    """A peer optimizer's package is not installed (or lacks the class)."""


@dataclass(frozen=True)
class Peer:
    name: str
    module: str
    cls: str
    install: str
    build: Callable[[Any, Any, torch.nn.Module, float, dict[str, Any], int], torch.optim.Optimizer]
    # (module, class) of the exceptions with which the peer reports a numerical failure of its own
    gives_up: tuple[tuple[str, str], ...] = ()


def _heavyball_soap(
    mod: Any, cls: Any, model: torch.nn.Module, lr: float, o: dict[str, Any], freq: int
) -> Any:
    mod.utils.compile_mode = None  # eager, like every other optimizer of the harness
    if hasattr(mod.utils, "compile_mode_recommended_to_none"):
        mod.utils.compile_mode_recommended_to_none = None
    betas = tuple(o.get("betas", (0.9, 0.999)))
    return cls(model.parameters(), lr=lr, betas=betas, shampoo_beta=betas[1], eps=1e-8,
               weight_decay=o.get("weight_decay", 0.0), precondition_frequency=freq,
               use_precond_schedule=False, max_precond_dim=256, split=True)  # fmt: skip


def _meta_shampoo(mod: Any, cls: Any, model: torch.nn.Module, lr: float, o: dict[str, Any], freq: int) -> Any:
    betas = tuple(o.get("betas", (0.9, 0.999)))
    graft = getattr(mod, "AdamPreconditionerConfig", None) or mod.AdamGraftingConfig
    return cls(model.parameters(), lr=lr, betas=betas, epsilon=1e-12, weight_decay=o.get("weight_decay", 0.0),
               max_preconditioner_dim=256, precondition_frequency=freq, start_preconditioning_step=freq,
               grafting_config=graft(beta2=betas[1], epsilon=1e-8))  # fmt: skip


_HEAVYBALL = Peer("heavyball_soap", "heavyball", "SOAP", "pip install -e '.[peers]'", _heavyball_soap)
_META = Peer(
    "meta_shampoo",
    "distributed_shampoo",
    "DistributedShampoo",
    "install facebookresearch/optimizers from its repository (not on PyPI)",
    _meta_shampoo,
    gives_up=(("distributed_shampoo.shampoo_types", "PreconditionerValueError"),),
)
PEERS: dict[str, Peer] = {p.name: p for p in (_HEAVYBALL, _META)}


def load(name: str, importer: Callable[[str], Any] = importlib.import_module) -> tuple[Any, Any]:
    """(module, optimizer class) of peer ``name``; :class:`PeerUnavailableError` when absent."""
    p = PEERS[name]
    try:
        mod = importer(p.module)
        return mod, getattr(mod, p.cls)
    except (ImportError, AttributeError) as exc:
        raise PeerUnavailableError(f"{p.module}.{p.cls} is not installed ({exc}); {p.install}") from None


def available(name: str) -> bool:
    try:
        load(name)
    except PeerUnavailableError:
        return False
    return True


def gives_up(name: str, importer: Callable[[str], Any] = importlib.import_module) -> tuple[type, ...]:
    """The exception types with which peer ``name`` reports a numerical failure (see the module
    docstring); a type its installed version lacks is an error (the list would be silently stale)."""
    try:
        return tuple(getattr(importer(m), c) for m, c in PEERS[name].gives_up)
    except (ImportError, AttributeError) as exc:
        raise PeerUnavailableError(f"peer {name!r}: its failure type is missing ({exc})") from None


def make_peer(name: str, model: torch.nn.Module, lr: float, options: dict[str, Any], frequency: int) -> Any:
    mod, cls = load(name)
    return PEERS[name].build(mod, cls, model, lr, dict(options), int(frequency))


__all__ = ["PEERS", "Peer", "PeerUnavailableError", "available", "gives_up", "load", "make_peer"]
