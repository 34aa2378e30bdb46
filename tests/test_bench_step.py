"""experiments/bench_step.py: the floor's flop count, the CLI's outputs, the peer adapters.

Timings are never asserted; the tests check what is counted, what is written and that every
configuration builds and steps.
"""

from __future__ import annotations

import csv
import importlib
import math
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import bench_floor  # noqa: E402
import bench_models  # noqa: E402
import bench_step  # noqa: E402

import shampoo  # noqa: E402

# ----------------------------------------------------------------------------------------------------
# The floor against hand counts


def test_block_dims_hand_cases() -> None:
    # 40 x 300 at block 256: no merge (12000 > 256), 300 cut into 256 + 44
    assert bench_floor.block_dims((40, 300), 256) == [(40, 256), (40, 44)]
    # trailing dims merge while the product stays <= 256: (4, 8, 3) -> 96 -> one 1-D block
    assert bench_floor.block_dims((4, 8, 3), 256) == [(96,)]
    # (64, 3, 3, 3): 27 merges, 64 * 27 > 256 does not
    assert bench_floor.block_dims((64, 3, 3, 3), 256) == [(64, 27)]
    assert bench_floor.block_dims((1, 512, 1), 256) == [(256,), (256,)]
    assert bench_floor.block_dims((512,), 256) == []  # vectors: diagonal, no GEMMs


def test_block_flops_hand_count() -> None:
    # an a x b block: L = G G^T (2 a^2 b), R = G^T G (2 a b^2), L^-1/4 G (2 a^2 b), (.) R^-1/4 (2 a b^2)
    a, b = 40, 44
    assert bench_floor.block_flops((a, b)) == 2 * a * a * b + 2 * a * b * b + 2 * a * a * b + 2 * a * b * b
    assert bench_floor.block_flops((256, 256)) == 8 * 256**3
    assert bench_floor.block_flops((96,)) == 4 * 96 * 96  # g g^T and one matrix-vector product


@pytest.mark.parametrize(
    "shape", [(40, 300), (768, 256), (512, 256), (128, 256), (4, 8, 3), (1, 512, 1), (300, 2, 5)]
)
def test_block_dims_follow_the_optimizer(shape: tuple[int, ...]) -> None:
    layout = shampoo.layout_param(0, shape, max_preconditioner_dim=256)
    blocks = [b.shape for b in layout.blocks if b.kind == shampoo.BlockKind.SHAMPOO]
    assert sorted(blocks) == sorted(bench_floor.block_dims(shape, 256))


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)  # a lookup: not a matmul
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)  # in_proj 24 x 8, out_proj 8 x 8
        self.lin = nn.Linear(8, 300)  # 300 x 8 (+ bias, elementwise)


def test_floor_hand_count() -> None:
    m = _Toy()
    assert bench_floor.matmul_params(m) == 24 * 8 + 8 * 8 + 300 * 8
    tokens, layers, batch, seq, d = 12, 1, 3, 4, 8
    eq = {8: 3.0, 44: 4.0, 64: 5.0, 80: 6.0, 192: 7.0, 256: 8.0}
    fl = bench_floor.compute_floor(
        m,
        tokens=tokens,
        layers=layers,
        batch=batch,
        seq=seq,
        d_model=d,
        block=256,
        frequency=5,
        eigh_gemm_eq=eq,
    )
    # model: 6 x 12 tokens x 2656 params + attention 12 x 1 x 3 x 4^2 x 8
    assert fl.model_6tp == 6 * 12 * 2656
    assert fl.model == 6 * 12 * 2656 + 12 * 3 * 16 * 8
    # blocks: embed 10 x 8 (80 <= 256 merges into one 80-dim factor), in_proj 24 x 8 (192 <= 256: one
    # 192-dim factor), out_proj 8 x 8 (64), lin 300 x 8 -> 256 x 8 and 44 x 8 (2400 > 256, no merge)
    assert fl.factor_sizes == {80: 1, 192: 1, 64: 1, 256: 1, 8: 2, 44: 1}
    gemm = 4 * 80 * 80 + 4 * 192 * 192 + 4 * 64 * 64 + 4 * 256 * 8 * (256 + 8) + 4 * 44 * 8 * (44 + 8)
    assert fl.gemm == gemm
    roots = sum(k * (eq[n] + 1) * 2 * n**3 for n, k in {80: 1, 192: 1, 64: 1, 256: 1, 8: 2, 44: 1}.items())
    assert fl.roots == int(roots)
    assert math.isclose(fl.ratio, 1 + (gemm + roots / 5) / fl.model)


def test_floor_ratio_hand_count() -> None:
    class One(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(256, 256, bias=False)

    fl = bench_floor.compute_floor(
        One(),
        tokens=1000,
        layers=0,
        batch=0,
        seq=0,
        d_model=0,
        block=256,
        frequency=10,
        eigh_gemm_eq={256: 9.0},
    )
    n = 256
    model = 6 * 1000 * n * n
    roots = 2 * (9.0 + 1.0) * 2 * n**3  # two factors, eigh (9 GEMMs) + Q diag Q^T (1 GEMM)
    assert fl.roots == roots
    assert math.isclose(fl.ratio, 1 + (8 * n**3 + roots / 10) / model)
    assert fl.ratio == fl.ratio_6tp  # no attention term
    assert math.isclose(fl.root_share, (roots / 10) / (model + 8 * n**3 + roots / 10))
    te, tg = 0.02, 0.001  # eigh and GEMM seconds at n = 256
    fl = bench_floor.compute_floor(
        One(), tokens=1000, layers=0, batch=0, seq=0, d_model=0, block=256, frequency=10,
        eigh_gemm_eq={256: 9.0}, kernel_seconds={256: (te, tg)},
    )  # fmt: skip
    assert math.isclose(fl.gemm_seconds, 4 * tg)  # 8 n^3 flops at 2 n^3 / tg flop/s
    assert math.isclose(fl.root_seconds, 2 * (te + tg))
    assert math.isclose(fl.time_ratio(0.5), 1 + (4 * tg + 2 * (te + tg) / 10) / 0.5)
    with pytest.raises(ValueError, match="lacks factor sizes"):
        bench_floor.compute_floor(
            One(), tokens=1, layers=0, batch=0, seq=0, d_model=0, block=256, frequency=1, eigh_gemm_eq={}
        )


def test_w1_shapes_and_counts() -> None:
    m = bench_step.W1Model()
    assert bench_floor.matmul_params(m) == 4 * 12 * 256 * 256 + 512 * 256
    assert (bench_step.VOCAB, bench_step.SEQ, bench_step.BATCH) == (512, 128, 16)
    assert m(torch.zeros(2, bench_step.SEQ, dtype=torch.long)).shape == (2, 128, 512)
    # W1 family: head dim 64, feed-forward 4 d
    for key, size in bench_models.SIZES.items():
        if key != "tiny":
            assert (size.d_model, size.heads * 64, size.ff) == (int(key), size.d_model, 4 * size.d_model)


def test_eigh_gemm_eq_is_measured() -> None:
    eq = bench_floor.measure_eigh_gemm_eq([8, 16], batch=2, repeats=1)
    k = bench_floor.measure_kernels([8], batch=2, repeats=1)
    assert k[8][0] > 0 and k[8][1] > 0
    assert set(eq) == {8, 16} and all(v > 0 and math.isfinite(v) for v in eq.values())


# ----------------------------------------------------------------------------------------------------
# The CLI


def _read(out: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(out / "bench_step.csv") as fh:
        r = csv.DictReader(fh)
        return list(r.fieldnames or []), list(r)


def test_cli_two_step_smoke(tmp_path: Path) -> None:
    argv = ["--sizes", "tiny", "--rounds", "1", "--chunk", "2", "--warmup", "1", "--frequencies", "1", "2"]
    argv += ["--frequency", "2", "--solvers", "schur_newton", "--peers", "none", "--out", str(tmp_path)]
    bench_step.main(argv)
    cols, rows = _read(tmp_path)
    assert cols[: len(bench_step.CSV_COLUMNS)] == bench_step.CSV_COLUMNS
    by = {r["config"]: r for r in rows}
    assert {"adamw", "shampoo_f1", "shampoo_f2", "shampoo_f2_schur_newton"} <= set(by)
    for name in ("adamw", "shampoo_f1", "shampoo_f2", "shampoo_f2_schur_newton"):
        r = by[name]
        assert r["status"] == "ok"
        assert float(r["cpu_total_s"]) > 0 and float(r["wall_total_s"]) > 0
        assert math.isfinite(float(r["final_loss"]))
    assert float(by["adamw"]["ratio_adamw_cpu"]) == 1.0
    assert float(by["shampoo_f1"]["root_cpu_s_per_step"]) > 0  # the compute_roots hook saw the rounds
    assert float(by["shampoo_f1"]["floor_ratio"]) > float(by["shampoo_f2"]["floor_ratio"]) > 1.0
    soap = by["shampoo_soap_f2"]
    assert soap["status"] == "ok" or soap["status"].startswith("unavailable")
    md = (tmp_path / "bench_step.md").read_text()
    assert "| shampoo_f2 |" in md and "d 32" in md


def test_cli_cuda_without_gpu_says_so(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CUDA path runs instead of refusing")
    with pytest.raises(SystemExit, match="CUDA is not available"):
        bench_step.main(["--device", "cuda", "--quick", "--out", str(tmp_path)])


def test_cli_unknown_solver() -> None:
    with pytest.raises(SystemExit, match="unknown solver 'eigen'"):
        bench_step.main(["--quick", "--solvers", "eigen", "--peers", "none"])


# ----------------------------------------------------------------------------------------------------
# Peer adapters


class _FakePeerOpt(torch.optim.Optimizer):
    """A stand-in peer: SGD that records the settings it was built with."""

    built: ClassVar[list[dict]] = []

    def __init__(self, params, lr: float, frequency: int, block: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, {"lr": lr})
        _FakePeerOpt.built.append({"lr": lr, "frequency": frequency, "block": block})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-g["lr"])


def _fake_module() -> types.ModuleType:
    mod = types.ModuleType("fakepeer")
    mod.FakeOpt = _FakePeerOpt  # type: ignore[attr-defined]
    mod.__version__ = "9.9"  # type: ignore[attr-defined]
    mod.setup_calls = 0  # type: ignore[attr-defined]
    return mod


def _fake_adapter() -> bench_models.PeerAdapter:
    def setup(mod):  # type: ignore[no-untyped-def]
        mod.setup_calls += 1

    return bench_models.PeerAdapter(
        "fake",
        "fakepeer",
        "FakeOpt",
        lambda c: {"lr": c.lr, "frequency": c.frequency, "block": c.block},
        "x",
        setup,
    )


def test_fake_peer_adapter_builds_and_steps() -> None:
    mod = _fake_module()
    c = bench_models.Common(frequency=7)
    spec = bench_models.peer_spec(_fake_adapter(), c, importer=lambda name: mod)
    assert spec.unavailable is None and spec.frequency == 7
    assert spec.settings["class"] == "fakepeer.FakeOpt 9.9"
    m = bench_models.EncoderLM(bench_models.SIZES["tiny"])
    opt = spec.build(m)  # type: ignore[misc]
    assert mod.setup_calls == 1 and _FakePeerOpt.built[-1] == {"lr": 1e-3, "frequency": 7, "block": 256}
    before = [p.detach().clone() for p in m.parameters()]
    m.loss(bench_models.make_batches(m.size, 0, 1)[0]).backward()
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))


def test_missing_peer_is_reported_not_dropped() -> None:
    def importer(name):  # type: ignore[no-untyped-def]
        raise ImportError(f"No module named {name!r}")

    spec = bench_models.peer_spec(_fake_adapter(), bench_models.Common(), importer=importer)
    assert spec.build is None and "pip install -e '.[peers]'" in (spec.unavailable or "")
    with pytest.raises(ValueError, match="unknown peer 'nope'"):
        bench_models.peer_specs(["nope"], bench_models.Common())


def _tiny_argv(peer: str, out: Path) -> list[str]:
    """CLI arguments of a 2-round run on the tiny model: AdamW, eigh Shampoo at frequency 2, ``peer``."""
    return ["--sizes", "tiny", "--rounds", "2", "--chunk", "2", "--warmup", "1", "--frequencies", "2",
            "--frequency", "2", "--solvers", "none", "--soap", "off", "--peers", peer, "--out", str(out)]  # fmt: skip


def test_cli_with_fake_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fakepeer", _fake_module())
    monkeypatch.setitem(bench_models.PEERS, "fake", _fake_adapter())
    bench_step.main(_tiny_argv("fake", tmp_path))
    cols, rows = _read(tmp_path)
    assert "ratio_to_fake" in cols
    by = {r["config"]: r for r in rows}
    assert by["fake"]["status"] == "ok" and float(by["fake"]["ratio_to_fake"]) == 1.0
    assert by["fake"]["root_share"] == ""  # a peer's roots run inside its step: not measured, not 0
    assert float(by["shampoo_f2"]["ratio_to_fake"]) > 0
    assert "fakepeer.FakeOpt 9.9" in by["fake"]["settings"]
    assert "Ratio to fake" in (tmp_path / "bench_step.md").read_text()


class _FailingPeerOpt(_FakePeerOpt):
    """Fails at its third step, as a peer whose decomposition breaks down mid-run."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.steps = 0

    def step(self, closure=None):  # type: ignore[no-untyped-def]
        self.steps += 1
        if self.steps == 3:
            raise torch.linalg.LinAlgError("svd failed to converge")
        return super().step(closure)


def test_cli_reports_failed_and_too_slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _fake_module()
    mod.FailingOpt = _FailingPeerOpt  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fakepeer", mod)
    bad = bench_models.PeerAdapter("fakebad", "fakepeer", "FailingOpt", _fake_adapter().settings)
    monkeypatch.setitem(bench_models.PEERS, "fakebad", bad)
    argv = _tiny_argv("fakebad", tmp_path)
    bench_step.main(argv)
    by = {r["config"]: r for r in _read(tmp_path)[1]}
    assert by["fakebad"]["status"].startswith("failed in round 1: _LinAlgError: svd failed")
    assert by["shampoo_f2"]["status"] == "ok" and by["adamw"]["status"] == "ok"  # the others go on
    bench_step.main([*argv, "--max-config-seconds", "1e-9"])
    by = {r["config"]: r for r in _read(tmp_path)[1]}
    assert by["shampoo_f2"]["status"].startswith("too slow:")


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(bench_models.PEERS))
def test_real_peer_builds_and_steps(name: str) -> None:
    adapter = bench_models.PEERS[name]
    if not _importable(adapter.module):
        pytest.skip(
            f"{adapter.module} is not installed (the optional 'peers' extra: pip install -e '.[peers]')"
        )
    c = bench_models.Common(frequency=2)
    spec = bench_models.peer_spec(adapter, c)
    assert spec.unavailable is None
    torch.manual_seed(0)
    m = bench_models.EncoderLM(bench_models.SIZES["tiny"])
    opt = spec.build(m)  # type: ignore[misc]
    before = [p.detach().clone() for p in m.parameters()]
    for b in bench_models.make_batches(m.size, 0, 4):  # 4 steps: two preconditioner updates at frequency 2
        opt.zero_grad()
        m.loss(b).backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert sum(not torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True)) > len(before) // 2
