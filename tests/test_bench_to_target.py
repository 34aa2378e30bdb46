"""experiments/bench_solvers.py --to-target and its peer adaptors (experiments/root_peers.py)."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import bench_solvers as bs
import root_peers

from matroots.solvers.base import matmul_count_power


def test_fewest_finds_the_least_k_meeting_the_target() -> None:
    ref = np.eye(4)

    def run_k(k: int):  # error 2^-k exactly (a root (1 + 2^-k) I), 3 products per iteration
        return (1.0 + 2.0**-k) * np.eye(4), 3.0 * k

    out = bs.fewest(run_k, ref, 1e-3)
    assert out["k"] == 10 and out["gemms"] == 30.0  # 2^-10 < 1e-3 < 2^-9
    assert out["error"] == 2.0**-10


def test_fewest_reports_a_floor_and_a_failure() -> None:
    ref = np.eye(3)
    floor = bs.fewest(lambda k: ((1.0 + 2e-3 + 2.0**-k) * np.eye(3), float(k)), ref, 1e-3)
    assert math.isinf(floor["gemms"]) and floor["note"].startswith("floor")
    assert floor["error"] < 4e-3  # stopped at the floor, not at K_MAX
    failed = bs.fewest(lambda k: (None, math.inf), ref, 1e-3)
    assert math.isinf(failed["gemms"]) and failed["note"] == "failed"


def test_slow_linear_phase_is_not_taken_for_a_floor() -> None:
    # error ~1 for 12 iterations, then converging: a slow start is not a rounding floor
    def run_k(k: int):
        return (1.0 + (0.6 if k < 12 else 2.0 ** (12 - k))) * np.eye(2), float(k)

    out = bs.fewest(run_k, np.eye(2), 1e-3)
    assert out["k"] == 22


@pytest.mark.parametrize("kappa", [1e4, 1e6])
def test_bf16_matrix_is_spd_and_its_kappa_reported(kappa: float) -> None:
    A, k_solved, shift = bs.matrix_in_format(64, kappa, torch.bfloat16, 4)
    assert A.dtype == torch.bfloat16 and shift > 0  # rounding alone gives an indefinite matrix here
    w = np.linalg.eigvalsh(A.double().numpy())  # bf16 entries are exact in float64
    assert w[0] > 0
    assert k_solved == pytest.approx(w[-1] / w[0], rel=1e-12)
    if kappa == 1e4:  # reachable: the diagonal's bf16 spacing (~5e-4 at 0.1) is below lambda_min
        assert abs(math.log(k_solved / kappa)) <= math.log(1.05)
    else:  # kappa 1e6: lambda_min 1e-6 is below that spacing; the closest found, within a decade
        assert abs(math.log10(k_solved / kappa)) < 1


def test_fp32_matrix_is_the_rounded_construction() -> None:
    A, _, shift = bs.matrix_in_format(32, 1e2, torch.float32, 4)
    A64, _ = bs.build(32, 1e2, 4, seed=32)
    assert shift == 0.0 and torch.equal(A, torch.from_numpy(A64).float())


def test_power_products_match_binary_powering() -> None:
    assert all(root_peers.power_products(p) == matmul_count_power(p) for p in range(1, 33))


def test_absent_peers_are_reported_absent() -> None:
    def importer(name: str):
        raise ImportError(name)

    assert root_peers.found(importer) == {p.name: None for p in root_peers.PEERS}


def test_pytorch_optimizer_peer_counts_its_iterations() -> None:
    mod = pytest.importorskip("pytorch_optimizer.optimizer.utils")
    peer = next(p for p in root_peers.PEERS if p.module == "pytorch_optimizer")
    A, _, _ = bs.matrix_in_format(32, 1e2, torch.float64, 4)
    _, mm = peer.solve(mod, A, 4, 5)
    assert mm == 5 * 4 + 101 / 32  # X M', M'^4 (2 products), M'^4 M; 101 matrix-vector products
    X_default, mm_default = peer.solve(mod, A, 4, None)
    assert torch.equal(X_default, mod.compute_power_schur_newton(A, 4, ridge_epsilon=0.0))
    its = (mm_default - 101 / 32) / 4
    assert its == int(its) and 1 <= its <= 100


SHIPPED = Path(__file__).resolve().parents[1] / "results" / "bench_to_target"
ROW_LINE = re.compile(r"^\s*\d+\s+(fp32|bf16)\s")


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.json")), ids=lambda p: p.stem)
def test_shipped_rows_carry_provenance_and_match_their_log(path: Path) -> None:
    """Each shipped --to-target run (results/bench_to_target/NAME.json, written by ``--json``) records
    how it was made (argv, commit, torch, threads, machine, start, whether complete, which peers were
    found) and NAME.log beside it is its printed table: the same rows, as ``_fmt_target`` prints them,
    in order. A row has GEMM-equivalents exactly when its error meets the target, and peer rows only
    from a run that found that peer."""
    run = json.loads(path.read_text())
    assert "--to-target" in run["argv"] and re.fullmatch(r"[0-9a-f]{40}", run["commit"])
    assert run["torch"] and run["machine"] and run["started"] and isinstance(run["complete"], bool)
    assert isinstance(run["threads"], int) and set(run["peers"]) == {p.name for p in root_peers.PEERS}
    rows = run["rows"]
    assert rows
    for r in rows:
        assert r["target"] == bs.TARGETS[r["dtype"]]
        assert math.isfinite(r["gemms"]) == (r["error"] <= r["target"]), r
        if r["method"] in run["peers"]:
            assert run["peers"][r["method"]], r["method"]
    log = path.with_suffix(".log").read_text().splitlines()
    assert [line for line in log if ROW_LINE.match(line)] == [bs._fmt_target(r) for r in rows]


def _history() -> Path | None:
    """The repository's root when this checkout has its full history (not shallow), else None."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        shallow = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-shallow-repository"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return root if shallow.returncode == 0 and shallow.stdout.strip() == "false" else None


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.json")), ids=lambda p: p.stem)
def test_shipped_run_was_made_by_a_commit_of_this_history(path: Path) -> None:
    """The commit a shipped run names is an ancestor of the checked-out one, so the code that made it
    can be read (a run made in a worktree whose branch was rebased away names a lost commit)."""
    import subprocess

    root = _history()
    if root is None:
        pytest.skip("no full git history in this checkout")
    commit = json.loads(path.read_text())["commit"]
    r = subprocess.run(
        ["git", "-C", str(root), "merge-base", "--is-ancestor", commit, "HEAD"],
        capture_output=True,
        timeout=30,
    )
    assert r.returncode == 0, f"{path.name}: commit {commit} is not in this history"
