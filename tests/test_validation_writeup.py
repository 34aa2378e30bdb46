"""docs/validation.md (paper_figs/validation_findings.py) and the validation figures of `make figures FULL=1`,
on a tiny protocol run shipped by the real ship function: blocks regenerate, `--check` fails when the page
and the data disagree, a partial set says PARTIAL per task and "not yet run" where final seeds are missing,
and the figures are written readable at 16 cm."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # the test writes files; the library itself never forces a backend

import pytest
from _figfonts import record_fonts
from _tiny_validation import tiny_protocol

from matroots.study.validation import config, ship
from matroots.study.validation import run as vrun

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"paper_{name}", ROOT / "paper_figs" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


V = _module("validation_findings")


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny protocol run (digits, 2 trials, final seeds 1 and 2) shipped complete, and a copy shipped
    partial: AdamW's final seeds removed."""
    tmp = tmp_path_factory.mktemp("vwrite")
    cfg = tmp / "ptiny.toml"
    cfg.write_text(tiny_protocol(trials=2, steps=10, eval_every=5))
    vrun.run_validation(config.load_config(cfg), tmp / "run", workers=1, progress=False)
    ship.ship(tmp / "run", tmp / "full" / "validation", config=cfg)
    shutil.copytree(tmp / "run", tmp / "cut")
    for part in (tmp / "cut" / "parts").iterdir():
        if part.name.startswith(("digits.s1.adamw.", "digits.s2.adamw.")):
            part.unlink()
    ship.ship(tmp / "cut", tmp / "partial" / "validation", config=cfg, allow_partial=True)
    doc = tmp / "validation.md"
    doc.write_text((ROOT / "docs" / "validation.md").read_text())
    return {"full": tmp / "full", "partial": tmp / "partial", "doc": doc, "tmp": tmp}


def test_blocks_regenerate_and_check_fails_when_page_and_data_disagree(sets: dict[str, Path]) -> None:
    doc, full = sets["doc"], sets["full"]
    assert V.main(["--write", "--doc", str(doc), "--results", str(full)]) == 0
    text = doc.read_text()
    assert V.main(["--check", "--doc", str(doc), "--results", str(full)]) == 0
    # every block carries the shipped numbers: digits' table against AdamW, the chosen points, the reading
    prot = ship.load(full / "validation")["protocol"]
    adamw = prot[(prot["task"] == "digits") & (prot["config"] == "adamw")].iloc[0]
    assert f"{adamw['final_test_loss']:.4f}" in text
    assert "| adamw | chosen | 2 |" in text  # AdamW's own row: ratio 1 (its interval: resampled seeds)
    assert "**digits**: complete; tuning trials" in text
    assert "best of 2 trials" in text and "fixed (not tuned)" in text
    assert "Shampoo vs AdamW in CPU time: shampoo-eigh " in text
    # a hand edit inside a block, or data that changed under the page, fails the check
    begin = V.F._marker("validation_time")
    edited = doc.parent / "edited.md"
    edited.write_text(text.replace(begin + "\n", begin + "\nhand-typed 0.5x\n", 1))
    assert V.main(["--check", "--doc", str(edited), "--results", str(full)]) == 1
    assert V.main(["--check", "--doc", str(doc), "--results", str(sets["partial"])]) == 1
    assert V.main(["--write", "--doc", str(edited), "--results", str(full)]) == 0
    assert edited.read_text() == text


def test_a_partial_set_says_so_per_task_and_names_what_is_not_yet_run(sets: dict[str, Path]) -> None:
    blocks = V.blocks(sets["partial"])
    time, hp, reading = blocks["validation_time"], blocks["validation_hparams"], blocks["validation_reading"]
    assert "**PARTIAL**: the numbers below change" in time
    assert "**digits**: **PARTIAL**;" in time and "(AdamW's 0/2)" in time
    assert (
        "Time to target: not yet run (the target and every ratio need AdamW's final seeds, 0/2 done)" in time
    )
    assert "**digits** (PARTIAL)" in hp and "best of 2 trials" in hp  # tuning done, finals missing
    assert "Not yet run (no final seeds of AdamW): digits." in reading
    assert "on 0 of 0 tasks measured" in reading
    # a task of the config with no row at all (the set shipped before the run reached it)
    cfg = sets["tmp"] / "more.toml"
    cfg.write_text(tiny_protocol(trials=2, steps=10, eval_every=5, tasks=("lsq",)))
    s = V.load(sets["full"])
    s.cover = V.coverage(s.runs, config.load_config(cfg))
    assert "**digits**: complete;" in V.time_to_target(s)
    assert "**lsq**: **not yet run**; tuning trials 0/" in V.time_to_target(s)
    assert "**lsq**: not yet run." in V.tuned_hparams(s)
    assert "Not yet run (no final seeds of AdamW): lsq." in V.reading(s)


def test_an_entry_that_chose_nothing_is_named_and_not_waited_for(sets: dict[str, Path]) -> None:
    """An absent peer (package not installed: every trial 'Unavailable') or an entry whose every trial
    failed has no final seeds to run; the task is complete without them and the line names the entry.
    Until its tuning is done it is still waited for."""
    grid = config.load_config(sets["tmp"] / "ptiny.toml")
    runs = V.load(sets["full"]).runs
    soap = runs["config"] == "heavyball_soap"
    for why, failure in (("absent", "Unavailable"), ("failed", "Diverged")):
        cut = runs[~(soap & (runs["phase"] == "final"))].copy()
        cut.loc[cut["config"] == "heavyball_soap", "failure"] = failure
        cov = V.coverage(cut, grid)["digits"]
        assert cov.complete and cov.unchosen == {"heavyball_soap": why}
        assert cov.final_total == 3 * len(grid.protocol.final_seeds)  # adamw, shampoo-eigh, soap-published
        assert f"heavyball_soap: {why} (no final seeds)." in cov.line()
        one_trial = cut[~((cut["config"] == "heavyball_soap") & (cut["trial"] == cut["trial"].max()))]
        cov = V.coverage(one_trial, grid)["digits"]  # a trial not yet run: maybe it succeeds
        assert not cov.complete and cov.unchosen == {}


def test_no_shipped_set_says_not_yet_shipped(tmp_path: Path) -> None:
    blocks = V.blocks(tmp_path)
    assert all(t.startswith("_Not yet shipped") for t in blocks.values())


def test_the_repository_page_matches_its_shipped_set() -> None:
    assert V.main(["--check"]) == 0


def test_full_figures_include_the_validation_curves_readable_at_page_width(
    sets: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.image as mimg

    from matroots.study import figure_style

    fonts = record_fonts(monkeypatch)  # the smallest font of each figure as saved
    figs = _module("figures")
    for which in ("full", "partial"):
        out = sets["tmp"] / f"figs_{which}"
        written, index = figs.shipped_validation_figures(sets[which], out)
        assert set(written) == set(figs.SHIPPED_VALIDATION_FIGURES)
        assert all(("PARTIAL" in line) == (which == "partial") for line in index)
        for name in figs.SHIPPED_VALIDATION_FIGURES:
            png, pdf = out / f"{name}.png", out / f"{name}.pdf"
            assert png.stat().st_size > 5000 and pdf.read_bytes()[:5] == b"%PDF-", name
            width_in = mimg.imread(png).shape[1] / 130  # figure_style.save writes the PNG at 130 dpi
            assert width_in <= figure_style.PAGE_WIDTH_IN + 0.02, (name, width_in)
            assert fonts[name] >= figure_style.MIN_FONT_PT, (name, fonts[name])
    written, index = figs.shipped_validation_figures(sets["tmp"] / "nothing", sets["tmp"] / "none")
    assert written == {} and "no shipped validation set" in index[0]


def test_a_runs_figures_are_byte_identical_when_rewritten(sets: dict[str, Path]) -> None:
    """`matroots validate` writes RUN/figures through figure_style.save: fixed metadata (no creation
    date in the PDF), so rewriting the same tables gives the same files."""
    from matroots.study.validation import figures as vfig

    tables = ship.load(sets["full"] / "validation", repo_root=ROOT)
    first = vfig.save_all(tables, sets["tmp"] / "fig_a")
    again = vfig.save_all(tables, sets["tmp"] / "fig_b")
    assert [p.name for p in first] == [p.name for p in again] and len(first) == 4
    for a, b in zip(first, again, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert all(b"CreationDate" not in p.read_bytes() for p in first if p.suffix == ".pdf")
