"""The Shampoo update against independent float64 computations (numpy eigh), blocked and not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import shampoo

EPS = 1e-3


def inv_root(A: np.ndarray, e: float) -> np.ndarray:
    w, Q = np.linalg.eigh(A)
    return (Q * w ** (-e)) @ Q.T


def textbook(grads: list[np.ndarray], exps: list[float], eps: float = EPS) -> np.ndarray:
    """G x_1 (L_1 + eps I)^{-e_1} ... with L_d = sum_t G_t,(d) G_t,(d)^T (beta2 = 1), for the last G."""
    X = grads[-1]
    for d, e in enumerate(exps):
        if e == 0:
            continue
        mats = [np.moveaxis(g, d, 0).reshape(g.shape[d], -1) for g in grads]
        L = sum(m @ m.T for m in mats) + eps * np.eye(grads[-1].shape[d])
        X = np.moveaxis(np.tensordot(inv_root(L, e), X, axes=([1], [d])), 0, d)
    return X


def run_updates(opt: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[list[torch.Tensor]]):
    """Apply the given gradients step by step; return the updates (before - after) of the last step."""
    for step_grads in grads:
        before = [p.detach().clone() for p in params]
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return [(b - p.detach()).numpy() for b, p in zip(before, params, strict=True)]


def make_opt(params, root_solver="eigh", **kw) -> shampoo.Shampoo:
    base = dict(
        lr=1.0,
        betas=(0.0, 1.0),
        eps=EPS,
        grafting="none",
        precondition_frequency=1,
        start_preconditioning_step=1,
        factor_dtype=torch.float64,
        root_dtype=torch.float64,
        root_solver=root_solver,
        merge_dims=False,
        max_preconditioner_dim=1000,
    )
    base.update(kw)
    return shampoo.Shampoo(params, **base)


def rand_grads(shape, steps=3, seed=0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(steps)]


@pytest.mark.parametrize("solver", ["eigh", "coupled_newton", "schur_newton"])
def test_textbook_update_each_solver(solver: str) -> None:
    W = torch.zeros(7, 5, dtype=torch.float64, requires_grad=True)
    grads = rand_grads((7, 5))
    (upd,) = run_updates(make_opt([W], solver), [W], [[g] for g in grads])
    ref = textbook([g.numpy() for g in grads], [0.25, 0.25])
    np.testing.assert_allclose(upd, ref, rtol=1e-8, atol=1e-10)


def test_textbook_with_ema_bias_correction_and_first_moment() -> None:
    b1, b2, T = 0.8, 0.9, 3
    W = torch.zeros(4, 6, dtype=torch.float64, requires_grad=True)
    grads = rand_grads((4, 6), T, seed=3)
    (upd,) = run_updates(make_opt([W], betas=(b1, b2), eps=1e-2), [W], [[g] for g in grads])
    G = [g.numpy() for g in grads]
    m = sum((1 - b1) * b1 ** (T - 1 - t) * G[t] for t in range(T)) / (1 - b1**T)
    L = sum((1 - b2) * b2 ** (T - 1 - t) * G[t] @ G[t].T for t in range(T)) / (1 - b2**T)
    R = sum((1 - b2) * b2 ** (T - 1 - t) * G[t].T @ G[t] for t in range(T)) / (1 - b2**T)
    ref = inv_root(L + 1e-2 * np.eye(4), 0.25) @ m @ inv_root(R + 1e-2 * np.eye(6), 0.25)
    np.testing.assert_allclose(upd, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("shape", "tiled"), [((10, 7), False), ((8, 12), True)])
def test_blocked_equals_per_block(shape: tuple[int, int], tiled: bool) -> None:
    W = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    grads = rand_grads(shape, seed=1)
    opt = make_opt([W], max_preconditioner_dim=4)
    (upd,) = run_updates(opt, [W], [[g] for g in grads])
    assert (shampoo.blocking.tile_grid(opt.state[W].layout) is not None) == tiled
    G = [g.numpy() for g in grads]
    for rows in [slice(r, min(r + 4, shape[0])) for r in range(0, shape[0], 4)]:
        for cols in [slice(c, min(c + 4, shape[1])) for c in range(0, shape[1], 4)]:
            ref = textbook([g[rows, cols] for g in G], [0.25, 0.25])
            np.testing.assert_allclose(upd[rows, cols], ref, rtol=1e-9, atol=1e-12)


def test_absent_gradients_leave_state_alone() -> None:
    """A parameter without a gradient is skipped; its bucket-mates are updated as if alone."""
    a = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    solo = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    kw = dict(grafting="adam", betas=(0.9, 0.9), precondition_frequency=2)
    opt, ref = make_opt([a, b], **kw), make_opt([solo], **kw)
    ga, gb = rand_grads((4, 3), 5, seed=8), rand_grads((4, 3), 5, seed=9)
    for t in range(5):
        a.grad, solo.grad = ga[t].clone(), ga[t].clone()
        b.grad = gb[t].clone() if t in (0, 3) else None
        opt.step()
        ref.step()
    torch.testing.assert_close(a, solo, rtol=1e-14, atol=1e-15)
    assert opt.state[a].step == 5 and opt.state[b].step == 2
    (fa, *_), (fb, *_) = opt.state[a].blocks[0].factors, opt.state[b].blocks[0].factors
    assert fa.root_step == 5 and fb.root_step == 1
    np.testing.assert_allclose(
        fb.matrix.numpy(), 0.9 * 0.1 * gb[0].numpy() @ gb[0].numpy().T + 0.1 * gb[3].numpy() @ gb[3].numpy().T
    )


def test_merged_dims() -> None:
    W = torch.zeros(2, 3, 5, dtype=torch.float64, requires_grad=True)
    opt = make_opt([W], max_preconditioner_dim=6, merge_dims=True)
    grads = rand_grads((2, 3, 5), seed=2)
    (upd,) = run_updates(opt, [W], [[g] for g in grads])
    (block,) = opt.state[W].layout.blocks
    assert block.shape == (6, 5)
    ref = textbook([g.numpy().reshape(6, 5) for g in grads], [0.25, 0.25])
    np.testing.assert_allclose(upd.reshape(6, 5), ref, rtol=1e-9, atol=1e-12)


def test_order3_without_merging() -> None:
    W = torch.zeros(3, 4, 5, dtype=torch.float64, requires_grad=True)
    grads = rand_grads((3, 4, 5), seed=4)
    (upd,) = run_updates(make_opt([W]), [W], [[g] for g in grads])
    ref = textbook([g.numpy() for g in grads], [1 / 6] * 3)
    np.testing.assert_allclose(upd, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("shape", "override", "exps", "merged"),
    [
        ((6, 5), {2: {1: 0.0}}, [0.25, 0.0], (6, 5)),
        ((6, 5), {2: {0: 0.5}}, [0.5, 0.25], (6, 5)),
        ((6, 5), {2: 0.5}, [0.5, 0.5], (6, 5)),
        # dims 0 and 1 merge (no override), dim 2 is not preconditioned and never merged
        ((2, 3, 5), {3: {2: 0.0}}, [0.25, 0.0], (6, 5)),
    ],
)
def test_exponent_override(shape, override, exps, merged) -> None:
    W = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    opt = make_opt([W], merge_dims=True, max_preconditioner_dim=8, exponent_override=override)
    grads = rand_grads(shape, seed=5)
    (upd,) = run_updates(opt, [W], [[g] for g in grads])
    assert opt.state[W].layout.merged_shape == merged
    ref = textbook([g.numpy().reshape(merged) for g in grads], exps)
    np.testing.assert_allclose(upd.reshape(merged), ref, rtol=1e-9, atol=1e-12)


def test_all_dims_overridden_to_zero_is_graft_only() -> None:
    W = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    opt = make_opt([W], exponent_override={2: 0.0}, grafting="sgd")
    grads = rand_grads((4, 3))
    (upd,) = run_updates(opt, [W], [[g] for g in grads])
    assert opt.state[W].layout.blocks[0].kind is shampoo.BlockKind.GRAFT
    np.testing.assert_allclose(upd, grads[-1].numpy(), rtol=1e-12)


def test_vector_policies() -> None:
    g = torch.Generator().manual_seed(6)
    shapes = {"full": (5,), "diag": (4,), "graft": (3,), "scalar": ()}
    params = {k: torch.zeros(s, dtype=torch.float64, requires_grad=True) for k, s in shapes.items()}
    grads = [[torch.randn(s, generator=g, dtype=torch.float64) for s in shapes.values()] for _ in range(3)]
    opt = make_opt(
        [
            {"params": [params["full"]], "vector_policy": "shampoo", "max_preconditioner_dim": 3},
            {"params": [params["diag"], params["scalar"]], "vector_policy": "diagonal", "diagonal_eps": 1e-6},
            {"params": [params["graft"]], "vector_policy": "graft"},
        ]
    )
    upd = dict(zip(shapes, run_updates(opt, list(params.values()), grads), strict=True))
    G = {k: [step[i].numpy() for step in grads] for i, k in enumerate(shapes)}
    # 1-D Shampoo: full-matrix AdaGrad per chunk of max_preconditioner_dim, exponent 1/2.
    for sl in (slice(0, 3), slice(3, 5)):
        np.testing.assert_allclose(upd["full"][sl], textbook([x[sl] for x in G["full"]], [0.5]), rtol=1e-9)
    for k in ("diag", "scalar"):
        acc = sum(x**2 for x in G[k])
        np.testing.assert_allclose(upd[k], G[k][-1] / (np.sqrt(acc) + 1e-6), rtol=1e-12)
    np.testing.assert_allclose(upd["graft"], G["graft"][-1], rtol=1e-12)
    kinds = [(d.param, d.block, d.kind) for d in opt.diagnostics()]
    assert kinds == [
        (0, 0, "shampoo"),
        (0, 1, "shampoo"),
        (1, 0, "diagonal"),
        (2, 0, "diagonal"),
        (3, 0, "graft"),
    ]


def test_layout_rules() -> None:
    lay = shampoo.layout_param(0, (64, 3, 3, 3), max_preconditioner_dim=1024)
    assert lay.merged_shape == (64, 27) and lay.blocks[0].roots == (4, 4)
    lay = shampoo.layout_param(0, (1, 300, 1), max_preconditioner_dim=256)
    assert lay.merged_shape == (300,) and [b.shape for b in lay.blocks] == [(256,), (44,)]
    lay = shampoo.layout_param(0, (768, 256), max_preconditioner_dim=256)
    assert [b.shape for b in lay.blocks] == [(256, 256)] * 3
    assert lay.blocks[0].root_cost == 2 * 256**3
    lay = shampoo.layout_param(0, (1, 1), max_preconditioner_dim=8)
    assert lay.blocks[0].kind is shampoo.BlockKind.DIAGONAL


def test_grafting_rescales_each_block_to_the_graft_norm() -> None:
    W = torch.zeros(8, 6, dtype=torch.float64, requires_grad=True)
    grads = rand_grads((8, 6), seed=7)
    opt = make_opt([W], grafting=shampoo.AdaGradGrafting(eps=1e-10), max_preconditioner_dim=4)
    (upd,) = run_updates(opt, [W], [[g] for g in grads])
    G = [g.numpy() for g in grads]
    for rows in (slice(0, 4), slice(4, 8)):
        for cols in (slice(0, 4), slice(4, 6)):
            blk = [g[rows, cols] for g in G]
            graft = blk[-1] / (np.sqrt(sum(b**2 for b in blk)) + 1e-10)
            direction = textbook(blk, [0.25, 0.25])
            ref = direction * np.linalg.norm(graft) / np.linalg.norm(direction)
            np.testing.assert_allclose(upd[rows, cols], ref, rtol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=0, max_size=4).map(tuple),
    max_dim=st.integers(1, 8),
    merge=st.booleans(),
    policy=st.sampled_from(["diagonal", "graft", "shampoo"]),
)
def test_blocks_partition_the_parameter(shape, max_dim, merge, policy) -> None:
    lay = shampoo.layout_param(
        0, shape, max_preconditioner_dim=max_dim, merge_dims_=merge, vector_policy=policy
    )
    t = torch.arange(max(1, int(np.prod(shape))), dtype=torch.float64).reshape(shape)
    merged = lay.merged_view(t)
    cover = torch.zeros_like(merged)
    for b in lay.blocks:
        cover[b.slices] += 1
        assert tuple(merged[b.slices].shape) == b.shape
        assert all(b.shape[i] <= max_dim for i in b.factor_dims)
    assert bool((cover == 1).all())
    tiling = shampoo.blocking.tile_grid(lay)
    if tiling is not None:
        grid, bshape = tiling
        tiles = shampoo.blocking.tiled_view(merged, grid, bshape).reshape(-1, *bshape)
        for j, b in enumerate(lay.blocks):
            assert torch.equal(tiles[j], merged[b.slices])
