"""Eigenvalue-corrected Shampoo (SOAP): Adam, or AdaGrad, in the eigenbasis of a block's Kronecker factors.

Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam" (arXiv:2409.11321), Alg. 1
(the same update as George et al. 2018, "Fast approximate natural gradient descent in a Kronecker
factored eigenbasis" (EKFAC), with Shampoo's factors in place of K-FAC's). For a matrix block W
(m x n) with gradient G, per step t:

    L <- b L + (1 - b) G G^T,  R <- b R + (1 - b) G^T G     (b = the group's betas[1]; 1: sums)
    G' = Q_L^T G Q_R                                         (the gradient in the factors' eigenbasis)
    V  <- b2 V + (1 - b2) G' o G'                            (b2 = 1: V <- V + G' o G', AdaGrad)
    M  <- b1 M + (1 - b1) G                                  (first moment, in the ORIGINAL basis)
    M' = Q_L^T M Q_R
    N  = Q_L (M' / (sqrt(V / c2) + eps)) Q_R^T / c1,    c1 = 1 - b1^t, c2 = 1 - b2^t (bias corrections)
    W  <- W - lr N,

and every ``precondition_frequency`` steps (from ``start_preconditioning_step`` on) the eigenbases
Q_L, Q_R are refreshed from L and R. A block of order k has one factor and one basis per dim
(G' = G x_1 Q_1^T ... x_k Q_k^T); a dim without a factor (exponent override 0) keeps the identity,
and dims above ``max_preconditioner_dim`` are cut into blocks, as for Shampoo (:mod:`shampoo.blocking`).
Vector blocks keep the group's diagonal (Adam-style) preconditioner, as SOAP runs Adam on 1-D
parameters. The statistics L, R are the Kronecker transform's own (upper triangle, mirrored when
read; the group's ``statistics_frequency`` / ``statistics_dtype`` apply).

Choices, and where they come from:

* **Momentum** is kept in the original basis and rotated for each update (Alg. 1, lines 4-5, and the
  reference code, which stores M rotated but rotates it back and forth exactly at each basis change:
  the same quantity). A first moment in the original basis is unaffected by basis changes, so a
  refreshed basis never mixes old and new coordinates in M. It is the pipeline's
  :class:`~shampoo.transforms.FirstMoment` (beta1, with its bias correction c1).
* **Second moments across a basis change** are kept, not reset or rotated (Alg. 1; Meta's
  eigenvalue-corrected Shampoo keeps them too). SOAP's QR refresh first sorts the columns of the old
  basis by their Rayleigh quotients under the new statistics, diag(Q^T L Q), and permutes V along that
  dim in the same way, so that each entry of V follows the direction it was measured in. The same
  re-sort is applied here before every refresh (QR, eigh and eigh_warm alike): bases are stored with
  columns in descending order of their eigenvalue estimates (SOAP's convention), and an eigh's
  descending eigenvectors then line up with the re-sorted V. On the first refresh the old basis is the
  identity (below), so V's coordinates are matched to eigen-directions by the diagonal of L.
* **Refresh timing**: SOAP rotates step t's gradient with the basis computed *before* step t, and
  refreshes the basis from L_t, R_t after the update (Alg. 1, lines 10-12: "never use the current
  gradient in the projection"). The engine calls :meth:`SOAP.refresh` between the statistics update
  and the direction of a due step; the refresh is recorded (``basis_pending`` = that step) and the
  new bases are computed from the step-t statistics at the start of the block's next update, before
  the next gradient is rotated: exactly the paper's order. A pending refresh is checkpointed.
* **Before the first refresh** the bases are the identity: the update is Adam (AdaGrad) on the block
  in its own coordinates, as in Meta's implementation (SOAP's reference code instead skips the first
  step). Blocks are therefore always :meth:`SOAP.ready`; the engine uses the grafting direction before
  ``start_preconditioning_step``, so ``start_preconditioning_step=1, grafting="none"`` is SOAP as
  published (the refreshes then come at steps 1, 1 + f, 1 + 2f, ...).
* **eps** is added as torch.optim.Adam adds it, to sqrt(V / c2) (computed as (sqrt(V) + eps sqrt(c2))
  / sqrt(c2), the same number): with the bases fixed to the identity the update is torch.optim.Adam's
  (Adagrad's for b2 = 1). SOAP's reference code adds eps to sqrt(V) before the bias correction, i.e.
  its eps is ours times sqrt(c2); the two differ only in the first ~1/(1 - b2) steps.
* **Grafting** is the group's (optional: SOAP uses none, ``grafting="none"``); with a grafting method
  each block's SOAP direction is rescaled to the grafting direction's norm, as for Shampoo.

Basis updates (``basis_update``):

* ``"eigh_warm"`` (default): matroots' warm-started eigensolver (:mod:`matroots.solvers.eigh_warm`)
  from the previous basis (a cold eigh the first time). It accepts the refined basis when the Shampoo
  root that basis implies for the factor (the factor's p, the group's eps, eps_mode and psd policy) is
  within a cold eigh's error, else it runs the full eigh: the same accuracy contract as Shampoo with
  ``root_solver="eigh_warm"``. Its verdict ("accepted", "refined", "fallback: ...", "cold") is the
  factor's ``warm`` in :meth:`shampoo.Shampoo.diagnostics`.
* ``"eigh"``: a full ``torch.linalg.eigh`` in ``promote(factor_dtype, root_dtype)`` (fp32 failures
  retried in fp64).
* ``"qr"``: SOAP's amortised update, one step of orthogonal (power) iteration from the re-sorted
  previous basis: Q <- qr(L Q) (Vyas et al. §4; Meta's QR eigendecomposition with one iteration).
* ``"identity"``: no rotation, no factor statistics: Adam (AdaGrad) per block, the Q = I limit of the
  method (an ablation baseline that costs as Adam).

A refresh goes through the refresh engine (:mod:`shampoo.refresh`), with the same policy as Shampoo's
roots: a refresh that fails (a numerical error, a non-finite basis) keeps the (re-sorted) previous
basis; eigh_warm's failed rows are solved again by the fp64 eigh (its fallback, ``[fallback eigh]``);
a factor without a usable basis counts a failure, and ``FailurePolicy.max_consecutive_failures`` in a
row raise :class:`~shampoo.errors.RootComputationError`. Statistics that became non-finite are reset
to zero with a :class:`~shampoo.errors.FactorResetWarning`, and a non-finite second moment is reset
with its block's first moment.

Checkpoint (per block, ``blocks.<i>.``; see :mod:`shampoo.state`): ``second_moment`` (V, the block's
shape), ``basis_pending`` (0-d int64: the step whose refresh is still to be computed, 0: none),
``factors.<d>.eigenbasis`` (Q of block dim d, (n, n), columns in descending order of the eigenvalue
estimates), ``factors.<d>.matrix`` (the statistics, as for Shampoo) and the factor's bookkeeping
(``factors.<d>.solver``, ``.residual``, ``.warm``, ``.has_root`` = has a computed basis,
``.root_step`` = the step of its statistics, failures, ...). No ``factors.<d>.root`` is kept.

Diagnostics per factor: ``solver`` ("soap:eigh_warm", "soap:eigh", "soap:qr", "...[fallback eigh]"),
``warm``, ``iterations`` (refinement / power steps), ``residual`` = ||offdiag(Q^T L Q)||_F / ||L||_F of
the primary's new basis (NaN when it failed) (the relative distance of Q diag(Q^T L Q) Q^T from L; ~u for an eigh, the convergence
measure of the QR update), ``converged``, ``seconds``, failures. psd_shift, eps_abs and kappa are NaN:
no root is solved.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from matroots import MatrootsNumericalError
from matroots.core import arguments
from matroots.core.errors import InvalidArgumentError
from matroots.solvers.eigh import eigh_checked
from matroots.solvers.eigh_warm import EighWarmConfig

from ..refresh import Result, RootJob, Round, Snapshot, SolveOutcome, finite_rows
from ..state import FactorState, declare, mirror_upper_
from .base import Stack, StepContext
from .kronecker import Kronecker, KroneckerState, kronecker_for
from .moments import SecondMoment

if TYPE_CHECKING:
    from ..state import BlockState

log = logging.getLogger("shampoo")

BASIS_UPDATES = ("eigh_warm", "eigh", "qr", "identity")
_NUMERICAL = (MatrootsNumericalError, torch.linalg.LinAlgError)


def rotate(X: torch.Tensor, bases: list[torch.Tensor | None], *, back: bool = False) -> torch.Tensor:
    """X x_1 Q_1^T ... x_k Q_k^T (the coefficients of X in the bases Q_i), or with ``back`` X x_1 Q_1 ...
    x_k Q_k (back to the original basis), for a stack X (b, *shape) and Q_i (b, n_i, n_i) or None
    (identity). Matrices take the two-GEMM path Q_L^T X Q_R (back: Q_L X Q_R^T)."""
    b, shape = X.shape[0], X.shape[1:]
    if len(shape) == 2 and bases[0] is not None and bases[1] is not None:
        QL, QR = bases
        if back:
            return torch.bmm(torch.bmm(QL, X), QR.mT)
        return torch.bmm(torch.bmm(QL.mT, X), QR)
    Y = X
    for i, Q in enumerate(bases):  # contract dim i with Q's rows (Q^T y), then cycle it to the end
        Y = Y.reshape(b, shape[i], -1)
        Y = Y.mT if Q is None else torch.bmm(Y.mT, Q.mT if back else Q)
    return Y.reshape(X.shape)


def _permute_dim(V: torch.Tensor, dim: int, perm: torch.Tensor) -> torch.Tensor:
    """V (r, *shape) with block dim ``dim`` permuted by perm (r, n): out[.., i, ..] = V[.., perm[i], ..]."""
    shape = [1] * V.ndim
    shape[0], shape[dim + 1] = perm.shape[0], perm.shape[1]
    return V.gather(dim + 1, perm.view(shape).expand_as(V))


def _columns(Q: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    return Q.gather(-1, perm.unsqueeze(-2).expand_as(Q))


@dataclass
class SOAPState:
    """Stacked state of a bucket: second moments, pending refreshes, and (unless ``identity``) the
    Kronecker statistics with their eigenbases (``stats.roots`` holds the bases: the Kronecker
    transform's identity-initialised (b, n, n) storage, here the eigenbases, not roots)."""

    v: torch.Tensor  # (b, *shape) second moment of the rotated gradient
    pending: torch.Tensor  # (b,) int64: parameter step of a refresh still to be computed (0: none)
    stats: KroneckerState | None
    labels: dict[tuple[int, int], str] = field(default_factory=dict)  # (position, dim) -> name

    @property
    def bases(self) -> list[torch.Tensor]:
        return self.stats.roots if self.stats is not None else []


@dataclass(frozen=True, kw_only=True)
class SOAP:
    """Eigenvalue-corrected Shampoo / SOAP as a per-block preconditioner (module docstring).

    Use it as a param group's ``preconditioner`` (``preconditioner=shampoo.SOAP(...)`` or
    ``preconditioner="soap"``); the group's betas[0] is the first moment, betas[1] the factor EMA.

    Args:
        beta2: EMA of the second moment of the rotated gradient, in (0, 1]; 1.0 sums (AdaGrad). None
            (default): the group's betas[1] (one beta for factors and second moments, as SOAP's
            ``shampoo_beta=-1``).
        eps: added to sqrt(V / (1 - beta2^t)) as in torch.optim.Adam (>= 0).
        basis_update: "eigh_warm" (default), "eigh", "qr" (one power step, as SOAP) or "identity".
    """

    beta2: float | None = None
    eps: float = 1e-8
    basis_update: str = "eigh_warm"

    def __post_init__(self) -> None:
        arguments.store(
            self,
            beta2=arguments.real(
                "SOAP.beta2", self.beta2, minimum=0.0, exclusive_minimum=True, maximum=1.0, allow_none=True,
                what="EMA of the rotated second moment; 1.0 sums as AdaGrad; None: the group's betas[1]",
            ),
            eps=arguments.real("SOAP.eps", self.eps, minimum=0.0, what="added to sqrt(V / (1 - beta2^t))"),
            basis_update=arguments.choice("SOAP.basis_update", self.basis_update, BASIS_UPDATES),
        )  # fmt: skip

    # -- the transform interface ------------------------------------------------------------------

    def init(self, stack: Stack) -> SOAPState:
        pending = torch.zeros(stack.size, dtype=torch.int64, device=stack.device)
        stats = None
        if self.basis_update != "identity":
            stats = Kronecker(beta2=1.0).init(stack)  # shapes and dtypes; the group's transform updates it
        return SOAPState(stack.zeros(), pending, stats)

    def bind(self, state: SOAPState, j: int, block: BlockState) -> None:
        declare(block, "second_moment", state.v[j], minimum=0.0)  # Adam's v: a sum of squares
        declare(block, "basis_pending", state.pending[j], minimum=0)  # a step (0: none pending)
        st = state.stats
        if st is None:
            return
        block.factors = [
            FactorState(dim=d, n=st.factors[k].shape[-1], root_p=p, matrix=st.factors[k][j], root=None)
            for k, (d, p) in enumerate(zip(st.dims, st.ps, strict=True))
        ]
        for k, f in enumerate(block.factors):
            st.records[k].append(f)
            declare(block, f"factors.{f.dim}.eigenbasis", st.roots[k][j])

    def update(self, state: SOAPState, G: torch.Tensor, ctx: StepContext) -> None:
        st = state.stats
        Gr = G
        if st is not None:
            self._refresh_pending(state, ctx)
            Gr = rotate(G, self._bases(state, ctx))
        V = ctx.take(state.v)
        self._second_moment(ctx).update(V, Gr)
        ctx.put(state.v, V)
        if st is not None:
            _statistics_transform(ctx).update(st, G, ctx)

    def direction(
        self, state: SOAPState, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        bases = self._bases(state, ctx) if state.stats is not None else []
        mr = rotate(m, bases) if bases else m
        V = ctx.take(state.v)
        N, scale = self._second_moment(ctx).direction(
            V, mr, ctx.steps, bias_correction=ctx.opts.use_bias_correction
        )
        return (rotate(N, bases, back=True) if bases else N), scale

    def ready(self, state: SOAPState, j: int) -> bool:
        return True  # identity bases before the first refresh: Adam in the block's coordinates

    def refresh(
        self, state: SOAPState, positions: list[int], steps: list[int], label: Callable[[int, int], str]
    ) -> list[RootJob]:
        """The due refreshes as one job per factor slot, with SOAP's own refresher. A synchronous
        round hands them back (``defer``): they are recorded and the bases computed from these
        statistics at the start of the block's next update (the paper's order, module docstring). A
        background round (``root_schedule="async"``) solves the same snapshot (the statistics after
        this step's update, the bases in use) while training goes on, and installs it at the start of
        the step ``max_root_delay`` steps later: with delay 1, where the synchronous round installs."""
        st = state.stats
        if st is None:
            return []
        for j in positions:
            for d in st.dims:
                state.labels[(j, d)] = label(j, d)

        def defer() -> None:
            for j, t in zip(positions, steps, strict=True):
                state.pending[j] = t

        refresher = _RefresherFor(self, state)
        return [
            RootJob(
                factors=st.factors[k], roots=st.roots[k], records=st.records[k], p=st.ps[k],
                positions=list(positions), steps=list(steps),
                label=lambda j, d=d: state.labels.get((j, d), f"position {j}"),
                refresher=refresher, defer=defer if k == 0 else _nothing,
            )
            for k, d in enumerate(st.dims)
        ]  # fmt: skip

    def accumulators(self, state: SOAPState) -> list[torch.Tensor]:
        return [state.v]  # statistics are checked (and reset) at each refresh

    # -- helpers ----------------------------------------------------------------------------------

    def _second_moment(self, ctx: StepContext) -> SecondMoment:
        """Adam (AdaGrad at beta2 = 1) on the rotated gradient: beta2 (None: the group's betas[1]), eps."""
        return SecondMoment(ctx.opts.beta2 if self.beta2 is None else self.beta2, self.eps)

    def _bases(self, state: SOAPState, ctx: StepContext) -> list[torch.Tensor | None]:
        st = state.stats
        assert st is not None
        out: list[torch.Tensor | None] = [None] * st.ndim
        for k, d in enumerate(st.dims):
            out[d] = ctx.take(st.roots[k])
        return out

    def _refresh_pending(self, state: SOAPState, ctx: StepContext) -> None:
        pend = ctx.take(state.pending)
        local = (pend > 0).nonzero().flatten()
        if local.numel() == 0:
            return
        rows = local if ctx.sel is None else ctx.sel.index_select(0, local)
        steps = pend.index_select(0, local).tolist()
        st = state.stats
        assert st is not None
        rnd = Round(_BasisRefresh(self, state, ctx.opts))  # one round: one warning, limits after it
        for k, d in enumerate(st.dims):  # the eigenbases of each factor slot (module docstring)
            rnd.run(
                [
                    RootJob(
                        factors=st.factors[k], roots=st.roots[k], records=st.records[k], p=st.ps[k],
                        positions=rows.tolist(), steps=steps,
                        label=lambda j, d=d: state.labels.get((j, d), f"position {j}"),
                    )
                ]
            )  # fmt: skip
        rnd.finish()
        state.pending.index_fill_(0, rows, 0)


def _nothing() -> None:
    """A slot's job whose block is deferred by its first slot's job (one record per block)."""


@dataclass(frozen=True, eq=False)
class _RefresherFor:
    """Builds SOAP's refresher of one bucket's state from the group's options (RootJob.refresher)."""

    soap: SOAP
    state: SOAPState

    def __call__(self, opts: Any) -> _BasisRefresh:
        return _BasisRefresh(self.soap, self.state, opts)


@dataclass(frozen=True)
class _BasisRefresh:
    """How SOAP refreshes the eigenbases of a factor slot (a :class:`shampoo.refresh.Refresher`; one
    job per slot: the slot's statistics and bases, the due rows; module docstring, "Second moments
    across a basis change" and "Basis updates"). The solve re-sorts the old basis by its Rayleigh
    quotients under the new statistics and computes the new basis (descending columns); install
    permutes V the same way and writes the new bases (the re-sorted old ones where none is usable)."""

    soap: SOAP
    state: SOAPState
    opts: Any
    noun: ClassVar[str] = "eigenbasis"
    nouns: ClassVar[str] = "eigenbases"
    remedies: ClassVar[str] = "basis_update='eigh', root_dtype=torch.float64"
    log_level: ClassVar[int] = logging.DEBUG

    @property
    def name(self) -> str:
        return f"soap:{self.soap.basis_update}"

    @property
    def fallback_name(self) -> str | None:
        return f"{self.name}[fallback eigh]" if self.soap.basis_update == "eigh_warm" else None

    @property
    def dtype(self) -> torch.dtype:
        return torch.promote_types(self.opts.factor_dtype, self.opts.root_dtype)

    @property
    def policy(self) -> Any:
        return self.opts.failure

    def detail(self, p: Fraction) -> str:
        return f"basis_update={self.soap.basis_update!r}"

    def _slot(self, jobs: list[RootJob]) -> tuple[int, torch.Tensor]:
        """(factor slot, due rows) of the one job of a snapshot."""
        st = self.state.stats
        assert st is not None and len(jobs) == 1
        k = next(i for i, F in enumerate(st.factors) if F is jobs[0].factors)
        return k, torch.tensor(jobs[0].positions, device=jobs[0].factors.device)

    def inputs(self, jobs: list[RootJob]) -> torch.Tensor:
        _, rows = self._slot(jobs)
        return mirror_upper_(jobs[0].factors.index_select(0, rows)).to(self.dtype)

    def prepare(
        self, snap: Snapshot, records: list[FactorState], copy: bool
    ) -> tuple[torch.Tensor, list[bool], int, torch.Tensor]:
        k, rows = self._slot(snap.jobs)
        Q = snap.jobs[0].roots.index_select(0, rows).to(self.dtype)  # a copy
        # eigh_warm: a factor whose warm start fell back recently solves cold for a few refreshes
        warm = self.soap.basis_update == "eigh_warm"
        snap.backoff = [warm and f.has_root and f.warm_skip > 0 for f in records]
        fresh = [not f.has_root or skip for f, skip in zip(records, snap.backoff, strict=True)]
        return Q, fresh, k, rows

    def solve(self, snap: Snapshot) -> SolveOutcome:
        t0 = time.perf_counter()
        A, (Q, fresh, _, _) = snap.A, snap.extra
        r = A.shape[0]
        ok_in = ~torch.tensor(snap.reset, dtype=torch.bool)
        AQ = torch.bmm(A, Q)
        rq = (AQ * Q).sum(-2)  # Rayleigh quotients of the old columns under the new statistics
        perm = torch.argsort(rq, dim=-1, descending=True, stable=True)
        perm = torch.where(ok_in.to(A.device).view(-1, 1), perm, torch.arange(A.shape[-1], device=A.device))
        Qp = _columns(Q, perm)
        Qn, ok, info = self._new_basis(A, Qp, _columns(AQ, perm), snap.p, fresh)
        ok &= ok_in
        Qn = torch.where(ok.to(A.device).view(-1, 1, 1), Qn, Qp)
        S = Qn.mT @ A @ Qn
        off = torch.linalg.matrix_norm(S - torch.diag_embed(S.diagonal(dim1=-2, dim2=-1))).double()
        resid = (off / torch.linalg.matrix_norm(A).double().clamp_min(1e-300)).cpu().tolist()
        nan = [math.nan] * r
        return SolveOutcome(
            Qn, ok, info["iterations"], [x if bool(o) else math.nan for x, o in zip(resid, ok, strict=True)],
            time.perf_counter() - t0, nan, "" if bool(ok[ok_in].all()) else info["error"] or "non-finite basis",
            warm=info["warm"], carry=(perm, Qp),
        )  # fmt: skip

    def fallback(self, snap: Snapshot, rows: list[int]) -> SolveOutcome:
        """eigh_warm's fallback: the fp64 eigh of the rows its warm or cold solve did not give."""
        t0 = time.perf_counter()
        Qf, okf, err = _eigh(snap.A.index_select(0, torch.tensor(rows, device=snap.A.device)), torch.float64)
        nan = [math.nan] * len(rows)
        return SolveOutcome(
            Qf.flip(-1).to(self.dtype), okf, [0] * len(rows), nan, time.perf_counter() - t0, nan, err
        )

    def install(self, snap: Snapshot, result: Result) -> None:
        """V permuted as the old basis's columns were; the new bases written (the re-sorted old ones
        where none is usable)."""
        st = self.state.stats
        assert st is not None
        perm, Qp = result.primary.carry
        _, _, k, rows = snap.extra
        V = _permute_dim(self.state.v.index_select(0, rows), st.dims[k], perm)
        self.state.v.index_copy_(0, rows, V)
        Qn = torch.where(result.good.to(Qp.device).view(-1, 1, 1), result.final, Qp)
        st.roots[k].index_copy_(0, rows, Qn.to(st.roots[k].dtype))

    def _new_basis(
        self, A: torch.Tensor, Qp: torch.Tensor, AQp: torch.Tensor, p: Fraction, fresh: list[bool]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """(new bases with descending columns, ok per row, info) for the re-sorted old bases Qp."""
        r, work = A.shape[0], self.dtype
        info: dict[str, Any] = {"warm": [""] * r, "iterations": [0] * r, "error": ""}
        if self.soap.basis_update == "qr":
            try:
                Qn = torch.linalg.qr(AQp).Q
            except _NUMERICAL as exc:
                info["error"] = f"{type(exc).__name__}: {exc}"
                return Qp, torch.zeros(r, dtype=torch.bool), info
            info["iterations"] = [1] * r
            return Qn, finite_rows(Qn), info
        if self.soap.basis_update == "eigh_warm":
            Qn = Qp.clone()
            ok = torch.zeros(r, dtype=torch.bool)
            errors = []
            for idx, warm in (
                ([i for i in range(r) if not fresh[i]], True),
                ([i for i in range(r) if fresh[i]], False),
            ):
                if not idx:
                    continue
                sel = torch.tensor(idx, device=A.device)
                out = _eigh_warm(
                    A.index_select(0, sel), Qp.index_select(0, sel) if warm else None, p, self.opts, work
                )
                if isinstance(out, str):
                    errors.append(out)
                    continue
                Qw, okw, warm_l, iters = out
                Qn.index_copy_(0, sel, Qw.flip(-1))
                for j, i in enumerate(idx):
                    ok[i] = bool(okw[j])
                    info["warm"][i], info["iterations"][i] = warm_l[j], iters[j]
            info["error"] = "; ".join(errors)
            return Qn, ok, info
        Qe, ok, info["error"] = _eigh(A, work)
        return Qe.flip(-1).to(work), ok, info


def _eigh(A: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Ascending eigenvectors of the batch A in ``dtype``, ok per row (matroots' eigh_checked: an
    fp32 failure, reported or not, is solved again in fp64)."""
    try:
        _, Q = eigh_checked(A.to(dtype), {})
    except _NUMERICAL as exc:
        return A.clone(), torch.zeros(A.shape[0], dtype=torch.bool), f"{type(exc).__name__}: {exc}"
    ok = finite_rows(Q)
    return Q.to(A.dtype), ok, "" if bool(ok.all()) else "non-finite eigenvectors"


def _eigh_warm(
    A: torch.Tensor, Q: torch.Tensor | None, p: Fraction, opts: Any, work: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, list[str], list[int]] | str:
    """matroots' eigh_warm on the batch A from the bases Q (None: cold): (ascending eigenvectors, ok,
    verdicts, refinement steps), or the text of the numerical error it raised (the engine falls back)."""
    pp: int | Fraction = int(p) if p.denominator == 1 else p
    try:
        res = EighWarmConfig().solve(
            A, pp, eps=opts.eps, eps_mode=opts.eps_mode, dtype=work, warm_start=Q, psd=opts.psd, quiet=True
        )
    except _NUMERICAL as exc:
        return f"{type(exc).__name__}: {exc}"
    r = A.shape[0]
    Qn = res.info["eigenvectors"].reshape(r, *A.shape[-2:]).to(work)
    conv = (
        res.converged if isinstance(res.converged, torch.Tensor) else torch.tensor([bool(res.converged)] * r)
    )
    ok = conv.reshape(r).cpu() & finite_rows(Qn)
    warm = res.info.get("warm", "")
    warm_l = [warm] * r if isinstance(warm, str) else list(warm)
    iters = res.iterations
    iters_l = iters.reshape(r).tolist() if isinstance(iters, torch.Tensor) else [int(iters)] * r
    return Qn, ok, warm_l, iters_l


def _statistics_transform(ctx: StepContext) -> Kronecker:
    """The group's Kronecker transform (its beta2 and statistics options), whose update SOAP reuses."""
    return kronecker_for(ctx.opts)  # type: ignore[arg-type]  # GroupOptions has the statistics options


def preconditioner_named(name: str) -> SOAP:
    """The preconditioner transform a param group's ``preconditioner="<name>"`` stands for."""
    if isinstance(name, str) and name.lower() == "soap":
        return SOAP()
    raise InvalidArgumentError(
        f"preconditioner must be a per-block transform (shampoo.transforms.Preconditioner, e.g. "
        f"shampoo.SOAP(...)), one of the names ('soap',) or None; got {name!r}"
    )


__all__ = ["BASIS_UPDATES", "SOAP", "SOAPState", "preconditioner_named", "rotate"]
