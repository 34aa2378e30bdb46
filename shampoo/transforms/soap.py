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

A refresh that fails (a numerical error, a non-finite basis) keeps the (re-sorted) previous basis and
counts a failure; the group's ``FailurePolicy.max_consecutive_failures`` consecutive failures raise
:class:`~shampoo.errors.RootComputationError`; eigh_warm failures are retried with the fp64 eigh first.
Statistics that became non-finite are reset to zero with a :class:`~shampoo.errors.FactorResetWarning`
(as for Shampoo), and a non-finite second moment is reset with its block's first moment.

Checkpoint (per block, ``blocks.<i>.``; see :mod:`shampoo.state`): ``second_moment`` (V, the block's
shape), ``basis_pending`` (0-d int64: the step whose refresh is still to be computed, 0: none),
``factors.<d>.eigenbasis`` (Q of block dim d, (n, n), columns in descending order of the eigenvalue
estimates), ``factors.<d>.matrix`` (the statistics, as for Shampoo) and the factor's bookkeeping
(``factors.<d>.solver``, ``.residual``, ``.warm``, ``.has_root`` = has a computed basis,
``.root_step`` = the step of its statistics, failures, ...). No ``factors.<d>.root`` is kept.

Diagnostics per factor: ``solver`` ("soap:eigh_warm", "soap:eigh", "soap:qr", "...[fallback eigh]"),
``warm``, ``iterations`` (refinement / power steps), ``residual`` = ||offdiag(Q^T L Q)||_F / ||L||_F of
the new basis (the relative distance of Q diag(Q^T L Q) Q^T from L; ~u for an eigh, the convergence
measure of the QR update), ``converged``, ``seconds``, failures. psd_shift, eps_abs and kappa are NaN:
no root is solved.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import torch

from matroots import MatrootsNumericalError
from matroots.core import arguments
from matroots.core.errors import InvalidArgumentError
from matroots.solvers.eigh import eigh_checked
from matroots.solvers.eigh_warm import EighWarmConfig

from ..errors import FactorResetWarning, RootComputationError
from ..state import FactorState, declare, mirror_upper_
from .base import RootJob, Stack, StepContext, col
from .kronecker import Kronecker, KroneckerState, kronecker_for

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
        b2 = self._beta2(ctx)
        if b2 == 1.0:
            V.addcmul_(Gr, Gr)
        else:
            V.mul_(b2).addcmul_(Gr, Gr, value=1.0 - b2)
        ctx.put(state.v, V)
        if st is not None:
            _statistics_transform(ctx).update(st, G, ctx)

    def direction(
        self, state: SOAPState, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        bases = self._bases(state, ctx) if state.stats is not None else []
        mr = rotate(m, bases) if bases else m
        denom = ctx.take(state.v).sqrt()
        b2 = self._beta2(ctx)
        scale: torch.Tensor | float = 1.0
        if ctx.opts.use_bias_correction and b2 < 1.0:
            # sqrt(V / c2) + eps = (sqrt(V) + eps sqrt(c2)) / sqrt(c2): 1 / sqrt(c2) goes to the scale
            c = ctx.per_block([(1.0 - b2**t) ** 0.5 for t in ctx.steps])
            denom.add_(col(c, denom.ndim, denom.dtype) * self.eps)
            scale = c
        else:
            denom.add_(self.eps)
        N = torch.div(mr, denom, out=denom)
        return (rotate(N, bases, back=True) if bases else N), scale

    def ready(self, state: SOAPState, j: int) -> bool:
        return True  # identity bases before the first refresh: Adam in the block's coordinates

    def refresh(
        self, state: SOAPState, positions: list[int], steps: list[int], label: Callable[[int, int], str]
    ) -> list[RootJob]:
        """Record the due refreshes; the bases are computed from these statistics at the start of the
        block's next update (the paper's order, module docstring). No root jobs."""
        if state.stats is None:
            return []
        for j, t in zip(positions, steps, strict=True):
            state.pending[j] = t
            for d in state.stats.dims:
                state.labels[(j, d)] = label(j, d)
        return []

    def accumulators(self, state: SOAPState) -> list[torch.Tensor]:
        return [state.v]  # statistics are checked (and reset) at each refresh

    # -- helpers ----------------------------------------------------------------------------------

    def _beta2(self, ctx: StepContext) -> float:
        return ctx.opts.beta2 if self.beta2 is None else self.beta2

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
        for k in range(len(st.dims)):
            self._refresh_slot(state, k, rows, steps, ctx)
        state.pending.index_fill_(0, rows, 0)

    def _refresh_slot(
        self, state: SOAPState, k: int, rows: torch.Tensor, steps: list[int], ctx: StepContext
    ) -> None:
        """New eigenbases of factor slot k for the blocks ``rows`` (module docstring, "Basis updates")."""
        t0 = time.perf_counter()
        st = state.stats
        assert st is not None
        opts = ctx.opts
        d, records = st.dims[k], [st.records[k][j] for j in rows.tolist()]
        work = torch.promote_types(opts.factor_dtype, opts.root_dtype)
        A = mirror_upper_(st.factors[k].index_select(0, rows)).to(work)
        ok_in = torch.isfinite(A).flatten(1).all(-1)
        if not bool(ok_in.all()):
            self._reset(state, k, rows, ok_in, records)
            eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
            A = torch.where(ok_in.view(-1, 1, 1), A, eye)  # solved and discarded
        ok_in = ok_in.cpu()
        Q = st.roots[k].index_select(0, rows).to(work)
        AQ = torch.bmm(A, Q)
        rq = (AQ * Q).sum(-2)  # Rayleigh quotients of the old columns under the new statistics
        perm = torch.argsort(rq, dim=-1, descending=True, stable=True)
        perm = torch.where(ok_in.view(-1, 1), perm, torch.arange(A.shape[-1], device=A.device))
        Qp = _columns(Q, perm)
        V = _permute_dim(state.v.index_select(0, rows), d, perm)
        state.v.index_copy_(0, rows, V)
        # eigh_warm: a factor whose warm start fell back recently solves cold for a few refreshes
        backoff = [self.basis_update == "eigh_warm" and f.has_root and f.warm_skip > 0 for f in records]
        fresh = [not f.has_root or skip for f, skip in zip(records, backoff, strict=True)]
        Qn, ok, info = self._new_basis(A, Qp, _columns(AQ, perm), st.ps[k], fresh, opts, work)
        ok &= ok_in
        Qn = torch.where(ok.view(-1, 1, 1), Qn, Qp)
        S = Qn.mT @ A @ Qn
        off = torch.linalg.matrix_norm(S - torch.diag_embed(S.diagonal(dim1=-2, dim2=-1))).double()
        resid = (off / torch.linalg.matrix_norm(A).double().clamp_min(1e-300)).cpu().tolist()
        st.roots[k].index_copy_(0, rows, Qn.to(st.roots[k].dtype))
        seconds = (time.perf_counter() - t0) / max(len(records), 1)
        name = f"soap:{self.basis_update}"
        for i, f in enumerate(records):
            f.seconds = seconds
            if not bool(ok_in[i]):
                continue
            f.warm = info["warm"][i]
            f.warm_hits += f.warm in ("accepted", "refined")
            f.update_warm_backoff(skipped=backoff[i])
            f.iterations = info["iterations"][i]
            f.solver = name + info["suffix"][i]
            primary_failed = bool(info["suffix"][i]) or not bool(ok[i])
            f.primary_failures += primary_failed
            f.consecutive_primary_failures = f.consecutive_primary_failures + 1 if primary_failed else 0
            if bool(ok[i]):
                f.residual, f.converged, f.error = resid[i], True, ""
                f.has_root, f.root_step, f.consecutive_failures = True, steps[i], 0
                f.fallback_uses += bool(info["suffix"][i])
            else:
                f.converged, f.error = False, info["error"][i] or "non-finite basis"
                f.failures += 1
                f.consecutive_failures += 1
        self._check_limits(state, k, rows, records, opts)
        log.log(
            logging.DEBUG, "soap basis %s rows=%d ok=%d seconds=%.4f", name, len(records), int(ok.sum()),
            seconds * len(records),
        )  # fmt: skip

    def _new_basis(
        self,
        A: torch.Tensor,
        Qp: torch.Tensor,
        AQp: torch.Tensor,
        p: Fraction,
        fresh: list[bool],
        opts: Any,
        work: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[Any]]]:
        """(new bases with descending columns, ok per row, per-row info) for the re-sorted old bases Qp."""
        r = A.shape[0]
        info: dict[str, list[Any]] = {"warm": [""] * r, "iterations": [0] * r, "suffix": [""] * r,
                                      "error": [""] * r}  # fmt: skip
        if self.basis_update == "qr":
            try:
                Qn = torch.linalg.qr(AQp).Q
            except _NUMERICAL as exc:
                info["error"] = [f"{type(exc).__name__}: {exc}"] * r
                return Qp, torch.zeros(r, dtype=torch.bool), info
            info["iterations"] = [1] * r
            return Qn, _finite_rows(Qn), info
        if self.basis_update == "eigh_warm":
            Qn = Qp.clone()
            ok = torch.zeros(r, dtype=torch.bool)
            for idx, warm in (
                ([i for i in range(r) if not fresh[i]], True),
                ([i for i in range(r) if fresh[i]], False),
            ):
                if not idx:
                    continue
                sel = torch.tensor(idx, device=A.device)
                out = _eigh_warm(
                    A.index_select(0, sel), Qp.index_select(0, sel) if warm else None, p, opts, work
                )
                if out is None:
                    continue
                Qw, okw, warm_l, iters = out
                Qn.index_copy_(0, sel, Qw.flip(-1))
                for j, i in enumerate(idx):
                    ok[i] = bool(okw[j])
                    info["warm"][i], info["iterations"][i] = warm_l[j], iters[j]
            bad = (~ok).nonzero().flatten()
            if bad.numel() == 0:
                return Qn, ok, info
            Qf, okf, err = _eigh(A.index_select(0, bad.to(A.device)), torch.float64)  # the fallback
            for j, i in enumerate(bad.tolist()):
                info["suffix"][i] = "[fallback eigh]"
                info["error"][i] = err
                if bool(okf[j]):
                    Qn[i] = Qf[j].flip(-1).to(work)
                    ok[i] = True
            return Qn, ok, info
        Qe, ok, err = _eigh(A, work)
        info["error"] = [err] * r
        return Qe.flip(-1).to(work), ok, info

    def _reset(
        self, state: SOAPState, k: int, rows: torch.Tensor, ok_in: torch.Tensor, records: list[FactorState]
    ) -> None:
        st = state.stats
        assert st is not None
        bad = rows[~ok_in.to(rows.device)]
        st.factors[k].index_fill_(0, bad, 0.0)
        labs = []
        for f, j, good in zip(records, rows.tolist(), ok_in.tolist(), strict=True):
            if not good:
                f.factor_resets += 1
                f.converged = False
                f.error = "statistics were non-finite and were reset to zero; previous basis kept"
                labs.append(state.labels.get((j, st.dims[k]), f"position {j}"))
        msg = (
            f"shampoo (SOAP): the Kronecker factor statistics of {len(labs)} factor(s) became non-finite "
            f"({', '.join(labs[:5])}{' ...' if len(labs) > 5 else ''}), typically G G^T overflowing after one "
            "huge gradient; they were reset to zero and the previous eigenbases kept. Clip gradients or "
            "use factor_dtype=torch.float64 if this repeats."
        )
        log.warning(msg)
        warnings.warn(msg, FactorResetWarning, stacklevel=6)

    def _check_limits(
        self, state: SOAPState, k: int, rows: torch.Tensor, records: list[FactorState], opts: Any
    ) -> None:
        limit = opts.failure.max_consecutive_failures
        over = [
            (j, f) for j, f in zip(rows.tolist(), records, strict=True) if f.consecutive_failures >= limit
        ]
        if not over:
            return
        j, f = over[0]
        assert state.stats is not None
        lab = state.labels.get((j, state.stats.dims[k]), f"position {j}")
        raise RootComputationError(
            f"shampoo (SOAP): {f.consecutive_failures} consecutive eigenbasis refreshes failed for {lab} "
            f"(n={f.n}, basis_update={self.basis_update!r}, {len(over)} factor(s) affected); last error: "
            f"{f.error}. The previous bases were kept so far. Try basis_update='eigh', "
            "root_dtype=torch.float64, or raise FailurePolicy.max_consecutive_failures."
        )


def _finite_rows(X: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(X).flatten(1).all(-1).cpu()


def _eigh(A: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Ascending eigenvectors of the batch A in ``dtype``, ok per row (matroots' eigh_checked: an
    fp32 failure, reported or not, is solved again in fp64)."""
    try:
        _, Q = eigh_checked(A.to(dtype), {})
    except _NUMERICAL as exc:
        return A.clone(), torch.zeros(A.shape[0], dtype=torch.bool), f"{type(exc).__name__}: {exc}"
    ok = _finite_rows(Q)
    return Q.to(A.dtype), ok, "" if bool(ok.all()) else "non-finite eigenvectors"


def _eigh_warm(
    A: torch.Tensor, Q: torch.Tensor | None, p: Fraction, opts: Any, work: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, list[str], list[int]] | None:
    """matroots' eigh_warm on the batch A from the bases Q (None: cold): (ascending eigenvectors, ok,
    verdicts, refinement steps), or None when it raised a numerical error (the caller falls back)."""
    pp: int | Fraction = int(p) if p.denominator == 1 else p
    try:
        res = EighWarmConfig().solve(
            A, pp, eps=opts.eps, eps_mode=opts.eps_mode, dtype=work, warm_start=Q, psd=opts.psd, quiet=True
        )
    except _NUMERICAL:
        return None
    r = A.shape[0]
    Qn = res.info["eigenvectors"].reshape(r, *A.shape[-2:]).to(work)
    conv = (
        res.converged if isinstance(res.converged, torch.Tensor) else torch.tensor([bool(res.converged)] * r)
    )
    ok = conv.reshape(r).cpu() & _finite_rows(Qn)
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
