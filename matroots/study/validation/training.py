"""One validation unit: train a task with one optimizer config, record curves, root diagnostics, timing.

:func:`run_unit` is the runner's job function: it returns the unit's rows, each tagged with ``table``
(``"curve"``, ``"run"`` or ``"root"``; :mod:`matroots.study.validation.run` splits them into
``curves.parquet``, ``runs.parquet`` and ``roots.parquet``). It never raises for a training failure:
divergence (a non-finite loss), Shampoo's ``RootComputationError`` and a peer's own numerical
failure (``peers.gives_up``, e.g. Meta's ``PreconditionerValueError``) end the run early and are
recorded in the ``failure`` column, as is a solver that rejects the configuration outright (a
``MatrootsError`` such as ``UnsupportedExponentError`` for a Newton iteration in a format too narrow
for the factor size).

Timing: after training, the unit times its own optimizer against AdamW on the same (trained) model in
the same process, interleaved: ``rounds`` x (a chunk of this optimizer, a chunk of AdamW), the order
alternating (ABBA...), each chunk ``chunk_steps`` steps (by default the precondition frequency, so
every Shampoo chunk holds exactly one root round). The ratio of the median per-step times is
``time_ratio`` (wall) and ``time_ratio_cpu`` (process CPU time, immune to other processes' load).

Root accuracy: after every root round, ``root_error_samples`` factors (evenly spaced over the
optimizer's factors) are compared with float64 references of the same factor: the stored statistics,
bias-corrected as Shampoo does, projected onto the PSD cone (rounding-negative eigenvalues set to 0),
shifted by an eps (absolute, or eps * lambda_max for ``eps_mode="relative"``) and rooted by eigh.
``forward_error = ||X - R||_F / ||R||_F`` uses the configured eps (what the solver was asked for);
``forward_error_total`` uses the grid's common ``reference_eps`` (the same target for every
configuration, so a large eps shows up as error too); ``forward_error_solved`` is against the matrix
actually solved, with the whole shift Shampoo reports (``regularisation``: rank-policy shift + eps).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import time
import warnings
from typing import Any

import numpy as np
import torch

from ...core.regularize import absolute_shift
from .. import provenance
from ..threads import one_thread
from .config import Unit
from .tasks import Task, get_task

log = logging.getLogger("matroots.study.validation")


# ----------------------------------------------------------------------------------------------------
# optimizers


def make_optimizer(unit: Unit, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The unit's optimizer on ``model`` (AdamW, SGD with momentum, or Shampoo with the unit's root config).

    ``options`` are keyword arguments of the optimizer. For Shampoo, the defaults here are
    ``grafting="adam"``, ``max_preconditioner_dim=256`` and ``start_preconditioning_step`` = the
    precondition frequency; ``fallback`` (a solver name or ``"none"``), ``fallback_dtype`` and
    ``max_consecutive_failures`` build its :class:`shampoo.FailurePolicy` (a deliberately degraded
    configuration can switch the fp64 fallback off, so that its inaccurate roots are what trains).
    """
    spec, lr = unit.optimizer, unit.lr
    opts = dict(spec.options)
    if spec.name == "adamw":
        opts.setdefault("weight_decay", 0.0)
        return torch.optim.AdamW(model.parameters(), lr=lr, **opts)
    if spec.name == "sgd":
        opts.setdefault("momentum", 0.9)
        return torch.optim.SGD(model.parameters(), lr=lr, **opts)
    if spec.name == "soap":
        return _make_soap(spec, lr, opts, model)
    if spec.name == "peer":
        from .peers import make_peer

        return make_peer(spec.root_solver, model, lr, opts, spec.precondition_frequency)
    return _make_shampoo(spec, lr, opts, model)


def _make_shampoo(
    spec: Any, lr: float, opts: dict[str, Any], model: torch.nn.Module
) -> torch.optim.Optimizer:
    """Shampoo with the spec's root config, defaults and failure policy (see :func:`make_optimizer`)."""
    import shampoo
    from shampoo.config import default_root_solver

    from ...core import precision

    cfg = default_root_solver(spec.root_solver)
    if spec.solver_options:
        cfg = dataclasses.replace(cfg, **spec.solver_options)
    if "betas" in opts:
        opts["betas"] = tuple(opts["betas"])
    for k in ("factor_dtype",):
        if k in opts:
            opts[k] = precision.as_dtype(opts[k])
    opts.setdefault("max_preconditioner_dim", 256)
    opts.setdefault("grafting", "adam")
    if "grafting_beta2" in opts:  # the protocol's beta2 for the grafted Adam / RMSprop too
        from shampoo.config import GRAFTINGS

        b2, kind = float(opts.pop("grafting_beta2")), opts["grafting"]
        opts["grafting"] = GRAFTINGS[kind](beta2=b2) if kind in ("adam", "rmsprop") else kind
    failure = {
        k: opts.pop(k) for k in ("fallback", "fallback_dtype", "max_consecutive_failures") if k in opts
    }
    if failure:
        fb = failure.get("fallback", "eigh")
        failure["fallback"] = None if fb in ("none", None) else default_root_solver(fb)
        if "fallback_dtype" in failure:
            failure["fallback_dtype"] = precision.as_dtype(failure["fallback_dtype"])
        opts["failure"] = shampoo.FailurePolicy(**failure)
    return shampoo.Shampoo(
        model.named_parameters(),
        lr=lr,
        eps=spec.eps,
        eps_mode=spec.eps_mode,
        precondition_frequency=spec.precondition_frequency,
        root_solver=cfg,
        root_dtype=precision.as_dtype(spec.root_dtype),
        **opts,
    )


def _make_soap(spec: Any, lr: float, opts: dict[str, Any], model: torch.nn.Module) -> torch.optim.Optimizer:
    """Shampoo with :class:`shampoo.SOAP` (basis update ``spec.root_solver``, Adam eps ``spec.eps``) as
    the preconditioner; defaults as published: no grafting, preconditioned from step 1, blocks <= 256.
    ``soap_beta2`` in the options is SOAP's own second-moment beta (default: betas[1])."""
    import shampoo

    if "betas" in opts:
        opts["betas"] = tuple(opts["betas"])
    pre = shampoo.SOAP(beta2=opts.pop("soap_beta2", None), eps=spec.eps, basis_update=spec.root_solver)
    opts.setdefault("max_preconditioner_dim", 256)
    opts.setdefault("grafting", "none")
    opts.setdefault("start_preconditioning_step", 1)
    return shampoo.Shampoo(
        [{"params": list(model.named_parameters()), "preconditioner": pre}],
        lr=lr,
        precondition_frequency=spec.precondition_frequency,
        **opts,
    )


def _is_shampoo(opt: torch.optim.Optimizer) -> bool:
    return type(opt).__name__ == "Shampoo"


# ----------------------------------------------------------------------------------------------------
# root diagnostics and forward errors


def _factor_states(opt: Any) -> list[tuple[str, int, Any, Any]]:
    """(param key, block index, factor state, group options) of every owned factor, in a fixed order.

    Reads the optimizer's typed per-block state (the same walk as ``Shampoo.dump_factors``).
    """
    from shampoo.config import GroupOptions

    out = []
    for gi, eng in enumerate(opt._engines):
        if eng is None:
            continue
        opts = GroupOptions.from_group(opt.param_groups[gi])
        for st in eng.states:
            for b in st.blocks:
                if b.owned:
                    out.extend((str(st.key), b.spec.index, f, opts) for f in b.factors)
    return out


def _eps_abs(w: np.ndarray, eps: float, mode: str) -> float:
    """The solvers' eps_abs (:func:`matroots.core.regularize.absolute_shift`) for a spectrum ``w`` (ascending)."""
    return float(absolute_shift(eps, mode, torch.tensor(float(w[-1]), dtype=torch.float64)))


def _inverse_root(w: np.ndarray, V: np.ndarray, shift: float, p: float) -> np.ndarray | None:
    lam = w + shift
    return (V * lam ** (-1.0 / p)) @ V.T if lam[0] > 0 else None


def reference_roots(
    A: np.ndarray, p: float, shifts: list[tuple[float, str]]
) -> list[tuple[np.ndarray | None, float]]:
    """float64 (A_psd + eps_abs I)^{-1/p} by one eigh for each (eps, mode); A_psd is the PSD projection
    of sym(A). An element is (None, eps_abs) when the shifted matrix is singular."""
    w, V = np.linalg.eigh(0.5 * (A + A.T))
    w = np.clip(w, 0.0, None)
    return [(_inverse_root(w, V, e, p), e) for e in (_eps_abs(w, eps, mode) for eps, mode in shifts)]


def root_forward_errors(
    f: Any, opts: Any, reference_eps: float, reference_mode: str, regularisation: float = math.nan
) -> dict[str, float]:
    """Relative Frobenius forward errors of a factor's current root X against float64 eigh roots of
    the same (bias-corrected) factor A:

    A is bias-corrected as Shampoo does it: divided by 1 - beta2^u, u the factor's statistics updates
    (the root's step unless ``statistics_frequency`` > 1).

    * ``forward_error``: against (A_psd + eps_abs I)^{-1/p}, the factor regularised as configured:
      what the user asked for (the solver's, the format's and the rank policy's deviation);
    * ``forward_error_total``: against (A_psd + reference_eps I)^{-1/p}, one target for every
      configuration of the grid, so the eps bias counts too;
    * ``forward_error_solved``: against (sym(A) + r I)^{-1/p}, r = ``regularisation`` as Shampoo
      reports it (rank-policy shift + eps): the matrix actually solved, so only the solver's and the
      format's error remain (NaN when r is not reported).
    """
    from shampoo.transforms.kronecker import statistics_updates

    # Shampoo's bias correction 1 - beta2^u counts the factor's updates u, which is the step t of its
    # root only when every step updates it (statistics_frequency k > 1: u = statistics_updates)
    t = int(f.root_step)
    u = statistics_updates(t, opts.statistics_frequency, opts.start_preconditioning_step)
    bc = 1.0 - opts.beta2**u if opts.use_bias_correction and opts.beta2 < 1.0 and u > 0 else 1.0
    A = f.matrix.detach().double().cpu().numpy() / bc
    X = f.root.detach().double().cpu().numpy()
    p = float(f.root_p)
    out = {"forward_error": math.nan, "forward_error_total": math.nan, "forward_error_solved": math.nan,
           "eps_abs_reference": math.nan}  # fmt: skip
    try:
        w, V = np.linalg.eigh(0.5 * (A + A.T))
    except np.linalg.LinAlgError:
        return out
    wp = np.clip(w, 0.0, None)
    e = _eps_abs(wp, opts.eps, opts.eps_mode)
    out["eps_abs_reference"] = e
    refs = {
        "forward_error": _inverse_root(wp, V, e, p),
        "forward_error_total": _inverse_root(wp, V, _eps_abs(wp, reference_eps, reference_mode), p),
        "forward_error_solved": _inverse_root(w, V, regularisation, p)
        if math.isfinite(regularisation)
        else None,
    }
    finite = bool(np.isfinite(X).all())
    for name, ref in refs.items():
        if ref is not None:
            out[name] = float(np.linalg.norm(X - ref) / np.linalg.norm(ref)) if finite else math.inf
    return out


def _reported(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _scalar(v: Any) -> Any:
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    return str(v)


def root_rows(opt: Any, unit: Unit, step: int) -> list[dict[str, Any]]:
    """One row per factor after a root round: ``opt.diagnostics()`` fields, plus the forward error of
    ``unit.root_error_samples`` evenly spaced factors (NaN for the others)."""
    samples = unit.root_error_samples
    diag_rows = [r for d in opt.diagnostics() for r in d.rows() if "solver" in r]
    states = _factor_states(opt)
    n = len(diag_rows)
    picks = (
        set(np.unique(np.linspace(0, n - 1, min(samples, n)).round().astype(int)).tolist()) if n else set()
    )
    rows = []
    for i, r in enumerate(diag_rows):
        row = {k: _scalar(v) for k, v in r.items()}
        row.update(step=step, fresh=bool(r.get("root_step") == r.get("step")), sampled=i in picks)
        row.update(forward_error=math.nan, forward_error_total=math.nan, forward_error_solved=math.nan)
        row["eps_abs_reference"] = math.nan
        if i in picks and i < len(states) and states[i][2].has_root and states[i][2].root is not None:
            f, opts = states[i][2], states[i][3]
            reg = _reported(r, "regularisation")
            row.update(root_forward_errors(f, opts, unit.reference_eps, unit.reference_eps_mode, reg))
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------------
# training


def _one_step(
    task: Task, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Any
) -> tuple[float, float]:
    """One training step; returns (loss, seconds of opt.step())."""
    opt.zero_grad(set_to_none=True)
    loss = task.loss(model, batch)
    loss.backward()
    t = time.perf_counter()
    opt.step()
    return float(loss.detach()), time.perf_counter() - t


def interleaved_timing(
    task: Task, model: torch.nn.Module, opt: torch.optim.Optimizer, unit: Unit
) -> dict[str, float]:
    """Median per-step wall/CPU time of ``opt`` and of a fresh AdamW on a copy of ``model``, interleaved."""
    base = copy.deepcopy(model)
    adam = torch.optim.AdamW(base.parameters(), lr=unit.lr, weight_decay=0.0)
    batches = task.batches(unit.seed + 7919)
    _one_step(task, base, adam, next(batches))  # AdamW's state is created on its first step
    times: dict[str, dict[str, list[float]]] = {
        k: {"wall": [], "cpu": [], "opt": []} for k in ("self", "adamw")
    }
    pair = {"self": (model, opt), "adamw": (base, adam)}
    for r in range(unit.timing_rounds):
        for who in ("self", "adamw") if r % 2 == 0 else ("adamw", "self"):
            m, o = pair[who]
            w0, c0, ot = time.perf_counter(), time.process_time(), 0.0
            for _ in range(unit.timing_chunk):
                ot += _one_step(task, m, o, next(batches))[1]
            k = unit.timing_chunk
            times[who]["wall"].append((time.perf_counter() - w0) / k)
            times[who]["cpu"].append((time.process_time() - c0) / k)
            times[who]["opt"].append(ot / k)
    med = {w: {k: float(np.median(v)) for k, v in d.items()} for w, d in times.items()}
    return {
        "step_s": med["self"]["wall"],
        "adamw_step_s": med["adamw"]["wall"],
        "time_ratio": med["self"]["wall"] / med["adamw"]["wall"],
        "step_cpu_s": med["self"]["cpu"],
        "adamw_step_cpu_s": med["adamw"]["cpu"],
        "time_ratio_cpu": med["self"]["cpu"] / med["adamw"]["cpu"],
        "opt_step_s": med["self"]["opt"],
        "adamw_opt_step_s": med["adamw"]["opt"],
        "opt_time_ratio": med["self"]["opt"] / med["adamw"]["opt"],
    }


def identity(unit: Unit) -> dict[str, Any]:
    """The columns naming a unit (shared by all its rows); protocol units add their phase, trial and
    hyperparameter point (``hparams``, JSON)."""
    s = unit.optimizer
    extra = {}
    if unit.phase:
        extra = {
            "phase": unit.phase,
            "trial": unit.trial,
            "hparams": json.dumps(unit.hparams, sort_keys=True),
        }
    return {
        **extra,
        "unit": unit.key,
        "task": unit.task.name,
        "optimizer": s.name,
        "config": s.label,
        "lr": unit.lr,
        "seed": unit.seed,
        "root_solver": s.solver_label,
        "root_method": s.root_solver,
        "root_dtype": s.root_dtype,
        "eps": s.eps if s.name in ("shampoo", "soap") else math.nan,
        "eps_mode": s.eps_mode,
        "precondition_frequency": s.precondition_frequency,
    }


def run_unit(unit: Unit) -> list[dict[str, Any]]:
    """Train one unit and return its curve, run and root rows (see the module docstring)."""
    one_thread()
    from .peers import PeerUnavailableError

    task = get_task(unit.task.name, **unit.task.size)
    model = task.build_model(unit.seed)
    ident = identity(unit)
    try:
        opt = make_optimizer(unit, model)
    except PeerUnavailableError as exc:  # the peer's package is absent here: recorded, not dropped
        return [{**ident, "table": "run", "steps": unit.task.steps, "steps_done": 0, "failure": "Unavailable",
                 "failure_message": str(exc)[:300], "metric_name": task.metric,
                 "versions": provenance.versions_string(), "machine": provenance.machine_string()}]  # fmt: skip
    outcomes = _outcomes(unit)
    prog = _Progress(task=task, model=model, ident=ident)
    prog.record(0)
    failure, message, done = _train(unit, opt, prog, outcomes)
    if prog.losses:
        prog.record(done)
    totals = _shampoo_totals(opt, prog.roots) if _is_shampoo(opt) else {}  # before the timing steps
    timing = {}
    if not failure:
        timing = interleaved_timing(task, model, opt, unit)
    run = _run_row(unit, prog, failure, message, done, timing)
    run.update(totals)
    return [*prog.curves, run, *prog.roots]


def _outcomes(unit: Unit) -> tuple[type, ...]:
    """The exceptions of a step that end the unit as a recorded failure (not an error of the run)."""
    from shampoo.errors import RootComputationError

    from ...core.errors import MatrootsError

    outcomes: tuple[type, ...] = (RootComputationError, MatrootsError)
    if unit.optimizer.name == "peer":
        from .peers import gives_up

        outcomes += gives_up(unit.optimizer.root_solver)
    return outcomes


@dataclasses.dataclass
class _Progress:
    """A unit's training so far: its curve and root rows, its step times and the losses since the last
    evaluation."""

    task: Task
    model: torch.nn.Module
    ident: dict[str, Any]
    curves: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    roots: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    wall: float = 0.0
    cpu: float = 0.0
    losses: list[float] = dataclasses.field(default_factory=list)

    def record(self, step: int) -> dict[str, float]:
        """Evaluate the model, append the curve row of ``step`` and return the evaluation."""
        ev = self.task.evaluate(self.model)
        self.curves.append(
            {
                **self.ident,
                "table": "curve",
                "step": step,
                "train_loss": float(np.mean(self.losses)) if self.losses else math.nan,
                "val_loss": ev["val_loss"],
                "metric": ev[self.task.metric],
                **(
                    {"test_loss": ev["test_loss"], "test_metric": ev["test_metric"]}
                    if "test_loss" in ev
                    else {}
                ),
                "wall_s": self.wall,
                "cpu_s": self.cpu,
            }
        )
        self.losses.clear()
        return ev


def _train(
    unit: Unit, opt: torch.optim.Optimizer, prog: _Progress, outcomes: tuple[type, ...]
) -> tuple[str, str, int]:
    """The training steps, evaluated every eval_every; the failure and its message ("" if none) and
    the last step done."""
    from .protocol import lr_factor

    task, model = prog.task, prog.model
    failure, message, done = "", "", 0
    rounds = 0
    batches = task.batches(unit.seed)
    shampoo_opt = _is_shampoo(opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Shampoo's root-failure warnings are counted in its diagnostics
        for step in range(1, unit.task.steps + 1):
            batch = next(batches)
            if unit.schedule:  # warmup + cosine: the same schedule family for every optimizer
                for g in opt.param_groups:
                    g["lr"] = unit.lr * lr_factor(step, unit.task.steps, unit.warmup_fraction)
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                lv, _ = _one_step(task, model, opt, batch)
            except outcomes as exc:
                # Shampoo gave up (N consecutive failures), the solver rejected the config's input
                # (e.g. a Newton iteration in a format too narrow for the factor size), or a peer
                # reported a numerical failure of its own (peers.gives_up): an outcome.
                failure, message = type(exc).__name__, str(exc)[:300]
                break
            prog.wall += time.perf_counter() - w0
            prog.cpu += time.process_time() - c0
            done = step
            prog.losses.append(lv)
            if shampoo_opt and opt.timing.root_rounds != rounds:
                rounds = opt.timing.root_rounds
                prog.roots.extend({**prog.ident, "table": "root", **r} for r in root_rows(opt, unit, step))
            if not math.isfinite(lv):
                failure, message = "Diverged", f"non-finite training loss at step {step}"
                break
            if step % unit.task.eval_every == 0 or step == unit.task.steps:
                ev = prog.record(step)
                if not math.isfinite(ev["val_loss"]):
                    failure, message = "Diverged", f"non-finite validation loss at step {step}"
                    break
    return failure, message, done


def _run_row(
    unit: Unit, prog: _Progress, failure: str, message: str, done: int, timing: dict[str, Any]
) -> dict[str, Any]:
    """The unit's run row: its outcome, final and best losses, training time and provenance."""
    task = prog.task
    final = prog.curves[-1]
    return {
        **prog.ident,
        "table": "run",
        "steps": unit.task.steps,
        "eval_every": unit.task.eval_every,
        "steps_done": done,
        "failure": failure,
        "failure_message": message,
        "final_val_loss": final["val_loss"] if not failure else math.nan,
        "final_metric": final["metric"] if not failure else math.nan,
        "final_test_loss": final.get("test_loss", math.nan) if not failure else math.nan,
        "final_test_metric": final.get("test_metric", math.nan) if not failure else math.nan,
        "metric_name": task.metric,
        "metric_goal": task.metric_goal,
        "best_val_loss": float(np.nanmin([c["val_loss"] for c in prog.curves])),
        "train_wall_s": prog.wall,
        "train_cpu_s": prog.cpu,
        "options": json.dumps(unit.optimizer.options, sort_keys=True),
        "solver_options": json.dumps(unit.optimizer.solver_options, sort_keys=True),
        "task_info": json.dumps(task.info(), sort_keys=True, default=str),
        "versions": provenance.versions_string(),
        "machine": provenance.machine_string(),
        **timing,
    }


def _shampoo_totals(opt: Any, roots: list[dict[str, Any]]) -> dict[str, Any]:
    last = [r for d in opt.diagnostics() for r in d.rows() if "solver" in r]

    def stats(col: str) -> dict[str, float]:
        v = np.array([r[col] for r in roots if r.get("sampled")], dtype=float)
        v = v[~np.isnan(v)]
        return {f"{col}_median": float(np.median(v)) if v.size else math.nan,
                f"{col}_max": float(np.max(v)) if v.size else math.nan}  # fmt: skip

    return {
        "root_rounds": int(opt.timing.root_rounds),
        "roots_computed": int(opt.timing.roots_computed),
        "root_seconds": float(opt.timing.root_seconds),
        "factors": len(last),
        "root_failures": int(sum(r.get("failures", 0) for r in last)),
        "primary_failures": int(sum(r.get("primary_failures", 0) for r in last)),
        "fallback_uses": int(sum(r.get("fallback_uses", 0) for r in last)),
        **stats("forward_error"),
        **stats("forward_error_total"),
        **stats("forward_error_solved"),
    }


def crash_rows(unit: Unit) -> list[dict[str, Any]]:
    """The run row of a unit that took its worker down repeatedly."""
    return [{**identity(unit), "table": "run", "steps": unit.task.steps, "failure": "WorkerCrashed"}]


__all__ = [
    "crash_rows",
    "interleaved_timing",
    "make_optimizer",
    "reference_roots",
    "root_forward_errors",
    "root_rows",
    "run_unit",
]
