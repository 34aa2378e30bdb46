"""Kronecker-factor statistics and preconditioning on stacks of same-shape blocks.

Shampoo (Gupta, Koren & Singer 2018, Alg. 1/2; Anil et al. 2020; Shi et al. 2023, §2-3): for a block
G of order k with factor dims i, the statistics are the mode-i Gram matrices

    L_i <- beta2 L_i + (1 - beta2) G_(i) G_(i)^T        (beta2 = 1: L_i <- L_i + G_(i) G_(i)^T),

G_(i) the mode-i matricisation, and the preconditioned direction is the multilinear product
G x_1 L_1^{-1/p_1} x_2 ... x_k L_k^{-1/p_k} (for matrices, L^{-1/4} G R^{-1/4}).

A :class:`BlockBucket` holds the stacked state of same-shape blocks (b, ...) and runs statistics,
the diagonal preconditioner, grafting and preconditioning as batched kernels (``baddbmm``, ``bmm``,
elementwise ops over the whole stack). Factors are exactly symmetric whenever they are read: see
:func:`mirror_upper_`. The per-block typed states
(:class:`shampoo.state.BlockState`) hold views into that storage.
"""

from __future__ import annotations

import torch

from . import grafting
from .blocking import BlockKind
from .config import GroupOptions, NoGrafting
from .state import BlockState, FactorState, mirror_upper_


def _col(x: torch.Tensor | float, ndim: int, dtype: torch.dtype) -> torch.Tensor | float:
    """A per-block (k,) tensor shaped to broadcast over a stack of ndim dims."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype).view(-1, *([1] * (ndim - 1)))
    return x


def _vec(x: torch.Tensor | float, k: int, device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64)
    return torch.full((k,), float(x), dtype=torch.float64, device=device)


def _div(a: torch.Tensor | float, b: torch.Tensor | float) -> torch.Tensor | float:
    if not isinstance(b, torch.Tensor) and b == 1.0:
        return a
    return a / b


def per_block(values: list[float], ndim: int, device: torch.device) -> float | torch.Tensor:
    """A float when all values agree (the common case), else a (b, 1, ..., 1) float64 tensor."""
    first = values[0]
    if all(v == first for v in values):
        return first
    return torch.tensor(values, dtype=torch.float64, device=device).view(-1, *([1] * (ndim - 1)))


def matricize(G: torch.Tensor, dim: int) -> torch.Tensor:
    """Mode-``dim`` matricisation of a stack G (b, *shape): (b, n_dim, numel / n_dim)."""
    b = G.shape[0]
    if G.ndim == 3:
        return G if dim == 0 else G.mT
    return G.movedim(dim + 1, 1).reshape(b, G.shape[dim + 1], -1)


def precondition(X: torch.Tensor, roots: list[torch.Tensor | None]) -> torch.Tensor:
    """X x_1 R_1 x_2 ... x_k R_k for a stack X (b, *shape) and symmetric R_i (b, n_i, n_i) or None.

    Each step contracts the leading dim and rotates it to the end (Y^T R), so after k steps the dims
    are back in order; matrices take the two-GEMM path R_1 X R_2.
    """
    b, shape = X.shape[0], X.shape[1:]
    if len(shape) == 2 and roots[0] is not None and roots[1] is not None:
        return torch.bmm(torch.bmm(roots[0], X), roots[1])
    Y = X
    for i, R in enumerate(roots):
        Y = Y.reshape(b, shape[i], -1)
        Y = torch.bmm(Y.mT, R) if R is not None else Y.mT
    return Y.reshape(X.shape)


def block_norms(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each block of a stack, shape (b,)."""
    return torch.linalg.vector_norm(x.reshape(x.shape[0], -1), dim=1)


class BlockBucket:
    """Same-shape, same-kind blocks of one param group, with stacked state.

    Args:
        blocks: the (owned) blocks, all with the same ``spec.bucket_key``.
        opts: the group's options.
        dtype, device: of the parameters (first moment, grafting state, roots); factor statistics
            are kept in ``opts.factor_dtype``.
    """

    def __init__(
        self, blocks: list[BlockState], opts: GroupOptions, dtype: torch.dtype, device: torch.device
    ):
        spec = blocks[0].spec
        self.blocks = blocks
        self.kind = spec.kind
        self.shape = spec.shape
        self.root_ps = spec.roots
        self.factor_dims = spec.factor_dims
        self.dtype = dtype
        self.device = device
        b = len(blocks)
        full = (b, *self.shape)
        zeros = torch.zeros(full, dtype=dtype, device=device)
        self.first_moment = zeros.clone() if opts.beta1 > 0 else None
        self.graft_state = grafting.init(opts.grafting, zeros)
        self.diagonal = zeros.clone() if self.kind is BlockKind.DIAGONAL else None
        self.factors: list[torch.Tensor] = []
        self.roots: list[torch.Tensor] = []
        for d in self.factor_dims:
            n = self.shape[d]
            self.factors.append(torch.zeros(b, n, n, dtype=opts.factor_dtype, device=device))
            eye = torch.eye(n, dtype=dtype, device=device)
            self.roots.append(eye.expand(b, n, n).clone())
        for j, bs in enumerate(blocks):
            bs.first_moment = self.first_moment[j] if self.first_moment is not None else None
            bs.graft_state = self.graft_state[j] if self.graft_state is not None else None
            bs.diagonal = self.diagonal[j] if self.diagonal is not None else None
            bs.factors = [
                FactorState(
                    dim=d,
                    n=self.shape[d],
                    root_p=self.root_ps[d],  # type: ignore[arg-type]
                    matrix=self.factors[k][j],
                    root=self.roots[k][j],
                )
                for k, d in enumerate(self.factor_dims)
            ]
        self.grad_buffer = zeros  # reused for the stacked gradient of a full step

    def __len__(self) -> int:
        return len(self.blocks)

    # -- statistics ---------------------------------------------------------------------------------

    def update_statistics(
        self, sel: torch.Tensor | None, G: torch.Tensor, opts: GroupOptions, steps: list[int]
    ) -> torch.Tensor:
        """Fold the stacked gradient G of the selected blocks (``sel`` None: all) into every statistic.

        Returns m, the gradient EMA (G itself when beta1 = 0); its bias correction 1/(1 - beta1^t) is a
        per-block factor that :meth:`directions` folds into the output scale.
        """
        b1, b2 = opts.beta1, opts.beta2
        if self.graft_state is not None:
            v = _take(self.graft_state, sel)
            grafting.update(opts.grafting, v, G)
            _put(self.graft_state, sel, v)
        if self.diagonal is not None:
            u = _take(self.diagonal, sel)
            if b2 == 1.0:
                u.addcmul_(G, G)
            else:
                u.mul_(b2).addcmul_(G, G, value=1.0 - b2)
            _put(self.diagonal, sel, u)
        if self.factors:
            Gf = G if G.dtype == self.factors[0].dtype else G.to(self.factors[0].dtype)
            for k, d in enumerate(self.factor_dims):
                F = _take(self.factors[k], sel)
                Gi = matricize(Gf, d)
                if b2 == 1.0:
                    F.baddbmm_(Gi, Gi.mT)
                else:
                    F.baddbmm_(Gi, Gi.mT, beta=b2, alpha=1.0 - b2)
                _put(self.factors[k], sel, F)
        if self.first_moment is None:
            return G
        m = _take(self.first_moment, sel)
        m.lerp_(G, 1.0 - b1)
        _put(self.first_moment, sel, m)
        return m

    # -- directions ---------------------------------------------------------------------------------

    def directions(
        self,
        sel: torch.Tensor | None,
        m: torch.Tensor,
        opts: GroupOptions,
        steps: list[int],
        use_preconditioner: list[bool],
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """Search directions of the selected blocks as (D, s): block j's direction is s_j D_j.

        ``m`` is the gradient EMA from :meth:`update_statistics`. The per-block factor s (a float, or a
        (k,) tensor) carries the bias correction of m, Adam's bias correction and the grafting norm
        ratio, so that the caller applies all of them in the one pass that writes the direction out.
        ``use_preconditioner[j]``: block j is past ``start_preconditioning_step`` (and, for Shampoo
        blocks, has at least one root); otherwise its direction is the grafting direction.
        """
        cfg = opts.grafting
        dev = m.device
        bc1: torch.Tensor | float = 1.0
        if self.first_moment is not None and opts.use_bias_correction:
            bc1 = per_block([1.0 - opts.beta1**t for t in steps], 1, dev)
        bc2 = grafting.bias_correction2(cfg, _steps_arg(steps, dev), opts.use_bias_correction)
        graft_dir, graft_scale = grafting.direction(cfg, _take(self.graft_state, sel), m, bc2)
        if self.kind is BlockKind.GRAFT or not any(use_preconditioner):
            return graft_dir, _div(graft_scale, bc1)
        pre_scale: torch.Tensor | float = 1.0
        if self.kind is BlockKind.DIAGONAL:
            assert self.diagonal is not None
            u = _take(self.diagonal, sel)
            denom = u.sqrt()
            if opts.use_bias_correction and opts.beta2 < 1.0:
                # sqrt(u / c) + eps = (sqrt(u) + eps sqrt(c)) / sqrt(c), c = 1 - beta2^t
                c = per_block([(1.0 - opts.beta2**t) ** 0.5 for t in steps], 1, dev)
                denom.add_(_col(c, denom.ndim, denom.dtype) * opts.diagonal_eps)
                pre_scale = c
            else:
                denom.add_(opts.diagonal_eps)
            pre = torch.div(m, denom, out=denom)
        else:
            roots: list[torch.Tensor | None] = [None] * len(self.shape)
            for k, d in enumerate(self.factor_dims):
                roots[d] = _take(self.roots[k], sel)
            pre = precondition(m, roots)
        if not isinstance(cfg, NoGrafting):
            # Grafting: rescale each block to the norm of the grafting direction.
            gn = block_norms(graft_dir)
            if isinstance(graft_scale, torch.Tensor) or graft_scale != 1.0:
                gn = gn * graft_scale
            pn = block_norms(pre)
            pre_scale = torch.where(pn > 0, gn / pn, torch.zeros_like(pn))
        if all(use_preconditioner):
            return pre, _div(pre_scale, bc1)
        mask = torch.tensor(use_preconditioner, device=dev)
        D = torch.where(mask.view(-1, *([1] * (pre.ndim - 1))), pre, graft_dir)
        k = len(steps)
        scale = torch.where(mask, _vec(pre_scale, k, dev), _vec(graft_scale, k, dev))
        return D, _div(scale, bc1)

    def reset_non_finite_accumulators(self) -> list[int]:
        """Zero the grafting / diagonal accumulator of every block where it became NaN/Inf (one huge
        gradient makes g^2 overflow), and that block's first moment, which holds the same gradient
        (with a fresh second moment it would give huge, then non-finite, directions for hundreds of
        steps); returns the positions reset. Without the reset an infinite Adam second moment makes
        the block's direction 0 for ever, silently."""
        bad = torch.zeros(len(self.blocks), dtype=torch.bool)
        for t in (self.graft_state, self.diagonal):
            if t is None:
                continue
            sums = t.reshape(len(self.blocks), -1).sum(-1, dtype=torch.promote_types(t.dtype, torch.float32))
            rows = ~torch.isfinite(sums)
            if bool(rows.any()):
                rows = ~torch.isfinite(t).reshape(len(self.blocks), -1).all(-1)
                t[rows.to(t.device)] = 0.0
                bad |= rows.cpu()
        if self.first_moment is not None and bool(bad.any()):
            self.first_moment[bad.to(self.first_moment.device)] = 0.0
        return bad.nonzero().flatten().tolist()

    def has_any_root(self, position: int) -> bool:
        return any(f.has_root for f in self.blocks[position].factors)


def _steps_arg(steps: list[int], device: torch.device) -> int | torch.Tensor:
    first = steps[0]
    if all(s == first for s in steps):
        return first
    return torch.tensor(steps, device=device)


def _take(t: torch.Tensor | None, sel: torch.Tensor | None) -> torch.Tensor:
    """The selected rows of a stacked state (the storage itself when ``sel`` is None)."""
    if t is None:
        return None  # type: ignore[return-value]
    return t if sel is None else t.index_select(0, sel)


def _put(t: torch.Tensor, sel: torch.Tensor | None, value: torch.Tensor) -> None:
    """Write rows taken by :func:`_take` back (a no-op when they were the storage itself)."""
    if sel is not None:
        t.index_copy_(0, sel, value)


__all__ = ["BlockBucket", "block_norms", "matricize", "mirror_upper_", "per_block", "precondition"]
