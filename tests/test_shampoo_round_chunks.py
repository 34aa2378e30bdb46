"""The root round in chunks (``ShampooImplementation(round_chunk_bytes=...)``).

A round solves the due factors of one (n, p) in consecutive chunks of at most round_chunk_bytes per
(c, n, n) batch, so that every temporary of a solve is chunk-sized. What must hold:

* the chunks partition the due rows in order, jobs cut at row boundaries, steps and update counts
  cut with them;
* a chunk is solved exactly as the same factors alone: with one factor per chunk, every stored root
  is bitwise the root of a direct matroots call on that factor (bias-corrected, the group's eps and
  psd policy, fully validated), and it is the true root against a float64 numpy reference;
* chunking never changes the answer beyond rounding (a chunk's power-of-two pre-scaling is its own):
  parameters after several root rounds agree for one factor per chunk, a few, and one batch;
* a failure stays in its chunk: one factor that cannot be solved fails alone, not its whole batch;
* only the due rows are read and written, for consecutive and scattered positions alike.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import matroots
import shampoo
import shampoo.root_batches as batches_mod
from shampoo.config import DiagnosticsConfig, GroupOptions
from shampoo.refresh import RootJob
from shampoo.roots import compute_roots
from shampoo.state import FactorState, mirror_upper_

F64 = torch.float64


def _records(factors: torch.Tensor, roots: torch.Tensor, p: Fraction) -> list[FactorState]:
    n = factors.shape[-1]
    return [FactorState(dim=0, n=n, root_p=p, matrix=factors[i], root=roots[i]) for i in range(len(factors))]


def _job(b: int, positions: list[int], n: int = 4, updates: bool = False) -> RootJob:
    factors, roots = torch.zeros(b, n, n), torch.zeros(b, n, n)
    return RootJob(
        factors=factors,
        roots=roots,
        records=_records(factors, roots, Fraction(4)),
        p=Fraction(4),
        positions=positions,
        steps=[100 + i for i in positions],
        label=str,
        updates=[7 + i for i in positions] if updates else None,
    )


def _rows(chunk: list[RootJob]) -> int:
    return sum(len(j.positions) for j in chunk)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 100])
def test_chunks_partition_the_due_rows_in_order(rows: int) -> None:
    jobs = [_job(5, [0, 1, 2, 3, 4], updates=True), _job(3, [0, 2]), _job(4, [1, 2, 3], updates=True)]
    matrix_bytes = 4 * 4 * 4
    impl = shampoo.ShampooImplementation(round_chunk_bytes=rows * matrix_bytes + matrix_bytes // 2)
    assert impl.chunk_rows(matrix_bytes) == rows
    chunks = batches_mod.chunk_jobs(jobs, impl.chunk_rows(matrix_bytes))

    def flat(js: list[RootJob]) -> list[tuple]:
        out = []
        for j in js:
            ups = j.updates if j.updates is not None else [None] * len(j.positions)
            out += [(id(j.factors), p, s, u) for p, s, u in zip(j.positions, j.steps, ups, strict=True)]
        return out

    assert [r for c in chunks for r in flat(c)] == flat(jobs)  # every due row once, in order
    total = _rows(jobs)
    assert len(chunks) == math.ceil(total / rows)
    assert all(_rows(c) == rows for c in chunks[:-1]) and 0 < _rows(chunks[-1]) <= rows
    for c in chunks:
        for j in c:  # a slice keeps the job's storage and records (writes reach the optimizer state)
            src = next(s for s in jobs if s.factors is j.factors)
            assert j.roots is src.roots and j.records is src.records and j.p == src.p


def test_chunks_hold_at_least_one_factor() -> None:
    rows = shampoo.ShampooImplementation(round_chunk_bytes=1).chunk_rows(4 * 4 * 4)
    chunks = batches_mod.chunk_jobs([_job(3, [0, 1, 2])], rows)
    assert [_rows(c) for c in chunks] == [1, 1, 1]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    # blocks of 16: a 48 x 32 weight gives 6 blocks (12 factors of 16), a 40 x 16 weight 16/16/8 rows
    return torch.nn.Sequential(
        torch.nn.Linear(32, 48, dtype=F64), torch.nn.Tanh(), torch.nn.Linear(48, 16, dtype=F64),
        torch.nn.Tanh(), torch.nn.Linear(16, 40, dtype=F64),
    )  # fmt: skip


def _impl(chunk_bytes: int | None) -> shampoo.ShampooImplementation:
    return shampoo.ShampooImplementation(round_chunk_bytes=chunk_bytes)


def _train(chunk_bytes: int | None, steps: int = 9, **kw) -> shampoo.Shampoo:
    model = _model()
    opt = shampoo.Shampoo(
        model.parameters(), lr=0.05, betas=(0.9, 0.99), eps=1e-10, max_preconditioner_dim=16,
        precondition_frequency=3, start_preconditioning_step=1, grafting="adam",
        factor_dtype=F64, root_dtype=F64, implementation=_impl(chunk_bytes), **kw,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(64, 32, generator=g, dtype=F64), torch.randn(64, 40, generator=g, dtype=F64)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X), Y).backward()
        opt.step()
    return opt


def _factors(opt: shampoo.Shampoo) -> list[tuple[FactorState, int]]:
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state[p]
            for blk in st.blocks:
                out += [(f, st.step) for f in blk.factors]
    return out


def test_one_factor_per_chunk_is_the_direct_solve_of_that_factor() -> None:
    opt = _train(chunk_bytes=1, steps=7)  # last round at step 7: roots of the step-7 factors
    checked = 0
    for f, step in _factors(opt):
        assert f.converged and f.root_step == 7, (f.solver, f.error)
        A = mirror_upper_(f.matrix.detach().clone()) / (1.0 - 0.99**step)  # the lower triangle is scratch
        direct = matroots.solvers.EighConfig().solve(A, int(f.root_p), eps=1e-10, psd="shift", dtype=F64)
        assert torch.equal(f.root, direct.root), "a one-factor chunk must be the solve of that factor alone"
        # ... and the true root of the matrix solved (float64 numpy reference, its own shift)
        w, Q = np.linalg.eigh(A.numpy())
        ref = (Q * (w + f.regularisation) ** (-1.0 / float(f.root_p))) @ Q.T
        err = np.linalg.norm(f.root.numpy() - ref) / np.linalg.norm(ref)
        assert err < 1e3 * f.kappa * 2.0**-53, (err, f.kappa)
        checked += 1
    assert checked == 2 * 6 + 2 * 3 + 2 * 3  # every factor of every block (48x32, 16x48, 40x16)


@pytest.mark.parametrize("chunk_matrices", [1, 5])
def test_chunking_changes_nothing_but_rounding(chunk_matrices: int) -> None:
    one = _train(chunk_bytes=None)
    chunked = _train(chunk_bytes=chunk_matrices * 16 * 16 * 8)
    p1 = [p.detach() for g in one.param_groups for p in g["params"]]
    p2 = [p.detach() for g in chunked.param_groups for p in g["params"]]
    for a, b in zip(p1, p2, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-11, atol=1e-13)
    for (fa, _), (fb, _) in zip(_factors(one), _factors(chunked), strict=True):
        torch.testing.assert_close(fb.root, fa.root, rtol=1e-10, atol=1e-12)
        assert fa.converged and fb.converged


def test_a_failure_stays_in_its_chunk() -> None:
    """psd='none' with a tiny eps: the rank-deficient factors of one block cannot be solved by eigh
    (NotPositiveDefiniteError for their batch). One factor per chunk: those fail alone (the fallback
    solves them) and every other factor's primary solve succeeds; one batch: all of them fail."""
    W = torch.zeros(48, 16, dtype=F64, requires_grad=True)  # 3 blocks of 16 x 16

    def run(chunk_bytes: int | None) -> list[FactorState]:
        opt = shampoo.Shampoo(
            [W], lr=0.0, betas=(0.0, 0.99), eps=1e-30, psd="none", grafting="none",
            max_preconditioner_dim=16, precondition_frequency=1, start_preconditioning_step=1,
            factor_dtype=F64, root_dtype=F64, implementation=_impl(chunk_bytes),
        )  # fmt: skip
        g = torch.Generator().manual_seed(3)
        grad = torch.randn(48, 16, generator=g, dtype=F64)
        grad[:16] = torch.outer(
            torch.randn(16, generator=g, dtype=F64), torch.randn(16, generator=g, dtype=F64)
        )
        W.grad = grad
        with pytest.warns(shampoo.RootFailureWarning):
            opt.step()
        return [f for blk in opt.state[W].blocks for f in blk.factors]

    chunked = run(1)
    assert [f.primary_failures for f in chunked] == [1, 1, 0, 0, 0, 0]
    assert all(f.converged for f in chunked[2:]) and all(f.solver == "eigh" for f in chunked[2:])
    assert not any(f.converged for f in chunked[:2])  # the fallback (eigh, fp64, psd 'none') fails too
    whole = run(None)
    assert [f.primary_failures for f in whole] == [1] * 6


@pytest.mark.parametrize("bias_correction", [True, False])  # False: the in-place view path
@pytest.mark.parametrize("positions", [[1, 2], [0, 2, 3], [3]])
def test_only_due_rows_are_read_and_written(positions: list[int], bias_correction: bool) -> None:
    b, n = 4, 6
    g = torch.Generator().manual_seed(5)
    G = torch.randn(b, n, 3 * n, generator=g, dtype=F64)
    factors = torch.triu(G @ G.mT)  # the upper triangle is the statistic (lower: scratch)
    full = factors + torch.triu(factors, 1).mT  # the matrix it stands for
    kept = factors.clone()
    stored = torch.full((b, n, n), 7.0, dtype=F64)
    job = RootJob(
        factors=factors, roots=stored, records=_records(factors, stored, Fraction(2)),
        p=Fraction(2), positions=positions, steps=[3] * len(positions), label=str,
    )  # fmt: skip
    opt = shampoo.Shampoo(
        [torch.zeros(2, dtype=F64)], betas=(0.9, 0.9), eps=1e-8, factor_dtype=F64, root_dtype=F64,
        use_bias_correction=bias_correction,
    )  # fmt: skip
    opts = GroupOptions.from_group(opt.param_groups[0])
    report = compute_roots([job], opts, DiagnosticsConfig())
    assert report.factors == len(positions) and report.failures == 0
    assert torch.equal(torch.triu(factors), torch.triu(kept))  # the statistic itself is never altered
    if not bias_correction and positions == [1, 2]:  # the in-place view path: due rows mirrored
        assert torch.equal(factors[1:3], full[1:3]) and torch.equal(factors[0], kept[0])
    for i in range(b):
        if i not in positions:
            assert torch.equal(stored[i], torch.full((n, n), 7.0, dtype=F64)), "a row not due was written"
            continue
        A = full[i].numpy() / ((1 - 0.9**3) if bias_correction else 1.0)
        w, Q = np.linalg.eigh(A)
        f = job.records[i]
        ref = (Q * (w + f.regularisation) ** -0.5) @ Q.T
        np.testing.assert_allclose(stored[i].numpy(), ref, rtol=1e-9, atol=1e-12)
