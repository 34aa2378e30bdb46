"""The state dict of :class:`shampoo.Shampoo`, the torch.optim way: its parameters' state and groups
packed for saving, and on loading the checks of its structure, the matching of saved keys (names,
``_orig_mod.`` prefixes, positions) to the optimizer's parameters, the saved hyperparameters
validated as the constructor validates them, and the restore plans, all before anything is loaded.
Checked by tests/test_optim_conformance.py against ``torch.optim.AdamW``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from .config import CONFIG_KEYS, GroupOptions, config_to_dict
from .errors import StateDictError
from .root_pipeline import check_schedule_state
from .state import flatten, plan_restore


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


def param_state(param_groups: list[dict[str, Any]], engines: list[Any], state: Any) -> dict[Any, Any]:
    """The flattened state of every parameter that has stepped or loaded (as ``opt.state`` says),
    by its key."""
    out: dict[Any, Any] = {}
    for g, eng in zip(param_groups, engines, strict=True):
        if eng is not None:
            for p, st in zip(g["params"], eng.states, strict=True):
                if state.get(p) is st:
                    out[st.key] = flatten(st)
    return out


def pack_groups(param_groups: list[dict[str, Any]], keys: list[list[str | int]]) -> list[dict[str, Any]]:
    """The param groups as saved: config objects as plain dicts, ``params`` as their keys."""
    groups = []
    for g, ks in zip(param_groups, keys, strict=True):
        # not "params" (replaced by their keys): a deepcopy of every parameter, and of a sharded
        # one's gradient whose storage FSDP2 may have freed (RuntimeError: invalid python storage)
        packed = {
            k: (config_to_dict(v) if k in CONFIG_KEYS else copy.deepcopy(v))
            for k, v in g.items()
            if k != "params"
        }
        packed["params"] = list(ks)  # param_names stay, as torch.optim keeps them
        groups.append(packed)
    return groups


def gathered_schedule(data: dict[str, Any], sharding: Any) -> dict[str, Any]:
    """The root schedule's export (:meth:`shampoo.root_pipeline.RootPipeline.export`), every rank's
    under ``distributed=DDPConfig`` (``sharding``: its :class:`shampoo.distributed.BlockSharding`;
    collective)."""
    if sharding is None or sharding.world_size == 1:
        return data
    shards: list[Any] = [None] * sharding.world_size
    torch.distributed.all_gather_object(shards, data, group=sharding.config.process_group)
    return {
        "delay": data["delay"],
        "blocks": [b for shard in shards for b in shard["blocks"]],
        "pending": [r for shard in shards for r in shard["pending"]],
    }


def split_saved(
    saved_groups: list[dict[str, Any]],
    saved: dict[Any, Any],
    keys: list[list[str | int]],
    shapes: list[list[tuple[int, ...]]],
) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """(the saved parameters' state re-keyed by this optimizer's keys (:func:`match_keys`), the
    entries not keyed by a saved group's parameter, copied as they are, as torch.optim does)."""
    param_keys = {k for sg in saved_groups for k in sg["params"]}
    extra = {k: v for k, v in saved.items() if k not in param_keys}
    ours = match_keys(saved_groups, {k: v for k, v in saved.items() if k in param_keys}, keys, shapes)
    return ours, extra


def saved_step(state_dict: dict[str, Any]) -> tuple[int, Any]:
    """The saved global step and root schedule (``state_dict["shampoo"]``), checked."""
    meta = state_dict.get("shampoo", {})
    step = meta.get("global_step", 0) if isinstance(meta, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise StateDictError(f"state dict 'shampoo.global_step' must be an int >= 0, got {step!r}")
    schedule = meta.get("root_schedule", {}) if isinstance(meta, dict) else {}
    check_schedule_state(schedule, step)
    return step, schedule


def restore_plans(eng: Any, saved: dict[Any, Any]) -> list[Any]:
    """The restore plan (:func:`shampoo.state.plan_restore`) of each of the engine's parameters with
    saved state; malformed entries are a StateDictError."""
    plans = []
    for st in eng.states:
        if st.key in saved:
            try:
                plans.append(plan_restore(st, saved[st.key]))
            except StateDictError:
                raise
            except (KeyError, IndexError, TypeError, RuntimeError) as exc:  # malformed entries
                raise StateDictError(f"parameter {st.key!r}: malformed saved state ({exc!r})") from exc
    return plans


__all__ = [
    "check_state_dict",
    "gathered_schedule",
    "loaded_group",
    "match_keys",
    "pack_groups",
    "param_state",
    "restore_plans",
    "saved_step",
    "split_saved",
]
