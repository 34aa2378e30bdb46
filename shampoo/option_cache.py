"""A param group's validated options, kept across steps while the group's values stay the same.

:meth:`shampoo.config.GroupOptions.from_group` validates every option of a group (~40 us on the
shared CPU box, a tenth of a small model's whole optimizer step). :class:`OptionsCache` builds it
again only when a value of the group dict is no longer the object it was at the last build; when
only ``lr`` changed (an LR scheduler, every step), it checks that one value
(:meth:`~shampoo.config.GroupOptions.with_lr`). A group holding a value that could change in place
(a tensor, such as a tensor lr, or a list or dict, also inside a tuple) is validated at every step,
as before the cache.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping
from typing import Any

import torch

from .config import GroupOptions

_NAMES = tuple(f.name for f in dataclasses.fields(GroupOptions))
_LR = _NAMES.index("lr")
_VALUES = operator.itemgetter(*_NAMES)  # a group's option values, one tuple


def _in_place(value: Any) -> bool:
    """Whether ``value`` could change without becoming another object."""
    if isinstance(value, tuple):
        return any(_in_place(v) for v in value)
    return isinstance(value, torch.Tensor | list | dict | set | bytearray)


class OptionsCache:
    """``get(group)``: :meth:`GroupOptions.from_group` of ``group``, reused while its values are the
    same objects (see the module docstring)."""

    def __init__(self) -> None:
        self._values: tuple[Any, ...] | None = None
        self._opts: GroupOptions | None = None

    def get(self, group: Mapping[str, Any]) -> GroupOptions:
        try:
            values = _VALUES(group)
        except KeyError:  # an option missing from the group (not one torch.optim filled in)
            return GroupOptions.from_group(group)
        old, opts = self._values, self._opts
        if old is None or opts is None:
            opts = GroupOptions.from_group(group)
        elif all(map(operator.is_, old, values)):
            return opts
        elif [i for i, (a, b) in enumerate(zip(old, values, strict=True)) if a is not b] == [_LR]:
            opts = opts.with_lr(values[_LR])
        else:
            opts = GroupOptions.from_group(group)
        if any(_in_place(v) for v in values):
            self._values = self._opts = None
        else:
            self._values, self._opts = values, opts
        return opts


__all__ = ["OptionsCache"]
