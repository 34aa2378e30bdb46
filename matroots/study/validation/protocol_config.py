"""The ``[[optimizers]]`` of a protocol config (a validation config with a ``[protocol]`` table, see
:mod:`matroots.study.validation.config` and :mod:`matroots.study.validation.protocol`): each entry's
spec template, search space, fixed values and default point.

Kept apart from the grid's parser in :mod:`~matroots.study.validation.config`, which calls it for a
config with a ``[protocol]`` table; both read the types of :mod:`~matroots.study.validation.specs`.
"""

from __future__ import annotations

import math
from typing import Any

from ...core.options import EPS_MODES
from . import protocol as proto
from .specs import (
    BASELINE,
    DTYPES,
    OptimizerSpec,
    ProtocolEntry,
    _int,
    _label,
    _list,
    _number,
    _solvers,
    _str,
    _table,
    _task_names,
    bad_config,
)


def protocol_entries(raw: dict[str, Any], protocol: proto.Protocol) -> tuple[ProtocolEntry, ...]:
    """The ``[[optimizers]]`` of a protocol config (see :mod:`matroots.study.validation.protocol`)."""
    out = [
        _protocol_entry(o, f"optimizers[{i}]", protocol)
        for i, o in enumerate(_list(raw.get("optimizers") or []))
    ]
    if not any(e.spec.name == BASELINE and e.tune for e in out):
        raise bad_config("the protocol needs a tuned 'adamw' entry: every ratio is against it")
    labels = [e.spec.label for e in out]
    if len(set(labels)) != len(labels):
        raise bad_config(
            f"optimizer entries with the same label {sorted({x for x in labels if labels.count(x) > 1})}"
        )
    return tuple(out)


def _protocol_entry(o: Any, where: str, protocol: proto.Protocol) -> ProtocolEntry:
    """One ``[[optimizers]]`` table of a protocol config: its spec, search space, fixed values, default."""
    oname = _protocol_name(o, where)
    opts = dict(_table(o.get("options", {}), f"{where}.options", "optimizer keyword arguments"))
    only = _task_names(o.get("tasks", ()), where)
    space = proto.parse_space(o.get("space"), protocol.space, f"{where}.space")
    fixed = dict(_table(o.get("fixed", {}), f"{where}.fixed", "hyperparameter values"))
    unknown = set(fixed) - set(proto.DIMENSIONS)
    if unknown:
        raise bad_config(
            f"{where}.fixed: unknown hyperparameters {sorted(unknown)}; allowed: {list(proto.DIMENSIONS)}"
        )
    tune = o.get("tune", True)
    if not isinstance(tune, bool):
        raise bad_config(f"{where}.tune must be true or false, got {tune!r}")
    if not tune and "lr" not in fixed:
        raise bad_config(f"{where}: an untuned entry (tune = false) needs fixed.lr")
    spec = _protocol_spec(o, oname, opts, where)
    for k in fixed:
        if k in proto.OPTIMIZER_DIMS[oname] or k in ("lr", "beta2", "weight_decay", "warmup_fraction"):
            continue
        raise bad_config(f"{where}.fixed: {k} is not a hyperparameter of {oname}")
    _hparams(fixed, f"{where}.fixed")
    own = dict(proto.DEFAULT_POINTS.get(spec.root_solver if oname == "peer" else oname, {}))
    given = o.get("default", {})
    if not isinstance(given, dict) or set(given) - set(proto.DIMENSIONS):
        raise bad_config(
            f"{where}.default must be a table of hyperparameters ({list(proto.DIMENSIONS)}), got {given!r}"
        )
    _hparams(given, f"{where}.default")
    _betas(opts, f"{where}.options")
    own.update(given)
    return ProtocolEntry(spec=spec, space=space, fixed=fixed, tune=tune, only=only, default=own)


def _protocol_name(o: Any, where: str) -> str:
    """The optimizer name of a protocol entry, once the entry is a table with only its name's keys."""
    if not isinstance(o, dict):
        raise bad_config(f"{where} must be a table ([[optimizers]] with name, label, ...), got {o!r}")
    oname = o.get("name")
    if not isinstance(oname, str) or oname not in proto.OPTIMIZER_DIMS:
        raise bad_config(f"{where}: name must be one of {sorted(proto.OPTIMIZER_DIMS)}, got {oname!r}")
    allowed = {"name", "label", "options", "tasks", "space", "fixed", "tune", "default"}
    allowed |= {"shampoo": {"root_solver", "root_dtype", "eps"}, "soap": {"basis_update", "eps"},
                "peer": {"peer"}}.get(oname, set())  # fmt: skip
    bad = set(o) - allowed
    if bad:
        hint = " (the protocol samples lr: give its range in space)" if "lr" in bad else ""
        raise bad_config(f"{where}: unknown keys {sorted(bad)} for {oname}{hint}; allowed: {sorted(allowed)}")
    return oname


def _protocol_spec(o: dict[str, Any], oname: str, opts: dict[str, Any], where: str) -> OptimizerSpec:
    """The spec template of a protocol entry (its solver, basis update or peer; frequency 10)."""
    from shampoo.transforms.soap import BASIS_UPDATES

    from .peers import PEERS

    if oname == "shampoo":
        solvers = _solvers(o.get("root_solver", "eigh"), where)
        if len(solvers) != 1:
            raise bad_config(
                f"{where}: a protocol entry takes one root_solver (a name or {{name=..., options={{...}}}}), "
                f"got {o.get('root_solver')!r}"
            )
        ((sname, sopts, slabel),) = solvers
        eps = o.get("eps", {"value": 1e-12, "mode": "absolute"})
        eps = eps if isinstance(eps, dict) else {"value": eps}
        if set(eps) - {"value", "mode"}:
            raise bad_config(f"{where}.eps must be a number or {{value=..., mode=...}}, got {eps!r}")
        value = _number(eps.get("value", 1e-12), f"{where}.eps value", 0.0)
        mode = _str(eps.get("mode", "absolute"), f"{where}.eps mode", EPS_MODES)
        dtype = _str(o.get("root_dtype", "fp32"), f"{where}.root_dtype", DTYPES)
        return OptimizerSpec(name="shampoo", options=opts, root_solver=sname, solver_options=sopts,
                             solver_label=slabel, root_dtype=dtype, eps=value, eps_mode=mode,
                             precondition_frequency=10, label=_label(o, where, f"shampoo[{slabel}]"))  # fmt: skip
    if oname == "soap":
        basis = o.get("basis_update", "eigh_warm")
        if not isinstance(basis, str) or basis not in BASIS_UPDATES:
            raise bad_config(f"{where}: basis_update {basis!r} not one of {BASIS_UPDATES}")
        return OptimizerSpec(name="soap", options=opts, root_solver=basis, solver_label=basis, root_dtype="fp32",
                             eps=_number(o.get("eps", 1e-8), f"{where}.eps", 0.0), precondition_frequency=10,
                             label=_label(o, where, f"soap[{basis}]"))  # fmt: skip
    if oname == "peer":
        peer = o.get("peer")
        if not isinstance(peer, str) or peer not in PEERS:
            raise bad_config(f"{where}: peer must be one of {sorted(PEERS)}, got {peer!r}")
        return OptimizerSpec(name="peer", options=opts, root_solver=peer, solver_label=peer,
                             precondition_frequency=10, label=_label(o, where, peer))  # fmt: skip
    return OptimizerSpec(name=oname, options=opts, label=_label(o, where, oname))


def _betas(opts: dict[str, Any], where: str) -> None:
    """``options.betas`` of a protocol entry (its beta1 is read at every trial): a list of numbers."""
    betas = opts.get("betas", [0.9])
    if not isinstance(betas, list) or not betas:
        raise bad_config(f"{where}.betas must be a list of numbers, e.g. [0.9, 0.999], got {betas!r}")
    for b in betas:
        _number(b, f"{where}.betas", 0.0, 1.0)


def _hparams(values: dict[str, Any], where: str) -> None:
    """The values of a ``fixed`` or ``default`` table: numbers in their ranges, grafting a name."""
    for k, v in values.items():
        if k == "grafting":
            _str(v, f"{where}.grafting")
        elif k == "precondition_frequency":
            _int(v, f"{where}.precondition_frequency", 1)
        elif k == "lr":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
                raise bad_config(f"{where}.lr must be a finite number > 0, got {v!r}")
        elif k in ("beta2", "warmup_fraction"):
            _number(v, f"{where}.{k}", 0.0, 1.0)
        elif k in proto.DIMENSIONS:
            _number(v, f"{where}.{k}", 0.0, math.inf)


__all__ = ["protocol_entries"]
