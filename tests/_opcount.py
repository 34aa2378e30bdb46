"""Counting the torch operations a call dispatches (the per-call overhead tests count ops, never time)."""

from __future__ import annotations

import collections

from torch.utils._python_dispatch import TorchDispatchMode


class OpCount(TorchDispatchMode):
    """``with OpCount() as c: ...`` then ``c.ops``: how often each aten operation was dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def count_options_built(monkeypatch) -> collections.Counter[str]:
    """A counter whose ``["options"]`` goes up each time a ``SolveOptions`` is built (and validated),
    for the tests that check a call reuses cached options instead of building them again."""
    from matroots.core import options

    built: collections.Counter[str] = collections.Counter()
    post = options.SolveOptions.__post_init__

    def counted(self) -> None:
        built["options"] += 1
        post(self)

    monkeypatch.setattr(options.SolveOptions, "__post_init__", counted)
    return built
