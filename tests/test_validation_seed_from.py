"""Seeding a validation run from a shipped validation set (``matroots validate CONFIG --out RUN --resume
--seed-from results/validation``, matroots.study.validation.seed): a run folder lost with its machine
costs only the units the set does not hold. On a tiny protocol run (digits, one trial each, final seeds
1 and 2): a run seeded from its complete ship trains nothing and its tables and ship are the
source's; seeded from a partial ship it trains only the missing units and ends with the uninterrupted
run's tables (clock columns aside); a set shipped before ``parts.parquet`` (results/validation at
11b2e82) still seeds, to the same ship; each refusal is one typed line, and nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from _tiny_validation import tiny_protocol

from matroots import cli
from matroots.study import provenance, runner, seeding
from matroots.study.seed_record import SEEDED_FROM
from matroots.study.validation import config, seed, ship
from matroots.study.validation import run as vrun

ROOT = Path(__file__).resolve().parents[1]
#: protocol columns computed from the curves' CPU clock (cumulative cpu_s): they differ between two runs
#: of the same units, as seed.CLOCK_COLUMNS do in the parts
CPU_DERIVED = ("cpu_to_target_s", "cpu_ratio", "cpu_ratio_lo", "cpu_ratio_hi")
FAKE_COMMIT = "f" * 40
TABLES = ("runs", "curves", "chosen", "protocol")
AUTO_REMOVED = "digits.s1.adamw.", "digits.s2.adamw."  # AdamW's two final-seed units


def _resume(
    grid: config.ValidationGrid, out: Path, source: Path, lines: list[str]
) -> dict[str, pd.DataFrame]:
    prepare = seed.seeder(source, grid, out, lines.append)
    return vrun.run_validation(grid, out, workers=1, progress=False, resume=True, prepare=prepare)


def _stats(run: Path) -> dict:
    return runner.read_provenance(run)["runs"][-1]["stats"]


def _without_clocks(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    drop = {*seed.CLOCK_COLUMNS, *CPU_DERIVED, SEEDED_FROM}
    cols = sorted(c for c in df.columns if c not in drop)
    return df[cols].sort_values([k for k in keys if k in cols], kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run and its ship; a partial ship without AdamW's final seeds (its provenance
    naming another commit); and the complete ship as a set of before parts.parquet."""
    tmp = tmp_path_factory.mktemp("vseed")
    cfg = tmp / "ptiny.toml"
    cfg.write_text(tiny_protocol(trials=1, steps=4, eval_every=2))
    vrun.run_validation(config.load_config(cfg), tmp / "run", workers=1, progress=False)
    ship.ship(tmp / "run", tmp / "full", config=cfg)
    shutil.copytree(tmp / "run", tmp / "cut")
    for part in (tmp / "cut" / runner.PARTS).iterdir():
        if part.name.startswith(AUTO_REMOVED):
            part.unlink()
    ship.ship(tmp / "cut", tmp / "partial", config=cfg, allow_partial=True)
    prov_path = tmp / "partial" / "provenance.json"
    prov = json.loads(prov_path.read_text())
    prov["commits"] = [FAKE_COMMIT]
    prov_path.write_text(json.dumps(prov))  # the provenance is not hashed; its files are
    shutil.copytree(tmp / "full", tmp / "old")
    (tmp / "old" / f"{ship.PARTS}.parquet").unlink()
    prov = json.loads((tmp / "old" / "provenance.json").read_text())
    del prov["sha256"][ship.PARTS]
    (tmp / "old" / "provenance.json").write_text(json.dumps(prov))
    return {"tmp": tmp, "cfg": cfg, "run": tmp / "run", "full": tmp / "full", "partial": tmp / "partial",
            "old": tmp / "old", "units": len(runner.done_units(tmp / "run"))}  # fmt: skip


@pytest.fixture(scope="module")
def grid(sets: dict[str, Path]) -> config.ValidationGrid:
    return config.load_config(sets["cfg"])


def test_seeded_from_the_complete_ship_trains_nothing_and_has_the_source_runs_tables(sets, grid) -> None:
    out, lines = sets["tmp"] / "seeded_full", []
    tables = _resume(grid, out, sets["full"], lines)
    assert _stats(out)["ran"] == 0
    assert len(lines) == 1 and lines[0].startswith(f"seeded {sets['units']} units ("), lines
    source = vrun.collect(sets["run"])
    for name in TABLES:  # the seeded rows are the source's bits: clocks included, nothing excluded
        pd.testing.assert_frame_equal(tables[name].drop(columns=[SEEDED_FROM], errors="ignore"), source[name])
    assert (tables["runs"][SEEDED_FROM] == ship.read_provenance(sets["full"])["sha256"]["runs"]).all()
    rec = ship.ship(out, sets["tmp"] / "reshipped_full", config=sets["cfg"])
    for name in (*ship.FILES, ship.PARTS):
        a = pd.read_parquet(sets["tmp"] / "reshipped_full" / f"{name}.parquet")
        pd.testing.assert_frame_equal(a, pd.read_parquet(sets["full"] / f"{name}.parquet"))
    assert rec["complete"] and rec["seeded"]["units"] == sets["units"]
    assert set(ship.read_provenance(sets["full"])["commits"]) <= set(rec["commits"])


def test_a_partial_ship_resumed_trains_only_its_missing_units_and_ends_as_the_uninterrupted_run(
    sets, grid
) -> None:
    out, lines = sets["tmp"] / "seeded_partial", []
    tables = _resume(grid, out, sets["partial"], lines)
    stats = _stats(out)
    assert stats["ran"] == 2  # AdamW's final seeds 1 and 2, nothing else
    assert lines[0].startswith(f"seeded {sets['units'] - 2} units (")
    # the set's units were computed at another commit: seeding says so (and records it), as the sweep's
    # seeding does, and does not refuse (a set made over sessions always predates the code resuming it)
    here = provenance.git().get("commit")
    if here:
        assert f"computed at commit(s) {FAKE_COMMIT[:12]}, this code is at {here[:12]}" in lines[0]
    source = vrun.collect(sets["run"])
    keys = ["task", "config", "phase", "trial", "seed", "step"]
    for name in TABLES:  # clocks of the two recomputed units (and what the protocol derives from them) aside
        pd.testing.assert_frame_equal(
            _without_clocks(tables[name], keys), _without_clocks(source[name], keys)
        )
    seeded = tables["runs"][tables["runs"][SEEDED_FROM].notna()]
    assert len(seeded) == sets["units"] - 2 and not seeded["unit"].str.startswith(AUTO_REMOVED).any()
    rec = ship.ship(out, sets["tmp"] / "reshipped_partial", config=sets["cfg"])
    assert rec["complete"] and FAKE_COMMIT in rec["commits"]
    assert rec["seeded"]["units"] == sets["units"] - 2 and rec["seeded"]["sources"][0]["share"] == 1.0


def test_a_set_shipped_before_parts_parquet_seeds_to_the_same_ship(sets, grid) -> None:
    out, lines = sets["tmp"] / "seeded_old", []
    _resume(grid, out, sets["old"], lines)
    assert _stats(out)["ran"] == 0 and lines[0].startswith(f"seeded {sets['units']} units (")
    ship.ship(out, sets["tmp"] / "reshipped_old", config=sets["cfg"])
    for name in ship.FILES:  # its tuning curves and unshipped columns are gone; the shipped tables are not
        a = pd.read_parquet(sets["tmp"] / "reshipped_old" / f"{name}.parquet")
        pd.testing.assert_frame_equal(a, pd.read_parquet(sets["full"] / f"{name}.parquet"))


def test_the_shipped_results_validation_still_loads_and_maps_onto_its_config() -> None:
    tables = ship.load(ROOT / "results" / "validation", repo_root=ROOT)
    # the config it was shipped from (validate_full_8sobol.toml: the first protocol, kept for this set)
    full = config.load_config(ROOT / ship.read_provenance(ROOT / "results" / "validation")["config"])
    src = seed.read_source(ROOT / "results" / "validation", full)
    by_unit, incomplete = seed.unit_rows(src, full)
    assert len(by_unit) == len(tables["runs"]) and not incomplete


def test_parts_already_in_the_run_folder_are_kept_when_they_agree(sets, grid) -> None:
    out = sets["tmp"] / "agree"
    shutil.copytree(sets["run"], out)  # the very run the set was shipped from
    stats = seed.seed(out, grid, seed.read_source(sets["full"], grid))
    assert stats.units_written == 0 and stats.units_present == sets["units"]


def _conflicting_folder(sets: dict[str, Path], name: str) -> Path:
    out = sets["tmp"] / name
    (out / runner.PARTS).mkdir(parents=True)
    part = sorted((sets["run"] / runner.PARTS).glob("digits.s1.shampoo.*.parquet"))[0]
    df = pd.read_parquet(part)
    df.loc[df["table"] == "run", "final_val_loss"] += 1e-9  # another run's result for the same unit
    df.to_parquet(out / runner.PARTS / part.name)
    return out


def test_parts_that_disagree_with_the_set_are_refused_and_nothing_is_written(sets, grid) -> None:
    out = _conflicting_folder(sets, "conflict")
    with pytest.raises(seed.SeedConflictError, match=r"1 of its parts disagree .* run column final_val_loss"):
        seed.seeder(sets["full"], grid, out)
    assert not (out / "provenance.json").exists() and len(list((out / runner.PARTS).iterdir())) == 1


def test_a_set_of_another_config_or_with_a_file_not_its_provenances_is_refused(sets, grid, tmp_path) -> None:
    other = tmp_path / "other.toml"
    other.write_text(tiny_protocol(trials=2, steps=4, eval_every=2))
    with pytest.raises(
        seeding.SeedSourceError, match=r"config hash .* but the validation's config hashes to"
    ):
        seed.read_source(sets["full"], config.load_config(other))
    bad = tmp_path / "bad"
    shutil.copytree(sets["full"], bad)
    prov = json.loads((bad / "provenance.json").read_text())
    prov["sha256"][ship.PARTS] = "0" * 64
    (bad / "provenance.json").write_text(json.dumps(prov))
    with pytest.raises(
        seeding.SeedSourceError, match=r"parts\.parquet is not the file its provenance describes"
    ):
        seed.read_source(bad, grid)
    prov["kind"] = "sweep"
    (bad / "provenance.json").write_text(json.dumps(prov))
    with pytest.raises(seeding.SeedSourceError, match="'sweep' results, not validation"):
        seed.read_source(bad, grid)


def test_the_command_line_seeds_and_refuses_in_one_line(sets, capsys) -> None:
    out = sets["tmp"] / "cli"
    argv = ["validate", str(sets["cfg"]), "--out", str(out), "--resume", "--workers", "1", "--no-progress"]
    assert cli.main([*argv, "--seed-from", str(sets["full"])]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"seeded {sets['units']} units (") and f"into {out}; 0 already there" in printed
    assert _stats(out)["ran"] == 0
    conflict = _conflicting_folder(sets, "cli_conflict")
    argv[3] = str(conflict)
    assert cli.main([*argv, "--seed-from", str(sets["full"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("matroots validate: SeedConflictError: cannot seed"), err
    assert not (conflict / "provenance.json").exists()
