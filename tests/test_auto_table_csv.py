"""The selection table read without pandas (matroots.solvers.auto_csv, auto_table.SelectionTable): the
same values, bit for bit, and the same types as the pandas reader it replaced, for the shipped table and
for hand-written tables; and ``method="auto"`` never imports pandas."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _auto_table import table_entry

from matroots.solvers import auto_table
from matroots.study.tuning.select import TABLE_COLUMNS

REPO = Path(__file__).resolve().parents[1]


def _pandas_read(path: Path) -> pd.DataFrame:
    """The loader as it was (pandas), the reference: read_csv and the same post-processing."""
    df = pd.read_csv(path, keep_default_na=True, na_values=["NA"], dtype={"options": str})
    for col in ("choice", "runner_up", "best_effort", "method"):
        if col in df:
            df[col] = df[col].astype(object).where(df[col].notna(), "NA")
    df["options"] = df["options"].astype(object).where(df["options"].notna(), "")
    if "missing_cases" not in df:
        df["missing_cases"] = np.nan
    return df


def _same(ref: pd.DataFrame, tab: auto_table.SelectionTable) -> None:
    assert list(tab.columns) == list(ref.columns)
    for name in ref.columns:
        want, got = ref[name], tab.columns[name]
        if want.dtype.kind in "if":  # numeric: the same numpy dtype and the same bits
            assert got.dtype == want.dtype, name
            assert got.tobytes() == want.to_numpy().tobytes(), name
        else:  # text (pandas' str or object): Python str per entry, NaN where missing
            assert got.dtype == object, name
            for a, b in zip(got.tolist(), want.tolist(), strict=True):
                if isinstance(b, float) and math.isnan(b):
                    assert isinstance(a, float) and math.isnan(a), name
                else:
                    assert type(a) is type(b) and a == b, (name, a, b)
    pd.testing.assert_frame_equal(tab.df, ref)  # the study layer's DataFrame: dtypes included
    for i in range(len(ref)):  # a looked-up row: the values and types pandas' row gave
        want_row, got_row = ref.iloc[i].to_dict(), tab.row(i)
        assert list(got_row) == list(want_row)
        for k, b in want_row.items():
            a = got_row[k]
            assert type(a) is type(b), (i, k, a, b)
            assert a == b or (isinstance(b, float) and math.isnan(b) and math.isnan(a)), (i, k)


def test_the_shipped_table_reads_as_pandas_reads_it() -> None:
    path = auto_table.shipped_path("cpu")
    _same(_pandas_read(path), auto_table.SelectionTable.load(path))


def test_hand_written_tables_read_as_pandas_reads_them(tmp_path: Path) -> None:
    """Missing fields in text, label and numeric columns, JSON options with quotes, integer kappas (an
    int64 column), a column absent (missing_cases), an all-missing column."""
    cn = '{"scaling": "frobenius", "note": "a, \\"quoted\\" one"}'
    rows = [
        table_entry(1, 100, 1e-4, "eigh", "eigh", missing_cases=0),
        table_entry(100, 1e6, 1e-10, "NA", "NA", "", best_effort="NA", reason="none met it", missing_cases=2),
        table_entry(
            1e6, 1e8, 1e-4, "coupled_newton[scaling=frobenius]", "coupled_newton", cn, missing_cases=0
        ),
    ]
    frame = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    cases = {
        "mixed.csv": frame,
        "int_kappa.csv": frame.assign(kappa_lo=[1, 100, 1000000], kappa_hi=[100, 1000000, 100000000]),
        "old.csv": frame.drop(columns=["missing_cases"]),
        "all_missing.csv": frame.assign(runner_up=np.nan, families=np.nan, worst_error=np.nan),
    }
    for name, df in cases.items():
        path = tmp_path / name
        df.to_csv(path, index=False, na_rep="NA", float_format="%.6g")
        _same(_pandas_read(path), auto_table.SelectionTable.load(path))


def test_lookups_on_the_shipped_table_are_unchanged() -> None:
    """Every (dtype, p, n band, kappa band, target) cell of the shipped table: the lookup returns that
    row (the first of its cell, as the pandas lookup did)."""
    path = auto_table.shipped_path("cpu")
    ref, tab = _pandas_read(path), auto_table.SelectionTable.load(path)
    for i in range(0, len(ref), 7):
        r = ref.iloc[i]
        n = int(r["n_lo"])
        kappa = float(r["kappa_lo"]) * 1.5
        lk = tab.lookup(
            device="cpu", dtype=r["dtype"], n=n, kappa=kappa, p=int(r["p"]), target=float(r["target"])
        )
        cell = ref[
            (ref["dtype"] == r["dtype"]) & (ref["p"] == r["p"]) & (ref["n_lo"] <= n) & (n < ref["n_hi"])
            & (ref["kappa_lo"] <= kappa) & (kappa < ref["kappa_hi"]) & (ref["target"] == r["target"])
        ]  # fmt: skip
        assert lk.entry == cell.iloc[0].to_dict() or all(
            lk.entry[k] == v or (isinstance(v, float) and math.isnan(v))
            for k, v in cell.iloc[0].to_dict().items()
        ), i


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_method_auto_does_not_import_pandas(dtype: str) -> None:
    """A fresh interpreter: ``import matroots`` and a first ``method="auto"`` call on the shipped table
    (n = 128: inside its bands) leave pandas unimported."""
    code = (
        "import sys, torch, matroots\n"
        f"A = torch.eye(128, dtype=torch.{dtype}) * 2\n"
        "r = matroots.inverse_root(A, 4, method='auto')\n"
        "assert r.info['auto']['groups'][0]['status'] == 'chosen', r.info['auto']\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
