"""eigh_warm: warm-started eigensolver. Accuracy against independent references on slowly perturbed
SPD sequences and on real Shampoo factor sequences, honest flags, fallbacks, a cold call that is eigh.

References: ``matroots.truth.reference`` (flint/mpmath, high precision) for the synthetic SPD sequences;
for the rank-deficient Shampoo factors, whose root is defined by eigh's clamp policy, a float64
eigendecomposition of the same fp32 matrix with the same threshold (the clamped function is not a
plain power, which the high-precision reference does not evaluate).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from _refs import U, fwd_bound, haar_orthogonal, rel_err

import matroots
from matroots.core.errors import ConvergenceWarning, InvalidArgumentError, MatrootsError
from matroots.truth import reference
from shampoo.state import mirror_upper_

DT = {"fp64": torch.float64, "fp32": torch.float32}


@pytest.fixture(autouse=True)
def one_thread():
    """Small matrices: intra-op threads only add synchronisation (and stall on a loaded machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def check_warm_round(res, ref: torch.Tensor, cond: torch.Tensor, u: float, n: int, t: int, counts) -> None:
    """One warm round: every root within 10 (1 + cond) u sqrt(n) of the float64 reference ``ref``, all
    flagged converged; tallies the warm verdicts ("accepted", "refined", "fallback", ...) into ``counts``."""
    for i in range(ref.shape[0]):
        bound = 10.0 * (1.0 + float(cond[i])) * u * math.sqrt(n)
        assert rel_err(res.root[i], ref[i].numpy()) <= bound, (n, t, i, res.info["warm"][i])
    assert bool(res.converged.all())
    for s in res.info["warm"]:
        counts[s.split(":")[0]] += 1


def _rotation(n: int, angle: float, rng: np.random.Generator) -> np.ndarray:
    """exp(angle K) for a random antisymmetric K with ||K||_2 ~ 1 (by scipy-free eigh of iK)."""
    Z = rng.standard_normal((n, n))
    K = (Z - Z.T) / (2 * math.sqrt(n))
    w, V = np.linalg.eigh(1j * K)  # iK is Hermitian
    return np.real((V * np.exp(-1j * angle * w)) @ V.conj().T)


def spd_sequence(n, kappa, steps, batch, angle, seed):
    """(steps, batch, n, n) float64: A_t = Q_t diag(lam_t) Q_t^T with Q_{t+1} = Q_t exp(angle K_t) and a
    geometric spectrum drifting by ~1% per step (exactly symmetric)."""
    rng = np.random.default_rng(seed)
    Qs = [haar_orthogonal(n, rng) for _ in range(batch)]
    lam0 = np.logspace(-math.log10(kappa), 0.0, n)
    out = np.empty((steps, batch, n, n))
    for t in range(steps):
        for i in range(batch):
            lam = lam0 * (1.0 + 0.01 * np.sin(0.3 * t + np.arange(n) + i))
            A = (Qs[i] * lam) @ Qs[i].T
            out[t, i] = 0.5 * (A + A.T)
            Qs[i] = Qs[i] @ _rotation(n, angle, rng)
    return out


def _ref_roots(A: np.ndarray, p) -> np.ndarray:
    return np.stack([reference.inverse_root(a, p).root for a in A])


@pytest.mark.parametrize("dname", ["fp64", "fp32"])
@pytest.mark.parametrize("p", [2, 4])
def test_slowly_perturbed_spd_sequence_is_within_the_cold_bound(dname, p):
    dt = DT[dname]
    kappa = 1e4 if dname == "fp64" else 1e3
    n, batch, steps = 24, 3, 10
    seq = spd_sequence(n, kappa, steps, batch, angle=1e-3, seed=p)
    prev, paths = None, []
    for t in range(steps):
        A = torch.from_numpy(seq[t]).to(dt)
        res = matroots.inverse_root(A, p, method="eigh_warm", warm_start=prev)
        ref = _ref_roots(A.double().numpy(), p)  # the matrix actually solved (rounded to dt)
        for i in range(batch):
            assert rel_err(res.root[i], ref[i]) <= fwd_bound(kappa, p, n, U[dname]), (t, i, res.info["warm"])
        assert bool(res.converged.all())
        paths += res.info["warm"]
        Q = res.info["eigenvectors"].double()
        I = torch.eye(n, dtype=torch.float64)
        assert float(torch.linalg.matrix_norm(Q.mT @ Q - I).max()) <= 1e3 * n * U[dname]
        prev = res
    assert paths[:batch] == ["cold"] * batch
    warm = [s for s in paths[batch:] if s in ("accepted", "refined")]
    assert len(warm) >= 0.9 * len(paths[batch:]), paths


def test_warm_result_reports_estimate_iterations_and_cost():
    seq = spd_sequence(20, 1e3, 2, 2, angle=1e-3, seed=3)
    r0 = matroots.inverse_root(torch.from_numpy(seq[0]), 4, method="eigh_warm")
    r1 = matroots.inverse_root(torch.from_numpy(seq[1]), 4, method="eigh_warm", warm_start=r0)
    assert r0.info["warm_counts"]["cold"] == 2 and r0.info["eigh_calls"] == 1
    assert torch.isnan(r0.residual).all()
    assert set(r1.info["warm"]) <= {"accepted", "refined"}
    est, tol = r1.residual, r1.info["warm_tol"]
    assert bool(((est >= 0) & (est <= tol)).all())
    refined = [i for i, s in enumerate(r1.info["warm"]) if s == "refined"]
    assert all(int(r1.iterations[i]) >= 1 for i in refined)
    assert r1.info["eigh_calls"] == 0 and 3.0 <= r1.matmuls < 20.0
    # eigenvalues ascending and the root is Q f(Lambda) Q^T of the returned pair
    w, Q = r1.info["eigenvalues"], r1.info["eigenvectors"]
    assert bool((w[:, 1:] >= w[:, :-1]).all())
    X = (Q * w.pow(-0.25).unsqueeze(-2)) @ Q.mT
    assert (
        float(torch.linalg.matrix_norm(X - r1.root).max() / torch.linalg.matrix_norm(r1.root).max()) < 1e-12
    )


def test_large_perturbation_falls_back_to_eigh_and_says_why():
    rng = np.random.default_rng(5)
    n = 20
    Qa = haar_orthogonal(n, rng)
    A0 = (Qa * np.logspace(-3, 0, n)) @ Qa.T
    A0 = 0.5 * (A0 + A0.T)
    Qb = haar_orthogonal(n, rng)
    A1 = (Qb * np.logspace(-3, 0, n)) @ Qb.T
    A1 = 0.5 * (A1 + A1.T)
    r0 = matroots.inverse_root(torch.from_numpy(A0), 2, method="eigh_warm")
    r1 = matroots.inverse_root(torch.from_numpy(A1), 2, method="eigh_warm", warm_start=r0)
    assert r1.info["warm"].startswith("fallback: ")
    assert r1.info["eigh_calls"] == 1 and r1.converged is True and math.isnan(r1.residual)
    assert rel_err(r1.root, reference.inverse_root(A1, 2).root) <= fwd_bound(1e3, 2, n, U["fp64"])


def test_fallback_false_returns_an_honestly_flagged_root():
    seq = spd_sequence(16, 1e3, 2, 1, angle=0.05, seed=7)[:, 0]  # not refinable to 1e-13 in 1 step
    r0 = matroots.inverse_root(torch.from_numpy(seq[0]), 2, method="eigh_warm")
    cfg = matroots.solvers.EighWarmConfig(fallback=False)
    with pytest.warns(ConvergenceWarning):
        r1 = matroots.inverse_root(torch.from_numpy(seq[1]), 2, method=cfg, warm_start=r0, max_iter=1)
    assert r1.converged is False and r1.info["warm"].startswith("not converged: ")
    assert r1.info["eigh_calls"] == 0
    assert r1.residual > r1.info["warm_tol"]  # the estimate says why it is not converged
    with pytest.raises(matroots.ConvergenceError):
        matroots.inverse_root(torch.from_numpy(seq[1]), 2, method=cfg, warm_start=r0, max_iter=1, strict=True)


# ------------------------------------------------------------------------------ real Shampoo factors
def shampoo_factor_sequence(steps=260, every=5, start=100, beta2=0.999, seed=0):
    """Kronecker factors of a digits MLP (64 -> 32 -> 10) accumulated in fp32 with torch.baddbmm and read
    with the upper triangle mirrored, as Shampoo does (EMA with bias correction). Returns
    {n: (rounds, blocks, n, n) float32}."""
    from sklearn.datasets import load_digits

    torch.manual_seed(seed)
    X, y = load_digits(return_X_y=True)
    X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    weights = [model[0].weight, model[2].weight]
    L = [torch.zeros(1, w.shape[0], w.shape[0]) for w in weights]
    R = [torch.zeros(1, w.shape[1], w.shape[1]) for w in weights]
    g = torch.Generator().manual_seed(seed)
    rounds: dict[int, list[torch.Tensor]] = {}
    for t in range(1, steps + 1):
        idx = torch.randint(0, len(X), (32,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        for w, Lw, Rw in zip(weights, L, R, strict=True):
            G = w.grad.unsqueeze(0)
            Lw.baddbmm_(G, G.mT, beta=beta2, alpha=1 - beta2)
            Rw.baddbmm_(G.mT, G, beta=beta2, alpha=1 - beta2)
        opt.step()
        if t >= start and t % every == 0:
            by_n: dict[int, list[torch.Tensor]] = {}
            for F in [*L, *R]:
                # read as Shampoo reads it: the upper triangle mirrored (the GEMM's lower one is scratch)
                by_n.setdefault(F.shape[-1], []).append(mirror_upper_(F.clone())[0] / (1 - beta2**t))
            for n, fs in by_n.items():
                rounds.setdefault(n, []).append(torch.stack(fs))
    return {n: torch.stack(v) for n, v in rounds.items() if n >= 32}


def _clamped_reference(A32: torch.Tensor, p: int, u: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 root of eigh's clamp policy (floor n u lambda_max) and the root's condition number."""
    n = A32.shape[-1]
    w, V = torch.linalg.eigh(A32.double())
    z = torch.maximum(w, n * u * w[..., -1:])
    f = z.pow(-1.0 / p)
    cond = (
        (1.0 / p)
        * z[..., 0].pow(-1.0 / p - 1)
        * torch.linalg.vector_norm(z, dim=-1)
        / torch.linalg.vector_norm(f, dim=-1)
    )
    return (V * f.unsqueeze(-2)) @ V.mT, cond


@pytest.fixture(scope="module")
def factors():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # a round after every step from step 100 to 240
        return shampoo_factor_sequence(steps=240, every=1, start=100)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dname", ["fp32", "fp64"])
def test_shampoo_factor_sequence_is_within_the_cold_bound(factors, dname):
    """fp32 (Shampoo's root dtype): root rounds every 5 steps; fp64 (tolerance ~1e-12, which takes
    more refinement steps): every step."""
    u = U[dname]
    p = 4
    cfg = matroots.solvers.EighWarmConfig(rank_policy="clamp")
    counts = {"cold": 0, "accepted": 0, "refined": 0, "fallback": 0}
    for n, rounds in factors.items():
        seq = rounds[::5] if dname == "fp32" else rounds[-30:]
        prev = None
        for t in range(seq.shape[0]):
            A = seq[t] if dname == "fp32" else 0.5 * (seq[t] + seq[t].mT).double()
            res = cfg.solve(A, p, warm_start=prev)
            ref, cond = _clamped_reference(A, p, u)
            check_warm_round(res, ref, cond, u, n, t, counts)
            prev = res
    total = sum(counts.values())
    if dname == "fp32":  # the Shampoo case: the warm path is taken on most rounds
        assert counts["accepted"] + counts["refined"] >= 0.8 * total, counts
    else:  # fp64 asks ~1e-12: some rounds need more than 3 refinement steps and fall back
        assert counts["accepted"] + counts["refined"] >= 0.4 * total, counts
        assert counts["fallback"] > 0  # and the fallback is exercised on real data


def test_factor_rounds_with_a_big_jump_fall_back(factors):
    seq = factors[32]  # two factors of size 32 (L of layer 1, R of layer 2)
    assert seq.shape[1] == 2
    cfg = matroots.solvers.EighWarmConfig(rank_policy="clamp")
    r0 = cfg.solve(seq[-1], 4)
    swapped = seq[-1][torch.tensor([1, 0])]  # each factor warm-started from the other's basis
    res = cfg.solve(swapped, 4, warm_start=r0)
    assert all(s.startswith("fallback: ") for s in res.info["warm"]), res.info["warm"]
    ref, cond = _clamped_reference(swapped, 4, U["fp32"])
    for i in range(2):
        assert rel_err(res.root[i], ref[i].numpy()) <= 10.0 * (1.0 + float(cond[i])) * U["fp32"] * math.sqrt(
            32
        )


# --------------------------------------------------------------------------------- cold = eigh
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("policy", ["perturb", "clamp", "pseudo_inverse"])
def test_cold_call_is_eigh_at_every_dtype(dtype, policy):
    g = torch.Generator().manual_seed(1)
    G = torch.randn(2, 3, 12, 30, generator=g)
    A = torch.matmul(G, G.mT) * 100.0  # batch shape (2, 3); fp16 inputs are prescaled
    kw = {"dtype": dtype, "rank_policy": policy, "eps": 1e-3, "eps_mode": "relative"}
    a = matroots.inverse_root(A, 4, method="eigh", **kw)
    b = matroots.inverse_root(A, 4, method="eigh_warm", **kw)
    assert torch.equal(a.root, b.root)
    assert b.info["warm"] == [["cold"] * 3] * 2 or b.info["warm"] == ["cold"] * 6
    assert b.info["eigenvectors"].shape == (2, 3, 12, 12) and b.info["eigenvalues"].shape == (2, 3, 12)
    w_ref = torch.linalg.eigvalsh(A.to(dtype).double())
    assert torch.allclose(
        b.info["eigenvalues"].double(),
        w_ref,
        rtol=0,
        atol=1e-2 * float(w_ref.abs().max())
        if dtype in (torch.bfloat16, torch.float16)
        else 1e-5 * float(w_ref.abs().max()),
    )
    for key in ("lambda_min", "lambda_max", "eps_abs"):
        assert torch.allclose(a.info[key].double(), b.info[key].double().reshape(a.info[key].shape))


def test_forward_root_and_transposed_view():
    seq = spd_sequence(16, 1e3, 2, 1, angle=2e-3, seed=11)
    A0, A1 = torch.from_numpy(seq[0][0]), torch.from_numpy(seq[1][0])
    r0 = matroots.root(A0.mT, 3, method="eigh_warm")
    r1 = matroots.root(A1.mT, 3, method="eigh_warm", warm_start=r0)
    assert r1.info["warm"] in ("accepted", "refined")
    ref = reference.root(A1.numpy(), 3).root
    assert rel_err(r1.root, ref) <= fwd_bound(1e3 ** (2 / 3), 3, 16, U["fp64"])


def test_tensor_warm_start_and_bad_warm_starts():
    seq = spd_sequence(12, 1e2, 2, 2, angle=1e-3, seed=13)
    A0, A1 = torch.from_numpy(seq[0]), torch.from_numpy(seq[1])
    r0 = matroots.inverse_root(A0, 2, method="eigh_warm")
    Q = r0.info["eigenvectors"]
    r1 = matroots.inverse_root(A1, 2, method="eigh_warm", warm_start=Q.numpy())  # raw basis: checked
    assert set(r1.info["warm"]) <= {"accepted", "refined"}
    # the previous *root* is not an orthonormal basis: refused, eigh runs
    r2 = matroots.inverse_root(A1, 2, method="eigh_warm", warm_start=r0.root)
    assert all("not orthonormal" in s for s in r2.info["warm"])
    bad = Q.clone()
    bad[1, 0, 0] = float("nan")
    r3 = matroots.inverse_root(A1, 2, method="eigh_warm", warm_start=bad)
    assert r3.info["warm"][0] in ("accepted", "refined") and "non-finite" in r3.info["warm"][1]
    with pytest.raises(InvalidArgumentError, match="eigenvectors"):
        matroots.inverse_root(
            A1, 2, method="eigh_warm", warm_start=matroots.inverse_root(A0, 2, method="eigh")
        )
    with pytest.raises(InvalidArgumentError, match="shape"):
        matroots.inverse_root(A1, 2, method="eigh_warm", warm_start=Q[:, :5, :5])
    with pytest.raises(InvalidArgumentError, match="batch"):
        matroots.inverse_root(A1, 2, method="eigh_warm", warm_start=torch.cat([Q, Q]))


def test_config_validation_and_registry():
    assert "eigh_warm" in matroots.solvers.available()
    for bad in (
        {"max_angle": 0.0},
        {"max_angle": 1.0},
        {"max_cluster": 0},
        {"safety": -1.0},
        {"fallback": 1},
    ):
        with pytest.raises(InvalidArgumentError):
            matroots.solvers.EighWarmConfig(**bad)
    with pytest.raises(MatrootsError):
        matroots.inverse_root(torch.eye(3, dtype=torch.float64), 2, method="eigh_warm", max_angel=0.1)


def test_explicit_tol_and_psd_policies():
    seq = spd_sequence(16, 1e3, 2, 2, angle=5e-3, seed=17)
    A0, A1 = torch.from_numpy(seq[0]).float(), torch.from_numpy(seq[1]).float()
    r0 = matroots.inverse_root(A0, 2, method="eigh_warm")
    loose = matroots.inverse_root(A1, 2, method="eigh_warm", warm_start=r0, tol=0.5)
    assert loose.info["warm"] == ["accepted", "accepted"] and loose.matmuls == 3.0
    for psd in ("shift", "meta"):
        a = matroots.inverse_root(A1, 2, method="eigh", psd=psd)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            b = matroots.inverse_root(A1, 2, method="eigh_warm", psd=psd, warm_start=r0)
        assert set(b.info["warm"]) <= {"accepted", "refined"}
        assert torch.allclose(a.info["psd_shift"], b.info["psd_shift"], rtol=1e-3, atol=1e-12)
        ref = _ref_roots(A1.double().numpy(), 2)
        for i in range(2):
            assert rel_err(b.root[i], ref[i]) <= fwd_bound(1e3, 2, 16, U["fp32"])


def test_shipped_shampoo_factors_mid_to_late(tmp_path):
    """The shipped real factors (matroots/data/shampoo_factors): each late-stage factor warm-started
    from the basis of the same factor 240 steps earlier. A big change: the fallback must catch it
    where the basis is too far, and every root is within the cold bound."""
    from pathlib import Path

    from matroots.study.matrices import load_shampoo_factors

    data = Path(matroots.__file__).parent / "data" / "shampoo_factors"
    by_key: dict[tuple, dict[str, np.ndarray]] = {}
    for A, meta in load_shampoo_factors(data):
        key = (meta["task"], meta["param"], meta["block"], meta["dim"])
        by_key.setdefault(key, {})[meta["stage"]] = A
    cfg = matroots.solvers.EighWarmConfig(rank_policy="clamp")
    paths = []
    for stages in by_key.values():
        if not {"mid", "late"} <= set(stages) or stages["mid"].shape[0] < 16:
            continue
        if not (np.abs(stages["mid"]).max() > 0 and np.abs(stages["late"]).max() > 0):
            continue  # an all-zero factor (a parameter without gradient) has no root to warm-start
        mid = torch.from_numpy(stages["mid"]).float()  # fp32 values stored exactly as float64
        late = torch.from_numpy(stages["late"]).float()
        r0 = cfg.solve(mid, 4)
        res = cfg.solve(late, 4, warm_start=r0)
        ref, cond = _clamped_reference(late.unsqueeze(0), 4, U["fp32"])
        n = late.shape[-1]
        assert rel_err(res.root, ref[0].numpy()) <= 10.0 * (1.0 + float(cond[0])) * U["fp32"] * math.sqrt(n)
        assert res.converged is True
        paths.append(res.info["warm"].split(":")[0])
    assert len(paths) >= 6 and "fallback" in paths, paths


def test_autograd_input_takes_the_differentiable_eigh_path():
    seq = spd_sequence(8, 1e2, 2, 1, angle=1e-3, seed=19)[:, 0]
    r0 = matroots.inverse_root(torch.from_numpy(seq[0]), 2, method="eigh_warm")
    A = torch.from_numpy(seq[1]).requires_grad_(True)
    res = matroots.inverse_root(A, 2, method="eigh_warm", warm_start=r0)
    assert res.info["warm"].startswith("cold (autograd")
    res.root.sum().backward()
    B = A.detach().clone().requires_grad_(True)
    matroots.inverse_root(B, 2, method="eigh").root.sum().backward()
    assert A.grad is not None and torch.equal(A.grad, B.grad)  # exactly eigh's Daleckii-Krein gradient
