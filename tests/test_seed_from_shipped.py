"""Seeding a sweep from a shipped set (``matroots sweep CONFIG --out RUN --resume --seed-from results/NAME``,
matroots.study.seeding): a run folder lost with its machine costs nothing. A run seeded from a partial
ship and resumed ships the rows an uninterrupted run ships; the seeded units' rows are the source's;
the ship keeps the source's commits, dates and CPU totals; a set of another kind or config, or with
tampered rows, is refused before anything is written; parts already in the run folder are kept."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from _tiny_sweep import TINY

from matroots.study import grid, runner, seeding, shipped, sweep

ROOT = Path(__file__).resolve().parents[1]
KEY = ["family", "n", "kappa", "seed", "p", "eps", "eps_mode", "dtype", "solver"]
#: per-solve timings: measured on this machine, so they differ between two runs of the same unit
TIMED = ("seconds", "cpu_seconds", "gemm_equivalents")
FAKE_COMMIT = "0" * 40
FAKE_CREATED = "2020-01-02T03:04:05+00:00"
FAKE_CPU = 1234.5


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(KEY, kind="stable").reset_index(drop=True)


def _unit_of(df: pd.DataFrame) -> pd.Series:
    return df[list(seeding.UNIT_FIELDS)].astype(object).apply(tuple, axis=1)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An uninterrupted tiny run and its ship, and a partial ship of half its units (whose provenance
    names a commit, a creation date and a CPU total of its own, to be found again downstream)."""
    tmp = tmp_path_factory.mktemp("seed")
    cfg = tmp / "tiny.toml"
    cfg.write_text(TINY)
    spec = grid.load_config(cfg)
    sweep.run_sweep(spec, tmp / "full_run", workers=1, progress=False)
    shipped.ship(tmp / "full_run", tmp / "full", config=cfg)
    half = tmp / "half_run"
    shutil.copytree(tmp / "full_run", half)
    parts = sorted((half / "parts").glob("*.parquet"))
    for f in parts[: len(parts) // 2]:
        f.unlink()
    (half / "results.parquet").unlink()
    shipped.ship(half, tmp / "half", config=cfg, allow_partial=True)
    prov_path = tmp / "half" / shipped.PROVENANCE
    prov = json.loads(prov_path.read_text())
    prov.update(commits=[FAKE_COMMIT], created=FAKE_CREATED, unit_cpu_seconds=FAKE_CPU)
    prov["starts"] = [{"event": "start", "started": FAKE_CREATED, "finished": None, "command": "earlier"}]
    prov_path.write_text(json.dumps(prov))  # the provenance is not hashed; its rows are
    return {"tmp": tmp, "cfg": cfg, "full": tmp / "full", "half": tmp / "half"}


@pytest.fixture(scope="module")
def seeded_ship(sets: dict[str, Path]) -> tuple[Path, dict]:
    """The partial set seeded into a fresh run folder, the rest computed, and the run shipped."""
    run = sets["tmp"] / "seeded_run"
    lines: list[str] = []
    sweep.run_sweep(
        grid.load_config(sets["cfg"]), run, workers=1, progress=False, resume=True,
        seed_from=sets["half"], on_seeded=lines.append,
    )  # fmt: skip
    assert len(lines) == 1 and lines[0].startswith("seeded 2 units (8 rows)"), lines
    rec = shipped.ship(run, sets["tmp"] / "reshipped", config=sets["cfg"])
    return run, rec


def test_seeded_resume_ships_the_uninterrupted_runs_rows(sets, seeded_ship) -> None:
    run, rec = seeded_ship
    prov = runner.read_provenance(run)
    assert prov["runs"][-1]["stats"]["ran"] == 2 and prov["runs"][-1]["stats"]["skipped"] == 2
    assert rec["complete"] and rec["units_done"] == 4
    new = shipped.load(sets["tmp"] / "reshipped")
    full = shipped.load(sets["full"])
    src = shipped.load(sets["half"])
    assert list(new.columns) == list(full.columns)
    # every row: the uninterrupted run's, column for column and dtype for dtype (timings aside)
    a, b = _sorted(new), _sorted(full)
    for c in a.columns:
        if c not in TIMED:
            pd.testing.assert_series_equal(a[c], b[c], check_categorical=False, obj=c)
        assert a[c].dtype == b[c].dtype or isinstance(a[c].dtype, pd.CategoricalDtype), c
    # the seeded units' rows: the source's bit for bit, timings included
    seeded = new[_unit_of(new).isin(set(_unit_of(src)))]
    assert len(seeded) == len(src) == 8
    s, t = _sorted(seeded), _sorted(src)
    for c in t.columns:
        assert isinstance(s[c].dtype, pd.CategoricalDtype) == isinstance(t[c].dtype, pd.CategoricalDtype), c
        if isinstance(t[c].dtype, pd.CategoricalDtype):
            assert s[c].astype(object).equals(t[c].astype(object)), c
        else:  # int64 in the source may only widen to float64 where later rows leave it empty
            assert s[c].dtype == t[c].dtype or (t[c].dtype.kind == "i" and s[c].dtype.kind == "f"), c
            pd.testing.assert_series_equal(s[c].astype(t[c].dtype), t[c], check_exact=True, obj=c)
    # the seeded parts say so: their unit key and the sha256 of the rows they came from
    parts = runner.read_parts(run)
    marked = parts[parts[seeding.SEEDED_FROM].notna()]
    sha = shipped.read_provenance(sets["half"])["sha256"]["rows"]
    assert set(marked[seeding.SEEDED_FROM]) == {sha} and marked["unit"].nunique() == 2


def test_ship_of_a_seeded_run_keeps_the_sources_commits_dates_and_cpu(sets, seeded_ship) -> None:
    run, rec = seeded_ship
    assert FAKE_COMMIT in rec["commits"] and len(rec["commits"]) >= 1
    assert rec["created"] == FAKE_CREATED
    assert rec["starts"][0]["command"] == "earlier"
    assert [s["event"] for s in rec["starts"]][:2] == ["start", "seeded"]
    computed = runner.read_parts(run)
    computed = computed[computed[seeding.SEEDED_FROM].isna()].drop_duplicates("unit")
    assert len(computed) == 2
    # all the source's units are seeded (share 1): its total, plus this run's two measured units
    assert rec["unit_cpu_seconds"] == pytest.approx(FAKE_CPU + computed["unit_cpu_seconds"].sum(), rel=1e-12)
    src_prov = shipped.read_provenance(sets["half"])
    assert rec["unit_wall_seconds"] == pytest.approx(
        src_prov["unit_wall_seconds"] + computed["unit_wall_seconds"].sum(), rel=1e-12
    )
    (source,) = rec["seeded"]["sources"]
    assert rec["seeded"]["units"] == 2 and source["share"] == 1.0
    assert source["sha256"] == src_prov["sha256"]["rows"] and source["created"] == FAKE_CREATED


def test_refuses_another_config_tampered_rows_and_a_non_sweep_set(sets, tmp_path: Path) -> None:
    spec = grid.load_config(sets["cfg"])
    other = tmp_path / "other.toml"
    other.write_text(TINY.replace("seeds = [0]", "seeds = [0, 1]"))
    with pytest.raises(seeding.SeedSourceError, match="config hash"):
        sweep.run_sweep(grid.load_config(other), tmp_path / "r1", progress=False, seed_from=sets["half"])
    tampered = tmp_path / "tampered"
    shutil.copytree(sets["half"], tampered)
    df = pd.read_parquet(tampered / shipped.ROWS)
    df.loc[0, "relative_forward_error"] = 0.5
    df.to_parquet(tampered / shipped.ROWS)
    with pytest.raises(seeding.SeedSourceError, match="not the file its provenance describes"):
        sweep.run_sweep(spec, tmp_path / "r2", progress=False, seed_from=tampered)
    other_kind = tmp_path / "validation"
    shutil.copytree(sets["half"], other_kind)
    prov = json.loads((other_kind / shipped.PROVENANCE).read_text())
    (other_kind / shipped.PROVENANCE).write_text(json.dumps({**prov, "kind": "validation"}))
    with pytest.raises(seeding.SeedSourceError, match="'validation' results, not sweep"):
        sweep.run_sweep(spec, tmp_path / "r3", progress=False, seed_from=other_kind)
    with pytest.raises(seeding.SeedSourceError, match=r"no provenance\.json"):
        sweep.run_sweep(spec, tmp_path / "r4", progress=False, seed_from=tmp_path)
    assert not any((tmp_path / r).exists() for r in ("r1", "r2", "r3", "r4")), "a refusal wrote a run folder"


def test_cli_refusal_is_one_line_and_exit_2(sets, tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text(TINY.replace("seeds = [0]", "seeds = [0, 1]"))
    run = tmp_path / "run"
    cmd = ["sweep", str(other), "--out", str(run), "--resume", "--seed-from", str(sets["half"])]
    p = subprocess.run(
        [sys.executable, "-m", "matroots.cli", *cmd, "--no-progress"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "SeedSourceError" in p.stderr and "config hash" in p.stderr
    assert not run.exists()


def _open(sets: dict[str, Path], run: Path) -> grid.GridSpec:
    spec = grid.load_config(sets["cfg"])
    sweep.prepare_out_dir(spec, run, resume=True)
    return spec


def test_seeding_keeps_the_parts_a_run_folder_already_holds(sets, tmp_path: Path) -> None:
    run = tmp_path / "run"
    spec = _open(sets, run)
    src = seeding.read_source(sets["half"], spec)
    by_unit, _ = seeding.unit_rows(src, spec)
    kept, corrupt = sorted(by_unit)
    (run / "parts").mkdir()
    mine = pd.DataFrame([{"unit": kept, "failure": "", "marker": "computed here"}])
    runner.atomic_write_parquet(mine, runner.part_path(run, kept))
    before = runner.part_path(run, kept).read_bytes()
    runner.part_path(run, corrupt).write_bytes(b"not parquet")  # unreadable: replaced, not kept
    stats = seeding.seed(run, spec, src)
    assert runner.part_path(run, kept).read_bytes() == before
    assert (stats.units_written, stats.units_present, stats.units_incomplete) == (1, 1, 0)
    assert len(list((run / runner.QUARANTINE).iterdir())) == 1
    assert pd.read_parquet(runner.part_path(run, corrupt))[seeding.SEEDED_FROM].notna().all()
    again = seeding.seed(run, spec, src)  # a second seeding writes nothing and records one source
    assert (again.units_written, again.units_present) == (0, 2)
    (event,) = runner.read_provenance(run)[seeding.SEEDED]
    assert event["commits"] == [FAKE_COMMIT] and len(event["seedings"]) == 2


def _reshipped(sets: dict[str, Path], dest: Path, rows: pd.DataFrame) -> Path:
    """A set holding ``rows`` under the partial set's provenance (its sha256 recomputed)."""
    prov = shipped.read_provenance(sets["half"])
    prov.pop("sha256", None)
    shipped.write_set(dest, {"rows": rows}, prov)
    return dest


def test_incomplete_units_are_skipped_and_unknown_rows_refused(sets, tmp_path: Path) -> None:
    spec = _open(sets, tmp_path / "run")
    rows = shipped.load(sets["half"])
    short = _reshipped(sets, tmp_path / "short", rows.drop(index=rows.index[0]))
    stats = seeding.seed(tmp_path / "run", spec, seeding.read_source(short, spec))
    assert (stats.units_written, stats.units_incomplete, stats.units_in_source) == (1, 1, 2)
    doubled = _reshipped(sets, tmp_path / "doubled", pd.concat([rows, rows.iloc[:1]], ignore_index=True))
    _, incomplete = seeding.unit_rows(seeding.read_source(doubled, spec), spec)
    assert len(incomplete) == 1
    odd = rows.copy()
    odd.loc[odd.index[0], "kappa"] = 3.0
    stray = _reshipped(sets, tmp_path / "stray", odd)
    with pytest.raises(seeding.SeedSourceError, match="1 of its 8 rows are no unit of the grid"):
        seeding.seed(tmp_path / "run", spec, seeding.read_source(stray, spec))
