"""The sweep and tune path to a CUDA selection table (`device = "cuda"`), tested on the CPU: the device is
part of a grid (validated, hashed only when not the CPU so every CPU run keeps its hash), a device this
machine lacks is refused before any work with a one-line error, the cost clock is the device's, and the
solve runs on a tensor of the grid's device, which on the CPU gives the rows the array gave."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _tiny_sweep import TINY

from matroots.study import grid, sweep
from matroots.study.grid import ConfigError
from matroots.study.tuning import cost
from matroots.study.tuning import spec as tune_spec

ROOT = Path(__file__).resolve().parents[1]


def _no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_grid_device_is_validated_and_cpu_hashes_are_unchanged() -> None:
    g = grid.load_config(ROOT / "experiments" / "configs" / "eps_regularisation.toml")
    assert g.device == "cpu" and "device" not in g.to_dict()
    # the hash formula before the field existed: sha256 of the sorted JSON of every other field
    old = {k: v for k, v in dataclasses.asdict(g).items() if k != "device"}
    want = hashlib.sha256(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert g.config_hash() == want
    raw = {"solvers": [{"name": "eigh"}]}
    for ok in ("cpu", "cuda", "cuda:1"):
        assert grid.from_dict({**raw, "device": ok}).device == ok
    assert grid.from_dict({**raw, "device": "cuda"}).config_hash() != grid.from_dict(raw).config_hash()
    assert grid.from_dict({**raw, "device": "cuda"}).to_dict()["device"] == "cuda"
    for bad in ("gpu", "cuda:x", "CUDA", 0):
        with pytest.raises(ConfigError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
            grid.from_dict({**raw, "device": bad})


def test_require_device_refuses_what_this_machine_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cost.require_device("cpu") == torch.device("cpu")
    _no_cuda(monkeypatch)
    with pytest.raises(cost.DeviceUnavailableError, match="sees no CUDA device"):
        cost.require_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(cost.DeviceUnavailableError, match=r"only 1 CUDA device"):
        cost.require_device("cuda:3")
    with pytest.raises(cost.DeviceUnavailableError, match="'cpu' or 'cuda"):
        cost.require_device("meta")


def test_a_cuda_sweep_on_a_cpu_machine_stops_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_cuda(monkeypatch)
    cfg = tmp_path / "tiny_cuda.toml"
    cfg.write_text('device = "cuda"\n' + TINY)
    g = grid.load_config(cfg)
    with pytest.raises(cost.DeviceUnavailableError, match="sees no CUDA device"):
        sweep.run_sweep(g, tmp_path / "run", workers=1, progress=False)
    assert not (tmp_path / "run").exists(), "nothing may be written for a run that cannot start"


def test_tune_and_sweep_commands_say_so_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny_cuda.toml"
    cfg.write_text('device = "cuda"\n' + TINY)
    tune_src = (ROOT / "experiments" / "configs" / "tune_tiny.toml").read_text()
    tune = tmp_path / "tune_cuda.toml"
    tune.write_text(tune_src.replace('device = "cpu"', 'device = "cuda"'))
    spec = tune_spec.load_config(tune)
    assert spec.device == "cuda" and all(s.device == "cuda" for s in spec.sweeps)
    assert (
        spec.config_hash()
        != tune_spec.load_config(ROOT / "experiments" / "configs" / "tune_tiny.toml").config_hash()
    )
    for argv in (
        ["sweep", str(cfg), "--out", str(tmp_path / "s")],
        ["tune", str(tune), "--out", str(tmp_path / "t")],
    ):
        # CUDA_VISIBLE_DEVICES="" hides any GPU, so the refusal is checked on every machine
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        p = subprocess.run(
            [sys.executable, "-m", "matroots.cli", *argv], capture_output=True, text=True, env=env
        )
        assert p.returncode == 2, p.stderr
        assert (
            p.stderr.count("\n") == 1
            and "DeviceUnavailableError" in p.stderr
            and "no CUDA device" in p.stderr
        )


def test_cost_clock_is_the_devices() -> None:
    assert cost.clock("cpu") is time.process_time
    assert cost.gemm_seconds(32, "fp32", device="cpu") > 0
    (out, secs) = cost.timed(lambda: torch.ones(3).sum().item(), device="cpu")
    assert out == 3.0 and secs >= 0


def test_sweep_rows_record_the_grid_device(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    df = sweep.run_sweep(grid.load_config(cfg), tmp_path / "run", workers=1, progress=False)
    assert set(df["device"]) == {"cpu"}
    ok = df[df["failure"] == ""]
    assert len(ok) and ok["relative_forward_error"].notna().all()


@pytest.mark.parametrize("method", ["eigh", "coupled_newton", "schur_newton", "polar_express"])
def test_a_tensor_input_gives_the_bits_of_the_array(method: str) -> None:
    """The sweep hands the solvers torch.as_tensor(A, device=grid.device); on the CPU that must be the
    computation the array gave (the same kernels on the same bits, so bitwise by construction)."""
    import numpy as np

    from matroots import api
    from matroots.study import matrices

    A, _ = matrices.generate("randsvd", 24, 1e4, np.random.default_rng(0))
    cfg = api.resolve_method(method)
    for dtype in ("fp64", "fp32"):
        a = cfg.solve(A, 4, dtype=dtype, quiet=True)
        b = cfg.solve(torch.as_tensor(A), 4, dtype=dtype, quiet=True)
        assert torch.equal(a.root, b.root) and a.iterations == b.iterations, (method, dtype)
