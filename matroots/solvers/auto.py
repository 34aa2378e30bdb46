"""``method="auto"``: the solver a measured selection table names for the problem at hand.

For each matrix of the batch: get kappa(A + eps I) (:mod:`matroots.solvers.kappa_estimate`: exact from one
float64 ``eigvalsh`` for small problems, else power iteration for lambda_max and Cholesky inverse
iteration for lambda_min, or the previous root when a warm start is given; or ``kappa_hint``, which
Shampoo passes from the previous round), multiply an inexact one by ``kappa_safety`` (such estimates
err low), look up the cell (device kind, working dtype, n band, kappa band, p) of the selection table
at the loosest tuned target that is <= ``target`` (:class:`matroots.solvers.auto_table.SelectionTable`), and
solve the elements that chose the same configuration together, as one batch. The table's answers
are memoised per question on the table object, so a repeated call costs the estimate and the solve.
Where the table's lowest kappa band names an eigendecomposition (and the estimate would be an exact
``eigvalsh``), that eigh runs first and kappa is read off its eigenvalues: one decomposition instead
of two when the band they prove decides the same solve (:mod:`matroots.solvers.auto_first`).

* ``status="chosen"``: the cell's cheapest configuration that met the target on every tuning case.
* ``status="unattainable"``: no candidate met the target in that cell; the cell's ``best_effort``,
  the most accurate candidate measured that solves the matrix given
  (:func:`matroots.study.tuning.select.best_effort`), is used.
* ``status="outside"``: the problem is outside the table (dtype, p, n or kappa not tuned, kappa not
  finite, target tighter than every tuned target, non-symmetric input, no table for the device): the
  documented safe choice is used: ``fallback`` if given, else ``EighConfig()`` (LAPACK
  eigendecomposition; the most accurate candidate wherever the tuning ran, defined for every rational
  p) for symmetric input and ``SchurNewtonConfig()`` for general input.

Each group reports the error to expect (``expected_error``): the cell's measured worst error (chosen;
unattainable: the best effort's), else cond(f, A) u of the working format (outside the table, or after
a re-solve with the safe choice), with cond from kappa for symmetric input (|q| kappa for the inverse
root, q = -1/p) and :func:`matroots.core.conditioning.cond_root` for general input. A :class:`TargetWarning`
says when the table cannot promise the target (unattainable) or the expected error exceeds it
(unless ``warn=False``).

If the chosen configuration raises a numerical error (e.g. ``eigh[rank_policy=perturb]`` on a factor
that rounding made indefinite), its elements are re-solved with the safe choice and ``info`` says so.

``info["auto"]`` holds the table used, the target (and where it came from), the kappa estimates and
their source, the estimate's cost, the configuration chosen per element, and one record per group
(configuration, elements, status, the cell with its measured worst error / median cost / runner-up,
and the reason). ``matmuls`` adds the estimate's cost to the element-weighted mean of the groups'.

Default targets (relative forward error), from the working dtype: fp64 1e-8, fp32 1e-3, fp16 and bf16
1e-1 -- roughly sqrt(u) for the wide formats and ~25 u for the half formats, what a root in that format
can deliver for moderately conditioned input (kappa <~ 1e4).

This module holds the configuration, its fields and the solve; the parts it runs are beside it:
:mod:`~matroots.solvers.auto_plan` (the table lookup: decisions, the per-problem plan, grouping),
:mod:`~matroots.solvers.auto_candidates` (table rows and labels to configs, the safe default),
:mod:`~matroots.solvers.auto_targets` (targets, the error to expect, :class:`TargetWarning`),
:mod:`~matroots.solvers.auto_first` (decomposing first) and
:mod:`~matroots.solvers.auto_result` (merging the groups, ``info["auto"]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..core import arguments, precision
from ..core.errors import InvalidArgumentError, MatrootsNumericalError
from ..core.inputs import (
    all_finite,
    check_shape,
    default_symmetry_tol,
    parse_exponent,
    symmetry_defect,
    to_tensor,
)
from ..core.options import SolveOptions
from ..core.psd import check_policy, floor_level
from ..core.result import RootResult
from . import auto_table, kappa_estimate, registry
from .auto_candidates import SOLVE_OPTIONS, default_safe
from .auto_certificate import certified_kappa
from .auto_first import (
    SOURCE_CERTIFIED,
    SOURCE_ELSEWHERE,
    SOURCE_ELSEWHERE_CERTIFIED,
    Decomposed,
    decomposed_ends,
    first_decision,
    reusing,
    spectrum_estimate,
    spectrum_first,
)
from .auto_plan import Decision, Plan, decide, group_decisions, plan_for
from .auto_result import Estimate, merge, question, report, spectrum_kappa
from .auto_targets import TargetWarning, default_target_of, expected_error, target_message
from .base import Capabilities, SolverConfig

log = logging.getLogger("matroots.auto")

# Caps of the effort fields: the table's kappa bands span a factor 100 and the estimate's error shrinks
# like (lambda_2/lambda_1)^(2k), so beyond ~100 steps an estimate gains nothing but time.
MAX_ESTIMATE_ITERS = 100


def _effort(name: str, value: object) -> int:
    v = arguments.integer(
        name, value, minimum=1, what=f"steps of the kappa estimate, at most {MAX_ESTIMATE_ITERS}"
    )
    if v > MAX_ESTIMATE_ITERS:  # type: ignore[operator]
        raise InvalidArgumentError(
            f"{name} must be an int in [1, {MAX_ESTIMATE_ITERS}] (steps of the kappa estimate), got {value!r}"
        )
    return int(v)  # type: ignore[arg-type]


def _table_field(value: object) -> str | None:
    """None, or the path of a readable selection table (checked now: a typo is an error, not a silent
    fall-back to the safe choice at every solve)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise InvalidArgumentError(
            f"table must be None or the path of a selection table CSV, got {value!r} of type {type(value).__name__}"
        )
    path = os.fspath(value)
    try:
        auto_table.load_table(path)
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"table must be None or the path of a selection table CSV, got {path!r}: no such file"
        ) from None
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"table must be None or the path of a selection table CSV, got {path!r}: {exc}"
        ) from None
    return path


def _device_field(value: object) -> str | None:
    if value is None:
        return None
    kind = None
    if isinstance(value, str):
        with contextlib.suppress(RuntimeError):
            kind = torch.device(value).type
    if kind is None:
        raise InvalidArgumentError(
            f"device must be None or a torch device kind ('cpu', 'cuda', ...), got {value!r}"
        )
    return kind


def _fallback_field(value: object) -> SolverConfig | None:
    if value is None:
        return None
    if isinstance(value, str) and value != "auto":
        return registry.get(value)
    if isinstance(value, SolverConfig) and not isinstance(value, AutoConfig):
        return value
    raise InvalidArgumentError(
        f"fallback must be None, a solver config or a registry name other than 'auto', got {value!r}"
    )


@dataclass(slots=True)  # built on every call: plain slots (internal, never mutated)
class _Call:
    """One call as auto sees it (:meth:`AutoConfig._call`)."""

    t: torch.Tensor
    flat: torch.Tensor
    det: torch.Tensor  # flat detached, once: every look at the input outside the solves uses it
    b: int
    n: int
    frac: Any
    wdtype: Any
    device: str
    target: float
    target_src: str
    sym: bool
    exact_sym: bool  # exactly symmetric (or trusted): every solver reads the input as it is
    hint: list[float] | None


@registry.register
@dataclass(frozen=True, kw_only=True)
class AutoConfig(SolverConfig):
    """The configuration a selection table names per batch element (see the module docstring).

    Args:
        target: relative forward error to meet; None means :func:`default_target` of the dtype.
        table: path of a selection table CSV; None means the shipped table of the input's device kind.
        device: device kind to look up ("cpu", "cuda"); None means the input tensor's.
        kappa_safety: factor applied to the kappa estimate before the lookup (estimates err low).
        power_iters, inverse_iters: effort of the kappa estimate (:mod:`matroots.solvers.kappa_estimate`).
        fallback: the safe choice outside the table; None means eigh (symmetric) / schur_newton.
        warn: warn (TargetWarning) when the target cannot be promised (see the module docstring).
    """

    name = "auto"
    # warm start: a previous root gives the kappa estimate and goes on to a chosen "root" method
    capabilities = Capabilities(warm_start="root", general_input=True)
    target: float | None = None
    table: str | None = None
    device: str | None = None
    kappa_safety: float = 2.0
    power_iters: int = 8
    inverse_iters: int = 4
    fallback: SolverConfig | None = None
    warn: bool = True

    def __post_init__(self) -> None:  # typed InvalidArgumentError for every field (matroots.core.arguments)
        arguments.store(
            self,
            target=arguments.real(
                "target", self.target, minimum=0.0, exclusive_minimum=True, maximum=1.0,
                exclusive_maximum=True, allow_none=True, what="a relative forward error",
            ),
            table=_table_field(self.table),
            device=_device_field(self.device),
            kappa_safety=arguments.real(
                "kappa_safety", self.kappa_safety, minimum=1.0, what="factor applied to the kappa estimate"
            ),
            power_iters=_effort("power_iters", self.power_iters),
            inverse_iters=_effort("inverse_iters", self.inverse_iters),
            fallback=_fallback_field(self.fallback),
            warn=arguments.flag("warn", self.warn),
            psd=check_policy(self.psd),
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------ choice
    def safe_choice(self, symmetric: bool) -> SolverConfig:
        """The documented safe configuration used outside the table."""
        if self.fallback is not None:
            return self.fallback
        return default_safe(symmetric)

    def decide(
        self, *, device: str, dtype: Any, n: int, kappa: float, p: Any, target: float, symmetric: bool = True
    ) -> Decision:
        """The decision for one matrix (no solving): table lookup, or the safe choice and why."""
        try:
            table, why = auto_table.load_table(self.table, device=device), ""
        except (InvalidArgumentError, FileNotFoundError) as exc:
            table, why = None, str(exc)
        return decide(table, why, self.safe_choice(symmetric), device, dtype, n, kappa, p, target, symmetric)

    # ------------------------------------------------------------------------------------------- solve
    def _solve(self, A: object, p: object, opts: SolveOptions, t0: float) -> RootResult:
        """The template of ``method="auto"`` (module docstring): the kappa estimate, one decision per
        element, each group solved by its configuration's own template (prepare -> run -> finalise),
        the warning where the target cannot be promised, and the groups merged into one result.

        ``opts.kappa_hint``: per-element kappa estimates of A + eps I (e.g. the previous round's, as
        Shampoo passes them), used instead of a fresh estimate when every entry is finite. The other
        options go to the chosen solvers.
        """
        call = self._call(A, p, opts)
        plan = self._plan(call)
        est: Estimate | None = Estimate([math.nan] * call.b, "none (non-symmetric input)", 0.0, False)
        if call.sym and call.hint is None and plan.kappa_free:
            return self._solve_kappa_free(A, call, plan, opts, t0)
        if call.sym and (call.hint is not None or all_finite(call.det)):
            est = None
            first = None if call.hint is not None else self._first_decision(call, plan, opts)
            kept = None
            if first is not None:  # the lowest band decomposes: eigh first, kappa from its eigenvalues
                done, est, kept = self._decompose_first(first, A, call, plan, opts, t0)
                if done is not None:
                    return done
            est = est or self._estimate(call, opts)
            # the eigenvalues left the band uncertain: where the float64 estimate (exact here:
            # first_decision) chose an eigh that reuses the decomposition, it solves from it
            hit = reusing(plan, est.kappa, kept.first) if kept is not None and est.exact else None
            if hit is not None:
                done = self._from_first(kept, hit, call, plan, est, time.perf_counter() - t0, opts, t0)
                if done is not None:
                    return done
        est_seconds = time.perf_counter() - t0
        # the estimate errs low unless it is exact (eigenvalues): the lookup uses kappa * kappa_safety
        safety = 1.0 if est.exact else self.kappa_safety
        looked = [k * safety if math.isfinite(k) else math.inf for k in est.kappa]
        groups = []
        for d, idx, cells in group_decisions(plan, looked):
            res, used, note, failed = self._solve_group(d, A, call, idx, opts)
            kap = [est.kappa[i] for i in idx]
            expected, source = expected_error(
                d, failed, call.sym, kap, call.det, idx, call.frac, opts.inverse, call.wdtype
            )
            groups.append((d, idx, res, used, note, cells, expected, source))
        return self._finish(call, plan, est, est_seconds, safety, groups, t0)

    def _first_decision(self, call: _Call, plan: Plan, opts: SolveOptions) -> Decision | None:
        """The lowest band's eigh decision when auto can decompose first
        (:func:`matroots.solvers.auto_first.first_decision`), else None. No test before it: the
        Cholesky pre-test it had cost more than the eigh it saved (auto_first's docstring)."""
        psd = opts.psd if opts.psd is not None else self.psd
        rounded = call.wdtype != call.t.dtype
        return first_decision(plan, call.b, call.n, psd, call.exact_sym, rounded)

    def _decompose_first(
        self, first: Decision, A: object, call: _Call, plan: Plan, opts: SolveOptions, t0: float
    ) -> tuple[RootResult | None, Estimate | None, Decomposed | None]:
        """The eigh of the lowest band on the whole batch, run before kappa is known
        (:mod:`matroots.solvers.auto_first`): (the result, its kappa, None) when every element's
        certain band decides that same solve (or one reusing it), finalised as that solve's own
        template would; else (None, kappa from the eigenvalues or None, the decomposition when some
        band was uncertain), for the usual path to go on with: None where the eigh raised, or where
        the eigenvalues proved another solve."""
        idx = list(range(call.b))
        sub, pp, group = self._group_call(first, A, call, idx, opts)
        # auto proved the input exactly symmetric (first_decision) and finite (_solve): the eigh
        # does not repeat the symmetry test, and returns the same bits (SolveOptions.trusted)
        group = group.trusting()
        cfg = first.config
        t1 = time.perf_counter()
        notes, sp = None, None
        try:  # cfg._solve's template up to the decomposition (and its spectrum: spectrum_first)
            prob = cfg._prepare(sub, pp, group)
            dec = cfg._decompose(prob)
            lapack = precision.lapack_dtype(prob.compute_dtype)
            if spectrum_first(plan, first, call.n, lapack):  # solves reusing it read first's spectrum
                notes = dict(dec.info)  # the decomposition's notes, for another rank policy's spectrum
                sp = cfg.spectrum_of(prob, dec, inverse=group.inverse)  # adds its notes to dec.info
        except MatrootsNumericalError:  # the usual path decides (and re-solves or raises) as before
            return None, None, None
        kept = Decomposed(first, prob, dec, group, t1, notes, sp)
        t_est = time.perf_counter()
        ends = dec.info if sp is not None else decomposed_ends(prob, dec.w)
        est = spectrum_estimate(plan, ends, call.n, lapack, self._certifier(plan, prob, dec, lapack))
        est_seconds = time.perf_counter() - t_est
        if est is None:  # uncertain: the float64 estimate decides, and may still choose a reusing eigh
            return None, None, kept
        hit = reusing(plan, est.kappa, first)  # exact: no safety factor
        if hit is None:
            elsewhere = SOURCE_ELSEWHERE_CERTIFIED if est.source == SOURCE_CERTIFIED else SOURCE_ELSEWHERE
            return None, Estimate(est.kappa, elsewhere, 0.0, True), None
        done = self._from_first(kept, hit, call, plan, est, est_seconds, opts, t0)
        return done, (est if done is not None else None), None

    @staticmethod
    def _certifier(plan: Plan, prob: Any, dec: Any, lapack: torch.dtype) -> Any:
        """The sharper band certificate for the elements Weyl's bound leaves open
        (:func:`matroots.solvers.auto_certificate.certified_kappa`), as ``spectrum_estimate`` calls it."""
        rate = 2.0 * (prob.n + 2) * precision.unit_roundoff(lapack)  # the band test's delta per max |w|
        return lambda rows: certified_kappa(
            plan, dec.A, dec.Q, dec.w, rows, eps=float(prob.eps), eps_mode=str(prob.eps_mode),
            prescale=prob.prescale, delta_rate=rate,
        )  # fmt: skip

    def _from_first(
        self,
        kept: Decomposed,
        hit: tuple,
        call: _Call,
        plan: Plan,
        est: Estimate,
        est_seconds: float,
        opts: SolveOptions,
        t0: float,
    ) -> RootResult | None:
        """The result of decision ``hit`` (:func:`~matroots.solvers.auto_first.reusing`) from the
        decomposition decomposing first computed, finalised as that solve's own template would;
        None where it raises (the usual path then re-solves it, and its own solve raises the same)."""
        d, idx, cells = hit
        chosen = d.config  # first's, or an eigh differing in the rank policy only (reuses)
        prob, dec, group, sp = kept.prob, kept.dec, kept.group, kept.spectrum
        if sp is not None and chosen != kept.first.config:  # its own spectrum, from the notes alone
            dec.info, sp = kept.notes, None
        try:  # chosen._run's second phase: what its own solve does after the same decomposition
            raw = chosen._from_decomposition(prob, dec, inverse=group.inverse, spectrum=sp)
        except MatrootsNumericalError:
            return None
        res = chosen._finalise(
            prob, raw, inverse=group.inverse, seconds=time.perf_counter() - kept.t1, quiet=group.quiet
        )
        expected, source = expected_error(
            d, False, True, est.kappa, call.det, idx, call.frac, opts.inverse, call.wdtype
        )
        groups = [(d, idx, res, d.label, "", cells, expected, source)]
        return self._finish(call, plan, est, est_seconds, 1.0, groups, t0)

    def _finish(
        self,
        call: _Call,
        plan: Plan,
        est: Estimate,
        est_seconds: float,
        safety: float,
        groups: list,
        t0: float,
    ) -> RootResult:
        """The groups' results merged into one, with the TargetWarning and ``info["auto"]``."""
        self._warn_missed(groups, call.target)
        out = merge(groups, call.t, call.b, call.n, est.matmuls)
        out.info["auto"] = self._report(call, plan, est, est_seconds, safety, groups)
        out.seconds = time.perf_counter() - t0
        out.method = "auto"
        return out

    def _solve_kappa_free(
        self, A: object, call: _Call, plan: Plan, opts: SolveOptions, t0: float
    ) -> RootResult:
        """:meth:`_solve` where the table's answer does not depend on kappa (the problem is outside
        the table's dtype, p or n bands, or there is no table: the safe choice for every kappa), so
        no estimate is taken to choose. kappa is still reported and still sets the error to expect
        (cond(f, A) u, the TargetWarning): read from the spectrum the solver computed when it
        reports one (eigh: ``solved_lambda_min/max``, the matrix actually solved, exactly), else
        estimated after the solve as before it."""
        d = plan.decision(math.nan)  # the one decision of this plan, whatever kappa
        idx = list(range(call.b))
        cells = [{"reason": d.reason, "cell": d.cell, "target_used": d.target_used, "elements": idx}]
        res, used, note, failed = self._solve_group(d, A, call, idx, opts)
        t_est = time.perf_counter()
        est = spectrum_kappa(res.info, call.b)
        if est is None:  # the solver reports no spectrum: the estimate, after the solve
            est = self._estimate(call, opts) if all_finite(call.det) else est
            est = est or Estimate([math.nan] * call.b, "none (non-finite input)", 0.0, False)
        est_seconds = time.perf_counter() - t_est
        expected, source = expected_error(
            d, failed, call.sym, est.kappa, call.det, idx, call.frac, opts.inverse, call.wdtype
        )
        groups = [(d, idx, res, used, note, cells, expected, source)]
        safety = 1.0 if est.exact else self.kappa_safety
        return self._finish(call, plan, est, est_seconds, safety, groups, t0)

    def _call(self, A: object, p: object, opts: SolveOptions) -> _Call:
        """The problem as auto sees it: the exponent, the flattened batch, the working dtype, the
        device kind, the target (and where it came from), symmetry, and the checked kappa hint."""
        frac = parse_exponent(p, integer=False, method=self.name)
        t = to_tensor(A)
        check_shape(t)
        n = t.shape[-1]
        flat = t.reshape(-1, n, n)
        b = flat.shape[0]
        hint = self._hint(opts.kappa_hint, b)
        wdtype = opts.dtype if opts.dtype is not None else t.dtype
        if self.target is not None:
            target, target_src = float(self.target), "argument"
        else:
            target, target_src = default_target_of(wdtype)
        det = flat.detach()
        sym, exact = (True, True) if opts.trusted else self._symmetric(det, t.dtype)  # trusted: symmetric
        return _Call(
            t=t, flat=flat, det=det, b=b, n=n, frac=frac, wdtype=wdtype, device=self.device or t.device.type,
            target=target, target_src=target_src, sym=sym, exact_sym=exact, hint=hint,
        )  # fmt: skip

    def _warn_missed(self, groups: list, target: float) -> None:
        """A TargetWarning where the table cannot promise the target (unattainable) or the error to
        expect exceeds it."""
        missed = [g for g in groups if g[0].status == "unattainable" or not (g[6] <= target)]
        if missed and self.warn:
            msg = target_message(missed, target)
            warnings.warn(msg, TargetWarning, stacklevel=4)  # the caller of solve()
            log.info(msg)  # the TargetWarning is the user-facing report

    # ----------------------------------------------------------------------------------------- helpers
    def _plan(self, call: _Call) -> Plan:
        """The table's answers for the call's problem (:func:`matroots.solvers.auto_plan.plan_for`)."""
        safe = self.safe_choice(call.sym)
        return plan_for(
            self, self.table, safe, call.device, call.wdtype, call.n, call.frac, call.target, call.sym
        )

    @staticmethod
    def _report(
        call: _Call, plan: Plan, est: Estimate, est_seconds: float, safety: float, groups: list
    ) -> dict[str, Any]:
        """``info["auto"]`` (:func:`matroots.solvers.auto_result.report`)."""
        asked = question(plan.table_name, call.device, call.wdtype, call.target, call.target_src)
        return report(asked, call.b, est, est_seconds, safety, groups)

    def _estimate(self, call: _Call, opts: SolveOptions) -> Estimate:
        """kappa(A + eps I) per element: the hint, else :func:`matroots.solvers.kappa_estimate.estimate_kappa`
        (exact at small sizes; from the previous root when a warm start is given)."""
        if call.hint is not None:
            return Estimate(call.hint, "kappa_hint", 0.0, False)
        prev = self._previous_root(opts.warm_start, call.b, call.n)
        floor = None
        if (opts.psd or self.psd) == "shift":
            floor = floor_level(call.det.to(call.wdtype), call.t.dtype)
        ke = kappa_estimate.estimate_kappa(
            call.det,
            eps=float(opts.eps),
            eps_mode=str(opts.eps_mode),
            power_iters=self.power_iters,
            inverse_iters=self.inverse_iters,
            previous_root=prev,
            p=float(call.frac) if prev is not None else None,
            floor=floor,
        )
        return Estimate(ke.kappa, ke.source, ke.matmuls, ke.exact)

    @staticmethod
    def _symmetric(flat: torch.Tensor, source: torch.dtype) -> tuple[bool, bool]:
        """(symmetric by the solvers' rule, exactly symmetric)."""
        if torch.equal(flat, flat.mT):  # exactly symmetric (the common case): one comparison
            return True, True
        return bool((symmetry_defect(flat) <= default_symmetry_tol(flat, source)).all()), False

    @staticmethod
    def _hint(kappa_hint: Any, b: int) -> list[float] | None:
        """The per-element kappa hint as b floats, or None when any entry is unknown (nan / inf: a
        fresh estimate is taken). A real number applies to every element."""
        if kappa_hint is None:
            return None
        allowed = f"a condition number >= 1 per matrix ({b} reals, nan or inf for unknown)"
        if isinstance(kappa_hint, torch.Tensor | np.ndarray):  # entries checked below (bool, complex)
            items = kappa_hint.reshape(-1).tolist()
        elif isinstance(kappa_hint, str | bytes) or not isinstance(kappa_hint, Sequence):
            items = [kappa_hint] * b
        else:
            items = list(kappa_hint)
        if len(items) != b:
            raise InvalidArgumentError(f"kappa_hint has {len(items)} entries for a batch of {b} matrices")
        ks = []
        for x in items:
            if isinstance(x, bool | np.bool_) or not isinstance(x, int | float | np.integer | np.floating):
                raise InvalidArgumentError(f"kappa_hint must be {allowed}, got {kappa_hint!r}")
            k = float(x)
            if k < 1:
                raise InvalidArgumentError(f"kappa_hint must be {allowed}, got the entry {x!r}")
            ks.append(k)
        return ks if all(math.isfinite(k) for k in ks) else None

    @staticmethod
    def _previous_root(warm_start: Any, b: int, n: int) -> torch.Tensor | None:
        Z = warm_start.root if isinstance(warm_start, RootResult) else warm_start
        if isinstance(Z, torch.Tensor) and Z.numel() == b * n * n and bool(torch.isfinite(Z).all()):
            return Z.reshape(b, n, n)
        return None

    def _group_call(
        self, d: Decision, whole: object, call: _Call, idx: list[int], opts: SolveOptions
    ) -> tuple[object, Any, SolveOptions]:
        """(input, p, options) of the group's solve by its configuration: the table's solve options
        (tol, max_iter, compute_dtype) apply where the caller set none."""
        # One group for the whole batch: the chosen solver gets exactly the caller's input (shape,
        # layout, autograd); otherwise the group's elements as a (k, n, n) batch.
        everything = len(idx) == call.b
        sub = whole if everything else call.flat[idx]
        # the table's solve options where the caller set none, the config's psd policy where the caller
        # gave none, the warm start where the chosen method uses one: a call that changes nothing
        # reuses the caller's options (a default call builds no SolveOptions, as a direct call)
        kw: dict[str, Any] = {}
        if d.solve_options:
            caller = opts.changed()
            kw = {k: v for k, v in d.solve_options.items() if k not in caller}
        psd = self.psd if self.psd != "none" and opts.psd is None else None  # the caller's policy
        p = call.frac
        pp = int(p) if p.denominator == 1 else p
        given = None  # the previous root, only for a method that uses one (its finiteness is a pass)
        if opts.warm_start is not None and d.config.capabilities.warm_start == "root":
            warm = self._previous_root(opts.warm_start, call.b, call.n)
            if warm is not None:
                given = opts.warm_start if everything else warm[idx]
        if kw:  # the table's solve options: validated as a new SolveOptions
            if psd is not None:
                kw["psd"] = psd
            group = dataclasses.replace(opts, warm_start=given, **kw)
        elif given is not opts.warm_start or psd is not None:
            group = opts.with_warm_start(given, psd=psd)  # the other fields are validated already
        else:
            group = opts
        return sub, pp, group

    def _solve_group(
        self, d: Decision, whole: object, call: _Call, idx: list[int], opts: SolveOptions
    ) -> tuple[RootResult, str, str, bool]:
        """The group's solve by its configuration's template (:meth:`_group_call`): (result,
        configuration used, note, whether the chosen one failed and the safe choice solved it)."""
        sub, pp, group = self._group_call(d, whole, call, idx, opts)
        try:
            return d.config._solve(sub, pp, group, time.perf_counter()), d.label, "", False
        except MatrootsNumericalError as exc:
            safe = self.safe_choice(True)
            if d.status == "outside" or safe == d.config:
                raise
            # the safe choice with the caller's own options: no warm start, none of the table's
            plain = dataclasses.replace(
                group, warm_start=None, **{k: getattr(opts, k) for k in SOLVE_OPTIONS}
            )
            res = safe._solve(sub, pp, plain, time.perf_counter())
            note = f"{d.label} raised {type(exc).__name__}; re-solved with the safe choice {safe.name}"
            log.info("method='auto': %s", note)
            return res, f"{safe.name}[after {d.label} failed]", note, True


__all__ = ["AutoConfig"]
