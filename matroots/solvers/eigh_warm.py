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
from .eigh_warm_step import RefinementStep, norm2, put_rows, take_rows
from .registry import register
from .warm_basis import warm_basis

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
        Q, delta, A = take_rows(Q0, idx), defect0[idx].clone(), take_rows(self.A, idx)
        # Q^T Q is formed (one GEMM) unless the basis is known orthonormal to LAPACK's level
        gram = bool((~(delta <= _TRUSTED * n * precision.unit_roundoff(self.A.dtype))).any())  # NaN: form it
        prev = torch.full((idx.numel(),), math.inf, dtype=torch.float64)
        k = 0
        while idx.numel():
            st = RefinementStep(self, idx, A, Q, delta if not gram else None)
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
                    "eigh_warm update k=%d: ||E||_F %s clusters %s", k, norm2(st.E[go]).tolist(),
                    [sorted(st.sizes[j], reverse=True)[:6] for j in go.tolist()],
                )  # fmt: skip
            idx, A, Q, prev = idx[go], take_rows(A, go), Qn, est[go]
            delta = torch.full((idx.numel(),), math.nan, dtype=torch.float64)
            gram = True
            k += 1
        if fb_idx:
            self.cold(torch.tensor(fb_idx, dtype=torch.int64), fb_why)

    def _finish(
        self,
        idx: torch.Tensor,
        st: RefinementStep,
        sel: torch.Tensor,
        est: torch.Tensor,
        tol: torch.Tensor,
        k: int,
        why: str = "",
    ) -> None:
        """Form the root W W^T (W = Q N^(-1/2) f^(1/2), N = diag(Q^T Q)) of finished elements."""
        Qs, f, d = take_rows(st.Q, sel), st.f[sel], st.d[sel]
        if st.R is not None:  # unit columns: the diagonal of Q^T Q - I does not enter the root
            Qs = Qs * (1.0 - st.rd[sel]).rsqrt().unsqueeze(-2)
        if why:  # not converged: the basis may be far from orthonormal, so the fold's range margin,
            # which assumes unit rows, does not hold; left prescaled (unrecorded elements are) for
            # _finalise's exact rescaling
            sq, folded = f.sqrt(), None
        else:
            sq, folded = root_eigenvalue_sqrt(self.prob, st.wr[sel], f, st.e, self.inverse)
        W = Qs * sq.unsqueeze(-2)
        self.X = put_rows(self.X, idx, W @ W.mT)
        self._folded(idx, folded)
        self.gemms[idx] += 1.0
        d, perm = torch.sort(d, dim=-1)
        n = d.shape[-1]
        ordered = bool((perm == torch.arange(n, device=perm.device)).all())
        self.Q = put_rows(self.Q, idx, Qs if ordered else Qs.gather(-1, perm.unsqueeze(-2).expand(-1, n, -1)))
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


__all__ = ["EighWarmConfig"]
