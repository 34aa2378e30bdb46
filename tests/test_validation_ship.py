"""Shipped validation results: compact files whose provenance matches the repository's config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from matroots.study.shipped import ShippedResultsError
from matroots.study.validation import config, figures, report, ship
from matroots.study.validation import run as vrun

ROOT = Path(__file__).resolve().parents[1]
TINY = "experiments/configs/validate_tiny.toml"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ship")
    grid = config.load_config(ROOT / TINY)
    vrun.run_validation(grid, tmp / "run", workers=2, progress=False)
    ship.ship(tmp / "run", tmp / "results", config=ROOT / TINY)
    return tmp


def test_shipped_set_holds_the_report_and_its_provenance_matches_the_repo_config(shipped: Path) -> None:
    tables = ship.load(shipped / "results", repo_root=ROOT)
    prov = ship.read_provenance(shipped / "results")
    grid = config.load_config(ROOT / TINY)
    assert prov["config_hash"] == grid.config_hash() and prov["name"] == "validate_tiny"
    assert prov["complete"] and prov["units_done"] == prov["units_total"]
    assert prov["commits"] and prov["starts"][0]["machine"]
    assert set(tables["curves"].columns) <= set(ship.CURVE_COLUMNS) | {"phase"}
    assert "shampoo-eigh" in set(tables["protocol"]["config"])
    assert "chosen" in set(tables["protocol"]["status"])
    fig = figures.held_out_curves(tables["curves"], tables["protocol"], "cpu_s")
    assert len(fig.axes[0].lines) >= 3  # AdamW, Shampoo, SOAP (published) and the target
    assert "soap-published" in report.write_report({**tables}, shipped)


def test_a_changed_config_or_file_is_refused(shipped: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "experiments" / "configs").mkdir(parents=True)
    src = (ROOT / TINY).read_text()
    (repo / TINY).write_text(src.replace("trials = 2", "trials = 3"))
    with pytest.raises(ShippedResultsError, match="now hashes"):
        ship.load(shipped / "results", repo_root=repo)
    bad = tmp_path / "bad"
    shutil.copytree(shipped / "results", bad)
    prov = json.loads((bad / "provenance.json").read_text())
    prov["sha256"]["runs"] = "0" * 64
    (bad / "provenance.json").write_text(json.dumps(prov))
    with pytest.raises(ShippedResultsError, match="not the file"):
        ship.load(bad)


def test_shipping_a_run_of_another_config_is_refused(shipped: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text((ROOT / TINY).read_text().replace("trials = 2", "trials = 3"))
    with pytest.raises(ShippedResultsError, match="hashes to"):
        ship.ship(shipped / "run", tmp_path / "out", config=other)


def test_every_shipped_validation_set_matches_its_config_in_the_repo() -> None:
    for prov in sorted((ROOT / "results").glob("validation*/provenance.json")):
        ship.load(prov.parent, repo_root=ROOT)
