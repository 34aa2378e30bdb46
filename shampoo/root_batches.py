"""The factor batches of a root round (:mod:`shampoo.roots`): due factors of equal (n, p) grouped and
cut into chunks (:func:`round_chunks`), read as exactly symmetric, bias-corrected inputs
(:func:`factor_inputs`), their previous roots or eigenbases as warm starts, and the new roots written
back into the root storage (:func:`write_back`).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import torch

from .config import GroupOptions
from .implementation import DEFAULT_IMPLEMENTATION, ShampooImplementation
from .refresh import RootJob
from .state import FactorState, mirror_upper_


def work_dtype(opts: GroupOptions) -> torch.dtype:
    return torch.promote_types(opts.factor_dtype, opts.root_dtype)


def round_chunks(
    jobs: list[RootJob], opts: GroupOptions, impl: ShampooImplementation = DEFAULT_IMPLEMENTATION
) -> list[list[RootJob]]:
    """The jobs of a round as batches of one (n, p) each, in chunks of at most
    ``impl.round_chunk_bytes`` (see :func:`chunk_jobs`), in order."""
    batches: dict[tuple[int, Fraction], list[RootJob]] = {}
    for job in jobs:
        batches.setdefault((job.factors.shape[-1], job.p), []).append(job)
    size = torch.empty((), dtype=work_dtype(opts)).element_size()
    return [
        chunk
        for (n, _), group in batches.items()
        for chunk in chunk_jobs(group, impl.chunk_rows(n * n * size), group[0].factors.device)
    ]


def factor_inputs(group: list[RootJob], dtype: torch.dtype, beta2: float | None) -> torch.Tensor:
    """The due factors of the jobs as one exactly symmetric batch (each factor's upper triangle, the
    statistic, mirrored onto its lower), divided by 1 - beta2^t when ``beta2`` is given.

    A single job without bias correction whose due rows are consecutive is mirrored in place and
    returned as a view of the factor storage (the solvers are pure and do not write to their input);
    otherwise each job is written, mirrored and bias-corrected, straight into the batch (one pass
    over the storage; the stored lower triangles stay scratch).
    """
    first = group[0].factors
    if len(group) == 1 and beta2 is None and first.dtype == dtype:
        view = _row_range(group[0])
        if view is not None:
            return mirror_upper_(first[view])
    total = sum(len(job.positions) for job in group)
    n = first.shape[-1]
    out = torch.empty((total, n, n), dtype=dtype, device=first.device)
    lower = torch.ones(n, n, dtype=torch.bool, device=first.device).tril_(-1)
    start = 0
    for job in group:
        F = _rows(job.factors, job)
        dst = out[start : start + len(job.positions)]
        if F.dtype == dtype:
            torch.where(lower, F.mT, F, out=dst)
        else:  # bf16 statistics solved in fp32: mirrored, then widened (exact)
            dst.copy_(torch.where(lower, F.mT, F))
        counts = job.updates if job.updates is not None else job.steps
        divs = [1.0 - beta2**t for t in counts] if beta2 is not None else [1.0]
        if all(d == divs[0] for d in divs) and divs[0] != 1.0:
            dst.div_(divs[0])
        elif not all(d == divs[0] for d in divs):
            dst.div_(torch.tensor(divs, dtype=dtype, device=dst.device).view(-1, 1, 1))
        start += len(job.positions)
    return out


def chunk_jobs(
    group: list[RootJob], rows: int | None, device: torch.device | None = None
) -> list[list[RootJob]]:
    """``group`` cut into consecutive slices of at most ``rows`` rows (None: one slice; from
    :meth:`ShampooImplementation.chunk_rows`), jobs cut at row boundaries, the order of the rows
    kept. Every temporary of a solve (the bias-corrected copy, the psd Cholesky tests, eigh's
    eigenvectors, the root) is then chunk-sized: glibc serves it from the heap, where the previous
    chunk's blocks are still mapped, instead of a fresh mmap of the whole batch (docs/design.md §6).
    Only on the CPU, whose allocator the limit is about: on a GPU one batched solve per (n, p) is
    kept (each call costs host syncs)."""
    if rows is None or (device is not None and device.type != "cpu"):
        return [group]
    out: list[list[RootJob]] = []
    cur: list[RootJob] = []
    room = rows
    for job in group:
        k = 0
        while k < len(job.positions):
            take = min(room, len(job.positions) - k)
            cur.append(_slice(job, k, k + take) if take < len(job.positions) else job)
            k, room = k + take, room - take
            if room == 0:
                out.append(cur)
                cur, room = [], rows
    if cur:
        out.append(cur)
    return out


def _slice(job: RootJob, a: int, b: int) -> RootJob:
    """The due rows a..b-1 of ``job`` (same storage and records)."""
    return replace(
        job,
        positions=job.positions[a:b],
        steps=job.steps[a:b],
        updates=None if job.updates is None else job.updates[a:b],
    )


def _row_range(job: RootJob) -> slice | None:
    """The due rows of ``job`` as a slice when they are consecutive, else None."""
    pos = job.positions
    if pos and pos == list(range(pos[0], pos[0] + len(pos))):
        return slice(pos[0], pos[0] + len(pos))
    return None


def _rows(store: torch.Tensor, job: RootJob) -> torch.Tensor:
    """The due rows of a (b, n, n) storage: a view when consecutive, else a gathered copy."""
    view = _row_range(job)
    if view is not None:
        return store[view]
    return store.index_select(0, torch.tensor(job.positions, device=store.device))


def previous_bases(states: list[FactorState], like: torch.Tensor) -> torch.Tensor:
    """The kept eigenbases of the due factors, stacked (identity where a factor has none)."""
    eye = torch.eye(like.shape[-1], dtype=like.dtype, device=like.device)
    return torch.stack([f.basis if f.basis is not None else eye for f in states])


def previous_roots(group: list[RootJob]) -> torch.Tensor:
    """The current roots of the due factors (warm starts): views of the root storage where the due
    rows are consecutive, so a solver must not write to its warm start or return it (matroots'
    solvers are pure: they copy it)."""
    prevs = [_rows(job.roots, job) for job in group]
    return torch.cat(prevs) if len(prevs) > 1 else prevs[0]


def write_back(group: list[RootJob], final: torch.Tensor, good: list[bool]) -> None:
    """Write the new roots of the ``good`` factors into their root storage."""
    start = 0
    for job in group:
        k = len(job.positions)
        store = job.roots
        rows = [r for r in range(k) if good[start + r]]
        view = _row_range(job) if len(rows) == k else None
        if view is not None:
            store[view].copy_(final[start : start + k])
        elif rows:
            sel = torch.tensor([job.positions[r] for r in rows], device=store.device)
            src = final[start : start + k][torch.tensor(rows)].to(store.dtype)
            store.index_copy_(0, sel, src)
        start += k


__all__ = [
    "chunk_jobs",
    "factor_inputs",
    "previous_bases",
    "previous_roots",
    "round_chunks",
    "work_dtype",
    "write_back",
]
