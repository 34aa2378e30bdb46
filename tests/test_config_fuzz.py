"""Fuzz the three TOML config parsers: a malformed value gets the parser's typed error, never a raw one.

Each case is a shipped config (``experiments/configs``) with one or two values replaced by junk or a
key deleted (seeded, deterministic). Every mutated config must either parse or raise the parser's
typed error (an :class:`~matroots.core.errors.InvalidArgumentError`: the validation config's
``bad_config``, the sweep grid's :class:`~matroots.study.grid.ConfigError`, the tune config's), and
the message must name the key or section that was wrong.

Before the parsers checked types where they read values, this corpus (seed 23) gave untyped errors:
validation 14 TypeError + 4 ValueError + 1 AttributeError of 300, sweep 4 TypeError + 2 ValueError
of 300, tune 51 TypeError + 13 ValueError + 5 KeyError of 300.
"""

from __future__ import annotations

import copy
import random
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from matroots.core.errors import InvalidArgumentError
from matroots.study import grid as gridmod
from matroots.study.tuning import spec as tunespec
from matroots.study.validation import config as vconfig

CONFIGS = Path(__file__).resolve().parents[1] / "experiments" / "configs"
JUNK: list[Any] = [None, -1, 0, 1, 2.5, True, "x", "all", "sync", [], [1], {}, {"value": 1}, float("inf"),
                   float("nan"), [1e-3], ["eigh"], "fp32", {"default": [1e-3]}, {"name": "eigh"}]  # fmt: skip
#: mutations per parser (validation: spread over its shipped configs)
CASES = {"validation": 300, "sweep": 300, "tune": 300}


def _bases(kind: str) -> dict[str, dict[str, Any]]:
    paths = sorted(CONFIGS.glob("*.toml"))
    pick = {
        "validation": [p for p in paths if p.name.startswith("validate_")],
        "tune": [p for p in paths if p.name.startswith("tune_")],
        "sweep": [p for p in paths if not p.name.startswith(("validate_", "tune_"))],
    }[kind]
    return {p.name: tomllib.loads(p.read_text()) for p in pick}


def _paths(o: Any, pre: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield pre
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _paths(v, (*pre, k))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _paths(v, (*pre, i))


def mutations(
    kind: str, n: int, seed: int = 23
) -> Iterator[tuple[str, list[tuple[Any, ...]], dict[str, Any]]]:
    """``n`` mutated configs of a parser: (base config, the paths changed, the config)."""
    bases = _bases(kind)
    rnd = random.Random(f"{kind}-{seed}")
    names = sorted(bases)
    for _ in range(n):
        name = rnd.choice(names)
        r = copy.deepcopy(bases[name])
        changed = []
        for _ in range(rnd.choice((1, 1, 2))):
            p = rnd.choice([p for p in _paths(r) if p])
            o = r
            for k in p[:-1]:
                o = o[k]
            if rnd.random() < 0.15 and isinstance(o, dict):
                del o[p[-1]]
            else:
                o[p[-1]] = copy.deepcopy(rnd.choice(JUNK))
            changed.append(p)
        yield name, changed, r


PARSERS: dict[str, tuple[Callable[[dict[str, Any]], Any], type[Exception]]] = {
    "validation": (vconfig.from_dict, InvalidArgumentError),
    "sweep": (gridmod.from_dict, gridmod.ConfigError),
    "tune": (tunespec.from_dict, InvalidArgumentError),
}

#: messages of whole-config checks that name no single key (the config as a whole is wrong)
WHOLE = ("the grid needs an 'adamw' entry", "the protocol needs a tuned 'adamw' entry", "same label",
         "repeats runs", "labelled", "names an order n that no family uses", "sweep names must be distinct",
         "duplicate candidate labels")  # fmt: skip


#: how messages name a section in words ("unknown matrix family ...", "unknown solver ...")
ALIASES = {"families": ("family",), "candidates": ("solver",), "solvers": ("solver",)}


def _names_a_key(msg: str, changed: list[tuple[Any, ...]], raw: dict[str, Any]) -> bool:
    """Whether the message names a key on a changed path (or a key of the junk table put there)."""
    if any(w in msg for w in WHOLE):
        return True
    keys = {str(k) for p in changed for k in p if isinstance(k, str)}
    for p in changed:
        o: Any = raw
        for k in p:
            o = o.get(k) if isinstance(o, dict) else o[k] if isinstance(o, list) and k < len(o) else None
        if isinstance(o, dict):
            keys |= set(o)
    keys |= {k[:-1] for k in keys if k.endswith("s")}  # "unknown task ..." names tasks
    keys |= {a for k in list(keys) for a in ALIASES.get(k, ())}
    return any(k in msg for k in keys)


def run_case(kind: str, raw: dict[str, Any]) -> tuple[str, Any]:
    """("OK", parsed) or ("ERR", exception) of one config through its parser."""
    parse, _ = PARSERS[kind]
    try:
        out = parse(copy.deepcopy(raw))
        if kind == "validation":
            out.units()  # the grid expands without a raw error too
        return "OK", out
    except Exception as exc:
        return "ERR", exc


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_mutated_configs_raise_typed_errors(kind: str) -> None:
    _, typed = PARSERS[kind]
    raw_errors: dict[str, list[str]] = {}
    unnamed: list[str] = []
    for name, changed, raw in mutations(kind, CASES[kind]):
        status, out = run_case(kind, raw)
        if status == "OK":
            continue
        where = f"{name} {changed}"
        if not isinstance(out, typed):
            raw_errors.setdefault(type(out).__name__, []).append(f"{where}: {out}")
        elif not _names_a_key(str(out), changed, raw):
            unnamed.append(f"{where}: {out}")
    counts = {k: len(v) for k, v in raw_errors.items()}
    assert not raw_errors, f"{kind}: untyped errors {counts}, e.g. " + "; ".join(
        v[0] for v in raw_errors.values()
    )
    assert not unnamed, f"{kind}: {len(unnamed)} messages name no changed key, e.g. {unnamed[:3]}"


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_shipped_configs_parse(kind: str) -> None:
    for name, raw in _bases(kind).items():
        status, out = run_case(kind, raw)
        assert status == "OK", f"{name}: {out!r}"
