"""The argument checks of :class:`shampoo.Shampoo` itself: unknown keywords, torch.optim's
implementation flags, the optimizer-wide settings and a param group's parameters. The
hyperparameters' own rules are :class:`shampoo.config.GroupOptions`'s; the rules the configs share
are in :mod:`shampoo.checks`.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .config import DiagnosticsConfig
from .distributed import DDPConfig
from .errors import InvalidShampooArgumentError, UnknownOptionError
from .fsdp import FSDPConfig

#: torch.optim implementation flags and the values Shampoo accepts (see :class:`Shampoo`).
IMPL_FLAGS = ("foreach", "fused", "capturable", "differentiable")


def unknown_option_error(name: str, init: Callable[..., Any]) -> UnknownOptionError:
    """The error for a keyword ``name`` that ``init`` does not take, with the closest option."""
    options = [
        p.name
        for p in inspect.signature(init).parameters.values()
        if p.kind is p.KEYWORD_ONLY
        or (p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in ("self", "params"))
    ]
    close = difflib.get_close_matches(name, options, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return UnknownOptionError(
        f"Shampoo got an unknown option {name!r}{hint}; the options are {', '.join(options)}"
    )


def check_impl_flags(
    *, foreach: Any = None, fused: Any = None, capturable: Any = False, differentiable: Any = False
) -> None:
    if foreach is not None and foreach is not True:
        raise ValueError(
            f"foreach={foreach!r}: Shampoo always uses the torch._foreach_* kernels; pass None or True"
        )
    why = {
        "fused": "there is no fused Shampoo kernel",
        "capturable": "CUDA-graph capture is not supported (the root failure policy syncs with the host)",
        "differentiable": "the step runs under torch.no_grad and the root solvers are not traced",
    }
    for name, value in (("fused", fused), ("capturable", capturable), ("differentiable", differentiable)):
        if value not in (None, False):
            raise ValueError(f"{name}={value!r} is not supported by Shampoo: {why[name]}; pass False")


def check_distributed(distributed: Any) -> None:
    if distributed is not None and not isinstance(distributed, DDPConfig | FSDPConfig):
        raise InvalidShampooArgumentError(
            "distributed", distributed, "a shampoo.DDPConfig, a shampoo.FSDPConfig or None"
        )


def check_diagnostics(diagnostics: Any) -> DiagnosticsConfig:
    """The optimizer's diagnostics config (None: the defaults)."""
    diag = diagnostics if diagnostics is not None else DiagnosticsConfig()
    if not isinstance(diag, DiagnosticsConfig):
        raise InvalidShampooArgumentError("diagnostics", diagnostics, "a shampoo.DiagnosticsConfig or None")
    return diag


def check_group_params(params: list[torch.Tensor]) -> None:
    """A new param group's parameters: each once, dense and real."""
    seen: dict[int, int] = {}
    for i, p in enumerate(params):
        if id(p) in seen:
            raise ValueError(
                f"parameter {i} of the group is parameter {seen[id(p)]} again: Shampoo keeps one state "
                "per parameter entry and would step it twice; pass each parameter once"
            )
        seen[id(p)] = i
        if p.is_sparse:
            raise ValueError("Shampoo does not support sparse parameters")
        if p.is_complex():
            raise ValueError(
                f"Shampoo does not support complex parameters (parameter {i} of the group is {p.dtype}): "
                "its Kronecker factors are real and would drop the imaginary part; keep the weight as "
                "a real tensor of shape (..., 2) and torch.view_as_complex it in forward()"
            )


__all__ = [
    "IMPL_FLAGS",
    "check_diagnostics",
    "check_distributed",
    "check_group_params",
    "check_impl_flags",
    "unknown_option_error",
]
