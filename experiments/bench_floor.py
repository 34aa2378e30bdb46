"""Arithmetic floor of Shampoo's step relative to AdamW's, computed from a model's shapes.

What is counted (flops; a multiply-add is 2):

* **Model, forward + backward**: ``6 x tokens x P`` with P the *matmul* parameters (the weights of
  every ``nn.Linear`` and the packed q/k/v ``in_proj_weight`` of every ``nn.MultiheadAttention``;
  embeddings are lookups, biases, norms and the position table are elementwise and not counted), plus
  attention's two activation-activation matmuls, ``QK^T`` and ``AV``: ``12 x layers x batch x seq^2 x
  d_model`` (4 b s^2 d forward, twice that backward). ``floor_6tp`` is the same floor without the
  attention term (the issue's "6 x tokens x params").
* **Shampoo's extra work per step**, per preconditioned block with merged dims (n_1 .. n_k) and
  N = prod n_i elements: the statistics contraction for each factor, ``2 n_i N`` (``2 n^2 m`` for an
  n x m block's left factor), and the preconditioning, one mode-i product per dim, ``2 n_i N``: in all
  ``4 N sum(n_i)`` (8 n^3 for an n x n block). Blocks follow the optimizer's rule: unit dims dropped,
  trailing dims merged while their product is <= the block size, each dim cut into pieces of at most
  the block size; 1-D parameters get a diagonal (elementwise) preconditioner and count 0.
* **Roots, amortised**: per factor of size n, one ``eigh`` plus the product ``Q diag(l^-1/p) Q^T``
  (one n x n x n GEMM, 2 n^3), every ``frequency`` steps. ``eigh`` is counted in GEMM equivalents
  ``e(n) = t_eigh(n) / t_gemm(n)`` measured in the same process (:func:`measure_eigh_gemm_eq`) or
  given, so a root costs ``(e(n) + 1) 2 n^3`` flops.
* **Not counted**: elementwise work (grafting's Adam moments, momentum, weight decay, the update),
  which mirrors AdamW's own elementwise step, so it cancels to first order in the ratio.

floor ratio = 1 + (statistics + preconditioning + roots / frequency) / model: the flop ratio. It
assumes Shampoo's GEMMs run at the model's flop rate, which on a CPU they beat (the model's step also
holds softmax, norms, dropout, activations and small GEMMs), so a measured ratio can sit below it.

time floor ratio = 1 + (statistics + preconditioning flops / GEMM rate + root round seconds /
frequency) / AdamW's measured step: the same extra work at the speed this machine runs it, with the
GEMM rate of a batched ``block x block x block`` matmul and the root round as per-factor ``eigh`` +
one GEMM, all measured in the same process (:func:`measure_kernels`). The measured ratio minus the
time floor is the overhead the implementation adds above the algorithm (validation, copies, small
kernels, elementwise passes, the root solver's extra work).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn


def matmul_params(model: nn.Module) -> int:
    """Parameters that enter a matmul with the activations (see the module docstring)."""
    total = 0
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            total += mod.weight.numel()
        elif isinstance(mod, nn.MultiheadAttention) and mod.in_proj_weight is not None:
            total += mod.in_proj_weight.numel()
    return total


def model_flops(
    model: nn.Module, tokens: int, *, layers: int = 0, batch: int = 0, seq: int = 0, d_model: int = 0
) -> dict[str, int]:
    """Forward + backward flops per step: ``6 tokens P`` plus attention ``12 L b s^2 d``."""
    p = matmul_params(model)
    linear = 6 * tokens * p
    attention = 12 * layers * batch * seq * seq * d_model
    return {
        "matmul_params": p,
        "tokens": tokens,
        "linear": linear,
        "attention": attention,
        "total": linear + attention,
    }


def block_dims(shape: Iterable[int], block: int) -> list[tuple[int, ...]]:
    """The merged dims of every preconditioned block of a parameter of ``shape`` ([] for diagonal)."""
    shape = [int(s) for s in shape]
    if len(shape) <= 1:
        return []
    merged: list[int] = []
    for s in reversed(shape):
        if s == 1:
            continue
        if merged and merged[0] * s <= block:
            merged[0] *= s
        else:
            merged.insert(0, s)
    if not merged:
        return []
    pieces = [[min(block, n - i) for i in range(0, n, block)] for n in merged]
    out: list[tuple[int, ...]] = [()]
    for sizes in pieces:
        out = [(*o, s) for o in out for s in sizes]
    return out


def block_flops(dims: tuple[int, ...]) -> int:
    """Statistics + preconditioning flops of one block per step: ``4 N sum(n_i)``."""
    n = math.prod(dims)
    return 4 * n * sum(dims)


@dataclass(frozen=True)
class Floor:
    """The floor of one model at one block size and frequency (flops per step)."""

    model: int
    model_6tp: int
    gemm: int  # statistics + preconditioning
    roots: int  # one root round (every factor)
    frequency: int
    factor_sizes: dict[int, int]  # n -> number of factors
    eigh_gemm_eq: dict[int, float]
    gemm_seconds: float = math.nan  # statistics + preconditioning at the measured GEMM rate
    root_seconds: float = math.nan  # one root round at the measured eigh + GEMM times

    def time_ratio(self, base_seconds: float) -> float:
        """1 + (GEMM seconds + root round seconds / frequency) / ``base_seconds`` (AdamW's step)."""
        return 1.0 + (self.gemm_seconds + self.root_seconds / self.frequency) / base_seconds

    @property
    def extra(self) -> float:
        return self.gemm + self.roots / self.frequency

    @property
    def ratio(self) -> float:
        return 1.0 + self.extra / self.model

    @property
    def ratio_6tp(self) -> float:
        return 1.0 + self.extra / self.model_6tp

    @property
    def root_share(self) -> float:
        """The roots' share of the floor's step (model + extra)."""
        return (self.roots / self.frequency) / (self.model + self.extra)


def factor_sizes(shapes: Iterable[tuple[int, ...]], block: int) -> Counter[int]:
    c: Counter[int] = Counter()
    for shape in shapes:
        for dims in block_dims(shape, block):
            c.update(dims)
    return c


def gemm_flops(shapes: Iterable[tuple[int, ...]], block: int) -> int:
    return sum(block_flops(d) for shape in shapes for d in block_dims(shape, block))


def root_flops(sizes: dict[int, int], eigh_gemm_eq: dict[int, float]) -> int:
    """One root round: per factor of size n, ``(e(n) + 1) 2 n^3``."""
    return int(sum(k * (eigh_gemm_eq[n] + 1.0) * 2 * n**3 for n, k in sizes.items()))


def compute_floor(
    model: nn.Module,
    *,
    tokens: int,
    layers: int,
    batch: int,
    seq: int,
    d_model: int,
    block: int,
    frequency: int,
    eigh_gemm_eq: dict[int, float],
    kernel_seconds: dict[int, tuple[float, float]] | None = None,
) -> Floor:
    """The floor of ``model``; ``kernel_seconds`` (n -> (eigh, GEMM) seconds, :func:`measure_kernels`)
    adds the time floor, with the GEMM rate of the largest n."""
    shapes = [tuple(p.shape) for p in model.parameters()]
    mf = model_flops(model, tokens, layers=layers, batch=batch, seq=seq, d_model=d_model)
    sizes = dict(factor_sizes(shapes, block))
    missing = sorted(set(sizes) - set(eigh_gemm_eq))
    if missing:
        raise ValueError(f"eigh_gemm_eq lacks factor sizes {missing}")
    gemm_s = root_s = math.nan
    if kernel_seconds is not None:
        top = max(kernel_seconds)
        rate = 2 * top**3 / kernel_seconds[top][1]
        gemm_s = gemm_flops(shapes, block) / rate
        root_s = sum(k * (kernel_seconds[n][0] + kernel_seconds[n][1]) for n, k in sizes.items())
    return Floor(
        gemm_seconds=gemm_s,
        root_seconds=root_s,
        model=mf["total"],
        model_6tp=mf["linear"],
        gemm=gemm_flops(shapes, block),
        roots=root_flops(sizes, eigh_gemm_eq),
        frequency=frequency,
        factor_sizes=sizes,
        eigh_gemm_eq={n: eigh_gemm_eq[n] for n in sizes},
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_kernels(
    sizes: Iterable[int], *, device: str = "cpu", batch: int = 8, repeats: int = 5, seed: int = 0
) -> dict[int, tuple[float, float]]:
    """Per n: median seconds of one ``torch.linalg.eigh`` and of one ``n x n x n`` matmul (per matrix).

    Both on a batch of ``batch`` fp32 SPD matrices ``G G^T / n + 1e-3 I`` (the shape of Shampoo's
    factors), timed with process CPU time on CPU and with synchronised wall time on CUDA.
    """
    dev = torch.device(device)
    clock = time.process_time if dev.type == "cpu" else time.perf_counter
    g = torch.Generator().manual_seed(seed)
    out: dict[int, tuple[float, float]] = {}
    for n in sorted(set(sizes)):
        G = torch.randn(batch, n, n, generator=g).to(dev)
        A = G @ G.mT / n + 1e-3 * torch.eye(n, device=dev)
        te, tg = [], []
        torch.linalg.eigh(A)
        torch.bmm(A, A)
        for _ in range(repeats):
            _sync(dev)
            t0 = clock()
            torch.linalg.eigh(A)
            _sync(dev)
            t1 = clock()
            for _ in range(4):
                torch.bmm(A, G)
            _sync(dev)
            t2 = clock()
            te.append((t1 - t0) / batch)
            tg.append((t2 - t1) / (4 * batch))
        out[n] = (statistics.median(te), max(statistics.median(tg), 1e-12))
    return out


def measure_eigh_gemm_eq(sizes: Iterable[int], **kwargs: object) -> dict[int, float]:
    """Per n: eigh time over GEMM time (:func:`measure_kernels`)."""
    return {n: te / tg for n, (te, tg) in measure_kernels(sizes, **kwargs).items()}  # type: ignore[arg-type]


__all__ = [
    "Floor",
    "block_dims",
    "block_flops",
    "compute_floor",
    "factor_sizes",
    "gemm_flops",
    "matmul_params",
    "measure_eigh_gemm_eq",
    "measure_kernels",
    "model_flops",
    "root_flops",
]
