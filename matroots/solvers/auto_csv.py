"""The selection table's CSV read without pandas, for the solver layer (``method="auto"``'s first call
imported pandas, ~0.5 s, to read ~1700 rows; issue 29 item 7). The study layer writes the tables with
pandas (``to_csv(index=False, na_rep="NA")``) and reads them through
:attr:`matroots.solvers.auto_table.SelectionTable.df`, a DataFrame of the same columns.

The columns come out as ``pandas.read_csv(path, keep_default_na=True, na_values=["NA"],
dtype={"options": str})`` types them (tests/test_auto_table_csv.py checks every row and column of the
shipped table and of the tests' tables against pandas, dtypes included):

* a field in pandas' default NA strings (:data:`NA_STRINGS`, ``pandas._libs.parsers.STR_NA_VALUES``)
  is missing;
* a column is int64 where every field is an integer and none is missing, else float64 where every
  present field is a number (Python's ``float``: correctly rounded, as pandas' parser is for the
  shortest-repr numbers ``to_csv`` writes), else text (an object array of ``str``, a missing field
  NaN); ``options`` is always text;
* quoting is the csv module's default dialect (``"`` quotes, doubled inside), which ``to_csv`` writes;
  blank lines are skipped.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np

from ..core.errors import InvalidArgumentError

#: pandas' default NA strings (pandas._libs.parsers.STR_NA_VALUES, pandas 3.1), "NA" among them
NA_STRINGS = frozenset(
    {
        "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A",
        "NA", "NULL", "NaN", "None", "n/a", "nan", "null",
    }
)  # fmt: skip
_INT = re.compile(r"[+-]?[0-9]+\Z")
TEXT_COLUMNS = frozenset({"options"})  # read as text whatever they hold (pandas: dtype={"options": str})


def read_columns(path: str | Path) -> dict[str, np.ndarray]:
    """The columns of a CSV file (header order), typed as the module docstring says. Raises
    InvalidArgumentError for a file that is not such a CSV (not text, empty, or a row whose field
    count is not the header's)."""
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8") as f:
            rows = [r for r in csv.reader(f) if r]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InvalidArgumentError(
            f"{p} is not a selection table CSV (written by `matroots tune`): {' '.join(str(exc).split())}"
        ) from None
    if not rows:
        raise InvalidArgumentError(
            f"{p} is not a selection table CSV (written by `matroots tune`): it is empty"
        )
    header, body = rows[0], rows[1:]
    for i, r in enumerate(body):
        if len(r) != len(header):
            raise InvalidArgumentError(
                f"{p} is not a selection table CSV (written by `matroots tune`): line {i + 2} has "
                f"{len(r)} fields, the header {len(header)}"
            )
    fields = list(zip(*body, strict=True)) if body else [()] * len(header)
    return {name: _typed(name, list(col)) for name, col in zip(header, fields, strict=True)}


def _typed(name: str, col: list[str]) -> np.ndarray:
    missing = [x in NA_STRINGS for x in col]
    if name not in TEXT_COLUMNS:
        present = [x for x, m in zip(col, missing, strict=True) if not m]
        if not any(missing) and present and all(_INT.match(x) for x in present):
            return np.array([int(x) for x in col], dtype=np.int64)
        numbers = _floats(col, missing)
        if numbers is not None:
            return numbers
    out = np.empty(len(col), dtype=object)
    out[:] = [math.nan if m else x for x, m in zip(col, missing, strict=True)]
    return out


def _floats(col: list[str], missing: list[bool]) -> np.ndarray | None:
    """float64 where every present field is a number pandas would read as one, else None (Python's
    ``float`` also takes "1_000" and surrounding blanks, which pandas reads as text)."""
    if any(not m and ("_" in x or x != x.strip()) for x, m in zip(col, missing, strict=True)):
        return None
    try:
        return np.array(
            [math.nan if m else float(x) for x, m in zip(col, missing, strict=True)], dtype=np.float64
        )
    except ValueError:
        return None


__all__ = ["NA_STRINGS", "TEXT_COLUMNS", "read_columns"]
