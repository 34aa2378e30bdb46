"""The shipped real Shampoo factors (family "shampoo") and every solver on them.

Accuracy is judged against a high-precision reference (matroots.truth.reference) of the matrix actually
solved (the factor in the working format plus the psd shift, plus eps) and against the SPD
conditioning bound (kappa/p) u of that matrix, with a dimension constant n; a solver may instead report
a failure (a typed numerical error, or converged=False), never return a wrong root as converged.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import matroots
from matroots import MatrootsNumericalError
from matroots.study import matrices
from matroots.truth import reference

SOLVERS = [s for s in matroots.solvers.available() if s != "auto"]
# one factor per (task, stage): early (rank-deficient), mid, late of each real task
PICKS = [
    (task, stage, n)
    for task, n in (("digits", 64), ("bytes_lm", 32), ("wide1", 32))
    for stage in ("early", "mid", "late")
]


def test_shipped_set_is_small_documented_and_exactly_symmetric() -> None:
    files = sorted(matrices.SHAMPOO_DATA.glob("*.npz"))
    assert len(files) == 9 and sum(f.stat().st_size for f in files) < 3_000_000
    prov = json.loads((matrices.SHAMPOO_DATA / "PROVENANCE.json").read_text())
    assert {"command", "optimizer", "stages", "torch"} <= set(prov)
    loaded = matrices.load_shampoo_factors(matrices.SHAMPOO_DATA)
    assert len(loaded) == len(prov["factors"])
    for A, meta in loaded:
        assert {"task", "stage", "step", "param", "block", "dim", "factor_dtype", "beta2", "eps"} <= set(meta)
        assert meta["symmetric"] and np.array_equal(A, A.T)
        assert np.array_equal(A.astype(np.float32).astype(np.float64), A)  # fp32 statistics, exactly
    early = [m for _, m in loaded if m["stage"] == "early"]
    assert {m["step"] for m in early} == {2}


def test_family_is_usable_like_any_other() -> None:
    A1, m1 = matrices.generate("shampoo", 32, 1e4, np.random.default_rng(5))
    A2, m2 = matrices.generate("shampoo", 32, 1e4, np.random.default_rng(5))
    assert np.array_equal(A1, A2) and m1["param"] == m2["param"]
    assert m1["family"] == "shampoo" and m1["kappa_requested"] == 1e4 and m1["kappa_source"] == "computed"
    _, m = matrices.generate("shampoo", 10, task="digits", stage="late")
    # the 10-class output layer: softmax-CE gradients sum to zero over classes, so the factor has rank 9
    # at every step; in fp32 statistics its null eigenvalue is rounding noise, |lambda| <~ n u lambda_max
    lam = m["eigenvalues"]
    assert abs(lam[0]) <= 10 * 2.0**-24 * lam[-1] < lam[1] and m["kappa"] > 1e5
    with pytest.raises(ValueError, match="orders available"):
        matrices.generate("shampoo", 33)
    with pytest.raises(ValueError, match="index"):
        matrices.generate("shampoo", 64, index=999)


def _solved(A: np.ndarray, dtype: torch.dtype, shift: float) -> np.ndarray:
    W = torch.from_numpy(A).to(dtype)
    W.diagonal().add_(torch.tensor(shift, dtype=torch.float64).to(dtype))
    return W.double().numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("solver", SOLVERS)
def test_every_solver_on_real_factors_is_accurate_or_reports_failure(solver: str, dtype: torch.dtype) -> None:
    cfg = matroots.resolve_method(solver)
    u = matroots.core.precision.unit_roundoff(dtype)
    solved = 0
    for task, stage, n in PICKS:
        A, meta = matrices.generate("shampoo", n, task=task, stage=stage, index=0)
        try:
            res = cfg.solve(A, 4, eps=1e-12, dtype=dtype, psd="shift", quiet=True)
        except MatrootsNumericalError:
            continue  # a reported failure
        if not bool(res.converged):
            continue  # a reported failure
        X = res.root.double().numpy()
        assert np.isfinite(X).all()
        M = _solved(A, dtype, float(res.info["psd_shift"][0]))
        lam = reference.eigvalsh(M) + 1e-12
        assert lam[0] > 0  # the policy produced a positive definite matrix
        kappa = float(lam[-1] / lam[0])
        ref = reference.inverse_root(M, 4, eps=1e-12)
        err = float(np.linalg.norm(X - ref.root) / np.linalg.norm(ref.root))
        assert err <= n * (kappa / 4) * u, (task, stage, meta["param"], err, kappa)
        solved += 1
    assert solved >= len(PICKS) - 1  # failures are allowed but must stay rare on real factors


def test_unreadable_dump_is_a_value_error_naming_the_file(tmp_path) -> None:
    from matroots.core.factor_dump import load_shampoo_factors

    bad = tmp_path / "broken.npz"
    bad.write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(ValueError, match=r"broken\.npz: not a readable \.npz archive"):
        load_shampoo_factors(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \.npz files"):
        load_shampoo_factors(tmp_path / "empty")
