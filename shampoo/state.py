"""Typed per-parameter, per-block and per-factor state, and its flattening for ``state_dict``.

Tensors in :class:`BlockState` and :class:`FactorState` are views into the stacked storage of their
bucket (:class:`shampoo.preconditioner.BlockBucket`), so batched kernels update them in place while
each block still has typed, inspectable state. ``flatten``/``restore`` turn a :class:`ParamState`
into a plain dict of tensors and numbers (picklable with ``torch.load(weights_only=True)``) and back.

Transform state: besides the fixed fields (first moment, grafting and diagonal accumulators, Kronecker
factors), a transform declares its own named tensors for a block in its ``bind`` with
:func:`declare` (views into its stacked storage, e.g. SOAP's ``second_moment`` and
``factors.<d>.eigenbasis``). They are :attr:`BlockState.tensors`: saved under
``blocks.<index>.<name>``, restored in place (a declared name missing from a saved state is a
:class:`~shampoo.errors.StateDictError`), and merged across the shards of a distributed run with the
rest of their block (:func:`merge_shards`). A transform that declares nothing (Kronecker, diagonal)
keeps the version-1 format exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch

from .blocking import BlockSpec, ParamLayout
from .errors import StateDictError

WARM_BACKOFF_MAX = 8
"""Most root rounds an eigenbasis solver's warm start is skipped after repeated fallbacks."""


@dataclass
class FactorState:
    """One Kronecker factor of a block: statistics, current inverse root and root bookkeeping."""

    dim: int
    n: int
    root_p: Fraction
    # (n, n) view into the bucket's factor storage; its upper triangle is the statistic, the lower one
    # scratch (state_dict(), dumps and diagnostics mirror it in place; a root round reads a mirrored
    # copy: see mirror_upper_ and shampoo.roots)
    matrix: torch.Tensor
    # (n, n) view into the bucket's root storage; identity until the first root. None for factors of
    # transforms that keep no root (SOAP keeps an eigenbasis, declared as block tensor state instead)
    root: torch.Tensor | None
    has_root: bool = False
    root_step: int = 0  # parameter step of the current root
    consecutive_failures: int = 0  # rounds in a row without a usable root from any solver
    consecutive_primary_failures: int = 0  # rounds in a row in which the configured solver failed
    failures: int = 0
    primary_failures: int = 0
    fallback_uses: int = 0
    # The last root computation (diagnostics):
    solver: str = ""
    iterations: int = 0
    residual: float = math.nan
    converged: bool = False
    seconds: float = 0.0
    kappa: float = math.nan  # condition number of the matrix actually solved (after psd shift and eps)
    psd_shift: float = math.nan  # absolute shift of the rank-deficiency policy (matroots.core.psd)
    psd_floor: float = math.nan  # its eigenvalue floor f (NaN: no floor)
    eps_abs: float = math.nan  # the absolute eps shift the solver applied
    regularisation: float = math.nan  # psd_shift + eps_abs: the whole shift of the matrix solved
    factor_resets: int = 0  # times the statistics were reset because they became non-finite
    error: str = ""
    # Eigenbasis solvers (root_solver "eigh_warm"): the eigenvectors of the last root, the next round's
    # warm start (checkpointed), and the solver's verdict on its warm start ("accepted", "refined", ...)
    basis: torch.Tensor | None = None
    warm: str = ""
    warm_hits: int = 0  # rounds whose warm start was accepted or refined (not a fallback)
    # Warm-start backoff (update_warm_backoff): after a warm start that fell back to the full eigh, the next
    # ``warm_skip`` rounds solve cold; the skip doubles with each further fallback (up to
    # WARM_BACKOFF_MAX) and resets when a warm start is accepted or refined.
    warm_skip: int = 0
    warm_backoff: int = 0

    def update_warm_backoff(self, *, skipped: bool) -> None:
        """Warm-start backoff of an eigenbasis solver (eigh_warm) after this factor's round.

        A warm start that ends in the solver's own full-eigh fallback costs the refinement it tried
        on top of the eigh (early in training a factor changes by 10-100% per round and its old basis
        is genuinely far). After such a round the next ``warm_backoff`` rounds solve cold (a cold
        eigh_warm call is a plain eigh); the backoff doubles with each further fallback, up to
        :data:`WARM_BACKOFF_MAX` rounds, and resets once a warm start is accepted or refined. A
        skipped round is reported as ``warm = "skipped (backoff)"``. Used by Shampoo's root rounds
        (root_solver="eigh_warm") and by SOAP's eigh_warm basis updates.
        """
        if skipped:
            self.warm_skip -= 1
            self.warm = "skipped (backoff)"
        elif self.warm.startswith("fallback"):
            self.warm_backoff = min(max(1, 2 * self.warm_backoff), WARM_BACKOFF_MAX)
            self.warm_skip = self.warm_backoff
        elif self.warm in ("accepted", "refined"):
            self.warm_backoff = self.warm_skip = 0


# FactorState fields that are tensors or fixed by the layout (not flattened as bookkeeping).
_FACTOR_FIXED = ("dim", "n", "root_p", "matrix", "root", "basis", "warm_skip", "warm_backoff")
# Diagnostics only, never saved: wall-clock time differs between two runs of the same state, whose
# state dicts must compare equal as torch.optim's do (an older state dict's value still loads).
_FACTOR_UNSAVED = ("seconds",)
# Saved only when nonzero (states without a pending backoff keep the format-1 entries exactly).
_BACKOFF_FIELDS = ("warm_skip", "warm_backoff")


@dataclass
class BlockState:
    """State of one block. Tensors are None for blocks this process does not own (distributed)."""

    spec: BlockSpec
    owned: bool = True
    first_moment: torch.Tensor | None = None  # EMA of the gradient (beta1 > 0)
    graft_state: torch.Tensor | None = None  # second moment of the grafting method
    diagonal: torch.Tensor | None = None  # diagonal preconditioner accumulator (DIAGONAL blocks)
    factors: list[FactorState] = field(default_factory=list)
    # Transform state: named tensors declared by a transform's bind (see the module docstring)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    # the smallest valid entry of a declared tensor (a second moment: 0), checked on load
    minimums: dict[str, float] = field(default_factory=dict)


_BLOCK_FIXED = ("shape", "first_moment", "graft_state", "diagonal")


def declare(block: BlockState, name: str, tensor: torch.Tensor, *, minimum: float | None = None) -> None:
    """Declare ``tensor`` (a view into a transform's stacked storage) as block state named ``name``.

    The name is the checkpoint key within the block (``blocks.<index>.<name>``); it must not be one of
    the fixed entries (shape, first_moment, graft_state, diagonal, or a Kronecker factor's
    ``factors.<d>.<field>``) nor be declared twice. A loaded value must be finite, of the tensor's
    shape and kind (floating or integer), and, with ``minimum``, have no entry below it (a second
    moment: 0); otherwise loading raises :class:`~shampoo.errors.StateDictError`.
    """
    reserved = name in _BLOCK_FIXED or (
        name.startswith("factors.")
        and name.rpartition(".")[2] in {f.name for f in dataclasses.fields(FactorState)}
    )
    if not name or reserved or name in block.tensors:
        raise ValueError(
            f"transform state name {name!r} of block {block.spec.index} is empty, reserved (shape, "
            "first_moment, graft_state, diagonal, factors.<d>.<FactorState field>) or already declared"
        )
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"transform state {name!r} must be a tensor, got {type(tensor).__name__}")
    block.tensors[name] = tensor
    if minimum is not None:
        block.minimums[name] = float(minimum)


@dataclass
class ParamState(Mapping[str, Any]):
    """State of one parameter.

    Also a read-only mapping with the entries of its state-dict form (:func:`flatten`, without
    copying the tensors), so ``len(opt.state[p])``, ``opt.state[p]["step"]`` and iteration work as
    for a torch.optim optimizer's dict of tensors.
    """

    key: str | int  # the parameter's name, or its position when the optimizer has no names
    layout: ParamLayout
    blocks: list[BlockState]
    step: int = 0  # updates applied (non-finite and absent gradients do not count)
    skipped_steps: int = 0  # updates skipped because of non-finite gradients or updates
    momentum_buffer: torch.Tensor | None = None  # heavy-ball momentum of the search direction

    def __getitem__(self, name: str) -> Any:
        return flatten(self, clone=False)[name]

    def __iter__(self) -> Iterator[str]:
        return iter(flatten(self, clone=False))

    def __len__(self) -> int:
        return len(flatten(self, clone=False))


def flatten(state: ParamState, *, clone: bool = True) -> dict[str, Any]:
    """A flat dict of tensors and plain values describing ``state`` (the owned blocks); the tensors
    are copies, or with ``clone=False`` the state's own (views: read, do not write)."""
    entries: dict[str, Any] = {
        "step": state.step,
        "skipped_steps": state.skipped_steps,
        "shape": tuple(state.layout.shape),
    }
    if state.momentum_buffer is not None:
        entries["momentum_buffer"] = _copy(state.momentum_buffer, clone)
    blocks = {b.spec.index: flatten_block(b, clone=clone) for b in state.blocks if b.owned}
    return join_blocks(entries, blocks)


def _copy(t: torch.Tensor, clone: bool) -> torch.Tensor:
    return t.clone() if clone else t


def flatten_block(b: BlockState, *, clone: bool = True) -> dict[str, Any]:
    """One block's entries (tensors, copied unless ``clone=False``, and bookkeeping), named within
    the block."""
    out: dict[str, Any] = {"shape": tuple(b.spec.shape)}
    for name in ("first_moment", "graft_state", "diagonal"):
        t = getattr(b, name)
        if t is not None:
            out[name] = _copy(t, clone)
    for f in b.factors:
        fp = f"factors.{f.dim}."
        out[fp + "matrix"] = _copy(mirror_upper_(f.matrix), clone)
        if f.root is not None:
            out[fp + "root"] = _copy(f.root, clone)
        if f.basis is not None:
            out[fp + "basis"] = _copy(f.basis, clone)
        for name in _BACKOFF_FIELDS:  # written only while a backoff is pending
            if getattr(f, name):
                out[fp + name] = getattr(f, name)
        for fld in dataclasses.fields(FactorState):
            if fld.name not in _FACTOR_FIXED and fld.name not in _FACTOR_UNSAVED:
                out[fp + fld.name] = getattr(f, fld.name)
    for name, t in b.tensors.items():
        out[name] = _copy(t, clone)
    return out


# The state-dict format (version 1): a parameter's entries, then each block's entries under
# "blocks.<index>." (written by join_blocks, read by split_blocks and restore; no other module
# knows the naming).
_BLOCKS = "blocks."


def join_blocks(entries: dict[str, Any], blocks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The flat state of a parameter from its own entries and its blocks' (in block order)."""
    out = dict(entries)
    for index in sorted(blocks):
        out.update({f"{_BLOCKS}{index}.{name}": v for name, v in blocks[index].items()})
    return out


def split_blocks(flat: dict[str, Any]) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The inverse of :func:`join_blocks`: (the parameter's entries, {block index: its entries})."""
    entries: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    for name, v in flat.items():
        index, sep, rest = name.removeprefix(_BLOCKS).partition(".")
        if name.startswith(_BLOCKS) and sep and index.isdigit():
            blocks.setdefault(int(index), {})[rest] = v
        else:
            entries[name] = v
    return entries, blocks


def merge_shards(shards: list[dict[str, Any]], device: torch.device | None = None) -> dict[str, Any]:
    """One parameter's flat state from the flat states of several processes that each hold some of
    its blocks (distributed Shampoo): the per-parameter entries of the first shard, the union of the
    blocks (a block held twice keeps the first copy). Tensors move to ``device`` when given."""
    entries, blocks = split_blocks(shards[0])
    for shard in shards[1:]:
        for index, block in split_blocks(shard)[1].items():
            blocks.setdefault(index, block)
    if device is not None:
        blocks = {
            i: {n: (v.to(device) if isinstance(v, torch.Tensor) else v) for n, v in b.items()}
            for i, b in blocks.items()
        }
    return join_blocks(entries, blocks)


def mirror_upper_(F: torch.Tensor) -> torch.Tensor:
    """Copy the upper triangle of each (n, n) matrix of F onto its lower triangle, in place.

    The factor statistics accumulate their **upper triangle**: ``baddbmm`` updates entry (i, j) from
    entry (i, j) alone, so the upper triangle evolves as a one-triangle accumulation would, while the
    lower triangle (written by the same GEMM with a different summation order, asymmetric at ~1e-7
    relative in fp32 for n >= 256) is scratch. This mirror makes the factor bitwise symmetric in any
    dtype; it runs whenever a factor is read (``state_dict()``, factor dumps, diagnostics; a root
    round writes the mirrored matrix straight into its solve's input, see shampoo.roots), not at
    every step, so symmetric statistics cost nothing on the step (a per-step symmetrisation is a
    strided transpose of every factor, about a third of the ``baddbmm`` itself).
    """
    n = F.shape[-1]
    lower = torch.ones(n, n, dtype=torch.bool, device=F.device).tril_(-1)
    flat = F.unsqueeze(0) if F.dim() == 2 else F  # one factor or a (b, n, n) stack (views of F)
    # in chunks of <= 4 MiB: the select's temporary stays in the heap (a whole-stack one is a fresh
    # mmap the kernel faults in: 400 MB at d_model 1024)
    step = max(1, 2**22 // max(1, n * n * F.element_size()))
    for i in range(0, flat.shape[0], step):
        c = flat[i : i + step]
        c.copy_(torch.where(lower, c.mT, c))
    return F


class _Plan:
    """The copies and assignments of a restore, made only after every saved entry was checked: a
    refused state dict leaves the optimizer as it was."""

    def __init__(self) -> None:
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.sets: list[tuple[Any, str, Any]] = []

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.copies.append((dst, src))

    def set(self, obj: Any, name: str, value: Any) -> None:
        self.sets.append((obj, name, value))

    def apply(self) -> None:
        for dst, src in self.copies:
            dst.copy_(src)
        for obj, name, value in self.sets:
            setattr(obj, name, value)


def _checked(
    dst: torch.Tensor, src: Any, what: str, *, finite: bool = True, minimum: float | None = None
) -> torch.Tensor:
    """``src`` after the checks of a saved tensor restored into ``dst`` (StateDictError naming
    ``what``): the same shape; the same kind (floating into floating, copied with rounding to
    ``dst``'s precision as torch.optim casts its state; integer into integer; nothing complex into a
    real tensor); with ``finite``, no NaN/Inf; with ``minimum``, no entry below it."""
    if not isinstance(src, torch.Tensor) or tuple(src.shape) != tuple(dst.shape):
        got = tuple(src.shape) if isinstance(src, torch.Tensor) else type(src).__name__
        raise StateDictError(f"state for {what} has shape {got}, expected {tuple(dst.shape)}")
    if dst.is_floating_point() and not src.is_floating_point():
        raise StateDictError(
            f"state for {what} has dtype {src.dtype}, expected a floating tensor ({dst.dtype})"
        )
    if not dst.is_floating_point() and (src.is_floating_point() or src.is_complex()):
        raise StateDictError(
            f"state for {what} has dtype {src.dtype}, expected an integer tensor ({dst.dtype})"
        )
    if finite and src.is_floating_point() and not bool(torch.isfinite(src).all()):
        bad = int((~torch.isfinite(src)).sum())
        raise StateDictError(
            f"state for {what} has {bad} non-finite entries (NaN/Inf); every update computed from it "
            "would be non-finite and skipped. Repair or drop the checkpoint"
        )
    if minimum is not None and src.numel() and bool((src < minimum).any()):
        raise StateDictError(
            f"state for {what} has {int((src < minimum).sum())} entries below {minimum:g} (smallest "
            f"{float(src.min()):.3e}); it holds a second moment or a step count, which is never negative"
        )
    return src


def _as_int(value: Any, what: str, *, minimum: int | None = 0) -> int:
    """A saved count: an int (or an integral float / one-element tensor, as torch.optim saves steps)
    >= ``minimum``; StateDictError naming ``what`` otherwise."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StateDictError(f"state for {what} must be an int, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise StateDictError(f"state for {what} must be an int, got {value!r}")
    count = int(value)
    if minimum is not None and count < minimum:
        raise StateDictError(f"state for {what} must be an int >= {minimum}, got {count}")
    return count


def restore(state: ParamState, flat: dict[str, Any]) -> None:
    """Load ``flat`` (from :func:`flatten`) into ``state`` in place, copying into existing storage."""
    plan_restore(state, flat).apply()


def plan_restore(state: ParamState, flat: dict[str, Any]) -> _Plan:
    """Check every entry of ``flat`` against ``state`` and return the restore, not yet applied.

    Checks (StateDictError naming the parameter and the saved key): shapes, dtypes, counts (``step``,
    ``skipped_steps`` and the factors' counters are ints >= 0: a negative step would skip updates
    until it reached 0, then divide by zero in the bias correction), finite first moments, momentum
    buffers, grafting and diagonal accumulators, roots, bases and transform tensors, non-negative
    second moments (grafting, diagonal, declared minimums) and factor-statistics diagonals.
    Non-finite factor statistics are accepted: the next root round resets them, with a warning.
    """
    key = state.key
    plan = _Plan()
    if not isinstance(flat, dict):
        raise StateDictError(f"parameter {key!r}: state must be a dict, got {type(flat).__name__}")
    saved_shape = flat.get("shape", state.layout.shape)
    if not isinstance(saved_shape, tuple | list | torch.Size) or tuple(saved_shape) != tuple(
        state.layout.shape
    ):
        raise StateDictError(
            f"parameter {key!r}: saved shape {saved_shape!r} differs from the parameter's {state.layout.shape}"
        )
    if "step" not in flat:
        raise StateDictError(f"parameter {key!r}: 'step' missing from the saved state")
    plan.set(state, "step", _as_int(flat["step"], f"parameter {key!r} 'step'"))
    plan.set(
        state, "skipped_steps", _as_int(flat.get("skipped_steps", 0), f"parameter {key!r} 'skipped_steps'")
    )
    if "momentum_buffer" in flat:
        if state.momentum_buffer is None:
            raise StateDictError(f"parameter {key!r}: the state has a momentum buffer but momentum is 0")
        src = _checked(state.momentum_buffer, flat["momentum_buffer"], f"parameter {key!r} 'momentum_buffer'")
        plan.copy(state.momentum_buffer, src)
    for b in state.blocks:
        if not b.owned:
            continue
        pre = f"blocks.{b.spec.index}."
        saved = flat.get(pre + "shape")
        if not isinstance(saved, tuple | list | torch.Size) or tuple(saved) != tuple(b.spec.shape):
            raise StateDictError(
                f"parameter {key!r} block {b.spec.index}: saved block shape {saved} differs from "
                f"{b.spec.shape}; the blocking options (max_preconditioner_dim, merge_dims, "
                "exponent_override, vector_policy) must match the run that saved the state"
            )
        for name, minimum in (("first_moment", None), ("graft_state", 0.0), ("diagonal", 0.0)):
            t = getattr(b, name)
            if t is not None:
                if pre + name not in flat:
                    raise StateDictError(f"parameter {key!r} block {b.spec.index}: {name} missing from state")
                what = f"parameter {key!r} '{pre}{name}'"
                plan.copy(t, _checked(t, flat[pre + name], what, minimum=minimum))
        for name, t in b.tensors.items():  # transform state, declared by the transforms' bind
            if pre + name not in flat:
                raise StateDictError(
                    f"parameter {key!r} block {b.spec.index}: {name} missing from state (the saved state "
                    "was written with a different preconditioner, or is incomplete)"
                )
            what = f"parameter {key!r} '{pre}{name}'"
            plan.copy(t, _checked(t, flat[pre + name], what, minimum=b.minimums.get(name)))
        for f in b.factors:
            fp = f"{pre}factors.{f.dim}."
            if fp + "matrix" not in flat or (f.root is not None and fp + "root" not in flat):
                raise StateDictError(f"parameter {key!r} block {b.spec.index}: factor {f.dim} missing")
            # Non-finite statistics are accepted (the next root round resets them, with a warning);
            # a non-finite root is refused: it would be applied as it is until the next round.
            what = f"parameter {key!r} '{fp}matrix'"
            src = _checked(f.matrix, flat[fp + "matrix"], what, finite=False)
            diag = src.diagonal(dim1=-2, dim2=-1)
            if bool((diag < 0).any()):  # sums of squares (NaN compares False: reset as above)
                raise StateDictError(
                    f"state for {what} has negative diagonal entries (smallest {float(diag.min()):.3e}): "
                    "a factor's statistics are sums of G G^T, positive semidefinite"
                )
            plan.copy(f.matrix, src)
            if f.root is not None:
                plan.copy(f.root, _checked(f.root, flat[fp + "root"], f"parameter {key!r} '{fp}root'"))
            basis = None
            if f.root is not None and fp + "basis" in flat:  # eigh_warm's warm start; it checks it again
                basis = torch.empty_like(f.root)
                plan.copy(basis, _checked(basis, flat[fp + "basis"], f"parameter {key!r} '{fp}basis'"))
            plan.set(f, "basis", basis)
            for name in _BACKOFF_FIELDS:  # absent (no backoff pending, older states): 0
                plan.set(f, name, _as_int(flat.get(fp + name, 0), f"parameter {key!r} '{fp}{name}'"))
            for fld in dataclasses.fields(FactorState):
                if fld.name not in _FACTOR_FIXED and fp + fld.name in flat:
                    value = _bookkeeping(flat[fp + fld.name], fld, f"parameter {key!r} '{fp}{fld.name}'")
                    plan.set(f, fld.name, value)
    return plan


def _bookkeeping(value: Any, fld: dataclasses.Field, what: str) -> Any:
    """A saved FactorState bookkeeping value, checked against the field's type."""
    default = fld.default
    if isinstance(default, bool):
        if not isinstance(value, bool | int):
            raise StateDictError(f"state for {what} must be a bool, got {value!r}")
        return bool(value)
    if isinstance(default, int):  # counts and steps: never negative
        return _as_int(value, what)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise StateDictError(f"state for {what} must be a number, got {value!r}")
        return float(value)
    if isinstance(default, str) and not isinstance(value, str):
        raise StateDictError(f"state for {what} must be a str, got {value!r}")
    return value


__all__ = [
    "BlockState",
    "FactorState",
    "ParamState",
    "declare",
    "flatten",
    "flatten_block",
    "join_blocks",
    "merge_shards",
    "mirror_upper_",
    "plan_restore",
    "restore",
    "split_blocks",
]
