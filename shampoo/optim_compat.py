"""torch.optim conformance helpers of :class:`shampoo.Shampoo`: the implementation flags it accepts or
refuses, and the matching of saved state-dict keys (names, ``_orig_mod.`` prefixes, positions) to the
optimizer's parameters. Checked by tests/test_optim_conformance.py against ``torch.optim.AdamW``.
"""

from __future__ import annotations

import copy
import difflib
import inspect
from collections.abc import Callable
from typing import Any

from .config import CONFIG_KEYS, GroupOptions
from .errors import StateDictError, UnknownOptionError

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


def _strip_compile_prefix(key: Any) -> Any:
    """A parameter name without the ``_orig_mod.`` segments torch.compile adds (positions unchanged)."""
    return key.replace("_orig_mod.", "") if isinstance(key, str) else key


def match_keys(
    saved_groups: list[dict[str, Any]],
    saved: dict[Any, Any],
    keys: list[list[str | int]],
    shapes: list[list[tuple[int, ...]]],
) -> dict[Any, Any]:
    """``saved`` re-keyed by this optimizer's parameter keys (see :meth:`Shampoo.load_state_dict`)."""
    named_saved = all(isinstance(k, str) for sg in saved_groups for k in sg["params"])
    named_now = all(isinstance(k, str) for ks in keys for k in ks)
    mapping: dict[Any, Any] = {}
    for gi, (sg, ks) in enumerate(zip(saved_groups, keys, strict=True)):
        if named_saved == named_now:  # names (torch.compile prefixes ignored) or global positions
            now = {_strip_compile_prefix(k): k for k in ks}
            old = {_strip_compile_prefix(k): k for k in sg["params"]}
            if set(now) != set(old):
                missing = sorted(map(str, set(now) ^ set(old)))
                raise StateDictError(
                    f"param group {gi}: parameters differ from the saved ones: {missing[:5]}"
                )
            mapping.update({old[n]: now[n] for n in now})
        else:  # names on one side only: by position within the group, as torch.optim does
            if len(sg["params"]) != len(ks):
                raise StateDictError(
                    f"param group {gi}: parameters differ from the saved ones: {len(sg['params'])} saved, "
                    f"{len(ks)} in the optimizer"
                )
            for pos, (old_key, shape) in enumerate(zip(sg["params"], shapes[gi], strict=True)):
                entry = saved.get(old_key)
                if isinstance(entry, dict) and "shape" in entry and tuple(entry["shape"]) != shape:
                    raise StateDictError(
                        f"param group {gi}: parameters differ from the saved ones: position {pos} "
                        f"({old_key!r}) was saved with shape {tuple(entry['shape'])}, the parameter is {shape}"
                    )
            mapping.update(dict(zip(sg["params"], ks, strict=True)))
    unknown = [k for k in saved if k not in mapping]
    if unknown:
        raise StateDictError(f"state dict has state for unknown parameters: {unknown[:5]}")
    return {mapping[k]: v for k, v in saved.items()}


def loaded_group(
    group: dict[str, Any], saved: dict[str, Any], gi: int
) -> tuple[dict[str, Any], GroupOptions]:
    """The param group ``group`` with the saved group's hyperparameters (config objects, dtypes and
    ``params`` and ``param_names`` stay as configured now), and its options, validated by the rules the constructor
    applies (:class:`~shampoo.config.GroupOptions`): a value the constructor refuses (``lr='abc'``,
    ``lr=nan``, ``precondition_frequency=0``, ``betas=(0.9,)``) is a StateDictError (a ValueError)
    with the constructor's message, before anything is loaded. ``group`` itself is not modified."""
    merged = dict(group)
    # ``param_names`` stay this optimizer's: they are its state keys (a saved ``_orig_mod.`` name, or
    # names loaded into an optimizer built without, would re-key its state)
    kept = (*CONFIG_KEYS, "params", "param_names")
    merged.update({k: copy.deepcopy(v) for k, v in saved.items() if k not in kept})
    try:
        return merged, GroupOptions.from_group(merged)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise StateDictError(f"state dict param group {gi}: {exc}") from exc


def check_state_dict(state_dict: Any, n_groups: int) -> tuple[list[dict[str, Any]], dict[Any, Any]]:
    """The (param_groups, state) of a state dict, after checking its structure (StateDictError)."""
    if not isinstance(state_dict, dict):
        raise StateDictError(f"a Shampoo state dict is a dict, got {type(state_dict).__name__}")
    missing = [k for k in ("state", "param_groups") if k not in state_dict]
    if missing:
        raise StateDictError(f"state dict lacks {missing}; expected the dict Shampoo.state_dict() returns")
    groups, state = state_dict["param_groups"], state_dict["state"]
    if not isinstance(groups, list | tuple) or not all(isinstance(g, dict) for g in groups):
        raise StateDictError("state dict 'param_groups' must be a list of dicts")
    if len(groups) != n_groups:
        raise StateDictError(f"state dict has {len(groups)} param groups, the optimizer {n_groups}")
    for gi, g in enumerate(groups):
        if not isinstance(g.get("params"), list | tuple):
            raise StateDictError(f"param group {gi} of the state dict has no 'params' list")
    if not isinstance(state, dict):
        raise StateDictError(f"state dict 'state' must be a dict, got {type(state).__name__}")
    return list(groups), state


__all__ = [
    "IMPL_FLAGS",
    "check_impl_flags",
    "check_state_dict",
    "loaded_group",
    "match_keys",
    "unknown_option_error",
]
