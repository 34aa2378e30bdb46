"""The ``[[optimizers]]`` of a protocol config (a validation config with a ``[protocol]`` table, see
:mod:`matroots.study.validation.config` and :mod:`matroots.study.validation.protocol`): each entry's
spec template, search space, fixed values and default point.

Kept apart from the grid's parser in :mod:`~matroots.study.validation.config`, which calls it for a
config with a ``[protocol]`` table; both read the types of :mod:`~matroots.study.validation.specs`.
"""

from __future__ import annotations

from typing import Any

from . import protocol as proto
from .specs import BASELINE, OptimizerSpec, ProtocolEntry, _list, _solvers, bad_config
from .tasks import TASKS


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
    opts = dict(o.get("options", {}))
    only = tuple(o.get("tasks", ()))
    for t in only:
        if t not in TASKS:
            raise bad_config(f"{where}: tasks lists unknown task {t!r}")
    space = proto.parse_space(o.get("space"), protocol.space, f"{where}.space")
    fixed = dict(o.get("fixed", {}))
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
    own = dict(proto.DEFAULT_POINTS.get(spec.root_solver if oname == "peer" else oname, {}))
    given = o.get("default", {})
    if not isinstance(given, dict) or set(given) - set(proto.DIMENSIONS):
        raise bad_config(
            f"{where}.default must be a table of hyperparameters ({list(proto.DIMENSIONS)}), got {given!r}"
        )
    own.update(given)
    return ProtocolEntry(spec=spec, space=space, fixed=fixed, tune=tune, only=only, default=own)


def _protocol_name(o: Any, where: str) -> str:
    """The optimizer name of a protocol entry, once the entry is a table with only its name's keys."""
    if not isinstance(o, dict):
        raise bad_config(f"{where} must be a table ([[optimizers]] with name, label, ...), got {o!r}")
    oname = o.get("name")
    if oname not in proto.OPTIMIZER_DIMS:
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
        ((sname, sopts, slabel),) = _solvers(o.get("root_solver", "eigh"), where)
        eps = o.get("eps", {"value": 1e-12, "mode": "absolute"})
        eps = eps if isinstance(eps, dict) else {"value": eps}
        return OptimizerSpec(name="shampoo", options=opts, root_solver=sname, solver_options=sopts,
                             solver_label=slabel, root_dtype=o.get("root_dtype", "fp32"),
                             eps=float(eps.get("value", 1e-12)), eps_mode=eps.get("mode", "absolute"),
                             precondition_frequency=10, label=o.get("label", f"shampoo[{slabel}]"))  # fmt: skip
    if oname == "soap":
        basis = o.get("basis_update", "eigh_warm")
        if basis not in BASIS_UPDATES:
            raise bad_config(f"{where}: basis_update {basis!r} not one of {BASIS_UPDATES}")
        return OptimizerSpec(name="soap", options=opts, root_solver=basis, solver_label=basis, root_dtype="fp32",
                             eps=float(o.get("eps", 1e-8)), precondition_frequency=10,
                             label=o.get("label", f"soap[{basis}]"))  # fmt: skip
    if oname == "peer":
        peer = o.get("peer")
        if peer not in PEERS:
            raise bad_config(f"{where}: peer must be one of {sorted(PEERS)}, got {peer!r}")
        return OptimizerSpec(name="peer", options=opts, root_solver=peer, solver_label=peer,
                             precondition_frequency=10, label=o.get("label", peer))  # fmt: skip
    return OptimizerSpec(name=oname, options=opts, label=o.get("label", oname))


__all__ = ["protocol_entries"]
