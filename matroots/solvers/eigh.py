"""Inverse p-th root by symmetric eigendecomposition.

A = Q diag(lambda) Q^T  =>  A^{-1/p} = Q diag(lambda^{-1/p}) Q^T for any rational p > 0
(Higham, *Functions of Matrices*, 2008, Thm. 1.12 / §1.2). Cost: one ``torch.linalg.eigh`` and one GEMM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..core import arguments, precision
from ..core import psd as psd_policy
from ..core.errors import EigensolverError, FormatRangeError, InvalidArgumentError, NotPositiveDefiniteError
from ..core.inputs import Problem, all_finite, require_symmetric, symmetric_input
from ..core.regularize import working_shift
from .base import Capabilities, RawResult, SolverConfig
from .eigh_autograd import SpectralRoot
from .registry import register
from .spd_start import domain_margin, domain_test, flag_undetermined

RANK_POLICIES = ("perturb", "clamp", "pseudo_inverse")


@register
@dataclass(frozen=True, kw_only=True)
class EighConfig(SolverConfig):
    """Eigendecomposition solver.

    Args:
        rank_policy: what to do with eigenvalues that are not safely positive after the eps shift.
            ``"perturb"`` (default): rely on eps; a non-positive eigenvalue raises
            NotPositiveDefiniteError. ``"clamp"``: floor eigenvalues at ``max(atol, rtol*lambda_max)``.
            ``"pseudo_inverse"``: eigenvalues ``<= max(atol, rtol*lambda_max)`` are dropped (their
            eigen-directions get 0 in the root).
        atol, rtol: the threshold above; ``rtol=None`` means n * u of the compute dtype.
        symmetry_tol: tolerance on ||A - A^T||_F / ||A||_F; None means 10 sqrt(n) u of the input (core.inputs.default_symmetry_tol).

    Autograd: when A requires grad (and grad mode is on) the root carries a graph back to A, with the
    Daleckii-Krein derivative (:mod:`.eigh_autograd`), finite for repeated eigenvalues; supported for
    ``rank_policy="perturb"`` (the default), absolute or relative eps and every psd policy. The
    other rank policies are not differentiable at their thresholds and refuse an input that requires
    grad (InvalidArgumentError).
    """

    name = "eigh"
    # the psd "meta" and "shift" shifts go on the computed eigenvalues (as Meta's does; "shift" is
    # decided on them, no Cholesky test: see matroots.core.psd)
    psd_on_eigenvalues = frozenset({"meta", "shift"})
    range_on_eigenvalues = True  # _check_root_spectrum, and _finalise's check of a root it rescales
    capabilities = Capabilities(differentiable=True)
    rank_policy: str = "perturb"
    atol: float = 0.0
    rtol: float | None = None
    symmetry_tol: float | None = None

    def __post_init__(self) -> None:
        arguments.store(
            self,
            rank_policy=arguments.choice("rank_policy", self.rank_policy, RANK_POLICIES),
            atol=arguments.real("atol", self.atol, minimum=0.0, what="absolute eigenvalue threshold"),
            rtol=arguments.real("rtol", self.rtol, minimum=0.0, allow_none=True, what="relative threshold"),
            symmetry_tol=arguments.real(
                "symmetry_tol", self.symmetry_tol, minimum=0.0, allow_none=True, what="relative defect"
            ),
        )

    def _working_matrix(self, prob: Problem) -> tuple[torch.Tensor, dict]:
        """The validated symmetric part of the input in the LAPACK compute format, and the info notes."""
        # trusted input (SolveOptions.trusted) is used as given; defect None: zero by construction
        A_sym, defect = symmetric_input(prob, zero_defect=False)
        if defect is not None and A_sym is not prob.A:  # prob.A itself comes back only with a zero defect
            require_symmetric(prob.A, self.name, prob.symmetry_tol(self.symmetry_tol), defect=defect)
        info: dict = {}
        cdtype = precision.lapack_dtype(prob.compute_dtype)
        if cdtype != prob.compute_dtype:
            info["compute_dtype_fallback"] = (
                f"LAPACK has no {precision.info(prob.compute_dtype).name} eigensolver: "
                f"eigh ran in {precision.info(cdtype).name} on the input rounded to "
                f"{precision.info(prob.dtype).name}"
            )
        A = A_sym if A_sym.dtype == cdtype else A_sym.to(cdtype)
        return A, info

    @staticmethod
    def _eigh(A: torch.Tensor, info: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`eigh_checked` (eigh_warm's cold path calls it through its config too)."""
        return eigh_checked(A, info)

    def _root_eigenvalues(
        self, prob: Problem, w: torch.Tensor, info: dict, *, inverse: bool
    ) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | None, torch.Tensor | None]:
        """(wr, f, e, psd_shift, active) for ascending eigenvalues ``w`` (prescaled units, LAPACK dtype).

        wr: w plus the psd and eps shifts; f = the root's eigenvalues under the rank policy (wr^e with
        e = -+1/p); active: where f is the power function itself (None: everywhere, rank_policy
        'perturb'; else False on clamped or dropped eigenvalues). Records lambda_min/max, eps_abs and
        the rank-policy counts in ``info``; raises as eigh does (:meth:`_root_spectrum`).
        """
        sp = self._root_spectrum(prob, w, info, inverse=inverse)
        return sp.wr, sp.f, sp.e, sp.psd_shift, sp.active

    def _root_spectrum(
        self, prob: Problem, w: torch.Tensor, info: dict, *, inverse: bool, w_finite: bool = False
    ) -> _Spectrum:
        """:meth:`_root_eigenvalues` with what its checks read on the way (:class:`_Spectrum`: the
        ends of wr and log2 max f), for ``_run``'s domain and finiteness tests. ``w_finite``: the
        caller proved every w finite (:func:`eigh_checked`'s fp32 test), so it is not scanned again.

        Each check reads its numbers once: the ends of the spectrum (lambda_min/max, the ends of the
        matrix solved) come from one (b, 2) float64 copy, read to Python floats in one ``tolist``
        (the sign test of 'perturb' and the domain margin are decided there, no small tensors).
        """
        cdtype = w.dtype
        active = None
        s = prob.prescale  # report in the user's units (fp16 inputs are pre-scaled by s)
        if not w_finite and not all_finite(w):  # the spectrum itself, before any shift
            k = int((~torch.isfinite(w).all(-1)).sum())
            raise EigensolverError(
                f"eigh: the computed spectrum has non-finite eigenvalues for {k} of {w.shape[0]} finite "
                f"matrices ({precision.info(cdtype).name}) and the eigensolver reported no error"
            )
        ends = _ends(w)  # (b, 2) float64: exact copies of w[..., 0] and w[..., -1]
        lmin, lmax = ends.unbind(-1)  # two views, one dispatched operation
        psd_shift = psd_policy.eigenvalue_shift(prob, w)
        shifted = psd_shift is not None or prob.eps > 0
        if psd_shift is not None:
            w = w + psd_shift.to(device=w.device, dtype=w.dtype).unsqueeze(-1)
        if prob.eps > 0:
            shift = working_shift(prob.eps, prob.eps_mode, lmax, s)
            wr = w + shift.to(w.dtype).unsqueeze(-1)
        else:
            shift, wr = torch.zeros_like(lmax), w
        if s != 1.0:
            lmin, lmax, shift = lmin / s, lmax / s, shift / s
        info.update(lambda_min=lmin, lambda_max=lmax, eps_abs=shift)
        e = -1.0 / float(prob.p) if inverse else 1.0 / float(prob.p)
        if shifted and not all_finite(wr):  # unshifted, wr is w, finite already
            raise FormatRangeError(
                f"eigh: an eigenvalue plus the eps shift (eps_abs={float(shift.max()):.3e}) overflows "
                f"{precision.info(cdtype).name}; use a smaller eps or a wider dtype"
            )
        wr_ends = _ends(wr) if shifted else ends
        solved_ends = wr_ends.tolist()  # [[wr_min, wr_max], ...] as Python floats (float64, exact)
        if self.rank_policy == "perturb":
            if any(lo <= 0 for lo, _ in solved_ends):
                worst = min(lo for lo, _ in solved_ends) / s
                raise NotPositiveDefiniteError(
                    f"matrix is not positive definite after regularisation: smallest eigenvalue "
                    f"{worst:.3e} (eps_abs={float(shift.max()):.3e}, dtype {precision.info(prob.dtype).name}); "
                    "increase eps, or use rank_policy='clamp' or 'pseudo_inverse'"
                )
            f = _pow_rows(wr, e)
            # the spectrum of the matrix actually solved (psd shift and eps included), user units:
            # its condition number for diagnostics (shampoo) without another pass over the matrix
            if not shifted and s == 1.0:
                info.update(solved_lambda_min=lmin, solved_lambda_max=lmax)  # the same numbers
            else:
                solved = wr_ends / s if s != 1.0 else wr_ends
                info.update(solved_lambda_min=solved[..., 0], solved_lambda_max=solved[..., 1])
        else:
            rtol = self.rtol if self.rtol is not None else prob.n * precision.unit_roundoff(cdtype)
            thresh = torch.clamp(rtol * wr[..., -1:].abs(), min=self.atol * prob.prescale)
            if self.rank_policy == "clamp" and self.atol <= 0 and any(hi <= 0 for _, hi in solved_ends):
                raise NotPositiveDefiniteError(
                    f"rank_policy='clamp' has nothing to clamp to: the largest eigenvalue is "
                    f"{min(hi for _, hi in solved_ends) / prob.prescale:.3e} <= 0 and atol=0; pass atol > 0 "
                    "or use rank_policy='pseudo_inverse'"
                )
            if self.rank_policy == "clamp":
                f = _pow_rows(torch.maximum(wr, thresh), e)
                active = wr >= thresh
                info["clamped"] = (wr < thresh).sum(-1)
            else:
                keep = active = wr > thresh
                f = torch.where(
                    keep, _pow_rows(wr.clamp_min(torch.finfo(wr.dtype).tiny), e), torch.zeros_like(wr)
                )
                info["dropped"] = (~keep).sum(-1)
                if not inverse:
                    f = torch.where(keep, _pow_rows(wr.clamp_min(0), e), torch.zeros_like(wr))
        powered = active if self.rank_policy == "pseudo_inverse" else True  # its zeros are dropped ones
        top = _check_root_spectrum(wr, f, e, cdtype, prob, powered)
        return _Spectrum(wr, f, e, psd_shift, active, solved_ends, top)

    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        self._check_grad(prob)
        return self._from_decomposition(prob, self._decompose(prob), inverse=inverse)

    def _check_grad(self, prob: Problem) -> None:
        if prob.grad_source is not None and self.rank_policy != "perturb":
            raise InvalidArgumentError(
                f"A requires grad, but rank_policy={self.rank_policy!r} is not differentiable at its "
                "threshold; use rank_policy='perturb' (with eps) for gradients, or pass A.detach()"
            )

    def spectrum_of(self, prob: Problem, dec: Decomposition, *, inverse: bool) -> _Spectrum:
        """:meth:`_root_spectrum` of a decomposition, its notes (lambda_min/max, eps_abs, ...) added
        to ``dec.info``, as ``_run`` takes it."""
        return self._root_spectrum(prob, dec.w, dec.info, inverse=inverse, w_finite=dec.checked)

    def _decompose(self, prob: Problem) -> Decomposition:
        """``_run``'s first phase: the working matrix and its eigendecomposition (with the info notes
        so far). It reads only ``symmetry_tol`` of this configuration: an EighConfig that differs in
        the rank policy alone (``rank_policy``, ``atol``, ``rtol``) decomposes the same matrix the same
        way, and ``method="auto"`` hands it to that one (:meth:`_from_decomposition`)."""
        A, info = self._working_matrix(prob)
        w, Q = self._eigh(A, info)
        return Decomposition(A, w, Q, info)

    def _from_decomposition(
        self, prob: Problem, dec: Decomposition, *, inverse: bool, spectrum: _Spectrum | None = None
    ) -> RawResult:
        """``_run``'s second phase on :meth:`_decompose`'s result (consumed: Q is scaled in place).
        ``spectrum``: :meth:`spectrum_of` ``dec`` by this configuration, already taken (its notes in
        ``dec.info``), else taken here."""
        self._check_grad(prob)
        A, Q, info, checked = dec.A, dec.Q, dec.info, dec.checked
        sp = spectrum if spectrum is not None else self.spectrum_of(prob, dec, inverse=inverse)
        wr, f, e, psd_shift = sp.wr, sp.f, sp.e, sp.psd_shift
        converged = None  # every element converged (RawResult), unless flag_singular says otherwise
        if inverse and self.rank_policy == "perturb" and near_singular(prob, A.dtype, sp.solved_ends):
            converged = torch.ones(prob.A.shape[0], dtype=torch.bool)
            shift = info["eps_abs"].to(torch.float64) * prob.prescale  # prescaled units (2^k: exact)
            if psd_shift is not None:
                shift = shift + psd_shift.reshape(-1).to(torch.float64)
            flag_singular(self.name, prob, A, wr, shift, info, converged)
        # X = Q f(Lambda) Q^T = W W^T with W = Q f(Lambda)^{1/2} (f >= 0 here), scaling Q in place: one
        # n x n temporary fewer (at n = 1024 each fresh one costs ~4 ms of page faults). Symmetric up to
        # the GEMM's rounding (~u ||X||); not symmetrised, which would cost a strided pass over X.
        b = prob.A.shape[0]
        folded, certified = None, False
        if prob.grad_source is None:
            sq, folded = root_eigenvalue_sqrt(prob, wr, f, e, inverse)
            # Proved finite, with no pass over X, for fp32: eigh_checked tested Q's entries (no fp64
            # retry ran) and every sqrt(f c) is finite, so |X_ij| <= max f c, here <= half the max.
            # Unfolded (c = 1), sqrt(f) rounds to at most sqrt(f) (1 + u): max f <= max / 4 (the log2
            # the range check read) gives max sqrt(f)^2 <= max / 2 with no second look at f
            log2_max = math.log2(torch.finfo(sq.dtype).max)
            certified = checked and (
                sp.top <= log2_max - 2 if folded is None else 2.0 * float(_log2_top(sq).max()) <= log2_max - 1
            )
            W = Q.mul_(sq.unsqueeze(-2))
            X = torch.bmm(W, W.mT)  # the kernel W @ W.mT calls for (b, n, n) operands, dispatched directly
        else:
            W = Q * f.sqrt().unsqueeze(-2)
            meta_active = (  # the "meta" shift -lambda_min moves with A; the "shift" policy's is constant
                (psd_shift.reshape(-1) > 0)
                if psd_shift is not None and prob.info.get("psd_policy") == "meta"
                else torch.zeros(b, dtype=torch.bool)
            )
            eps_rel = prob.eps if prob.eps_mode == "relative" else 0.0
            X = SpectralRoot.apply(prob.grad_source, W, Q, wr, e, prob.prescale, eps_rel, meta_active)
            info["autograd"] = "Daleckii-Krein derivative of the eigenvalue function (eigh_autograd)"
        info["eigh_calls"] = 1
        info["residual_note"] = "eigh reports no residual (NaN); use matroots.truth.metrics for errors"
        return RawResult(
            root=X,
            in_caller_units=folded,
            finite=certified,
            converged=converged,
            iterations=None,  # a direct method: 0 iterations, no residual (NaN)
            residual=None,
            matmuls=1.0,
            info=info,
        )


@dataclass(slots=True)
class Decomposition:
    """:meth:`EighConfig._decompose`'s result: the working matrix A, its ascending eigenvalues w and
    eigenvectors Q, and the info notes so far."""

    A: torch.Tensor
    w: torch.Tensor
    Q: torch.Tensor
    info: dict

    @property
    def checked(self) -> bool:
        """eigh_checked tested every fp32 eigenvalue and eigenvector (their sum is finite), unless it
        retried in fp64."""
        return self.Q.dtype == torch.float32 and "eigh_retry_fp64" not in self.info


@dataclass(slots=True)
class _Spectrum:
    """What :meth:`EighConfig._root_spectrum` computed: wr, f, e, psd_shift, active as in
    :meth:`EighConfig._root_eigenvalues`; ``solved_ends``: [wr_min, wr_max] per element (Python floats,
    prescaled units); ``top``: max over the batch of log2 max f (:func:`_check_root_spectrum`)."""

    wr: torch.Tensor
    f: torch.Tensor
    e: float
    psd_shift: torch.Tensor | None
    active: torch.Tensor | None
    solved_ends: list[list[float]]
    top: float


def _ends(w: torch.Tensor) -> torch.Tensor:
    """(b, 2) float64 [w[..., 0], w[..., -1]] of ascending rows w (b, n): one strided view and one copy."""
    n = w.shape[-1]
    return (w[..., :: n - 1] if n > 1 else w.expand(*w.shape[:-1], 2)).double()


def near_singular(prob: Problem, lapack: torch.dtype, solved_ends: list[list[float]]) -> bool:
    """Whether some element needs :func:`flag_singular`'s test: its test ``wr_min <= delta + err``
    (delta = u lambda_max, :func:`~matroots.solvers.spd_start.domain_margin`; err = n u_lapack
    lambda_max) on the ends as Python floats, the same float64 roundings as its tensors; ``lapack``:
    the format eigh ran in. False (the common case) decides it without a small tensor."""
    err_rate = prob.n * precision.unit_roundoff(lapack)
    u = max(precision.unit_roundoff(prob.dtype), precision.unit_roundoff(prob.compute_dtype))
    return any(lo <= u * hi + err_rate * hi for lo, hi in solved_ends)


def flag_singular(
    method: str,
    prob: Problem,
    A: torch.Tensor,
    wr: torch.Tensor,
    shift: torch.Tensor,
    info: dict,
    converged: torch.Tensor,
) -> None:
    """The SPD domain test of an inverse root (:func:`~matroots.solvers.spd_start.domain_test`, shared
    with coupled_newton and schur_newton): an element whose matrix solved (A + psd and eps shifts) has
    lambda_min < u lambda_max is singular to working precision and its inverse root is not determined
    (cond(A^{-1/p}) u >= kappa u / p > 1/p): ``converged`` False there, stop reason ``not_determined``;
    a matrix the float64 Cholesky test proves indefinite raises NotPositiveDefiniteError. Issue 22,
    class 2: an 8 x 8 PSD matrix of exact rank 7, rounded to fp64 (exact lambda_min -1.5e-17), had the
    computed eigenvalue ~1e-15 and its inverse square root (entries 2.4e7, vs 1.6e7 from schur_newton)
    came back converged.

    The computed eigenvalues wr (ascending) are exact for a matrix within n u ||A||_2 of A (u: LAPACK's
    format; Weyl): where wr_min > u lambda_max + n u lambda_max every element is clear of the margin and
    no Cholesky runs (the common case: one comparison). Elsewhere the float64 Cholesky test decides,
    exactly for fp32 and 16-bit input, to within rounding of kappa = 1/u for fp64 input.

    ``A``: the working matrices (prescaled, LAPACK's format), ``wr``: their ascending eigenvalues plus
    ``shift`` (b,), the psd and eps shifts in prescaled units.
    """
    lmax = wr[..., -1].double()
    err = prob.n * precision.unit_roundoff(A.dtype) * lmax
    delta = domain_margin(prob.n, prob.dtype, prob.compute_dtype, lmax)
    rows = wr[..., 0].double() <= delta + err
    if not bool(rows.any()):
        return
    undetermined = domain_test(method, prob, A, shift, lmax, rows)
    if bool(undetermined.any()):
        reason = ["direct"] * converged.shape[0]
        flag_undetermined(undetermined, converged, reason, info, prob, lmax)
        info["stop_reason"] = reason


def eigh_checked(A: torch.Tensor, info: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending eigenvalues and eigenvectors of the batch A; an fp32 failure is retried in fp64
    (recorded in ``info["eigh_retry_fp64"]``). Shared by eigh, eigh_warm and SOAP's basis update.

    A failure is a LinAlgError, or a non-finite spectrum or eigenvectors for a finite matrix that
    LAPACK did not report: MKL's threaded ssyevd (torch 2.13 CPU, 2 threads) returns NaN for some
    fp32 Shampoo factors with many exactly zero rows (an embedding's bytes never seen; one thread or
    fp64 solve them). Every element's eigenvalues and eigenvector sums are checked (b x n values and
    one pass over Q, <1% of the solve at n = 256) and the affected elements alone are solved again
    in fp64.
    """
    cdtype = A.dtype
    try:
        w, Q = torch.linalg.eigh(A)
    except torch.linalg.LinAlgError as exc:
        if cdtype != torch.float32:
            raise
        info["eigh_retry_fp64"] = f"fp32 eigh failed ({exc}); retried in fp64"
        w, Q = torch.linalg.eigh(A.double())
        return w.float(), Q.float()
    if cdtype != torch.float32:
        return w, Q
    if math.isfinite(w.sum().tolist()) and math.isfinite(Q.sum().tolist()):  # finite sums: finite entries
        return w, Q
    bad = ~(torch.isfinite(w).all(-1) & torch.isfinite(Q.sum(dim=(-2, -1))))
    if bool(bad.any()):
        rows = bad.nonzero().flatten()
        w64, Q64 = torch.linalg.eigh(A.index_select(0, rows).double())
        w[rows], Q[rows] = w64.float(), Q64.float()
        info["eigh_retry_fp64"] = (
            f"fp32 eigh returned non-finite eigenvalues or eigenvectors for {rows.numel()} of "
            f"{A.shape[0]} finite matrices without an error; those were solved again in fp64"
        )
    return w, Q


_POW_BLOCK = 64  # elements: a multiple of every SIMD width (and unroll) of torch's CPU pow kernel


def _pow_rows(w: torch.Tensor, e: float) -> torch.Tensor:
    """w ** e for eigenvalue rows (..., n), rounded the same for a row whatever the batch around it.

    torch's vectorised pow (Sleef) and the scalar code it uses for the tail of a buffer round
    differently in the last bit, and a row of a batch lands in a vector or in the tail depending on
    its neighbours: with n = 24 one element of a 4 x 24 fp32 batch differed from its solve alone
    (relative 3e-8 in the root). Each row is padded with ones to a multiple of ``_POW_BLOCK``
    elements, so every entry is computed by the vector kernel, in a batch as alone.
    """
    n = w.shape[-1]
    m = -(-n // _POW_BLOCK) * _POW_BLOCK
    if m == n or w.device.type != "cpu":
        return w.pow(e)
    padded = torch.ones((*w.shape[:-1], m), dtype=w.dtype, device=w.device)
    padded[..., :n] = w
    return padded.pow_(e)[..., :n]


def _log2_top(f: torch.Tensor, powered: torch.Tensor | bool = False) -> torch.Tensor:
    """(b,) float64: log2 of the largest root eigenvalue, log2 max f (log2 is monotone); +inf where
    some f is not finite (its power overflowed). A row whose f are all zero reads log2 of half the
    format's smallest subnormal where a zero is ``powered`` (True: everywhere; a (b, n) mask: where
    the rank policy raised an eigenvalue to its power, so 0 is an underflow), else -inf (set to 0 by
    the rank policy). Read from f itself, the values actually powered (under "clamp" a non-positive
    wr has f = thresh^e, the largest root eigenvalue of an inverse root), not from e log2(wr).

    The common case, every row's max positive and finite, costs a reduction, a log2 and one scalar
    read (a finite sum of the logs proves every row so); other rows take the entrywise path.
    """
    top = f.detach().amax(dim=-1).double().log2()  # NaN, inf and 0 maxima: non-finite logs
    if math.isfinite(float(top.sum())):
        return top
    fi = torch.finfo(f.dtype)
    powered_row = torch.as_tensor(powered, device=f.device)
    if powered_row.dim() > 0:
        powered_row = powered_row.any(dim=-1)
    zero = torch.where(
        powered_row,
        math.log2(fi.smallest_normal) + math.log2(fi.eps) - 1,  # half the smallest subnormal
        -math.inf,
    ).to(torch.float64)
    finite = torch.isfinite(f).all(dim=-1)
    return torch.where(finite, torch.where(top > -math.inf, top, zero), math.inf)


def root_eigenvalue_sqrt(
    prob: Problem, wr: torch.Tensor, f: torch.Tensor, e: float, inverse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(sqrt(f c), folded) for the root X = W W^T, W = Q diag(sqrt(f c)): the factor c that returns
    the root of a prescaled problem to the caller's units applied to the n root eigenvalues of an
    element instead of to its n^2 entries (``folded``: (b,) bool, where it was; None: nowhere, c = 1).
    Elsewhere ``SolverConfig._finalise`` rescales the root (:func:`~matroots.core.inputs.rescale_root`,
    a float64 pass over the batch: ~5% of an n = 256 Shampoo root round).

    An element is folded when the root is computed and returned in fp32 (Shampoo's roots; in fp64
    the exact rescaling of the root is kept: sqrt(f) c^(1/2) squared by the GEMM adds ~2 u, which a
    1 x 1 root at fp64's range edge shows against its 4 u test) and is clearly inside its range:
    |X_ij| <= max f c and max_i X_ii >= max f c / n, so with a margin of 2 neither the overflow
    nor the underflow test of :func:`~matroots.core.inputs.check_root_range` could fire (where one could,
    the rescaling and its exact test run as before). Decided per element, from its own eigenvalues:
    given the same eigenvalues an element gets the same bits in a batch as alone, and eigh_warm's
    cold path as eigh (LAPACK's eigenvalues themselves may round by a stack element's alignment).
    """
    sq = f.sqrt()
    fp32 = prob.dtype == wr.dtype == torch.float32
    if prob.prescale == 1.0 or not fp32 or prob.grad_source is not None:
        return sq, None
    log2_factor = float(prob.root_log2_scale(inverse))
    top = _log2_top(f) + log2_factor
    fmt = precision.info(prob.dtype)
    lo = math.log2(fmt.tiny) + 1 + math.log2(prob.n)
    folded = (top == -math.inf) | ((top <= math.log2(fmt.max) - 1) & (top >= lo))
    one = torch.ones(folded.shape, dtype=torch.float64, device=folded.device)
    c = torch.where(folded, one * 2.0 ** (log2_factor / 2), one)
    return (sq.double() * c.unsqueeze(-1).to(sq.device)).to(sq.dtype), folded.cpu()


def _check_root_spectrum(
    wr: torch.Tensor,
    f: torch.Tensor,
    e: float,
    cdtype: torch.dtype,
    prob: Problem,
    powered: torch.Tensor | bool,
) -> float:
    """FormatRangeError when the root's eigenvalues f overflow or all underflow ``cdtype``; returns
    the largest log2 max f of the batch (read once, for the caller's finiteness proof).

    X = Q diag(f) Q^T has |X_ij| <= max f, so max f decides the range (:func:`_log2_top`): an
    overflowing f reads inf, and an underflowing one 0, which where the eigenvalue was ``powered``
    (not zeroed by the rank policy) is an underflow: a zero root would otherwise be returned as
    converged (e.g. (4 I)^(-1/0.01) = 2^-200 I, which is 0 in fp32). The b maxima are read to Python
    floats once: when their sum is finite and the least is positive, every row's max is positive and
    finite and its log2 is taken in Python (float64, as :func:`_log2_top`'s fast path); else
    :func:`_log2_top` reads the rows entrywise.
    """
    fmt = precision.info(cdtype)
    g = f.detach() if f.requires_grad else f
    maxima = g.amax(dim=-1).tolist()  # Python floats (float64: exact copies of the maxima)
    if math.isfinite(sum(maxima)) and min(maxima) > 0:  # every row's max positive and finite
        tops = [math.log2(m) for m in maxima]
    else:  # NaN, inf and 0 maxima
        tops = _log2_top(f, powered).tolist()
    hi = max(tops)
    if hi > math.log2(fmt.max):
        worst = float(wr[..., 0].min()) / prob.prescale
        raise FormatRangeError(
            f"eigh: the root's eigenvalues (lambda + eps)^({e:.4g}) overflow {fmt.name} (smallest shifted "
            f"eigenvalue {worst:.3e}); increase eps or use a wider dtype"
        )
    tiny = math.log2(fmt.tiny)
    if any(-math.inf < t < tiny for t in tops):
        raise FormatRangeError(
            f"eigh: the root's eigenvalues (lambda + eps)^({e:.4g}) all underflow {fmt.name} (below "
            f"{fmt.tiny:.3e}); use a wider dtype"
        )
    return hi
