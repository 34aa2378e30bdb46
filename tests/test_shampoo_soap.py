"""Eigenvalue-corrected Shampoo / SOAP (``shampoo.SOAP``, shampoo/transforms/soap.py).

References are independent of the code under test: torch.optim.Adam / AdamW / Adagrad (bases fixed to
the identity), elementwise Adam written out here (a diagonal problem, whose factors are diagonal and
whose eigenbases are therefore signed permutations), single-process SOAP for the distributed run, the
uninterrupted run for resume. Tolerances: fp64, rtol 1e-12 / atol 1e-14 against torch.optim and the
hand-written Adam (the order of the floating-point operations differs: (sqrt(V) + eps sqrt(c2)) /
sqrt(c2) instead of sqrt(V) / sqrt(c2) + eps, so not bitwise); resume is bitwise (torch.equal); the
2-rank run is compared at 1e-6 as the other distributed tests (the same kernels on the same data).
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from _dist import run_ranks
from torch import nn

import shampoo
from matroots.core.errors import InvalidArgumentError
from shampoo.distributed import state_bytes

BASES = ("eigh_warm", "eigh", "qr")


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread (as the distributed ranks): small GEMMs on a loaded 2-core machine are
    slower with two spinning threads, and the single-process references must match the ranks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 9), nn.Tanh(), nn.Linear(9, 4)).to(dtype)


def _data(seed: int = 1, steps: int = 12, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, 32, 7, generator=g, dtype=dtype), torch.randn(
        steps, 32, 4, generator=g, dtype=dtype
    )


def _soap(model: nn.Module, pre: shampoo.SOAP, **kw) -> shampoo.Shampoo:
    kw = {"lr": 1e-2, "grafting": "none", "start_preconditioning_step": 1, "precondition_frequency": 3, **kw}
    return shampoo.Shampoo([{"params": list(model.named_parameters()), "preconditioner": pre}], **kw)


def _train(
    model: nn.Module, opt: torch.optim.Optimizer, X: torch.Tensor, Y: torch.Tensor, steps: range
) -> None:
    for t in steps:
        opt.zero_grad()
        nn.functional.mse_loss(model(X[t]), Y[t]).backward()
        opt.step()


# -- identity bases: torch.optim ------------------------------------------------------------------


@pytest.mark.parametrize(
    "torch_opt, kw",
    [
        ("Adam", {"weight_decay": 0.0}),
        ("Adam", {"weight_decay": 0.1}),  # L2: decoupled_weight_decay=False
        ("AdamW", {"weight_decay": 0.1}),
    ],
)
def test_identity_bases_equal_torch_adam(torch_opt: str, kw: dict) -> None:
    lr, betas, eps = 3e-2, (0.9, 0.999), 1e-8
    ref, mine = _mlp(), _mlp()
    conv = nn.Conv1d(3, 5, 2).double()  # a 3-D weight: the general-order rotation path (with identity)
    ref.add_module("c", conv)
    mine.add_module("c", nn.Conv1d(3, 5, 2).double())
    mine.c.load_state_dict(conv.state_dict())
    topt = getattr(torch.optim, torch_opt)(ref.parameters(), lr=lr, betas=betas, eps=eps, **kw)
    opt = _soap(
        mine, shampoo.SOAP(basis_update="identity", eps=eps), lr=lr, betas=betas, diagonal_eps=eps,
        weight_decay=kw["weight_decay"], decoupled_weight_decay=torch_opt == "AdamW",
    )  # fmt: skip
    X, Y = _data()
    Z = torch.randn(12, 4, 3, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for t in range(12):
        for model, o in ((ref, topt), (mine, opt)):
            o.zero_grad()
            (nn.functional.mse_loss(model[:3](X[t]), Y[t]) + model.c(Z[t]).square().mean()).backward()
            o.step()
    for (name, a), b in zip(ref.named_parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14, msg=name)


def test_identity_bases_with_beta2_one_equal_torch_adagrad() -> None:
    lr, eps = 5e-2, 1e-10
    ref, mine = _mlp(), _mlp()
    topt = torch.optim.Adagrad(ref.parameters(), lr=lr, eps=eps)
    opt = _soap(
        mine, shampoo.SOAP(basis_update="identity", eps=eps), lr=lr, betas=(0.0, 1.0), diagonal_eps=eps
    )
    X, Y = _data()
    _train(ref, topt, X, Y, range(12))
    _train(mine, opt, X, Y, range(12))
    for a, b in zip(ref.parameters(), mine.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


# -- a diagonal problem: the textbook update -------------------------------------------------------


def _diagonal_grads(steps: int, m: int, n: int) -> list[torch.Tensor]:
    """Diagonal m x n gradients whose magnitudes change order over time (the bases' columns reorder)."""
    g = torch.Generator().manual_seed(5)
    out = []
    for t in range(steps):
        d = (torch.rand(min(m, n), generator=g, dtype=torch.float64) + 0.1) * torch.where(
            torch.rand(min(m, n), generator=g) < 0.5, -1.0, 1.0
        ).double()
        d = d * (1.0 + 3.0 * (torch.arange(min(m, n)) == (t % min(m, n))).double())  # a changing leader
        G = torch.zeros(m, n, dtype=torch.float64)
        G[range(min(m, n)), range(min(m, n))] = d
        out.append(G)
    return out


@pytest.mark.parametrize("basis", BASES)
@pytest.mark.parametrize("shape", [(6, 6), (4, 6)])
def test_diagonal_problem_is_elementwise_adam(basis: str, shape: tuple[int, int]) -> None:
    """Diagonal G gives diagonal factors, whose eigenbases are signed permutations: the rotated
    gradient is G's entries permuted, so with the second moments following their directions through
    every re-sort (SOAP's rule) the update is Adam on each entry, off-diagonal entries never move."""
    lr, (b1, b2), eps, steps = 1e-2, (0.9, 0.95), 1e-8, 14
    W = nn.Parameter(torch.zeros(shape, dtype=torch.float64))
    opt = shampoo.Shampoo(
        [{"params": [W], "preconditioner": shampoo.SOAP(basis_update=basis, eps=eps)}], lr=lr, betas=(b1, b2),
        grafting="none", start_preconditioning_step=1, precondition_frequency=2, merge_dims=False,
        root_dtype=torch.float64, factor_dtype=torch.float64,
    )  # fmt: skip
    m = torch.zeros(shape, dtype=torch.float64)
    v = torch.zeros(shape, dtype=torch.float64)
    w = torch.zeros(shape, dtype=torch.float64)
    grads = _diagonal_grads(steps, *shape)
    # eigh / eigh_warm bases are exact signed permutations here. Householder QR leaves off-entries of
    # ~u in Q (and completes the null space of a rank-deficient L Q with some orthonormal basis), so an entry of G' that is 0 in exact arithmetic is ~u |G|, with V ~ (u |G|)^2: its
    # direction is ~u |G| / eps, and each step can move W by lr u |G| / eps (x10 for safety).
    u = torch.finfo(torch.float64).eps / 2
    big = max(float(G.abs().max()) for G in grads)
    atol = 1e-14 if basis != "qr" else 10 * steps * lr * u * big / eps
    for t, G in enumerate(grads, start=1):
        W.grad = G.clone()
        opt.step()
        m = b1 * m + (1 - b1) * G
        v = b2 * v + (1 - b2) * G * G
        w = w - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        torch.testing.assert_close(W.detach(), w, rtol=1e-12, atol=atol, msg=f"step {t}")
    blk = opt.state[W].blocks[0]
    for f in blk.factors:
        assert f.has_root and f.solver == f"soap:{basis}"
        P = blk.tensors[f"factors.{f.dim}.eigenbasis"].abs()
        if basis != "qr":  # exact for eigh / eigh_warm on diagonal input: a signed permutation
            assert torch.equal(P.sum(0), torch.ones(f.n, dtype=P.dtype)) and bool(((P == 0) | (P == 1)).all())
        else:
            torch.testing.assert_close(P.max(0).values, torch.ones(f.n, dtype=P.dtype), rtol=0, atol=1e-12)


# -- diagnostics, checkpoint names, errors ---------------------------------------------------------


@pytest.mark.parametrize("basis", BASES)
def test_diagnostics_rows_report_the_basis_update(basis: str) -> None:
    model = _mlp(dtype=torch.float32)
    opt = _soap(model, shampoo.SOAP(basis_update=basis), merge_dims=False)
    X, Y = _data(dtype=torch.float32)
    _train(model, opt, X, Y, range(8))
    rows = [r for d in opt.diagnostics() for r in d.rows() if r.get("solver")]
    assert len(rows) == 4  # two matrices, two factors each
    for r in rows:
        assert r["solver"] == f"soap:{basis}" and r["has_root"] and r["root_step"] == 7 and r["converged"]
        assert 0.0 <= r["residual"] < (1e-5 if basis != "qr" else 1.0)  # ||offdiag(Q^T L Q)|| / ||L||
        if basis == "eigh_warm":
            verdicts = (
                "accepted",
                "refined",
                "skipped (backoff)",
            )  # backoff: FactorState.update_warm_backoff
            assert r["warm"] in verdicts or r["warm"].startswith(("fallback", "cold")), r["warm"]
    if basis == "qr":
        assert all(r["iterations"] == 1 for r in rows)


def test_checkpoint_holds_the_soap_tensors_under_documented_names() -> None:
    model = _mlp(dtype=torch.float32)
    opt = _soap(model, shampoo.SOAP(), merge_dims=False)
    X, Y = _data(dtype=torch.float32)
    _train(model, opt, X, Y, range(7))  # refresh due at step 7: still pending in the checkpoint
    entry = opt.state_dict()["state"]["0.weight"]
    for name in ("second_moment", "basis_pending", "factors.0.eigenbasis", "factors.1.eigenbasis",
                 "factors.0.matrix", "factors.1.matrix", "first_moment"):  # fmt: skip
        assert f"blocks.0.{name}" in entry, name
    assert "blocks.0.factors.0.root" not in entry and "blocks.0.factors.0.basis" not in entry
    assert entry["blocks.0.second_moment"].shape == (9, 7)
    assert int(entry["blocks.0.basis_pending"]) == 7
    Q = entry["blocks.0.factors.1.eigenbasis"]
    torch.testing.assert_close(Q.T @ Q, torch.eye(7), atol=1e-5, rtol=0)
    assert entry["blocks.0.factors.0.solver"] == "soap:eigh_warm"
    assert state_bytes(opt)["blocks"] > 0
    # a SOAP checkpoint does not load into Kronecker Shampoo, nor an incomplete one into SOAP
    kron = shampoo.Shampoo(model.named_parameters(), lr=1e-2, merge_dims=False, grafting="none")
    with pytest.raises(shampoo.StateDictError, match="factor 0 missing"):
        kron.load_state_dict(opt.state_dict())
    sd = opt.state_dict()
    del sd["state"]["0.weight"]["blocks.0.second_moment"]
    with pytest.raises(shampoo.StateDictError, match="second_moment missing"):
        _soap(model, shampoo.SOAP(), merge_dims=False).load_state_dict(sd)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"beta2": 0.0}, "SOAP.beta2"),
        ({"beta2": 1.5}, "SOAP.beta2"),
        ({"beta2": True}, "SOAP.beta2"),
        ({"eps": -1e-8}, "SOAP.eps"),
        ({"eps": math.nan}, "SOAP.eps"),
        ({"basis_update": "lanczos"}, "SOAP.basis_update"),
        ({"basis_update": "QR"}, "SOAP.basis_update"),
    ],
)
def test_bad_config_values_raise_typed_errors_naming_the_field(kw: dict, field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field.replace(".", r"\.")):
        shampoo.SOAP(**kw)


def test_preconditioner_by_name_and_a_misspelt_name() -> None:
    model = _mlp(dtype=torch.float32)
    opt = shampoo.Shampoo([{"params": model.parameters(), "preconditioner": "soap"}])
    assert opt.param_groups[0]["preconditioner"] == shampoo.SOAP()
    with pytest.raises(InvalidArgumentError, match=r"preconditioner must be .*'soapp'"):
        shampoo.Shampoo([{"params": model.parameters(), "preconditioner": "soapp"}])


def test_preconditioner_as_a_constructor_argument_is_the_group_default() -> None:
    """``Shampoo(params, preconditioner="soap")`` is the param-group key set for every group: the same
    config, and the same steps (bitwise: the same code runs on the same numbers)."""
    torch.manual_seed(0)
    x, y = torch.randn(32, 7, dtype=torch.float64), torch.randn(32, 4, dtype=torch.float64)
    kw = {"lr": 1e-2, "precondition_frequency": 2, "start_preconditioning_step": 1}
    models = [_mlp(), _mlp()]
    by_arg = shampoo.Shampoo(models[0].parameters(), preconditioner="soap", **kw)
    by_group = shampoo.Shampoo([{"params": models[1].parameters(), "preconditioner": "soap"}], **kw)
    assert by_arg.param_groups[0]["preconditioner"] == shampoo.SOAP()
    assert by_arg.defaults["preconditioner"] == "soap"
    for _ in range(4):
        for model, opt in zip(models, (by_arg, by_group), strict=True):
            opt.zero_grad()
            (model(x) - y).square().mean().backward()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)
    opt = shampoo.Shampoo(models[0].parameters(), preconditioner=shampoo.SOAP(basis_update="qr"))
    assert opt.param_groups[0]["preconditioner"] == shampoo.SOAP(basis_update="qr")
    with pytest.raises(InvalidArgumentError, match=r"preconditioner must be .*'soapp'"):
        shampoo.Shampoo(models[0].parameters(), preconditioner="soapp")


# -- resume ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("basis", [*BASES, "identity"])
def test_resume_from_state_dict_mid_run_is_bitwise(basis: str) -> None:
    X, Y = _data(dtype=torch.float32)
    kw = {"max_preconditioner_dim": 5, "momentum": 0.5, "grafting": "adam"}  # several blocks per matrix
    a = _mlp(dtype=torch.float32)
    oa = _soap(a, shampoo.SOAP(basis_update=basis), **kw)
    _train(a, oa, X, Y, range(7))  # a refresh is pending at step 7
    buf = io.BytesIO()
    torch.save({"model": a.state_dict(), "opt": oa.state_dict()}, buf)
    _train(a, oa, X, Y, range(7, 12))
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    b = _mlp(seed=9, dtype=torch.float32)
    b.load_state_dict(saved["model"])
    ob = _soap(b, shampoo.SOAP(basis_update=basis), **kw)
    ob.load_state_dict(saved["opt"])
    _train(b, ob, X, Y, range(7, 12))
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
    sa, sb = oa.state_dict()["state"], ob.state_dict()["state"]
    for key in sa:
        for name, v in sa[key].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, sb[key][name]), (key, name)


# -- distributed: 2 ranks equal one process ----------------------------------------------------------


def _dist_opt(model: nn.Module, distributed=None) -> shampoo.Shampoo:
    return _soap(model, shampoo.SOAP(), lr=3e-2, max_preconditioner_dim=5, momentum=0.5, grafting="adam",
                 precondition_frequency=2, distributed=distributed)  # fmt: skip


def _single(steps: int) -> tuple[dict[str, torch.Tensor], dict]:
    model = _mlp(dtype=torch.float32)
    opt = _dist_opt(model)
    X, Y = _data(dtype=torch.float32)
    _train(model, opt, X, Y, range(steps))
    return {k: v.detach().clone() for k, v in model.named_parameters()}, opt.state_dict()


def _ranks(rank: int, ws: int) -> dict:
    model = _mlp(dtype=torch.float32)
    opt = _dist_opt(model, shampoo.DDPConfig(timeout=60))
    X, Y = _data(dtype=torch.float32)
    _train(model, opt, X, Y, range(5))
    sd = opt.state_dict()  # collective: the merged, single-process form
    _train(model, opt, X, Y, range(5, 8))
    after = {k: v.detach().clone() for k, v in model.named_parameters()}
    return {"sd": sd, "after": after, "owned": sum(b.owned for st in opt.state.values() for b in st.blocks)}


def _resume_ranks(rank: int, ws: int, model_state: dict, opt_state: dict) -> dict:
    model = _mlp(seed=4, dtype=torch.float32)
    model.load_state_dict(model_state)
    opt = _dist_opt(model, shampoo.DDPConfig(timeout=60))
    opt.load_state_dict(opt_state)
    X, Y = _data(dtype=torch.float32)
    _train(model, opt, X, Y, range(5, 8))
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_two_ranks_equal_a_single_process_and_resume_from_the_merged_state() -> None:
    _, ref_sd = _single(5)
    ref8, _ = _single(8)
    model = _mlp(dtype=torch.float32)
    opt = _dist_opt(model)
    X, Y = _data(dtype=torch.float32)
    _train(model, opt, X, Y, range(5))
    model_state = {k: v.clone() for k, v in model.state_dict().items()}
    per_rank = run_ranks(_ranks, 2)
    assert all(0 < r["owned"] < 8 for r in per_rank)  # the blocks are really split
    for r in per_rank:
        for k, v in ref8.items():
            torch.testing.assert_close(r["after"][k], v, rtol=1e-6, atol=1e-6, msg=k)
        for key, entry in ref_sd["state"].items():
            assert r["sd"]["state"][key].keys() == entry.keys(), key
            for name, v in entry.items():
                if isinstance(v, torch.Tensor):
                    torch.testing.assert_close(r["sd"]["state"][key][name], v, rtol=1e-6, atol=1e-6, msg=name)
    resumed = run_ranks(_resume_ranks, 2, model_state, ref_sd)
    for r in resumed:
        for k, v in ref8.items():
            torch.testing.assert_close(r[k], v, rtol=1e-6, atol=1e-6, msg=k)


# -- a real training run ---------------------------------------------------------------------------


def test_digits_mlp_trains_and_is_comparable_to_shampoo() -> None:
    from matroots.study.validation.tasks import get_task

    task = get_task("digits")
    finals = {}
    for name in ("soap", "shampoo"):
        model = task.build_model(0)
        if name == "soap":
            opt = _soap(model, shampoo.SOAP(), lr=1e-2, betas=(0.95, 0.95), precondition_frequency=10,
                        max_preconditioner_dim=256)  # fmt: skip
        else:
            opt = shampoo.Shampoo(model.named_parameters(), lr=1e-2, precondition_frequency=10,
                                  max_preconditioner_dim=256)  # fmt: skip
        start = task.evaluate(model)["val_loss"]
        for _, batch in zip(range(150), task.batches(0), strict=False):
            opt.zero_grad()
            task.loss(model, batch).backward()
            opt.step()
        finals[name] = task.evaluate(model)["val_loss"]
        assert finals[name] < 0.5 * start, (name, start, finals[name])
    assert finals["soap"] < 1.5 * finals["shampoo"], finals


def test_non_finite_statistics_are_reset_and_the_basis_kept() -> None:
    """One huge gradient overflows G G^T in fp32 (and V): the statistics are reset with a warning at
    the next refresh (the previous basis kept: still orthonormal), and training goes on finite."""
    W = nn.Parameter(torch.zeros(4, 3))
    opt = shampoo.Shampoo(
        [{"params": [W], "preconditioner": shampoo.SOAP(basis_update="eigh")}], lr=1e-2, grafting="none",
        start_preconditioning_step=1, precondition_frequency=2, merge_dims=False,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        W.grad = torch.randn(4, 3, generator=g)
        opt.step()
    blk = opt.state[W].blocks[0]
    W.grad = torch.full((4, 3), 1e30)  # finite, but its square overflows fp32
    with pytest.warns(shampoo.FactorResetWarning):
        for _ in range(3):
            opt.step()
            W.grad = torch.randn(4, 3, generator=g)
    f = blk.factors[0]
    assert f.factor_resets == 1 and "reset" in f.error
    Q = blk.tensors["factors.0.eigenbasis"]
    torch.testing.assert_close(Q.T @ Q, torch.eye(4), atol=1e-5, rtol=0)
    assert bool(torch.isfinite(W).all())
    assert bool(torch.isfinite(blk.tensors["second_moment"]).all())


def test_basis_eigh_solves_unreported_nan_rows_again_in_fp64(monkeypatch: pytest.MonkeyPatch) -> None:
    """MKL's threaded ssyevd can return NaN eigenvectors without an error (matroots.solvers.eigh):
    SOAP's eigh basis update solves those rows again in fp64; the others keep their fp32 solve."""
    from shampoo.transforms import soap as soap_mod

    g = torch.Generator().manual_seed(0)
    G = torch.randn(3, 12, 30, generator=g)
    A = G @ G.mT
    real = torch.linalg.eigh

    def nan_row(M: torch.Tensor, *a: object, **k: object) -> torch.return_types.linalg_eigh:
        out = real(M, *a, **k)
        if M.dtype == torch.float32 and M.shape[0] == 3:
            Q = out.eigenvectors.clone()
            Q[1, 0, 0] = float("nan")
            return torch.return_types.linalg_eigh((out.eigenvalues, Q))
        return out

    plain = real(A).eigenvectors
    monkeypatch.setattr(torch.linalg, "eigh", nan_row)
    Q, ok, err = soap_mod._eigh(A, torch.float32)
    assert ok.tolist() == [True, True, True] and err == ""
    assert torch.equal(Q[0], plain[0]) and torch.equal(Q[2], plain[2])
    ref = real(A[1].double()).eigenvectors.float()
    assert torch.equal(Q[1], ref)  # the fp64 solve, rounded
