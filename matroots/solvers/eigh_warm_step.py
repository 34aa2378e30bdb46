"""One Rayleigh-Ritz refinement step of the warm-started eigensolver (:mod:`matroots.solvers.eigh_warm`).

Ogita & Aishima 2018 ("Iterative refinement for symmetric eigenvalue decomposition", Alg. 1), with
cluster blocks: S = Q^T A Q (and R = I - Q^T Q when Q is not known orthonormal), the Daleckii-Krein
estimate of the root's error from Q (eigh_warm's module docstring, steps 1-3), and the refined basis.
The call's state (per-element outputs, the spectral function, the GEMM count) is the caller's
:class:`WarmRun`; the row helpers below are shared with it.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Protocol

import torch

from ..core import precision
from ..core.inputs import Problem
from .warm_bound import binned_second_order

log = logging.getLogger("matroots")


class WarmRun(Protocol):
    """What a refinement step reads of its eigh_warm call (``eigh_warm._Run``)."""

    cfg: Any  # EighWarmConfig: max_angle, max_cluster
    prob: Problem
    u: float
    gemms: torch.Tensor

    def spectrum(
        self, idx: torch.Tensor, d: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]: ...


def take_rows(x: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """x[sel] for a sorted index set ``sel``; x itself when sel is all of x (no n x n copy)."""
    return x if sel.numel() == x.shape[0] else x[sel]


def put_rows(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst[idx] = src; returns src itself when idx is all of dst."""
    if idx.numel() == dst.shape[0]:
        return src
    dst[idx] = src
    return dst


def norm2(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm over the last two dims (float64 for the host-side decisions)."""
    return torch.linalg.matrix_norm(x).double()


def out_of_band(v: torch.Tensor, what: str, dtype: torch.dtype) -> dict[int, str]:
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


class RefinementStep:
    """One Rayleigh-Ritz step on the elements ``idx``: S = Q^T A Q (and R = I - Q^T Q), the error
    estimate, and the refinement of Q (Ogita & Aishima 2018, Alg. 1, with cluster blocks).

    The n x n elementwise work is kept to ~10 passes (~17 with R) for the estimate: on a CPU each pass
    over a batch of n x n matrices costs 0.1-0.5 GEMM. Diagonal terms are removed analytically instead
    of by masking, and the row sums of Ohat^2 come from one matrix-vector product.
    """

    def __init__(
        self, run: WarmRun, idx: torch.Tensor, A: torch.Tensor, Q: torch.Tensor, delta: torch.Tensor | None
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
        self.unusable = out_of_band(self.d, "Ritz values", A.dtype)
        d = self.d
        if self.unusable:
            rows = torch.tensor(sorted(self.unusable), device=d.device)
            d = d.index_fill(0, rows, 1.0)
        wr, f, active, e = run.spectrum(idx, d)
        for j, why in out_of_band(f, "root eigenvalues", A.dtype).items():
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
                t2[need] = torch.minimum(
                    old2[need], binned_second_order(take_rows(O2, need), z[need], f[need])
                )
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
        E = torch.div(take_rows(self.O, rest), take_rows(self.dxT, rest))  # O_ij / (d_j - d_i)
        E.diagonal(dim1=-2, dim2=-1).zero_()
        if self.any_inactive:  # f is constant below the threshold: no rotation among those directions
            ina = ~take_rows(self.active, rest)
            E.masked_fill_(ina.unsqueeze(-1) & ina.unsqueeze(-2), 0.0)
        m, n = E.shape[0], E.shape[-1]
        clustered = E.abs() >= self.run.cfg.max_angle
        has = clustered.flatten(1).any(-1).cpu()
        self.has_cluster = torch.zeros(self.d.shape[0], dtype=torch.bool)
        for j in rest.tolist():
            self.sizes[j], self.cluster_cols[j] = [], []
        if bool(has.any()):
            perm = torch.sort(take_rows(self.wr, rest), dim=-1).indices
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
        E, Q = take_rows(self.E, sel), take_rows(self.Q, sel)
        n = Q.shape[-1]
        En = norm2(E)
        if bool((En * En > run.u).any()):
            V = torch.bmm(E, E).mul_(0.5).add_(E)
            run.gemms[self.idx[sel]] += 1.0
        else:  # E^2 below the rounding level
            V = E.clone()
        if self.R is not None:
            V.add_(take_rows(self.R, sel), alpha=0.5)
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


__all__ = ["RefinementStep", "WarmRun", "norm2", "out_of_band", "put_rows", "take_rows"]
