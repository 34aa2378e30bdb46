"""Shipped results (matroots.study.shipped, `matroots ship`, `make figures FULL=1`): the compact set holds the
run's rows for the listed columns unchanged, its provenance names the run's commit and config hash, it
refuses a tampered file, a changed config and an unfinished run, and the full figure set is drawn from
the results shipped in the repository without recomputing anything."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # the test writes files; the library itself never forces a backend

import pandas as pd
import pytest
from _tiny_sweep import TINY

from matroots.study import grid, shipped, sweep

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, pd.DataFrame]:
    tmp = tmp_path_factory.mktemp("ship")
    cfg = tmp / "tiny.toml"
    cfg.write_text(TINY)
    rows = sweep.run_sweep(grid.load_config(cfg), tmp / "run", workers=1, progress=False)
    return cfg, tmp / "run", rows


def test_ship_keeps_the_listed_columns_unchanged(tiny_run, tmp_path: Path) -> None:
    cfg, run, rows = tiny_run
    rec = shipped.ship(run, tmp_path / "set", config=cfg)
    back = shipped.load(tmp_path / "set", repo_root=ROOT)
    assert list(back.columns) == [c for c in shipped.COLUMNS if c in rows.columns]
    assert set(shipped.COLUMNS) - set(back.columns) == set(), "a listed column is missing from the rows"
    key = ["family", "n", "kappa", "seed", "p", "eps", "eps_mode", "dtype", "solver"]
    a = rows.sort_values(key).reset_index(drop=True)[list(back.columns)]
    b = back.sort_values(key).reset_index(drop=True)
    for c in b.columns:  # categoricals come back as categories of the same strings; floats bitwise
        pd.testing.assert_series_equal(b[c].astype(a[c].dtype), a[c], check_names=False, obj=c)
    assert rec["complete"] and rec["units_done"] == rec["units_total"] == len(
        grid.units(grid.load_config(cfg))
    )
    assert rec["rows"] == grid.case_count(grid.load_config(cfg))
    assert rec["config_hash"] == grid.load_config(cfg).config_hash()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI's clean clone is one): the run's commit is recorded
        assert rec["commits"] == [head.stdout.strip()]
    assert rec["unit_cpu_seconds"] > 0


def test_load_refuses_tampered_rows_and_changed_config(tiny_run, tmp_path: Path) -> None:
    cfg, run, _ = tiny_run
    cfg2 = tmp_path / "tiny.toml"
    shutil.copy(cfg, cfg2)
    shipped.ship(run, tmp_path / "set", config=cfg2)
    rows = tmp_path / "set" / shipped.ROWS
    df = pd.read_parquet(rows)
    df.loc[0, "relative_forward_error"] = 0.0
    df.to_parquet(rows)
    with pytest.raises(shipped.ShippedResultsError, match="not the file its provenance describes"):
        shipped.load(tmp_path / "set")
    shipped.ship(run, tmp_path / "set", config=cfg2)
    shipped.load(tmp_path / "set", repo_root=ROOT)
    cfg2.write_text(cfg2.read_text().replace("seeds = [0]", "seeds = [0, 1]"))
    with pytest.raises(shipped.ShippedResultsError, match="now hashes to"):
        shipped.load(tmp_path / "set", repo_root=ROOT)
    with pytest.raises(shipped.ShippedResultsError, match="was run from config hash"):
        shipped.ship(run, tmp_path / "set2", config=cfg2)


def test_ship_refuses_an_unfinished_run_unless_partial(tiny_run, tmp_path: Path) -> None:
    cfg, run, _ = tiny_run
    half = tmp_path / "half"
    shutil.copytree(run, half)
    parts = sorted((half / "parts").glob("*.parquet"))
    for f in parts[: len(parts) // 2]:
        f.unlink()
    (half / "results.parquet").unlink(missing_ok=True)
    with pytest.raises(shipped.ShippedResultsError, match=r"units; finish it"):
        shipped.ship(half, tmp_path / "set", config=cfg)
    rec = shipped.ship(half, tmp_path / "set", config=cfg, allow_partial=True)
    assert not rec["complete"] and rec["units_done"] == len(parts) - len(parts) // 2
    with pytest.raises(shipped.ShippedResultsError, match="partial"):
        shipped.load(tmp_path / "set", require_complete=True)


def test_ship_command_one_line_error(tiny_run, tmp_path: Path) -> None:
    _, run, _ = tiny_run
    other = ROOT / "experiments" / "configs" / "demo.toml"
    p = subprocess.run(
        [sys.executable, "-m", "matroots.cli", "ship", str(run), str(tmp_path / "x"), "--config", str(other)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "ShippedResultsError" in p.stderr and "was run from" in p.stderr


# --- the results shipped in the repository ------------------------------------------------------------


def _shipped_sets() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "results").glob("*/" + shipped.PROVENANCE))


def test_shipped_results_match_the_repository_configs() -> None:
    sets = _shipped_sets()
    names = {p.name for p in sets}
    assert {"precision_full", "eps_regularisation"} <= names, names
    total = 0
    for s in sets:
        prov = json.loads((s / shipped.PROVENANCE).read_text())
        if prov.get("kind") != "sweep":
            continue
        assert (ROOT / prov["config"]).exists(), prov["config"]
        df = shipped.load(s, repo_root=ROOT)  # sha256 of the rows and the config hash are checked here
        assert len(df) == prov["rows"] and prov["units_done"] <= prov["units_total"]
        assert prov["commits"] and not prov["dirty"]
    for f in (ROOT / "results").rglob("*"):
        total += f.stat().st_size if f.is_file() else 0
    assert total <= 25e6, f"results/ holds {total / 1e6:.1f} MB; the budget is 25 MB"


def test_full_figures_from_shipped_results(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("paper_figures", ROOT / "paper_figs" / "figures.py")
    figs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figs)
    out = tmp_path / "full"
    # a fixed sample of the shipped rows keeps this under a minute; `make figures FULL=1` draws them all
    written = figs.build(
        figs.FULL, out_dir=out, runs_dir=tmp_path / "no_runs", shipped=figs.RESULTS, sample=3000
    )
    assert set(figs.FIGURES) <= set(written)
    for name in figs.FIGURES:
        assert (out / f"{name}.png").stat().st_size > 5000, name
    index = (out / "index.md").read_text()
    assert "`precision_full`: shipped results/precision_full" in index
    assert not (tmp_path / "no_runs").exists(), "the shipped path must not run a sweep"
