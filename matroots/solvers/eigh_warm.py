"""Warm-started eigendecomposition for matrix roots: Rayleigh-Ritz refinement of a previous eigenbasis.

Shampoo's Kronecker factors change slowly between root rounds, so the previous eigenbasis Q of a factor
is close to the eigenbasis of the new one. ``eigh_warm`` refines Q instead of recomputing it, and
returns a root only when a computable estimate of its error is within the error of a cold ``eigh``.

Algorithm (per matrix; a batch is processed as a batch, each element deciding for itself). With
A the matrix solved (after the psd policy, :mod:`matroots.core.psd`) and f the root's eigenvalue function
(x + eps)^(-+1/p) under the rank policy (as :class:`~matroots.solvers.eigh.EighConfig` defines it):

1. Rayleigh-Ritz: S = Q^T A Q (two GEMMs) and, unless Q is known orthonormal to LAPACK's level (a
   basis from eigh), R = I - Q^T Q (one GEMM). d_i = s_ii / (1 - r_ii) (the Ritz values, Rayleigh
   quotients of the columns). To first order in R, the orthonormal U = Q (Q^T Q)^(-1/2) has
   U^T A U = D + O with D = diag(d) and O = offdiag(S) + R_off o (d_i + d_j)/2 (o: entrywise product).
2. Estimate the error of X = Q~ f(D) Q~^T (Q~: Q with unit columns). By the Daleckii-Krein theorem
   (Daleckii & Krein 1965; Higham, *Functions of Matrices*, 2008, Thm. 3.11 and Cor. 3.12; Bhatia,
   *Matrix Analysis*, 1997, §V.3 for the higher-order terms) the Frechet expansion of f at D is

       f(D + O) = f(D) + F1 o O + T2 + ...,   (F1)_ij = f[d_i, d_j],
       (T2)_ij = sum_k f[d_i, d_k, d_j] O_ik O_kj,

   with f[.,.] and f[.,.,.] the first and second divided differences. Q~ f Q~^T = U (f - R_off o
   (f_i + f_j)/2) U^T to first order, so the first-order error of X is U P U^T with

       P = F1 o O + R_off o (f_i + f_j) / 2,

   computed exactly. For the second order: for f(x) = x^e, |e| <= 1, one checks case by case that
   |f[x, y, z]| sqrt(x z) y <= max(f(x), f(y), f(z)) <= f(x) + f(y) + f(z) (x = y = z gives
   |e(e - 1)|/2 f(x); widely spread arguments give |e| f(min) or (1 - e) f(max) (y/x)). With the
   scaled off-diagonal Ohat_ij = O_ij / sqrt(z_i z_j) (z = the shifted Ritz values, floored at the
   rank-policy threshold) this gives |T2_ij| <= sum_k (f_i + f_j + f_k) |Ohat_ik| |Ohat_kj|, hence

       ||T2||_F <= 3 ||Ohat||_F ||diag(f) Ohat||_F,

   and the higher-order terms form a geometric tail of ratio <= ||Ohat||_2 (B = D^(1/2) (I + Ohat)
   D^(1/2): relative perturbation theory, Demmel & Veselic 1992, needs ||Ohat||_2 < 1). That bound of
   T2 explodes where a large direction couples small ones (a rank-deficient factor's tail: Ohat_ik =
   O_ik / sqrt(z_i z_k) is the rotation angle times sqrt(z_large / z_small)) although f[s, L, s] is only
   ~ f(s) / (s L); so T2 is bounded by the smaller of it and the binned bound of
   :func:`~matroots.solvers.warm_bound.binned_second_order` (|f[x, y, z]| <= max f / (M1 M2), M1 >= M2
   the two largest arguments, over factor-2 bins of z; all directions active only). The estimate of
   the relative forward error of X is

       est = ||P||_F / ||f(d)||_2 + (T2b + 3 r^2 ||diag(f) Ohat||_F / (1 - r)) / ||f(d)||_2 + 2 delta,

   T2b = min(3 r ||diag(f) Ohat||_F, binned bound), r = ||Ohat||_F (the third and higher orders keep
   the relative tail); delta is 0 when R was formed, else the known bound on ||Q^T Q - I||_F (a
   non-orthonormal Q perturbs both S and the product by ~delta relative). Couplings between two
   directions below the rank threshold are dropped from O: f is constant (clamp) or zero
   (pseudo-inverse) there, so they do not change the root.
3. Accept when est <= tol. The default tol is the cold eigh's own error level

       tol = safety (1 + cond(f, A)) u sqrt(n),   cond(f, A) = max_i |f'(z_i)| ||z||_2 / ||f(z)||_2

   (Higham 2008, Cor. 3.16: the relative condition number of the root, with max |f[.,.]| = |f'(z_min)|
   for a power function), u the unit roundoff of the working dtype, safety = 4 by default: S itself is
   formed in working precision, so even an exact eigenbasis shows an off-diagonal of ~u ||A|| whose
   estimate is ~(1 + cond) u sqrt(n), the cold eigh's own error. A ``tol`` passed to ``solve`` is the
   relative forward-error tolerance the caller asks for instead. Rounding errors of the warm path are
   of the cold eigh's size and are not part of est.
4. Otherwise refine (Ogita & Aishima 2018, *Iterative refinement for symmetric eigenvalue
   decomposition*, Japan J. Indust. Appl. Math. 35, Alg. 1; 2019, part II, for clustered eigenvalues).
   Pairs with |O_ij| < max_angle |d_i - d_j| are well separated: the first-order rotation
   E_ij = O_ij / (d_j - d_i) (antisymmetric) removes their coupling to second order. Pairs that are not
   separated form clusters (contiguous runs of the sorted Ritz values); E is 0 inside a cluster. Then
   Q <- Q V with V = I + E + E^2/2 + R/2: the exponential of E to second order (V^T V = I + E^4/4 for
   R = 0) and the first-order orthogonalisation (I - R)^(-1/2) ~ I + R/2; then the columns of each
   cluster are rotated by the eigenvectors of the cluster's block of S (a small eigh). Back to step 1:
   the off-diagonal and R converge quadratically once ||O||_F is below the smallest separated gap.
5. Fall back to a full eigh (and say why in ``info["warm"]``) when the basis is too far (a
   cluster larger than ``max_cluster`` n: the first-order rotation cannot separate the spectrum; r >= 1
   alone only makes est infinite, it does not stop the refinement), the estimate does not drop by 4x per step, or ``max_iter``
   refinement steps (default 3) did not reach tol; and where the estimate cannot be formed: non-finite
   Ritz values, a matrix (or root) whose scale lies outside [sqrt(tiny)/u, sqrt(max)] of the format,
   where the estimate's squares would underflow and make it too small (a batch is prescaled as a
   whole: a gradient spike puts a factor 1e35 times its neighbour into it), or an estimate or
   tolerance that is not a number. With ``fallback=False`` such elements return the
   refined root with ``converged=False`` instead.

Cost in GEMMs (n x n products) per matrix: accepted at once 3 (S and the root W W^T, W = Q~ f^(1/2));
each refinement step 5 (E^2, Q V, Q^T Q, A Q, Q^T (A Q)), so refined after one step 8, after two 13;
the cluster blocks add sum (size/n)^2; a fallback adds one eigh. The elementwise work of the estimate
is ~10 passes over n x n per estimate and ~10 per refinement step (the binned second-order bound,
one n x n x nb product, only where it decides acceptance), plus a fixed per-call cost of ~1 ms of
small torch calls. On a CPU that is not free: each pass costs 0.1-0.5 GEMM at n = 256 (it is
memory-bound), so measured per update the warm path is *slower* than LAPACK's eigh on the 2-core CPU
this was developed on (``experiments/bench_eigh_warm.py``). It pays where GEMMs are cheap next to an
eigendecomposition (accelerators) and when the basis is already good (accepted at once). Early in
training (bytes_lm, steps 1-60) a factor changes by 10-100% between root rounds (1-2% at steps
900-1000): the old basis is genuinely far, the first step finds one cluster spanning most of the
spectrum and falls back, which costs the warm attempt on top of the eigh
(``experiments/ab_eigh_warm.py --source``). A cold call
(no ``warm_start``) is a plain eigh, identical to ``method="eigh"``.

Shampoo (``root_solver="eigh_warm"``) keeps each factor's eigenbasis in its state (checkpointed) and
passes it as the next round's warm start (:mod:`shampoo.roots`; ``capabilities.warm_start == "eigenbasis"``).

The result's ``info`` holds ``eigenvectors`` (the new basis, batch shape x n x n, columns in ascending
order of ``eigenvalues``), ``eigenvalues`` (the Ritz values used for the root, in the user's units,
of the matrix solved before eps), ``basis_defect`` (||Q^T Q - I||_F as measured, or LAPACK's n u after an eigh), ``warm`` ("cold",
"accepted", "refined" or "fallback: <why>"; a list in flattened batch order for a batch), ``warm_counts``, ``warm_tol``,
``warm_estimate`` (also ``res.residual``: the estimated relative forward error, NaN where eigh ran) and
``warm_gemms``. Pass the result back as ``warm_start`` for the next matrix of the sequence (or the
eigenvector tensor; its orthogonality is then checked by a randomized estimate, 16/n GEMM).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch

from ..core import arguments, precision
from ..core import psd as psd_policy
from ..core.inputs import Problem
from .base import Capabilities, RawResult
from .eigh import EighConfig, flag_singular, root_eigenvalue_sqrt
from .registry import register
from .warm_basis import warm_basis
from .warm_bound import binned_second_order

log = logging.getLogger("matroots")

_MAX_ITER = 3  # default refinement steps before the fallback
_TRUSTED = 4.0  # a basis with ||Q^T Q - I||_F <= 4 n u is used without forming Q^T Q


@register
@dataclasses.dataclass(frozen=True, kw_only=True)
class EighWarmConfig(EighConfig):
    """Warm-started eigh (module docstring). Inherits ``rank_policy``, ``atol``, ``rtol``,
    ``symmetry_tol`` and ``psd`` from :class:`~matroots.solvers.eigh.EighConfig`, with their meaning.

    Args:
        max_angle: pairs with |O_ij| < max_angle |d_i - d_j| are rotated by first-order perturbation
            theory; the others are clustered and their blocks diagonalised exactly. In (0, 1).
        max_cluster: largest cluster, as a fraction of n, worth a block eigh; a larger one falls back to
            the full eigh. In (0, 1].
        safety: multiplies the default acceptance tolerance (1 + cond) u sqrt(n) (default 4). > 0.
        fallback: run the full eigh on elements whose warm estimate misses the tolerance (default); with
            False they return the refined root with ``converged=False``.

    ``solve(tol=...)`` sets the accepted relative forward error instead of the default, ``max_iter`` the
    number of refinement steps before falling back (default 3).
    """

    name = "eigh_warm"
    # "meta" on the Ritz values; "shift" by its Cholesky test (a warm update's Ritz values are only
    # accepted to the update's tolerance, not eigh's backward error)
    psd_on_eigenvalues = frozenset({"meta"})
    capabilities = Capabilities(warm_start="eigenbasis", differentiable=True)
    max_angle: float = 0.1
    max_cluster: float = 0.5
    safety: float = 4.0
    fallback: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        arguments.store(
            self,
            max_angle=arguments.real(
                "max_angle", self.max_angle, minimum=0.0, exclusive_minimum=True, maximum=1.0,
                exclusive_maximum=True, what="first-order rotation limit |O_ij / (d_j - d_i)|",
            ),
            max_cluster=arguments.real(
                "max_cluster", self.max_cluster, minimum=0.0, exclusive_minimum=True, maximum=1.0,
                what="largest cluster as a fraction of n",
            ),
            safety=arguments.real(
                "safety", self.safety, minimum=0.0, exclusive_minimum=True, what="tolerance factor"
            ),
            fallback=arguments.flag("fallback", self.fallback),
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------ run
    def _run(self, prob: Problem, *, inverse: bool, warm_start: object) -> RawResult:
        if prob.grad_source is not None:  # only the cold eigh carries autograd
            raw = super()._run(prob, inverse=inverse, warm_start=None)
            raw.info["warm"] = _per_batch(prob, ["cold (autograd: the eigh path)"] * prob.A.shape[0])
            return raw
        A, base_info = self._working_matrix(prob)
        run = _Run(self, prob, A, base_info, inverse)
        basis = warm_basis(warm_start, A)
        if basis is None:
            run.cold(torch.arange(A.shape[0]), "cold")
        else:
            run.warm(*basis)
        return run.result()


def _per_batch(prob: Problem, values: list[Any]) -> Any:
    return values if prob.batched else values[0]


def _take(x: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """x[sel] for a sorted index set ``sel``; x itself when sel is all of x (no n x n copy)."""
    return x if sel.numel() == x.shape[0] else x[sel]


def _put(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst[idx] = src; returns src itself when idx is all of dst."""
    if idx.numel() == dst.shape[0]:
        return src
    dst[idx] = src
    return dst


def _norm2(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm over the last two dims (float64 for the host-side decisions)."""
    return torch.linalg.matrix_norm(x).double()


def _out_of_band(v: torch.Tensor, what: str, dtype: torch.dtype) -> dict[int, str]:
    """{row: why} for the rows of ``v`` (m, n) whose largest |v| is not finite or lies outside
    [sqrt(tiny) / u, sqrt(max)] of ``dtype``: there the estimate's squares (O o O, ||f||, ||P||) would
    underflow below the second-order term (off-diagonal entries of ~sqrt(u) times the scale) or
    overflow, and an underflow makes the estimate too small. Inside a batch prescaled as a whole a
    matrix 1e35 times its neighbour (a gradient spike) lands there; the cold eigh solves it.
    """
    fi = torch.finfo(dtype)
    lo, hi = math.sqrt(fi.tiny) / precision.unit_roundoff(dtype), math.sqrt(fi.max)
    top = v.detach().abs().amax(-1).double().cpu()
    bad = ~((top >= lo) & (top <= hi))  # NaN and inf included
    return {
        int(j): f"{what} at scale {float(top[j]):.2e}, outside [{lo:.1e}, {hi:.1e}] where the warm "
        f"estimate is representable in {precision.info(dtype).name}"
        for j in bad.nonzero().flatten().tolist()
    }


class _Run:
    """State of one batched eigh_warm call: per-element outputs filled in as elements finish."""

    def __init__(self, cfg: EighWarmConfig, prob: Problem, A: torch.Tensor, info: dict, inverse: bool):
        self.cfg, self.prob, self.A, self.inverse = cfg, prob, A, inverse
        b, n = A.shape[0], A.shape[-1]
        self.info = info
        deferred = prob.info.pop(psd_policy._DEFER_KEY, None)  # only "meta" is deferred here
        self.defer_meta = deferred is not None and deferred[0] == "meta"
        self.X = torch.empty_like(A)
        self.Q = torch.empty_like(A)
        self.w = torch.empty(b, n, dtype=A.dtype, device=A.device)
        self.status = [""] * b
        self.est = torch.full((b,), math.nan, dtype=torch.float64)
        self.tol = torch.full((b,), math.nan, dtype=torch.float64)
        self.defect = torch.full((b,), math.nan, dtype=torch.float64)
        self.iters = torch.zeros(b, dtype=torch.int64)
        self.gemms = torch.zeros(b, dtype=torch.float64)
        self.converged = torch.ones(b, dtype=torch.bool)
        self.per_elem: dict[str, torch.Tensor] = {}
        self.eigh_calls = 0
        self.u = precision.unit_roundoff(prob.dtype)
        self.in_caller_units: torch.Tensor | None = None

    # --------------------------------------------------------------------------- spectral function
    def spectrum(
        self, idx: torch.Tensor, d: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """(wr, f, active, e) for Ritz values d (m, n) of the elements ``idx``, any order.

        Delegates to eigh's eps / psd / rank-policy rules on the sorted values; records the per-element
        info (lambda_min/max, eps_abs, clamp counts, psd shift) for ``idx``.
        """
        ds, perm = torch.sort(d, dim=-1)
        sub = dataclasses.replace(self.prob, A=self.A, info={})  # only n, eps, p, prescale are read
        if self.defer_meta:
            sub.info[psd_policy._DEFER_KEY] = ("meta", None)
        wr_s, f_s, e, _, act_s = self.cfg._root_eigenvalues(sub, ds, sub.info, inverse=self.inverse)
        self._record(idx, sub.info)
        wr = torch.empty_like(wr_s).scatter_(-1, perm, wr_s)
        f = torch.empty_like(f_s).scatter_(-1, perm, f_s)
        active = (
            torch.ones_like(d, dtype=torch.bool)
            if act_s is None
            else torch.empty_like(act_s).scatter_(-1, perm, act_s)
        )
        return wr, f, active, e

    def _record(self, idx: torch.Tensor, info: dict) -> None:
        m = idx.numel()
        for key, val in info.items():
            if isinstance(val, torch.Tensor) and val.ndim == 1 and val.numel() == m:
                if key not in self.per_elem:
                    fill = 0 if not val.is_floating_point() else math.nan
                    self.per_elem[key] = torch.full((self.A.shape[0],), fill, dtype=val.dtype)
                self.per_elem[key][idx] = val.cpu()
            elif key not in ("psd_shift",):
                self.info.setdefault(key, val)

    def _folded(self, idx: torch.Tensor, folded: torch.Tensor | None) -> None:
        """Record where the roots of ``idx`` came out in the caller's units (root_eigenvalue_sqrt)."""
        if folded is None:
            return
        if self.in_caller_units is None:
            self.in_caller_units = torch.zeros(self.A.shape[0], dtype=torch.bool)
        self.in_caller_units[idx] = folded

    # ------------------------------------------------------------------------------------- cold eigh
    def cold(self, idx: torch.Tensor, why: str | list[str]) -> None:
        """Full eigh for the elements ``idx`` (the cold path and the fallback)."""
        if idx.numel() == 0:
            return
        A = self.A[idx]
        w, Q = self.cfg._eigh(A, self.info)
        self.eigh_calls += 1
        wr, f, _, e = self.spectrum(idx, w)
        sq, folded = root_eigenvalue_sqrt(self.prob, wr, f, e, self.inverse)
        W = Q * sq.unsqueeze(-2)
        self.X[idx] = W @ W.mT
        self._folded(idx, folded)
        self.Q[idx], self.w[idx] = Q, w
        n = A.shape[-1]
        self.defect[idx] = n * precision.unit_roundoff(A.dtype)  # LAPACK's orthogonality, O(n u)
        self.gemms[idx] += 1.0
        reasons = why if isinstance(why, list) else [why] * idx.numel()
        for i, r in zip(idx.tolist(), reasons, strict=True):
            self.status[i] = r

    # ------------------------------------------------------------------------------------- warm path
    def warm(self, Q0: torch.Tensor, defect0: torch.Tensor, bad: list[str]) -> None:
        """Refine the warm bases of the elements that have a usable one; eigh for the rest."""
        b, n = self.A.shape[0], self.A.shape[-1]
        fb_idx = [i for i in range(b) if bad[i]]
        fb_why = [f"fallback: {bad[i]}" for i in fb_idx]
        idx = torch.tensor([i for i in range(b) if not bad[i]], dtype=torch.int64)
        max_iter = self.prob.max_iter if self.prob.max_iter is not None else _MAX_ITER
        Q, delta, A = _take(Q0, idx), defect0[idx].clone(), _take(self.A, idx)
        # Q^T Q is formed (one GEMM) unless the basis is known orthonormal to LAPACK's level
        gram = bool((~(delta <= _TRUSTED * n * precision.unit_roundoff(self.A.dtype))).any())  # NaN: form it
        prev = torch.full((idx.numel(),), math.inf, dtype=torch.float64)
        k = 0
        while idx.numel():
            st = _Step(self, idx, A, Q, delta if not gram else None)
            self.gemms[idx] += 3.0 if gram else 2.0
            est, tol = st.estimate()
            done = (est <= tol).nonzero().flatten()
            if done.numel():
                self._finish(idx[done], st, done, est[done], tol[done], k)
            rest = (~(est <= tol)).nonzero().flatten()  # NaN too: every element finishes or falls back
            if rest.numel() == 0:
                break
            why = st.plan(rest, est, tol, prev, k, max_iter)
            go = torch.tensor(
                [j for j, w in zip(rest.tolist(), why, strict=True) if not w], dtype=torch.int64
            )
            for j, reason in zip(rest.tolist(), why, strict=True):
                if not reason:
                    continue
                if self.cfg.fallback:
                    fb_idx.append(int(idx[j]))
                    fb_why.append(f"fallback: {reason}")
                    self.iters[idx[j]] = k
                else:
                    sel = torch.tensor([j])
                    self._finish(idx[sel], st, sel, est[sel], tol[sel], k, why=reason)
            if go.numel() == 0:
                break
            Qn = st.update(go)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "eigh_warm update k=%d: ||E||_F %s clusters %s", k, _norm2(st.E[go]).tolist(),
                    [sorted(st.sizes[j], reverse=True)[:6] for j in go.tolist()],
                )  # fmt: skip
            idx, A, Q, prev = idx[go], _take(A, go), Qn, est[go]
            delta = torch.full((idx.numel(),), math.nan, dtype=torch.float64)
            gram = True
            k += 1
        if fb_idx:
            self.cold(torch.tensor(fb_idx, dtype=torch.int64), fb_why)

    def _finish(
        self,
        idx: torch.Tensor,
        st: _Step,
        sel: torch.Tensor,
        est: torch.Tensor,
        tol: torch.Tensor,
        k: int,
        why: str = "",
    ) -> None:
        """Form the root W W^T (W = Q N^(-1/2) f^(1/2), N = diag(Q^T Q)) of finished elements."""
        Qs, f, d = _take(st.Q, sel), st.f[sel], st.d[sel]
        if st.R is not None:  # unit columns: the diagonal of Q^T Q - I does not enter the root
            Qs = Qs * (1.0 - st.rd[sel]).rsqrt().unsqueeze(-2)
        if why:  # not converged: the basis may be far from orthonormal, so the fold's range margin,
            # which assumes unit rows, does not hold; left prescaled (unrecorded elements are) for
            # _finalise's exact rescaling
            sq, folded = f.sqrt(), None
        else:
            sq, folded = root_eigenvalue_sqrt(self.prob, st.wr[sel], f, st.e, self.inverse)
        W = Qs * sq.unsqueeze(-2)
        self.X = _put(self.X, idx, W @ W.mT)
        self._folded(idx, folded)
        self.gemms[idx] += 1.0
        d, perm = torch.sort(d, dim=-1)
        n = d.shape[-1]
        ordered = bool((perm == torch.arange(n, device=perm.device)).all())
        self.Q = _put(self.Q, idx, Qs if ordered else Qs.gather(-1, perm.unsqueeze(-2).expand(-1, n, -1)))
        self.w[idx] = d
        self.est[idx] = est.double().cpu()
        self.tol[idx] = tol.double().cpu()
        self.defect[idx] = st.defect[sel].double().cpu()
        self.iters[idx] = k
        label = "accepted" if k == 0 else "refined"
        if why:  # fallback=False: the refined root, honestly flagged
            label = f"not converged: {why}"
            self.converged[idx] = False
        for i in idx.tolist():
            self.status[i] = label

    def _flag_singular(self, info: dict) -> None:
        """eigh's SPD domain test (:func:`~matroots.solvers.eigh.flag_singular`) on every element, from
        its eigenvalues (LAPACK's, or the accepted Ritz values, within the warm tolerance of them) plus
        its psd and eps shifts: an inverse root of a matrix singular to working precision is flagged
        ``not converged: not_determined``, warm or cold (issue 22, class 2)."""
        s = self.prob.prescale
        shift = info["eps_abs"].to(torch.float64) * s  # prescaled units (2^k: exact)
        if "psd_shift" in info:
            shift = shift + info["psd_shift"].reshape(-1).to(torch.float64)
        wr = self.w + shift.to(self.w.dtype).unsqueeze(-1)
        before = self.converged.clone()
        flag_singular(self.cfg.name, self.prob, self.A, wr, shift, info, self.converged)
        for i in (before & ~self.converged).nonzero().flatten().tolist():
            self.status[i] = "not converged: not_determined"

    # ---------------------------------------------------------------------------------------- result
    def result(self) -> RawResult:
        prob = self.prob
        info = self.info
        s = prob.prescale
        for key, val in self.per_elem.items():
            info[key] = val
        if "psd_shift" in self.per_elem:
            info["psd_shift"] = self.per_elem["psd_shift"]
        if self.inverse and self.cfg.rank_policy == "perturb":
            self._flag_singular(info)
        bs = prob.batch_shape
        n = prob.n
        info["eigenvectors"] = self.Q.reshape(*bs, n, n)
        info["eigenvalues"] = (self.w / s if s != 1.0 else self.w).reshape(*bs, n)
        info["basis_defect"] = self.defect.reshape(bs)
        info["warm"] = _per_batch(prob, self.status)
        counts = {"accepted": 0, "refined": 0, "fallback": 0, "cold": 0, "not converged": 0}
        for st in self.status:
            key = next(k for k in counts if st.startswith(k))
            counts[key] += 1
        info["warm_counts"] = counts
        info["warm_tol"] = self.tol.reshape(bs)
        info["warm_estimate"] = self.est.reshape(bs)
        info["warm_gemms"] = self.gemms.reshape(bs)
        info["eigh_calls"] = self.eigh_calls
        info["residual_note"] = (
            "residual = estimated relative forward error of the warm root (Daleckii-Krein, module "
            "docstring); NaN where eigh ran"
        )
        return RawResult(
            root=self.X,
            converged=self.converged,
            iterations=self.iters,
            residual=self.est,
            matmuls=float(self.gemms.mean()),
            info=info,
            in_caller_units=self.in_caller_units,
        )


class _Step:
    """One Rayleigh-Ritz step on the elements ``idx``: S = Q^T A Q (and R = I - Q^T Q), the error
    estimate, and the refinement of Q (Ogita & Aishima 2018, Alg. 1, with cluster blocks).

    The n x n elementwise work is kept to ~10 passes (~17 with R) for the estimate: on a CPU each pass
    over a batch of n x n matrices costs 0.1-0.5 GEMM. Diagonal terms are removed analytically instead
    of by masking, and the row sums of Ohat^2 come from one matrix-vector product.
    """

    def __init__(
        self, run: _Run, idx: torch.Tensor, A: torch.Tensor, Q: torch.Tensor, delta: torch.Tensor | None
    ):
        self.run, self.idx, self.Q = run, idx, Q
        # per element of idx: its cluster sizes and their columns (filled by _clusters)
        self.sizes: dict[int, list[int]] = {}
        self.cluster_cols: dict[int, list[torch.Tensor]] = {}
        # two n x n buffers serve the four products and sums (each fresh one costs page faults)
        AQ = A @ Q
        B = Q.mT @ AQ
        S = torch.add(B.mT, B, out=AQ)  # A Q is not needed any more
        S.mul_(0.5)  # symmetric part
        self.R: torch.Tensor | None = None
        dS = S.diagonal(dim1=-2, dim2=-1)
        if delta is None:  # measure the orthogonality: R = I - Q^T Q (symmetrised)
            G = torch.matmul(Q.mT, Q, out=B)
            R = G.mT + G
            R.mul_(-0.5).diagonal(dim1=-2, dim2=-1).add_(1.0)
            self.R = R
            self.rd = R.diagonal(dim1=-2, dim2=-1).clone()
            self.d = dS / (1.0 - self.rd)  # Rayleigh quotients of the columns
            off2 = torch.linalg.vector_norm(R, dim=(-2, -1)).double() ** 2 - (self.rd.double() ** 2).sum(-1)
            self.defect = off2.clamp_min(0).sqrt().cpu()  # ||R_off||_F: of the unit-column basis returned
            self.delta = torch.zeros_like(self.defect)
        else:
            self.d = dS.clone()
            self.defect = self.delta = delta
        # elements whose estimate the working format cannot hold go to the fallback with the reason
        # (position in idx -> why); their Ritz values are replaced by 1 for the shared spectrum call,
        # which refuses non-finite ones
        self.unusable = _out_of_band(self.d, "Ritz values", A.dtype)
        d = self.d
        if self.unusable:
            rows = torch.tensor(sorted(self.unusable), device=d.device)
            d = d.index_fill(0, rows, 1.0)
        wr, f, active, e = run.spectrum(idx, d)
        for j, why in _out_of_band(f, "root eigenvalues", A.dtype).items():
            self.unusable.setdefault(j, why)
        self.wr, self.f, self.active, self.e = wr, f, active, e
        self.S = S
        self.any_inactive = bool((~active).any())
        if self.any_inactive:
            zfloor = torch.where(active, wr, torch.full_like(wr, math.inf)).amin(-1, keepdim=True)
            self.z = torch.where(active, wr, zfloor.expand_as(wr))
        else:
            self.z = wr
        self.gn = torch.linalg.vector_norm(f.double(), dim=-1)  # ||f||_2 (fp32 squares overflow at 2^64)

    def estimate(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(est, tol) per element (float64, CPU): the estimated relative error of the root from Q."""
        e, f, z, wr, S, R = self.e, self.f, self.z, self.wr, self.S, self.R
        # dxT_ij = w_j - w_i (exact ties, the diagonal among them, set to 1: there f_j - f_i = 0 too)
        dxT = wr.unsqueeze(-2) - wr.unsqueeze(-1)
        dxT.masked_fill_(dxT == 0, 1.0)
        self.dxT = dxT
        # O (off-diagonal of U^T A U) with its diagonal left in: F1_ii = 0 removes it from P
        O = S if R is None else torch.addcmul(S, R, 0.5 * (self.d.unsqueeze(-1) + self.d.unsqueeze(-2)))
        self.O = O
        P = (f.unsqueeze(-2) - f.unsqueeze(-1)).div_(dxT).mul_(O)  # F1 o O: f[w_i, w_j] O_ij
        diag_p = torch.zeros_like(self.gn)
        if R is not None:  # Q f Q^T with a non-orthonormal Q: + R_off o (f_i + f_j)/2
            P.addcmul_(R, 0.5 * (f.unsqueeze(-1) + f.unsqueeze(-2)))
            diag_p = ((self.rd * f).double() ** 2).sum(-1)  # P_ii = r_ii f_i: normalised away
        first = (torch.linalg.vector_norm(P, dim=(-2, -1)).double() ** 2 - diag_p).clamp_min(0).sqrt()
        # second order: row sums of Ohat^2 (Ohat_ij = O_ij / sqrt(z_i z_j), both-inactive pairs left out)
        O2 = O.square()
        w = 1.0 / z
        rows = (O2 @ w.unsqueeze(-1)).squeeze(-1)
        if self.any_inactive:
            wa = torch.where(self.active, w, torch.zeros_like(w))
            rows = torch.where(self.active, rows, (O2 @ wa.unsqueeze(-1)).squeeze(-1))
            rows = rows - O2.diagonal(dim1=-2, dim2=-1) * torch.where(self.active, w, torch.zeros_like(w))
        else:
            rows = rows - O2.diagonal(dim1=-2, dim2=-1) * w
        rows = (rows.clamp_min(0) * w).double()
        r = rows.sum(-1).sqrt()
        fOh = ((f.double() ** 2) * rows).sum(-1).sqrt()
        # f'(z) and ||z||_2 in float64: in fp32 f / z overflows and ||z|| underflows far from scale 1
        zd = z.double()
        g1 = torch.where(self.active, e * f.double() / zd, torch.zeros_like(zd))
        cond = g1.abs().amax(-1) * torch.linalg.vector_norm(zd, dim=-1) / self.gn
        run = self.run
        if run.prob.tol is not None:
            tol = torch.full_like(cond, float(run.prob.tol))
        else:
            tol = run.cfg.safety * (1.0 + cond) * run.u * math.sqrt(z.shape[-1])
        old2 = 3.0 * r * fOh  # the second-order bound in Ohat (module docstring)
        # third and higher orders: the geometric tail in r; the second order by the sharper of two bounds
        tail = torch.where(r < 1, old2 * r / (1.0 - r).clamp_min(1e-300), torch.full_like(r, math.inf))
        base = (first + tail) / self.gn + 2.0 * self.delta.to(first.device).double()
        t2 = old2
        if not self.any_inactive:  # the binned bound only where it can change the verdict
            need = ((base <= tol) & (base + old2 / self.gn > tol)).nonzero().flatten()
            if need.numel():
                t2 = old2.clone()
                t2[need] = torch.minimum(old2[need], binned_second_order(_take(O2, need), z[need], f[need]))
        self.r = r.cpu()
        est = base + t2 / self.gn
        if self.unusable:
            est = est.clone()
            est[torch.tensor(sorted(self.unusable), device=est.device)] = math.nan
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "eigh_warm step: first-order %s second-order %s tail %s ||Ohat||_F %s basis defect %s",
                (first / self.gn).tolist(), (t2 / self.gn).tolist(), (tail / self.gn).tolist(), r.tolist(),
                self.defect.tolist(),
            )  # fmt: skip
        return est.cpu(), tol.cpu()

    def plan(
        self,
        rest: torch.Tensor,
        est: torch.Tensor,
        tol: torch.Tensor,
        prev: torch.Tensor,
        k: int,
        max_iter: int,
    ) -> list[str]:
        """For the elements ``rest``: the rotation (E, clusters) and, per element, "" to rotate or why not."""
        why = []
        est_all, tol_all, prev_all = (t.tolist() for t in (est, tol, prev))
        for j in rest.tolist():
            ej, tj, pj = est_all[j], tol_all[j], prev_all[j]
            # ||Ohat||_F >= 1 only makes the estimate infinite (no acceptance): the refinement can still
            # converge; whether it can is the cluster test below (a basis too far shows as one cluster)
            if j in self.unusable:
                why.append(self.unusable[j])
            elif math.isnan(ej) or math.isnan(tj):  # an overflow in the estimate: nothing to refine on
                why.append(f"the error estimate is not a number (estimate {ej:.2e}, tol {tj:.2e})")
            elif k >= max_iter:
                why.append(f"{k} refinement steps left the estimate {ej:.2e} > tol {tj:.2e}")
            elif k > 0 and not math.isfinite(ej):  # ||Ohat||_F still >= 1 after a rotation
                why.append(f"basis too far (estimate still unbounded after {k} refinement step(s))")
            elif k > 0 and ej > 0.25 * pj:
                why.append(f"not converging (estimate {pj:.2e} -> {ej:.2e}, tol {tj:.2e})")
            else:
                why.append("")
        self._clusters(rest)
        limit = self.run.cfg.max_cluster * self.d.shape[-1]
        for pos, j in enumerate(rest.tolist()):
            big = max(self.sizes[j]) if self.sizes[j] else 1
            if not why[pos] and big > limit:
                why[pos] = f"an eigenvalue cluster of {big} > max_cluster n = {limit:.0f}"
        return why

    def _clusters(self, rest: torch.Tensor) -> None:
        """First-order rotation E on separated pairs; clusters = contiguous runs of sorted Ritz values
        joined by pairs that are not separated (|O_ij| >= max_angle |d_i - d_j|)."""
        E = torch.div(_take(self.O, rest), _take(self.dxT, rest))  # O_ij / (d_j - d_i)
        E.diagonal(dim1=-2, dim2=-1).zero_()
        if self.any_inactive:  # f is constant below the threshold: no rotation among those directions
            ina = ~_take(self.active, rest)
            E.masked_fill_(ina.unsqueeze(-1) & ina.unsqueeze(-2), 0.0)
        m, n = E.shape[0], E.shape[-1]
        clustered = E.abs() >= self.run.cfg.max_angle
        has = clustered.flatten(1).any(-1).cpu()
        self.has_cluster = torch.zeros(self.d.shape[0], dtype=torch.bool)
        for j in rest.tolist():
            self.sizes[j], self.cluster_cols[j] = [], []
        if bool(has.any()):
            perm = torch.sort(_take(self.wr, rest), dim=-1).indices
            ar = torch.arange(n, device=E.device).expand(m, n)
            rank = torch.empty_like(perm).scatter_(-1, perm, ar.contiguous())
            reach = torch.where(clustered, rank.unsqueeze(-2), torch.full_like(rank, -1).unsqueeze(-2))
            reach_sorted = torch.maximum(reach.amax(-1).gather(-1, perm), ar)
            ends = torch.cummax(reach_sorted, dim=-1).values == ar  # a cluster ends at sorted position r
            cid_sorted = torch.cumsum(ends.long(), dim=-1) - ends.long()
            cid = torch.empty_like(cid_sorted).scatter_(-1, perm, cid_sorted)
            E.masked_fill_(cid.unsqueeze(-1) == cid.unsqueeze(-2), 0.0)  # inside a cluster: block eigh
            ends_cpu, perm_cpu = ends.cpu(), perm.cpu()
            for pos, j in enumerate(rest.tolist()):
                if not bool(has[pos]):
                    continue
                stops = ends_cpu[pos].nonzero().flatten().tolist()
                starts = [0] + [e + 1 for e in stops[:-1]]
                blocks = [(a, e - a + 1) for a, e in zip(starts, stops, strict=True) if e > a]
                self.sizes[j] = [sz for _, sz in blocks]
                self.cluster_cols[j] = [perm_cpu[pos, a : a + sz] for a, sz in blocks]
                self.has_cluster[j] = bool(blocks)
        if rest.numel() == self.S.shape[0]:
            self.E = E
        else:
            self.E = torch.zeros_like(self.S)
            self.E[rest] = E

    def update(self, sel: torch.Tensor) -> torch.Tensor:
        """Q V for the elements ``sel``, V = I + E + E^2/2 + R/2: the rotation exp(E) to second order
        (V^T V = I + E^4/4 for R = 0) and the first-order orthogonalisation (I - R)^(-1/2) ~ I + R/2;
        then each cluster's columns rotated by the eigenvectors of its block of S."""
        run = self.run
        E, Q = _take(self.E, sel), _take(self.Q, sel)
        n = Q.shape[-1]
        En = _norm2(E)
        if bool((En * En > run.u).any()):
            V = torch.bmm(E, E).mul_(0.5).add_(E)
            run.gemms[self.idx[sel]] += 1.0
        else:  # E^2 below the rounding level
            V = E.clone()
        if self.R is not None:
            V.add_(_take(self.R, sel), alpha=0.5)
        V.diagonal(dim1=-2, dim2=-1).add_(1.0)
        Qn = Q @ V
        run.gemms[self.idx[sel]] += 1.0
        groups: dict[int, list[tuple[int, torch.Tensor]]] = {}
        for pos, j in enumerate(sel.tolist()):
            for cols in self.cluster_cols.get(j, []):
                groups.setdefault(cols.numel(), []).append((pos, cols))
        rows = torch.arange(n, device=Q.device).view(1, n, 1)
        for size, items in groups.items():
            pos = torch.tensor([p for p, _ in items], device=Q.device)
            cols = torch.stack([c for _, c in items]).to(Q.device)  # (K, size)
            jj = sel.to(Q.device)[pos]
            blk = self.S[jj.view(-1, 1, 1), cols.unsqueeze(-1), cols.unsqueeze(-2)]
            _, Vb = torch.linalg.eigh(blk)
            at = (pos.view(-1, 1, 1), rows, cols.unsqueeze(-2))
            Qn[at] = Qn[at] @ Vb
            share = torch.full((pos.numel(),), (size / n) ** 2, dtype=torch.float64)
            run.gemms.index_add_(0, self.idx[sel[pos.cpu()]], share)
        return Qn


__all__ = ["EighWarmConfig"]
