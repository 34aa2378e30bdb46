"""Frozen keyword-only configs of the Shampoo optimizer, validated in ``__post_init__``.

Hyperparameters live in torch param-group dicts (so LR schedulers and per-group options work as with
any torch optimizer). :meth:`GroupOptions.from_group` turns one group dict into a validated, typed
:class:`GroupOptions`; the optimizer reads only that object. Config objects (grafting, root solver,
failure policy, exponent override) are frozen dataclasses, never mutable singletons.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch

import matroots
from matroots.core import precision
from matroots.core import psd as _psd
from matroots.core.options import EPS_MODES
from matroots.solvers import CoupledNewtonConfig, EighConfig, SolverConfig
from matroots.solvers.auto import AutoConfig

from .blocking import ExponentOverride
from .checks import check_beta, check_eps
from .errors import InvalidShampooArgumentError
from .grafting import (
    GRAFTINGS,
    AdaGradGrafting,
    AdamGrafting,
    GraftingConfig,
    NoGrafting,
    RMSpropGrafting,
    SGDGrafting,
    resolve_grafting,
)
from .transforms.base import Preconditioner
from .transforms.soap import preconditioner_named

# ----------------------------------------------------------------------------------------------------
# Root solvers


#: Relative forward-error target of ``root_solver="auto"``. Measured (experiments/bench_auto_shampoo.py,
#: digits MLP and ill-conditioned least squares, 200 steps): at 1e-2 the fp32 table sends factors with
#: kappa in [1e4, 1e6) to coupled Newton (eigh misses 1e-2 there) and the root share of the step rose
#: from 48% to 80% with the same validation loss (to 4 digits); at 1e-1 every factor gets eigh.
AUTO_TARGET = 1e-1


def default_root_solver(name: str, device: torch.device | None = None) -> SolverConfig:
    """The solver config a name stands for in Shampoo.

    * ``"eigh"``: ``EighConfig()``. Factor statistics are PSD and often rank deficient (early steps,
      small batches); rounded to fp32 their smallest eigenvalues come out slightly negative. That is
      handled for every solver alike by the optimizer's ``psd`` option (default ``"shift"``, see
      :mod:`matroots.core.psd`), passed to each solve; eigh needs no clamp of its own.
    * ``"auto"``: ``matroots.solvers.AutoConfig``: per factor, the configuration the measured
      selection table of the factor's device names for its (root dtype, n, estimated kappa, p) at
      :data:`AUTO_TARGET` (relative forward error of the root; :mod:`matroots.solvers.auto`). kappa
      comes from the previous root when there is one (warm start), else from a cheap estimate, so the
      choice follows the factor's conditioning from round to round. Outside the table (or without a
      table for the device): eigh on CPU, coupled Newton on accelerators. The configuration chosen
      per block is ``FactorState.solver`` (``opt.diagnostics()``), e.g. ``"auto:eigh[...]"``.
    * any other registered name: that solver with its defaults.

    Pass a config object for full control.
    """
    key = name.lower()
    if key == "auto":
        # warn=False: a factor whose target the table cannot promise is normal (rank-deficient factors);
        # it gets the most accurate candidate and the diagnostics say which.
        on_cpu = device is None or device.type in ("cpu", "meta")
        fallback = EighConfig() if on_cpu else CoupledNewtonConfig()
        return AutoConfig(target=AUTO_TARGET, fallback=fallback, warn=False)
    if key == "eigh":
        return EighConfig()
    if key == "coupled_newton":
        return CoupledNewtonConfig()
    return matroots.resolve_method(key)


def resolve_root_solver(value: str | SolverConfig, device: torch.device | None = None) -> SolverConfig:
    """A matroots solver config from a name (see :func:`default_root_solver`) or a config."""
    if isinstance(value, SolverConfig):
        return value
    if isinstance(value, str):
        return default_root_solver(value, device)
    raise InvalidShampooArgumentError("root_solver", value, "a matroots solver name or config")


@dataclass(frozen=True, kw_only=True)
class FailurePolicy:
    """What happens when a root computation raises, returns non-finite values or does not converge.

    The failed block keeps its previous root (identity, i.e. the graft direction, before its first
    one) and the ``fallback`` solver is tried in ``fallback_dtype``. A round in which a factor gets no
    usable root from either solver is a *failure*; ``max_consecutive_failures`` of them in a row raise
    :class:`~shampoo.errors.RootComputationError`. Rounds in which only the configured solver failed
    are counted separately (diagnostics: ``primary_failures``); set ``max_consecutive_primary_failures``
    to also raise on those.

    Only numerical failures are caught: ``matroots.MatrootsNumericalError`` and ``torch.linalg.LinAlgError``.
    Any other exception is a bug and propagates. A root counts as failed when the solver raises one of
    those, reports ``converged=False``, or returns non-finite entries (even if it claims convergence).
    The fallback solves the same matrix as the primary: the group's ``eps`` and ``psd`` policy apply.
    """

    fallback: SolverConfig | None = field(default_factory=EighConfig)
    fallback_dtype: torch.dtype = torch.float64
    max_consecutive_failures: int = 5
    max_consecutive_primary_failures: int | None = None

    def __post_init__(self) -> None:
        if self.fallback is not None and not isinstance(self.fallback, SolverConfig):
            object.__setattr__(self, "fallback", resolve_root_solver(self.fallback))
        object.__setattr__(self, "fallback_dtype", precision.as_dtype(self.fallback_dtype))
        if not isinstance(self.max_consecutive_failures, int) or self.max_consecutive_failures < 1:
            raise InvalidShampooArgumentError(
                "max_consecutive_failures", self.max_consecutive_failures, "an int >= 1"
            )
        m = self.max_consecutive_primary_failures
        if m is not None and (not isinstance(m, int) or m < 1):
            raise InvalidShampooArgumentError("max_consecutive_primary_failures", m, "None or an int >= 1")


# ----------------------------------------------------------------------------------------------------
# Diagnostics


@dataclass(frozen=True, kw_only=True)
class DiagnosticsConfig:
    """Optimizer-wide diagnostics options.

    Args:
        log_level: level of the per-factor lines logged at each root computation (a one-line summary
            is logged at INFO, failures at WARNING).
        dump_every: write the factor matrices every this many optimizer steps (0: never) to
            ``dump_dir`` in the .npz layout :mod:`shampoo.diagnostics` documents.
        dump_dir: directory of the dumps (created when needed).
        kappa_power_iters: power-iteration steps of the per-factor condition number estimate, for
            solvers that do not report the spectrum of the matrix they solved (eigh reports it, and
            its kappa is then exact: :func:`shampoo.roots.solve_batch`).
    """

    log_level: int = logging.DEBUG
    dump_every: int = 0
    dump_dir: str | Path | None = None
    kappa_power_iters: int = 20

    def __post_init__(self) -> None:
        if not isinstance(self.dump_every, int) or self.dump_every < 0:
            raise InvalidShampooArgumentError("dump_every", self.dump_every, "an int >= 0")
        if self.dump_every and self.dump_dir is None:
            raise InvalidShampooArgumentError("dump_dir", self.dump_dir, "a directory when dump_every > 0")
        if self.kappa_power_iters < 1:
            raise InvalidShampooArgumentError("kappa_power_iters", self.kappa_power_iters, ">= 1")


# ----------------------------------------------------------------------------------------------------
# Per-group options

VECTOR_POLICIES = ("diagonal", "graft", "shampoo")
PSD_POLICIES = _psd.PSD_POLICIES

# Group keys whose values define the block layout and state shapes: fixed once state exists.
STRUCTURAL_KEYS = (
    "max_preconditioner_dim",
    "merge_dims",
    "exponent_override",
    "vector_policy",
    "row_shards",
    "factor_dtype",
)
# Group keys holding config objects or dtypes (not restored from a state dict; see load_state_dict).
CONFIG_KEYS = (
    *STRUCTURAL_KEYS, "grafting", "root_solver", "root_dtype", "failure", "preconditioner", "statistics_dtype",
)  # fmt: skip
STATISTICS_DTYPES = (torch.bfloat16,)


def _check_lr(lr: Any) -> None:
    if not (isinstance(lr, int | float | torch.Tensor) and 0.0 <= float(lr) < math.inf):
        raise InvalidShampooArgumentError("lr", lr, "a finite number >= 0")


def _number(value: Any, name: str, allowed: str) -> float:
    """``value`` (a real number or a one-element tensor) as a float; InvalidShampooArgumentError otherwise."""
    ok = isinstance(value, int | float) or (isinstance(value, torch.Tensor) and value.numel() == 1)
    if isinstance(value, bool) or not ok or (isinstance(value, torch.Tensor) and value.is_complex()):
        raise InvalidShampooArgumentError(name, value, allowed)
    return float(value)


@dataclass(frozen=True, kw_only=True)
class GroupOptions:
    """Validated options of one param group. See :class:`shampoo.Shampoo` for their meaning.

    Options that reduce the statistics work (off by default; their measured costs and effect on the
    validation loss are in docs/design.md §6, "Cheaper statistics"):

    ``statistics_frequency`` (int k >= 1, default 1): the Kronecker factors are updated only at the
    parameter steps t with ``(t - start_preconditioning_step) % k == 0``, as Google's scalable_shampoo
    ``statistics_compute_steps`` (Anil et al. 2020, "Scalable second order optimization for deep
    learning", §5: statistics and preconditioners computed every few steps to amortise them).

    * Which gradient enters: the gradient of the updating step alone (after maximize and L2 weight
      decay); the other steps' gradients do not enter the factors (they are not summed: a sum of
      gradients would not give their statistics). The first moment, the grafting state and the
      diagonal accumulators of vector blocks still see every step's gradient.
    * beta2 and bias correction count updates: L <- beta2 L + (1 - beta2) G G^T at each update, so
      after u updates the factor is (1 - beta2) sum_j beta2^(u-j) G_j G_j^T (an EMA over
      k / (1 - beta2) steps; pass beta2^k to keep the horizon in steps), divided before its root by
      1 - beta2^u with u = :func:`shampoo.transforms.kronecker.statistics_updates` (t) (the number of
      updating steps in [1, t]); beta2 = 1 sums the updating steps' G G^T.
    * precondition_frequency and start_preconditioning_step: the first update is at step
      1 + (start - 1) % k <= start, so the first root never sees empty statistics, and when k divides
      ``precondition_frequency`` every root round follows an update in the same step; otherwise a root
      is computed from statistics up to k - 1 steps old (allowed; k > precondition_frequency
      recomputes some roots from unchanged statistics).
    * Checkpoints and distribution: the schedule is a closed form of the parameter step, k and
      ``start % k`` (no extra state), so a run resumed mid-period is bitwise the uninterrupted one,
      and every rank updates the same steps. k and start % k are fixed once the group has state.

    ``statistics_dtype`` (None or torch.bfloat16, default None): G is rounded to bf16 and G G^T is
    accumulated and stored in ``factor_dtype`` (fp32): a bf16 GEMM with fp32 accumulation. The
    products of bf16 values are exact in fp32, so the only new error is the rounding of G (at most
    2^-8 relative per entry, so at most ~2^-7 (|G| |G|^T)_ij per factor entry); the GEMM's sums are
    fp32 as before. On CUDA one ``baddbmm`` with bf16 inputs and ``out_dtype`` fp32 (tensor cores);
    on CPU torch has no bf16 x bf16 -> fp32 kernel, so the rounded G goes through the fp32 kernel:
    same result, no saving.

    A symmetric-product path for G G^T (BLAS ``?syrk``) is not offered: its thread pool fights
    torch's (see docs/design.md §6).
    """

    lr: float
    betas: tuple[float, float]
    eps: float
    eps_mode: str
    weight_decay: float
    decoupled_weight_decay: bool
    momentum: float
    nesterov: bool
    use_bias_correction: bool
    max_preconditioner_dim: int
    merge_dims: bool
    exponent_override: ExponentOverride
    vector_policy: str
    diagonal_eps: float
    precondition_frequency: int
    start_preconditioning_step: int
    grafting: GraftingConfig
    root_solver: SolverConfig
    factor_dtype: torch.dtype
    root_dtype: torch.dtype
    warm_start: bool
    failure: FailurePolicy = field(default_factory=FailurePolicy)
    psd: str | None = "shift"
    maximize: bool = False
    statistics_frequency: int = 1
    statistics_dtype: torch.dtype | None = None
    # A per-block preconditioner transform replacing the Kronecker one of the group's Shampoo blocks
    # (the interface: shampoo.transforms.Preconditioner); None: Kronecker factors.
    preconditioner: Any = None
    # Cut dim 0 into this many torch.chunk pieces before blocking (shampoo.blocking, step 3); None:
    # as the parameter is sharded (1 on one process, the shard count of a fully_shard'ed parameter).
    row_shards: int | None = None

    def __post_init__(self) -> None:
        self._check_update_rule()
        self._check_blocking_and_schedule()
        self._check_formats_and_configs()

    def _check_update_rule(self) -> None:
        """lr, betas, eps (stored as the float matroots' rule returns), eps_mode, psd, weight decay,
        the flags and momentum."""
        _check_lr(self.lr)
        if len(self.betas) != 2:
            raise InvalidShampooArgumentError("betas", self.betas, "a pair (beta1, beta2)")
        check_beta(self.betas[0], "betas[0] (gradient EMA)", allow_one=False)
        check_beta(self.betas[1], "betas[1] (factor EMA; 1.0 = sum)", allow_one=True)
        if self.betas[1] == 0.0:
            raise InvalidShampooArgumentError(
                "betas[1]", self.betas[1], "> 0 (0 would keep only the last gradient's statistics)"
            )
        object.__setattr__(self, "eps", check_eps(self.eps, "eps"))
        object.__setattr__(self, "diagonal_eps", check_eps(self.diagonal_eps, "diagonal_eps"))
        if self.eps_mode not in EPS_MODES:
            raise InvalidShampooArgumentError("eps_mode", self.eps_mode, f"one of {EPS_MODES}")
        if self.psd is not None and self.psd not in PSD_POLICIES:
            raise InvalidShampooArgumentError(
                "psd",
                self.psd,
                f"one of {PSD_POLICIES} (see matroots.core.psd) or None (the root solver config's own policy)",
            )
        object.__setattr__(self, "weight_decay", check_eps(self.weight_decay, "weight_decay"))
        flags = ("decoupled_weight_decay", "nesterov", "use_bias_correction", "merge_dims")
        flags += ("warm_start", "maximize")
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise InvalidShampooArgumentError(name, getattr(self, name), "True or False")
        check_beta(self.momentum, "momentum", allow_one=False)
        if self.nesterov and self.momentum <= 0:
            raise InvalidShampooArgumentError(
                "nesterov", self.nesterov, "False when momentum is 0 (Nesterov needs heavy-ball momentum > 0)"
            )

    def _check_blocking_and_schedule(self) -> None:
        """Block sizes, vectors and row shards; the root and statistics schedules and formats."""
        if not isinstance(self.max_preconditioner_dim, int) or self.max_preconditioner_dim < 1:
            raise InvalidShampooArgumentError(
                "max_preconditioner_dim", self.max_preconditioner_dim, "an int >= 1"
            )
        if self.vector_policy not in VECTOR_POLICIES:
            raise InvalidShampooArgumentError(
                "vector_policy", self.vector_policy, f"one of {VECTOR_POLICIES}"
            )
        r = self.row_shards
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 1):
            raise InvalidShampooArgumentError(
                "row_shards",
                r,
                "None (as the parameters are sharded) or an int >= 1 (cut dim 0 into that many "
                "torch.chunk pieces before blocking)",
            )
        if not isinstance(self.precondition_frequency, int) or self.precondition_frequency < 1:
            raise InvalidShampooArgumentError(
                "precondition_frequency", self.precondition_frequency, "an int >= 1"
            )
        s = self.start_preconditioning_step
        if not isinstance(s, int) or s < 1:
            raise InvalidShampooArgumentError("start_preconditioning_step", s, "an int >= 1")
        k = self.statistics_frequency
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidShampooArgumentError(
                "statistics_frequency", k, "an int >= 1 (update the Kronecker factors every k steps)"
            )
        sd = self.statistics_dtype
        if sd is not None and sd not in STATISTICS_DTYPES:
            raise InvalidShampooArgumentError(
                "statistics_dtype",
                sd,
                "None (G G^T in factor_dtype) or torch.bfloat16 (bf16 inputs, accumulation in factor_dtype)",
            )
        if sd is not None and self.factor_dtype not in (torch.float32, torch.float64):
            raise ValueError(
                f"statistics_dtype={sd} needs factor_dtype float32 or float64 (the accumulation format), "
                f"got factor_dtype={self.factor_dtype}"
            )

    def _check_formats_and_configs(self) -> None:
        """The factor and root dtypes and the config objects (root solver, grafting, failure,
        preconditioner)."""
        for name in ("factor_dtype", "root_dtype"):
            dt = getattr(self, name)
            if dt not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
                raise InvalidShampooArgumentError(name, dt, "a floating torch dtype")
        if not isinstance(self.root_solver, SolverConfig):
            raise InvalidShampooArgumentError("root_solver", self.root_solver, "a matroots SolverConfig")
        if not isinstance(self.grafting, GraftingConfig):
            raise InvalidShampooArgumentError("grafting", self.grafting, "a GraftingConfig")
        if not isinstance(self.failure, FailurePolicy):
            raise InvalidShampooArgumentError("failure", self.failure, "a FailurePolicy")
        if self.preconditioner is not None and not isinstance(self.preconditioner, Preconditioner):
            raise InvalidShampooArgumentError(
                "preconditioner",
                self.preconditioner,
                "a per-block transform (shampoo.transforms.Preconditioner: init, update, direction, bind, "
                "ready, refresh, accumulators; a subclass of it inherits the last four) or None",
            )

    def with_lr(self, lr: Any) -> GroupOptions:
        """These options with another ``lr``, checked as :meth:`from_group` checks it, without
        validating the other values again (what an LR scheduler changes every step)."""
        new = copy.copy(self)
        value = _number(lr, "lr", "a finite number >= 0")
        _check_lr(value)
        object.__setattr__(new, "lr", value)
        return new

    @property
    def beta1(self) -> float:
        return float(self.betas[0])

    @property
    def beta2(self) -> float:
        return float(self.betas[1])

    def structure(self) -> tuple[Any, ...]:
        """The values that fix the block layout and the shapes of the state."""
        return (
            self.max_preconditioner_dim,
            self.merge_dims,
            self.exponent_override,
            self.vector_policy,
            self.row_shards,
            self.factor_dtype,
            self.grafting.kind,
            type(self.preconditioner).__qualname__,
            self.beta1 > 0,
            self.momentum > 0,
            # the statistics schedule (a closed form of the step; see statistics_frequency)
            self.statistics_frequency,
            self.start_preconditioning_step % self.statistics_frequency,
        )

    @classmethod
    def from_group(cls, group: Mapping[str, Any]) -> GroupOptions:
        """Build from a torch param-group dict (already normalised by :func:`normalise_group`)."""
        kw = {f.name: group[f.name] for f in dataclasses.fields(cls) if f.name in group}
        kw["lr"] = _number(kw["lr"], "lr", "a finite number >= 0")
        betas = kw["betas"]
        if not isinstance(betas, tuple | list) or len(betas) != 2:
            raise InvalidShampooArgumentError("betas", betas, "a pair (beta1, beta2)")
        what = "a pair (beta1, beta2) of numbers in [0, 1)"
        kw["betas"] = (_number(betas[0], "betas", what), _number(betas[1], "betas", what))
        return cls(**kw)


def normalise_group(group: dict[str, Any], device: torch.device | None) -> None:
    """Replace names by config objects in a param-group dict, in place (then validate it)."""
    group["grafting"] = resolve_grafting(group["grafting"])
    group["root_solver"] = resolve_root_solver(group["root_solver"], device)
    if isinstance(group.get("preconditioner"), str):  # a name ("soap"): its transform
        group["preconditioner"] = preconditioner_named(group["preconditioner"])
    group["exponent_override"] = ExponentOverride.from_mapping(group["exponent_override"])
    group["factor_dtype"] = precision.as_dtype(group["factor_dtype"])
    group["root_dtype"] = precision.as_dtype(group["root_dtype"])
    if group.get("statistics_dtype") is not None:
        try:
            group["statistics_dtype"] = precision.as_dtype(group["statistics_dtype"])
        except ValueError as exc:
            raise InvalidShampooArgumentError(
                "statistics_dtype", group["statistics_dtype"], "None or torch.bfloat16"
            ) from exc
    if group["failure"] is None:
        group["failure"] = FailurePolicy()
    if isinstance(group["betas"], list):
        group["betas"] = tuple(group["betas"])
    opts = GroupOptions.from_group(group)
    if opts.root_solver.capabilities.integer_p:
        # Newton methods need integer p = 1/e: check the overrides early, not at the first root.
        for _order, val in opts.exponent_override.entries:
            for e in [val] if not isinstance(val, tuple) else [v for _, v in val]:
                if e and Fraction(e).limit_denominator(10**6) ** -1 % 1:
                    raise ValueError(
                        f"root solver {opts.root_solver.name!r} needs integer roots p = 1/e, but "
                        f"exponent_override has e={e}; use root_solver='eigh' for rational exponents"
                    )


def config_to_dict(value: Any) -> Any:
    """A plain (picklable with ``weights_only=True``) description of a config object."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"__config__": type(value).__name__}
        for f in dataclasses.fields(value):
            out[f.name] = config_to_dict(getattr(value, f.name))
        return out
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return tuple(config_to_dict(v) for v in value)
    return value


__all__ = [
    "CONFIG_KEYS",
    "GRAFTINGS",
    "STRUCTURAL_KEYS",
    "VECTOR_POLICIES",
    "AdaGradGrafting",
    "AdamGrafting",
    "DiagnosticsConfig",
    "ExponentOverride",
    "FailurePolicy",
    "GraftingConfig",
    "GroupOptions",
    "NoGrafting",
    "RMSpropGrafting",
    "SGDGrafting",
    "config_to_dict",
    "default_root_solver",
    "normalise_group",
    "resolve_grafting",
    "resolve_root_solver",
]
