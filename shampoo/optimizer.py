"""The Shampoo optimizer: a torch.optim.Optimizer whose step is a short pipeline of batched stages.

Per param group, one step is (Gupta et al. 2018; Anil et al. 2020; Shi et al. 2023, Alg. 1):

1. gradients: skip parameters whose gradient is non-finite (counted warning); L2 weight decay
   g <- g + wd w when ``decoupled_weight_decay=False``;
2. statistics (per bucket of same-shape blocks, batched): gradient EMA m (beta1), grafting state,
   diagonal accumulators, Kronecker factors L_i <- beta2 L_i + (1 - beta2) G_(i) G_(i)^T;
3. roots: every ``precondition_frequency`` steps from ``start_preconditioning_step`` on, the inverse
   roots of the due factors, batched per (n, p), with warm starts and the failure policy
   (:mod:`shampoo.refresh`); with ``root_schedule="async"`` the round is solved on a background
   thread from a snapshot and installed ``max_root_delay`` steps later (:mod:`shampoo.root_pipeline`);
4. directions (batched): Shampoo (or diagonal) direction of m_hat, rescaled per block to the norm of
   the grafting direction; the grafting direction alone before preconditioning starts;
5. assembly: block directions are written into one direction tensor per parameter
   (:meth:`Shampoo._assemble_directions`, the one place a distributed all-gather slots in);
6. update: heavy-ball ``momentum`` (``nesterov``), decoupled weight decay w <- (1 - lr wd) w, and
   w <- w - lr d; a parameter whose direction is non-finite is skipped (counted warning). On one
   process without momentum, for contiguous parameters of their state's dtype (fp32, fp64), 5 and
   6 are one pass: w <- w - lr s_j D_j straight from the buckets
   (``ShampooImplementation.apply_from_buckets``; the direction tensors stay allocated, unused). The
   apply path is chosen once per group and step (:meth:`Shampoo._apply_path`). On one process the finiteness of the directions is
   proved from the grafting norms (:meth:`shampoo.engine.GroupEngine.finite_directions`) instead of
   tested by a pass.

Stages 2-4 run only on blocks this process owns (:meth:`Shampoo._owns`); in a single process it owns
all of them. Beside this module: the constructor's argument checks (:mod:`shampoo.arguments`), stage 6
(:mod:`shampoo.update`), the state dict's packing, checks and key matching (:mod:`shampoo.state_dict`)
and the step's timing (:class:`shampoo.diagnostics.StepTiming`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import update
from .arguments import (
    IMPL_FLAGS,
    check_diagnostics,
    check_distributed,
    check_group_params,
    check_impl_flags,
    unknown_option_error,
)
from .blocking import BlockSpec
from .config import DiagnosticsConfig, FailurePolicy, GroupOptions, normalise_group
from .diagnostics import BlockDiagnostics, StepTiming, block_diagnostics, dump_factors, to_frame
from .distributed import BlockSharding, DDPConfig
from .engine import BucketDirections, GroupEngine
from .errors import ShampooError
from .fsdp import FSDPConfig, FSDPSharding
from .implementation import ShampooImplementation, resolve_implementation
from .option_cache import OptionsCache
from .root_pipeline import GroupRounds, RootPipeline, RootStatus, check_schedule
from .state_dict import (
    check_state_dict,
    gathered_schedule,
    loaded_group,
    pack_groups,
    param_state,
    restore_plans,
    saved_step,
    split_saved,
)
from .transforms.kronecker import statistics_updates

log = logging.getLogger("shampoo")


class Shampoo(torch.optim.Optimizer):
    """Shampoo with blocked Kronecker preconditioners, grafting, momentum and a matroots root solver.

    Args:
        params: parameters, ``named_parameters()`` (recommended: the state dict is then keyed by
            name, so it survives reordering) or param-group dicts.
        lr: learning rate.
        betas: (beta1, beta2). beta1: EMA of the gradient that is preconditioned (Adam's first moment;
            0 disables it). beta2: EMA of the Kronecker factors and diagonal accumulators; 1.0 sums
            them, as AdaGrad does.
        eps: regularisation of the factors, A + eps I (``eps_mode`` "absolute", or "relative":
            eps lambda_max(A)), passed to the root solver, on top of the ``psd`` shift.
        psd: rank-deficiency policy of the factors, the same for every root solver and the fallback
            (:mod:`matroots.core.psd`): ``"shift"`` (default) shifts a factor whose smallest eigenvalue is
            below the floor f = n u ||A||_F by a certified amount (Cholesky test; eigh: its own
            eigenvalues) so that it is >= f, then adds eps; ``"meta"`` reproduces Meta's
            DistributedShampoo (shift by -lambda_min when lambda_min < 0, then eps; no floor); ``"none"`` adds only eps (SPD methods then fail on singular factors and
            the failure policy takes over); None uses the root solver config's own ``psd`` field.
        weight_decay, decoupled_weight_decay: decoupled (AdamW: w <- (1 - lr wd) w) or L2
            (g <- g + wd w) weight decay.
        momentum, nesterov: heavy-ball momentum on the final search direction (torch.optim.SGD's
            semantics, dampening 0); ``nesterov`` needs momentum > 0.
        use_bias_correction: divide the gradient EMA by 1 - beta1^t, the factors (before their roots),
            diagonal accumulators and Adam grafting's second moment by 1 - beta2^t.
        max_preconditioner_dim, merge_dims, exponent_override, vector_policy: blocking, see
            :mod:`shampoo.blocking` and :class:`shampoo.ExponentOverride` (a mapping
            ``{order: e or {dim: e}}`` is accepted; e = 0 means "do not precondition this dim").
        row_shards: cut dim 0 of every parameter into this many ``torch.chunk`` pieces before
            blocking, so no block straddles two (the blocking of ``fully_shard``ed parameters
            on that many ranks, reproduced on one process); None: as the parameters are sharded
            (1 for plain tensors). See :mod:`shampoo.fsdp`.
        diagonal_eps: eps of the diagonal preconditioner of ``vector_policy="diagonal"`` blocks.
        precondition_frequency: recompute the roots every this many steps.
        start_preconditioning_step: first step that uses (and computes) roots; before it the update is
            the grafting method alone. Default: ``precondition_frequency``.
        grafting: "none", "sgd", "adagrad", "rmsprop", "adam" or a grafting config with its own
            eps/beta2 (e.g. ``AdamGrafting(beta2=0.99, eps=1e-8)``).
        root_solver: a matroots solver name or config (``"eigh"``, ``"coupled_newton"``,
            ``"schur_newton"``, ``"auto"``, ``matroots.CoupledNewtonConfig(...)``); see
            :func:`shampoo.config.default_root_solver` for what the names mean here.
        factor_dtype: dtype of the factor statistics; root_dtype: working precision of the roots.
            All other state (first moment, grafting and diagonal accumulators, stored roots,
            momentum) is kept in the parameter's dtype, or float32 for fp16/bf16 parameters (see
            :func:`shampoo.engine.state_dtype`), so 16-bit models train.
        warm_start: warm-start the root solver from the previous root where it supports it.
        failure: a :class:`FailurePolicy` (fallback solver, consecutive-failure limit).
        diagnostics: a :class:`DiagnosticsConfig` (log level, factor dumps); optimizer-wide.
        implementation: a :class:`shampoo.ShampooImplementation`, the fast paths this optimizer's
            step takes (fused Adam grafting, the update applied from the buckets, trusted factors,
            the root round's chunk size); None: all on, chunks of 8 MiB. Optimizer-wide and frozen,
            like torch.optim's ``foreach``/``fused``: two optimizers in one process may differ.
        root_schedule: ``"sync"`` (default): a due root round is computed in the step that needs it.
            ``"async"``: it is computed on a background thread from a copy of the bias-corrected
            factors taken at the step it falls due (step t), and installed at the start of step
            t + ``max_root_delay``, waiting for it if it is not finished; the steps in between use
            the previous roots. At most one round per block in flight (a block falling due while its
            round is pending is submitted at that round's install). ``max_root_delay=0`` computes
            in the step: the synchronous optimizer, bit for bit. The failure policy (fallback,
            counters, warnings, errors) acts at install, in the training thread. Optimizer-wide;
            see :mod:`shampoo.root_pipeline` and docs/design.md §6.
        root_threads: the background thread's intra-op thread budget (``torch.set_num_threads`` is
            per thread: the training thread keeps its own). root_timeout: seconds an install waits
            for its round before :class:`shampoo.errors.RootRoundTimeoutError` (None: no limit).
        distributed: a :class:`shampoo.DDPConfig` for data-parallel Shampoo (each rank computes its
            blocks' statistics, roots and directions; one all-gather shares them, see
            :mod:`shampoo.distributed`; gradients must already be identical on every rank:
            DistributedDataParallel, or an all-reduce before ``step``), a :class:`shampoo.FSDPConfig`
            for a ``fully_shard``ed (FSDP2/HSDP) model (each rank preconditions blocks of its own
            shard, see :mod:`shampoo.fsdp`), or None for a single process.
        maximize: maximise the objective (the gradient is negated before the statistics, as in
            torch.optim; the factors G G^T do not change, the direction flips).
        statistics_frequency: update the Kronecker factors every this many steps (at the steps t
            with (t - start_preconditioning_step) % k == 0, with that step's gradient; beta2 and the
            bias correction count updates). statistics_dtype: None or torch.bfloat16 (G rounded to
            bf16, G G^T accumulated in factor_dtype). Exact semantics and measured costs:
            :class:`shampoo.config.GroupOptions`.
        preconditioner: None (Kronecker factors and their inverse roots) or a per-block
            preconditioner transform replacing them in the group's Shampoo blocks: ``"soap"`` or a
            :class:`shampoo.SOAP` config (eigenvalue-corrected Shampoo), or any
            :class:`shampoo.transforms.Preconditioner`.
        foreach, fused, capturable, differentiable: torch.optim's implementation flags. Shampoo always
            uses the ``torch._foreach_*`` kernels, so ``foreach`` may be None or True (False is
            refused); ``fused=True``, ``capturable=True`` (CUDA-graph capture: the failure policy
            syncs with the host) and ``differentiable=True`` (the step runs under no_grad and the
            root solvers are not traced) are refused with a ValueError.

    A keyword that is none of these raises :class:`shampoo.UnknownOptionError` (a TypeError) naming
    the closest option.

    Every option except ``diagnostics``, ``distributed``, the root schedule (``root_schedule``,
    ``max_root_delay``, ``root_threads``, ``root_timeout``) and the implementation flags can be set per
    param group (they are the fields of :class:`shampoo.config.GroupOptions`, the one definition of
    the hyperparameters and their validation).

    Conformance with torch.optim (tests/test_optim_conformance.py): param groups, LR schedulers, the
    ``state_dict``/``load_state_dict`` pre and post hooks, ``copy.deepcopy`` and pickle, state dicts
    moved between optimizers built with and without names (and with the ``_orig_mod.`` prefix of a
    ``torch.compile``d model), ``param_names`` kept in the saved groups, entries of ``opt.state`` that
    are not a parameter's (a hook's) saved and loaded as they are, ``opt.state`` holding the
    parameters that have stepped or loaded. Differences: ``opt.state[p]`` is a typed
    :class:`shampoo.state.ParamState`, also a read-only mapping of its saved entries (``len``,
    iteration, ``["step"]``); the state dict's tensors are copies (torch's alias the live state),
    loading keeps this optimizer's ``param_names`` (they key its state), a parameter repeated in a
    group is refused (torch warns, then steps it twice), complex parameters are refused (the Kronecker factors are real; keep such a
    weight as a real tensor and ``torch.view_as_complex`` it in ``forward``), and parameters on the
    meta device are refused at the first step or state load (they hold no data).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-12,
        *,
        eps_mode: str = "absolute",
        psd: str | None = "shift",
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = True,
        momentum: float = 0.0,
        nesterov: bool = False,
        use_bias_correction: bool = True,
        max_preconditioner_dim: int = 1024,
        merge_dims: bool = True,
        exponent_override: Any = None,
        vector_policy: str = "diagonal",
        diagonal_eps: float = 1e-10,
        precondition_frequency: int = 100,
        start_preconditioning_step: int | None = None,
        grafting: Any = "adam",
        root_solver: Any = "eigh",
        factor_dtype: torch.dtype = torch.float32,
        root_dtype: torch.dtype = torch.float32,
        warm_start: bool = True,
        failure: FailurePolicy | None = None,
        diagnostics: DiagnosticsConfig | None = None,
        implementation: ShampooImplementation | None = None,
        distributed: Any = None,
        root_schedule: str = "sync",
        max_root_delay: int = 1,
        root_threads: int = 1,
        root_timeout: float | None = None,
        maximize: bool = False,
        statistics_frequency: int = 1,
        statistics_dtype: torch.dtype | None = None,
        preconditioner: Any = None,
        row_shards: int | None = None,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise unknown_option_error(next(iter(unknown)), Shampoo.__init__)
        check_impl_flags(foreach=foreach, fused=fused, capturable=capturable, differentiable=differentiable)
        check_distributed(distributed)
        self._sharding = BlockSharding(distributed) if isinstance(distributed, DDPConfig) else None
        self._fsdp = FSDPSharding(distributed) if isinstance(distributed, FSDPConfig) else None
        self._impl = resolve_implementation(implementation)
        self._diag = check_diagnostics(diagnostics)
        check_schedule(root_schedule, max_root_delay)
        self._roots = (
            RootPipeline(max_root_delay, root_threads, root_timeout) if root_schedule == "async" else None
        )
        self._engines: list[GroupEngine | None] = []
        self._options: list[OptionsCache] = []  # per group: its GroupOptions, rebuilt when it changes
        self._global_step = 0
        self.timing = StepTiming()
        # the hyperparameters are the fields of GroupOptions (one definition; validated there)
        arguments = locals()
        defaults = {f.name: arguments[f.name] for f in dataclasses.fields(GroupOptions)}
        super().__init__(params, defaults)

    # -- copy and pickle -----------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the hooks (as torch.optim: hooks are not copied or pickled): the engines,
        step counter, timing and configs go with it, so a copy steps on exactly like the original."""
        hooks = {k for k in self.__dict__ if k.startswith("_optimizer_") and k.endswith("_hooks")}
        out = {k: v for k, v in self.__dict__.items() if k not in hooks}
        if self._roots is not None:  # no thread in a copy: the schedule and rounds in flight as data
            r = self._roots
            out["_roots"] = (r.delay, r.threads, r.timeout, r.export(self._engines))
        return out

    def __setstate__(self, state: dict[str, Any]) -> None:
        roots = state.get("_roots")
        state = {**state, "_roots": None}
        super().__setstate__(state)  # restores the hook dicts and the step-function patching
        if "_options" not in self.__dict__:  # pickled before the options were cached
            self._options = [OptionsCache() for _ in self.param_groups]
        if roots is not None:  # the copy solves its rounds in flight again and installs them on time
            delay, threads, timeout, data = roots
            self._roots = RootPipeline(delay, threads, timeout)
            self._roots.load(data, self._engines, self._group_options, self._diag)

    def _group_options(self, gi: int) -> GroupOptions:
        return GroupOptions.from_group(self.param_groups[gi])

    # -- groups ---------------------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if group["start_preconditioning_step"] is None:
            group["start_preconditioning_step"] = group["precondition_frequency"]
        check_impl_flags(**{k: group[k] for k in IMPL_FLAGS if k in group})
        check_group_params(group["params"])
        device = group["params"][0].device if group["params"] else None
        normalise_group(group, device)
        self._engines.append(None)
        self._options.append(OptionsCache())

    def _param_keys(self) -> list[list[str | int]]:
        """Per group, the state-dict key of each parameter: its name, or its global position."""
        named = all("param_names" in g for g in self.param_groups)
        keys, pos = [], 0
        for g in self.param_groups:
            if named:
                keys.append(list(g["param_names"]))
            else:
                keys.append(list(range(pos, pos + len(g["params"]))))
            pos += len(g["params"])
        flat = [k for ks in keys for k in ks]
        if len(set(flat)) != len(flat):
            raise ValueError("parameter names must be unique across param groups")
        return keys

    def _owns(self, spec: BlockSpec) -> bool:
        """Whether this process computes the block's statistics, roots and direction."""
        sharding = self._sharding if self._fsdp is None else self._fsdp.gatherer
        return sharding is None or sharding.owns(spec, self.param_groups)

    def _engine(self, gi: int, opts: GroupOptions) -> GroupEngine:
        eng = self._engines[gi]
        if eng is None:
            eng = self._engines[gi] = self._new_engine(gi, opts)
        elif eng.structure != opts.structure():
            raise ShampooError(
                f"param group {gi}: blocking/state options changed after the state was created "
                f"({eng.structure} -> {opts.structure()}); they are fixed once the optimizer has stepped"
            )
        return eng

    def _new_engine(self, gi: int, opts: GroupOptions) -> GroupEngine:
        """Group ``gi``'s engine with fresh state (not installed)."""
        meta = [i for i, p in enumerate(self.param_groups[gi]["params"]) if p.device.type == "meta"]
        if meta:
            raise ValueError(
                f"param group {gi}: parameters {meta[:5]} are on the meta device (no data); "
                "materialise the model (e.g. model.to_empty(device=...) and initialise it) before "
                "stepping Shampoo or loading its state"
            )
        first = sum(len(g["params"]) for g in self.param_groups[:gi])
        params, layouts = list(self.param_groups[gi]["params"]), None
        if self._fsdp is None:
            return GroupEngine(params, self._param_keys()[gi], first, opts, self._owns, layouts, self._impl)
        # the local shards, blocked as the whole parameters are ("owner": the whole gradients)
        self._fsdp.setup(self.param_groups)
        layouts = self._fsdp.layouts(params, first, opts)
        tensors = self._fsdp.engine_tensors(gi, params)
        eng = GroupEngine(tensors, self._param_keys()[gi], first, opts, self._owns, layouts, self._impl)
        self._fsdp.localise(eng, params)
        return eng

    # -- step -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Perform one optimization step. See the module docstring for the pipeline."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t0 = time.perf_counter()
        self._global_step += 1
        try:
            for gi, group in enumerate(self.param_groups):
                self._step_group(gi, group, self._options[gi].get(group))
        except ShampooError as err:
            if self._fsdp is not None:
                self._fsdp.status(err)  # the other ranks raise instead of waiting
            raise
        if self._fsdp is not None:
            self._fsdp.status()
        if self._diag.dump_every and self._global_step % self._diag.dump_every == 0:
            self.dump_factors()
        self.timing.steps += 1
        self.timing.step_seconds += time.perf_counter() - t0
        return loss

    def _step_group(self, gi: int, group: dict[str, Any], opts: GroupOptions) -> None:
        params: list[torch.Tensor] = group["params"]
        idx = [i for i, p in enumerate(params) if p.grad is not None]
        if not idx:
            return
        eng = self._engine(gi, opts)
        for i in idx:  # as torch.optim: opt.state holds the parameters that have stepped (or loaded)
            self.state[params[i]] = eng.states[i]
        grads = self._local([params[i].grad for i in idx])
        if any(g.is_sparse for g in grads):  # type: ignore[union-attr]
            raise ValueError("Shampoo does not support sparse gradients")
        finite = self._agreed(idx, update.all_finite(grads), len(params), "gradients")  # type: ignore[arg-type]
        if not all(finite):
            bad = [eng.states[i] for i, ok in zip(idx, finite, strict=True) if not ok]
            update.skip(bad, "gradient")
            idx = [i for i, ok in zip(idx, finite, strict=True) if ok]
            grads = [g for g, ok in zip(grads, finite, strict=True) if ok]
            if not idx:
                return
        plist = self._local([params[i] for i in idx])
        if opts.maximize:
            grads = list(torch._foreach_neg(grads))  # type: ignore[arg-type]
        if opts.weight_decay and not opts.decoupled_weight_decay:
            grads = list(torch._foreach_add(grads, plist, alpha=opts.weight_decay))  # type: ignore[arg-type]
        for i in idx:
            eng.states[i].step += 1
        if self._fsdp is not None:  # "owner": the whole gradients
            grads = self._fsdp.engine_grads(gi, idx, grads)  # type: ignore[arg-type]
        pipe = self._roots
        rounds = None if pipe is None else GroupRounds(pipe, gi, self._global_step)
        before = (0.0, 0.0, 0.0) if pipe is None else pipe.seconds()
        try:
            outputs, report = eng.block_directions(opts, idx, grads, self._diag, rounds)  # type: ignore[arg-type]
        except ShampooError as err:
            if self._sharding is not None:
                self._sharding.report_failure(eng.plan, err)  # the other ranks raise instead of waiting
            elif self._fsdp is not None:  # in the collectives the other ranks are waiting in
                self._fsdp.failed(eng.plan, len(params), err)
            raise
        finally:
            if pipe is not None:  # training-thread time on roots: preparing, waiting, installing
                self.timing.add_pipeline(pipe.seconds(), before)
        if report is not None:
            self.timing.add_round(report.seconds if pipe is None else None, report.factors)
            log.info(
                "shampoo step %d group %d: %d roots in %.3fs (%d solver failures, %d without a root)",
                self._global_step, gi, report.factors, report.seconds, report.primary_failures, report.failures,
            )  # fmt: skip
        path = self._apply_path(opts, plist)
        if path == "gathered":
            update.apply_directions(eng, opts, idx, plist, self._assemble_directions(eng, idx, outputs))
        elif path == "assembled":
            assert self._fsdp is not None
            dirs = self._fsdp.assemble(eng.plan, idx, outputs, len(params))
            finite = update.all_finite(dirs)  # "owner": of the whole directions, the same on every rank
            if not self._fsdp.owner:
                finite = self._agreed(idx, finite, len(params), "search directions")
            update.apply_directions(eng, opts, idx, plist, self._fsdp.local_rows(gi, idx, dirs), finite)
        elif path == "buckets":
            factors = eng.update_factors(outputs, -opts.lr)  # -lr s_j, rounded once for both
            finite = eng.finite_directions(idx, outputs, -opts.lr, written=False, factors=factors)
            finite = self._agreed(idx, finite, len(params), "search directions")  # from grafting norms
            update.apply_from_buckets(eng, opts, idx, plist, outputs, finite, factors)
        else:  # without momentum the update is -lr d: its overflow skips the parameter too
            alpha = -opts.lr if opts.momentum == 0 else None
            finite = self._agreed(
                idx, eng.finite_directions(idx, outputs, alpha), len(params), "search directions"
            )
            update.apply_directions(
                eng, opts, idx, plist, self._assemble_directions(eng, idx, outputs), finite
            )

    def _agreed(self, idx: list[int], finite: list[bool], count: int, what: str) -> list[bool]:
        """Per present parameter, whether it is finite; under FSDP on every rank's shard (the whole
        parameter is skipped everywhere or nowhere: :meth:`shampoo.fsdp.FSDPSharding.agree`)."""
        return finite if self._fsdp is None else self._fsdp.agree(idx, finite, count, what)

    @property
    def sharding(self) -> BlockSharding | None:
        """The block sharding of ``distributed=DDPConfig(...)`` (its assignment and communication
        counters, :class:`shampoo.distributed.BlockSharding`); None otherwise."""
        return self._sharding

    @property
    def implementation(self) -> ShampooImplementation:
        """The fast paths this optimizer's step takes (``implementation=``; frozen)."""
        return self._impl

    def _apply_path(self, opts: GroupOptions, params: list[torch.Tensor]) -> str:
        """How a group's step applies its directions, chosen once per group and step:
        ``"gathered"`` (DDP: the all-gathered direction tensors, finiteness tested on them),
        ``"assembled"`` (FSDP "owner" or HSDP ``share_roots``: the directions all-gathered by the
        sharding layer, :meth:`shampoo.fsdp.FSDPSharding.assemble`),
        ``"buckets"`` (one process, no momentum, contiguous parameters of their state's dtype, and
        ``implementation.apply_from_buckets``: w <- w - lr s_j D_j straight from the buckets,
        :func:`shampoo.update.apply_from_buckets`) or ``"directions"`` (through the per-parameter
        direction tensors, :func:`shampoo.update.apply_directions`). The paths are equal to rounding
        (the per-block factor -lr s_j is rounded once instead of s_j D_j), not bitwise."""
        if self._sharding is not None:
            return "gathered"
        if self._fsdp is not None and self._fsdp.gatherer is not None:
            return "assembled"
        if self._impl.apply_from_buckets and opts.momentum == 0 and update.direct(params):
            return "buckets"
        return "directions"

    def _local(self, tensors: list[Any]) -> list[Any]:
        """The tensors the engine steps: the local shards of ``fully_shard``ed parameters and
        gradients (sharing their storage), anything else as it is."""
        return tensors if self._fsdp is None else self._fsdp.local(tensors)

    def _assemble_directions(
        self, eng: GroupEngine, present: list[int], outputs: list[BucketDirections]
    ) -> list[torch.Tensor]:
        """Write every block's direction (scaled by its per-block factor) into its parameter's
        direction tensor.

        This is the single place where search directions meet: a distributed optimizer all-gathers
        the owned blocks' directions here and writes the other ranks' blocks the same way.
        """
        if self._sharding is not None:
            return self._sharding.assemble(eng.plan, present, outputs)
        views = {i: eng.states[i].layout.merged_view(eng.directions[i]) for i in present}
        for out in outputs:
            eng.scatter(out.bucket, out.positions, out.D, out.scale, views)
        return [eng.directions[i] for i in present]

    # -- diagnostics ----------------------------------------------------------------------------------

    def diagnostics(self) -> list[BlockDiagnostics]:
        """Per owned block: solver, iterations, residual, converged, failures, seconds and kappa of
        each factor's last root computation (see :class:`shampoo.diagnostics.FactorDiagnostics`)."""
        out = []
        for eng in self._engines:
            if eng is None:
                continue
            for st in eng.states:
                out.extend(block_diagnostics(st.key, st.step, b) for b in st.blocks if b.owned)
        return out

    def root_status(self) -> list[RootStatus]:
        """Under ``root_schedule="async"``, per owned block with factors: the generation of its
        installed roots, the global step whose factors they came from, their age in steps and the
        round in flight (:class:`shampoo.root_pipeline.RootStatus`); [] under ``"sync"``."""
        if self._roots is None:
            return []
        return [
            self._roots.status((gi, st.key, b.spec.index), self._global_step)
            for gi, eng in enumerate(self._engines)
            if eng is not None
            for st in eng.states
            for b in st.blocks
            if b.owned and b.factors
        ]

    def diagnostics_frame(self) -> Any:
        """:meth:`diagnostics` as a tidy pandas DataFrame (one row per factor)."""
        return to_frame(self.diagnostics())

    def log_diagnostics(self, level: int = logging.INFO) -> None:
        """Log one line per factor with the values of :meth:`diagnostics`."""
        for d in self.diagnostics():
            for row in d.rows():
                log.log(level, "shampoo diagnostics %s", row)

    def dump_factors(self, directory: Any = None) -> Any:
        """Write every owned factor to an .npz file (layout in :mod:`shampoo.diagnostics`); under
        ``distributed=`` each rank writes its own blocks to ``directory/rank<r>``."""
        directory = directory if directory is not None else self._diag.dump_dir
        if directory is None:
            raise ValueError("dump_factors needs a directory (argument or DiagnosticsConfig.dump_dir)")
        if self._sharding is not None:
            directory = self._sharding.dump_directory(directory)
        elif self._fsdp is not None:
            directory = self._fsdp.dump_directory(directory)
        entries = []
        for gi, eng in enumerate(self._engines):
            if eng is None:
                continue
            opts = GroupOptions.from_group(self.param_groups[gi])
            for st in eng.states:
                u = statistics_updates(st.step, opts.statistics_frequency, opts.start_preconditioning_step)
                bc = 1.0 - opts.beta2**u if opts.use_bias_correction and opts.beta2 < 1.0 else 1.0
                extra = {
                    "step": self._global_step,
                    "param_step": st.step,
                    "beta2": opts.beta2,
                    "eps": opts.eps,
                    "eps_mode": opts.eps_mode,
                    "statistics_updates": u,
                }
                for b in st.blocks:
                    for f in b.factors if b.owned else []:
                        entries.append((st.key, b.spec.index, f, {**extra, "bias_correction": bc}))
        return dump_factors(directory, self._global_step, entries)

    # -- checkpoints ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """Everything needed to resume bitwise: factors, roots, grafting state, momentum, counters.

        ``state`` is keyed by parameter name (or global position when the optimizer was built without
        names); config objects in ``param_groups`` are stored as plain dicts for reference.
        """
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        keys = self._param_keys()
        state = param_state(self.param_groups, self._engines, self.state)
        if self._sharding is not None:  # collective: every rank's blocks, in the single-process form
            state = self._sharding.gather_state(state)
        elif self._fsdp is not None:  # this rank's blocks; DTensor momentum (torch.distributed.checkpoint)
            state = self._fsdp.export_state(state, self.param_groups, keys)
        # entries of opt.state that are not a parameter's (a hook's), as they are, as torch.optim
        state.update({k: v for k, v in self.state.items() if not isinstance(k, torch.Tensor)})
        groups = pack_groups(self.param_groups, keys)
        meta: dict[str, Any] = {"version": 1, "global_step": self._global_step}
        if self._roots is not None:
            meta["root_schedule"] = self._root_schedule_state()
        out = {"state": state, "param_groups": groups, "shampoo": meta}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, out)
            if result is not None:
                out = result
        return out

    def _root_schedule_state(self) -> dict[str, Any]:
        """The root schedule and rounds in flight (:meth:`shampoo.root_pipeline.RootPipeline.export`),
        every rank's under ``distributed=DDPConfig`` (collective, in :meth:`state_dict`'s order)."""
        assert self._roots is not None
        return gathered_schedule(self._roots.export(self._engines), self._sharding)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load a :meth:`state_dict`. Parameters are matched by key (name or position), groups by
        position. Hyperparameters are restored; config objects (grafting, root solver, blocking,
        dtypes, failure policy) stay as configured now, and the blocking must match the saved state.

        When both the saved state and this optimizer have parameter names they are matched by name
        (``_orig_mod.`` prefixes of ``torch.compile``d modules ignored); when either has none, by
        position within each group, as torch.optim does.
        """
        if isinstance(state_dict, dict):
            state_dict = dict(state_dict)  # shallow copy: a pre-hook may edit it
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        if self._fsdp is not None and isinstance(state_dict, dict):
            state_dict = self._fsdp.import_state(state_dict)  # DTensors -> this rank's shards
        saved_groups, saved = check_state_dict(state_dict, len(self.param_groups))
        keys = self._param_keys()
        shapes = [[tuple(p.shape) for p in g["params"]] for g in self.param_groups]
        saved, extra = split_saved(saved_groups, saved, keys, shapes)
        step, schedule = saved_step(state_dict)
        # everything is checked before anything is loaded: a refused state dict changes nothing
        merged = [
            loaded_group(g, sg, gi)
            for gi, (g, sg) in enumerate(zip(self.param_groups, saved_groups, strict=True))
        ]
        plans = []
        engines = list(self._engines)
        for gi, (_, opts) in enumerate(merged):
            group, eng = self.param_groups[gi], self._engines[gi]
            if eng is not None and any(
                p in self.state and k not in saved for p, k in zip(group["params"], keys[gi], strict=True)
            ):
                # a parameter with state here has none saved: it starts afresh, as in torch.optim
                engines[gi] = eng = None
            if not any(k in saved for k in keys[gi]):
                continue
            if eng is None:
                eng = engines[gi] = self._new_engine(gi, opts)
            elif eng.structure != opts.structure():
                self._engine(gi, opts)  # raises: the structure is fixed once there is state
            plans.extend(restore_plans(eng, saved))
        for g, (m, _) in zip(self.param_groups, merged, strict=True):
            g.update(m)
        for plan in plans:
            plan.apply()
        self._engines = engines
        self.state.clear()
        for g, eng in zip(self.param_groups, self._engines, strict=True):
            if eng is not None:
                for p, st in zip(g["params"], eng.states, strict=True):
                    if st.key in saved:
                        self.state[p] = st
        self.state.update(extra)
        self._global_step = step
        if (
            self._roots is not None
        ):  # rounds in flight of the replaced state dropped; the saved ones resubmitted
            self._roots.load(schedule, self._engines, self._group_options, self._diag)
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)


__all__ = ["Shampoo"]
