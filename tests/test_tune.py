"""matroots tune: the selection step, the CLI on a tiny config, regenerating the shipped table, and the
decision table of ``matroots report``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from matroots.solvers import auto_table as table
from matroots.study import report
from matroots.study.tuning import run, select, spec

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "experiments" / "configs"


def _spec(**kw) -> spec.TuneSpec:
    raw = {
        "name": "t",
        "targets": [1e-2, 1e-6],
        "n_bands": [8, 24, 48],
        "kappa_bands": [1, 1e3, 1e6],
        "candidates": [{"name": "eigh"}, {"name": "coupled_newton", "options": {"scaling": "frobenius"}}],
        "sweeps": [{"name": "s", "families": ["randsvd"], "n": [16]}],
    }
    raw.update(kw)
    return spec.from_dict(raw)


def _row(unit: str, solver: str, err: float, cost: float, *, n=16, kappa=10.0, failure="", dtype="fp64"):
    return {
        "unit": unit,
        "solver": solver,
        "method": solver.split("[")[0],
        "options": "{}",
        "family": "randsvd",
        "n": n,
        "kappa": kappa,
        "condition_number": kappa,
        "p": 2,
        "dtype": dtype,
        "device": "cpu",
        "failure": failure,
        "relative_forward_error": np.nan if failure else err,
        "gemm_equivalents": np.nan if failure else cost,
        "cpu_seconds": np.nan if failure else cost * 1e-6,
        "matmuls": 1.0,
    }


def test_candidate_option_axes_expand() -> None:
    s = _spec(
        candidates=[{"name": "coupled_newton", "options": {"scaling": ["optimal", "frobenius"], "tol": 1e-3}}]
    )
    assert [c.label for c in s.candidates] == [
        "coupled_newton[scaling=optimal,tol=0.001]",
        "coupled_newton[scaling=frobenius,tol=0.001]",
    ]
    assert s.candidates[0].solve_options == {"tol": 1e-3} and s.candidates[0].config_options == {
        "scaling": "optimal"
    }
    assert s.sweeps[0].name == "t-s" and len(s.sweeps[0].solvers) == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"targets": [2.0]},
        {"n_bands": [16]},
        {"kappa_bands": [10, 1]},
        {"margin": 0},
        {"typo": 1},
        {"device": "tpu"},
    ],
)
def test_bad_tune_configs_are_typed_errors(bad: dict) -> None:
    from matroots import MatrootsInputError

    with pytest.raises(MatrootsInputError):
        _spec(**bad)


def test_selection_cheapest_that_meets_target_on_every_case() -> None:
    # Cell n in [8, 24), kappa in [1, 1e3): two cases. "fast" is cheapest but misses 1e-6 on case b
    # and fails outright elsewhere; "slow" meets everything.
    rows = pd.DataFrame(
        [
            _row("a", "fast", 1e-9, 10.0),
            _row("b", "fast", 1e-4, 12.0),
            _row("a", "slow", 1e-12, 50.0),
            _row("b", "slow", 1e-12, 60.0),
            _row("c", "fast", 0, 0, kappa=1e4, failure="NotPositiveDefiniteError"),
            _row("c", "slow", 3e-3, 70.0, kappa=1e4),
        ]
    )
    tab, summ = select.select(rows, _spec())
    t = tab.set_index(["kappa_lo", "target"])
    loose, tight = t.loc[(1.0, 1e-2)], t.loc[(1.0, 1e-6)]
    assert loose["choice"] == "fast" and loose["runner_up"] == "slow"
    assert loose["median_gemm_equivalents"] == pytest.approx(11.0) and loose["worst_error"] == pytest.approx(
        1e-4
    )
    assert loose["runner_up_gemm_equivalents"] == pytest.approx(55.0)
    assert tight["choice"] == "slow" and tight["runner_up"] == "NA" and tight["cases"] == 2
    high_loose, high_tight = t.loc[(1e3, 1e-2)], t.loc[(1e3, 1e-6)]
    assert high_loose["choice"] == "slow" and high_loose["failure_rate"] == 0
    assert high_tight["choice"] == "NA" and np.isnan(high_tight["worst_error"])
    assert (
        "no candidate meets 1e-06" in high_tight["reason"] and "best is slow at 0.003" in high_tight["reason"]
    )
    assert summ["excluded_cases"] == 0
    # margin 0.01: a choice must reach 1e-4 for the 1e-2 target: "fast" (worst 1e-4) does, "slow" at
    # kappa >= 1e3 (3e-3) no longer does.
    tab2, _ = select.select(rows, _spec(margin=0.01))
    t2 = tab2.set_index(["kappa_lo", "target"])
    assert t2.loc[(1.0, 1e-2), "choice"] == "fast"  # 1e-4 <= 1e-4
    assert t2.loc[(1e3, 1e-2), "choice"] == "NA" and "with margin 0.01" in t2.loc[(1e3, 1e-2), "reason"]


def test_best_effort_is_the_most_accurate_candidate_that_solves_the_matrix_given() -> None:
    """Issue 22 class 5, the shape of the shipped fp32 cell n [24, 48) kappa [1e6, 1e8): eigh with
    clamping never fails but its error (0.7-0.9) is that of another matrix; coupled Newton is 20-200x
    more accurate and fails (NotConverged) on the one case whose rounded matrix is indefinite. The
    best effort is coupled Newton; clamping only where nothing else solved a case."""
    clamp = "eigh[rank_policy=clamp]"
    rows = [_row(u, clamp, e, 5.0, kappa=1e5) for u, e in (("a", 0.8), ("b", 0.7), ("c", 0.87))]
    rows += [_row(u, "cn", e, 9.0, kappa=1e5) for u, e in (("a", 0.03), ("b", 0.004))]
    rows += [_row("c", "cn", 0, 0, kappa=1e5, failure="NotConverged")]
    for r in rows:
        r["options"] = '{"rank_policy": "clamp"}' if r["solver"] == clamp else "{}"
    frame = pd.DataFrame(rows)
    tab, _ = select.select(frame, _spec())
    assert (tab["choice"] == "NA").all() and (tab["best_effort"] == "cn").all()
    assert tab["best_effort_error"].iloc[0] == pytest.approx(0.03)  # over the cases it did not fail
    assert "best is cn at 0.03, failing 33% of cases" in tab["reason"].iloc[0]
    only, _ = select.select(frame[frame["solver"] == clamp], _spec())
    assert (only["best_effort"] == clamp).all()


def test_selection_uses_kappa_of_matrix_solved_and_drops_cases_outside() -> None:
    rows = pd.DataFrame([_row("a", "fast", 1e-9, 1.0, kappa=10.0), _row("z", "fast", 1e-9, 1.0, n=100)])
    rows.loc[0, "condition_number"] = 5e3  # e.g. a low-rank case: kappa of A + eps I, not the nominal one
    tab, summ = select.select(rows, _spec())
    assert set(tab["kappa_lo"]) == {1e3} and summ["cases_outside_bands"] == 1


def _check_table_against_rows(tab: pd.DataFrame, rows: pd.DataFrame, ts: spec.TuneSpec) -> None:
    """Recompute every chosen entry from the sweep rows, independently of select()."""
    # a case run by two sweeps (same unit) counts once, with its first row (each run has its own
    # timing, so a duplicate would move the median cost)
    rows = rows.drop_duplicates(subset=["unit", "dtype", "solver"], keep="first")
    kap = select.case_kappa(rows)
    for _, e in tab.iterrows():
        cell = rows[
            (rows["dtype"] == e["dtype"])
            & (rows["p"] == e["p"])
            & (rows["n"] >= e["n_lo"])
            & (rows["n"] < e["n_hi"])
            & (kap >= e["kappa_lo"])
            & (kap < e["kappa_hi"])
        ]
        assert cell["unit"].nunique() == e["cases"]
        meets = {}
        for solver, g in cell.groupby("solver"):
            # a candidate must cover every case of the cell
            ok = (
                len(g) == e["cases"]
                and (g["failure"].fillna("") == "").all()
                and (g["relative_forward_error"] <= ts.margin * e["target"]).all()
            )
            meets[solver] = (ok, g["gemm_equivalents"].median())
        passing = {s: c for s, (ok, c) in meets.items() if ok}
        if e["choice"] == "NA":
            assert not passing and "best is" in e["reason"]
        else:
            assert e["choice"] in passing
            # the cheapest, or tied with it within cost_tolerance (then the first in the config's order)
            assert passing[e["choice"]] <= (1 + ts.cost_tolerance) * min(passing.values()) * (1 + 1e-9)
            assert e["worst_error"] <= ts.margin * e["target"]


def test_tune_cli_tiny_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from matroots import cli

    out = tmp_path / "tiny"
    args = ["tune", str(CONFIGS / "tune_tiny.toml"), "--out", str(out), "--no-progress", "--workers", "1"]
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "Cells won per candidate" in text and "Accuracy limits" in text
    tab = table.SelectionTable.load(out / "selection.csv").df
    assert list(tab.columns) == select.TABLE_COLUMNS
    prov = json.loads((out / "selection.json").read_text())
    for key in ("config", "config_hash", "git", "machine", "versions", "date", "gemm_timings", "command"):
        assert key in prov, key
    assert prov["gemm_timings"] and all(g["gemm_seconds"] > 0 for g in prov["gemm_timings"])
    ts = spec.load_config(CONFIGS / "tune_tiny.toml")
    rows = run.load_rows(ts, out)
    assert {"cpu_seconds", "gemm_seconds", "gemm_equivalents", "device"} <= set(rows.columns)
    ok = rows[rows["failure"] == ""]
    assert (ok["gemm_equivalents"] > 0).all()
    assert np.allclose(ok["gemm_equivalents"], ok["cpu_seconds"] / ok["gemm_seconds"])
    _check_table_against_rows(tab, rows, ts)
    # fp64 at kappa < 1e6 meets 1e-10 everywhere; fp32 cannot (u = 6e-8): NA with a reason.
    assert (tab[(tab["dtype"] == "fp64")]["choice"] != "NA").all()
    na = tab[(tab["dtype"] == "fp32") & (tab["target"] == 1e-10)]
    assert (na["choice"] == "NA").all() and na["reason"].str.contains("best is").all()
    # resume: nothing reruns, same table; without --resume the folder is refused.
    assert cli.main([*args, "--resume"]) == 0
    pd.testing.assert_frame_equal(table.SelectionTable.load(out / "selection.csv").df, tab)
    capsys.readouterr()
    assert cli.main(args) == 2
    assert "resume" in capsys.readouterr().err


def test_regenerate_shipped_table_from_its_config_on_a_small_grid(tmp_path: Path) -> None:
    """The shipped table's own config, shrunk to n = 16, two kappas, fp64/fp32, p = 2, regenerates a
    table of the same layout that method='auto' can read."""
    raw = tomllib.loads((CONFIGS / "tune_default.toml").read_text())
    raw["defaults"].update(dtypes=["fp64", "fp32"], p=[2])
    for sw in raw["sweeps"]:
        sw["n"] = [32] if sw["families"] == ["shampoo"] else [16]  # shipped factors: n in 10, 32, 64
        sw["kappa"] = sw["kappa"][:1] + sw["kappa"][-1:] if len(sw["kappa"]) > 1 else sw["kappa"]
        sw["families"] = sw["families"][:1]
        if "seeds" in sw:
            sw["seeds"] = sw["seeds"][:1]
        if "eps" in sw:
            sw["eps"] = sw["eps"][:1]
    ts = spec.from_dict(raw)
    tab, _ = run.run_tune(ts, tmp_path / "regen", workers=2, progress=False, install=tmp_path / "data")
    shipped = table.load_table()
    assert list(tab.columns) == list(shipped.df.columns)
    assert set(tab["target"]) == set(shipped.df["target"])
    installed = tmp_path / "data" / "selection_cpu.csv"
    assert installed.exists() and (tmp_path / "data" / "selection_cpu.json").exists()
    rows = run.load_rows(ts, tmp_path / "regen")
    _check_table_against_rows(tab, rows, ts)
    import matroots

    A = np.diag(np.geomspace(1.0, 1e-2, 16))
    res = matroots.inverse_root(A, 2, "auto", table=str(installed), target=1e-6)
    assert res.info["auto"]["groups"][0]["status"] == "chosen"
    assert str(installed) in res.info["auto"]["table"]


def test_the_shipped_table_names_only_code_that_exists() -> None:
    """Every dotted ``matroots.`` name in the shipped table's provenance (a rule it cites, say) resolves
    to a module and an attribute of it in this checkout (layer moves leave no dangling path behind)."""
    import importlib
    import re

    text = (table.DATA_DIR / "selection_cpu.json").read_text()
    names = set(re.findall(r"matroots(?:\.[A-Za-z_]\w*)+", text))
    for name in names:
        module, _, attr = name.rpartition(".")
        try:
            assert hasattr(importlib.import_module(module), attr), name
        except ModuleNotFoundError:
            assert importlib.import_module(name), name


def test_shipped_table_is_built_from_the_repositorys_config_with_the_matmul_only_candidates() -> None:
    """Issue 27: the shipped CPU table was tuned and selected from experiments/configs/tune_default.toml
    as it is now (its hash: an edited candidate list, option or grid changes it), and the SPD matmul-only
    iterations were candidates in it, so ``method="auto"`` can pick them where they win."""
    prov = table.load_table().provenance
    cfg = spec.load_config(CONFIGS / "tune_default.toml")
    assert prov["config_hash"] == cfg.config_hash()
    assert prov["candidates"] == [c.label for c in cfg.candidates]
    assert {"polar_express", "newton_schulz", "halley"} <= set(prov["candidates"])


def test_shipped_table_has_provenance_and_covers_the_documented_grid() -> None:
    t = table.load_table()
    prov = t.provenance
    assert prov["name"] == "tune_default" and prov["device"] == "cpu"
    assert prov["git"].get("commit") and prov["date"] and prov["machine"]
    assert set(t.df["dtype"]) == {"fp64", "fp32", "fp16", "bf16"}
    assert set(t.df["p"]) == {2, 4}
    assert t.df["n_lo"].min() == 12 and t.df["n_hi"].max() == 384
    # every NA has its reason; every choice its measured numbers
    na = t.df[t.df["choice"] == "NA"]
    assert na["reason"].str.startswith("no candidate meets").all()
    ch = t.df[t.df["choice"] != "NA"]
    assert (ch["worst_error"] <= 0.5 * ch["target"]).all()
    assert ch["median_gemm_equivalents"].notna().all() and (ch["failure_rate"] == 0).all()


def test_report_decision_table() -> None:
    rows = []
    for dtype in ("bf16", "fp64", "fp32"):
        for kappa in (1e0, 1e3, 1e6, 1e9, 1e12):
            for solver, err in (("eigh", 1e-3 if dtype != "bf16" else 3e-2), ("cn", 1e-1)):
                r = _row(f"{kappa}", solver, err * max(1.0, kappa / 1e9), 5.0, kappa=kappa, dtype=dtype)
                r.update(eps=0.0, eps_mode="absolute", seconds=1e-3, iterations=3)
                rows.append(r)
    df = pd.DataFrame(rows)
    edges = report.kappa_band_edges(df["kappa"])
    assert edges == [1.0, 1e6, np.inf]  # each band holds >= 2 of the sweep's kappas
    b = report.best_solver_table(df, 1e-2)
    assert list(b["dtype"].unique()) == ["fp64", "fp32", "bf16"]  # precision order
    assert list(b["kappa_band"][b["dtype"] == "fp64"]) == ["[1e0,1e6) (1e0,1e3)", ">=1e6 (1e6,1e9,1e12)"]
    fp64 = b[b["dtype"] == "fp64"].set_index("kappa_band")
    assert fp64.iloc[0]["best_solver"] == "eigh"
    assert (
        fp64.iloc[1]["best_solver"] == "NA"
        and "no solver meets 0.01 at fp64 p=2 kappa >=1e6" in fp64.iloc[1]["reason"]
    )
    bf = b[b["dtype"] == "bf16"]
    assert (bf["best_solver"] == "NA").all()
    assert bf.iloc[0]["reason"] == "no solver meets 0.01 at bf16 p=2 kappa [1e0,1e6); best is eigh at 0.03"
    text = report.format_report(df, 1e-2)
    assert "NA" in text and "nan" not in text.lower()
    assert "none" not in b["best_solver"].tolist()


def test_cells_missing_cases_are_flagged_never_silent(caplog: pytest.LogCaptureFixture) -> None:
    # The config asks for cases a, b (kappa band [1, 1e3)) and c (band [1e3, 1e6)); b crashed (its rows
    # are WorkerCrashed: no data, not a failure) and c never ran.
    planned = pd.DataFrame(
        [
            {"unit": u, "dtype": "fp64", "n": 16, "p": 2, "kappa": k}
            for u, k in (("a", 10.0), ("b", 10.0), ("c", 1e4))
        ]
    )
    rows = pd.DataFrame(
        [
            _row("a", "fast", 1e-9, 10.0),
            _row("a", "slow", 1e-12, 50.0),
            _row("b", "fast", 0, 0, failure="WorkerCrashed"),
            _row("b", "slow", 0, 0, failure="WorkerCrashed"),
        ]
    )
    with caplog.at_level("WARNING", logger="matroots.tune"):
        tab, summ = select.select(rows, _spec(), planned=planned)
    assert "fewer cases than the config asks for" in caplog.text
    assert summ["incomplete_cells"] == 2 and summ["missing_cases"] == 2
    t = tab.set_index(["kappa_lo", "target"])
    low = t.loc[(1.0, 1e-2)]
    assert low["choice"] == "fast" and low["cases"] == 1 and low["missing_cases"] == 1  # b is no failure
    assert "built from 1 of 2 cases" in low["reason"]
    high = t.loc[(1e3, 1e-2)]
    assert high["choice"] == "NA" and high["cases"] == 0 and high["missing_cases"] == 1
    assert "no case of" in high["reason"] and "resume" in high["reason"]
    # All cases present: nothing flagged.
    full = pd.concat([rows.iloc[:2], rows.iloc[:2].assign(unit="b")], ignore_index=True)
    tab, summ = select.select(full, _spec(), planned=planned.iloc[:2])
    assert (tab["missing_cases"] == 0).all() and summ["incomplete_cells"] == 0
