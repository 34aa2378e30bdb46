"""Selection tables on disk and their lookup (what ``method="auto"`` reads at run time).

The study layer builds and writes these tables (:mod:`matroots.study.tuning.select`); this module only
reads them. The package ships ``matroots/data/selection_cpu.csv`` (+ ``selection_cpu.json``, its provenance),
written by ``make tune`` = ``matroots tune experiments/configs/tune_default.toml --out
runs/tune_default --resume --install``. A table for another device kind is another
``selection_<device>.csv`` in the same folder, found by :func:`shipped`.
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core import precision
from ..core.errors import InvalidArgumentError
from .auto_csv import read_columns

if TYPE_CHECKING:
    import pandas as pd

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
# the columns a lookup reads (of matroots.study.tuning.select.TABLE_COLUMNS)
LOOKUP_COLUMNS = (
    "device", "dtype", "p", "n_lo", "n_hi", "kappa_lo", "kappa_hi", "target", "choice", "method", "options",
    "best_effort", "reason",
)  # fmt: skip


def shipped_path(device: str = "cpu") -> Path:
    """Path of the shipped table for a device kind ("cpu", "cuda", ...)."""
    return DATA_DIR / f"selection_{device}.csv"


@dataclass(frozen=True)
class Lookup:
    """The outcome of one table lookup.

    ``status``: ``"chosen"`` (a candidate met ``target_used`` on every tuning case of the cell),
    ``"unattainable"`` (the cell exists but no candidate met it; ``entry`` is still the row, whose
    ``best_effort`` is the most accurate candidate) or ``"outside"`` (no cell: ``reason`` says why).
    """

    status: str
    reason: str
    entry: dict[str, Any] | None = None
    target_used: float | None = None


class SelectionTable:
    """A selection table (rows of :data:`matroots.study.tuning.select.TABLE_COLUMNS`) with its provenance.

    ``columns``: name -> numpy column, as :func:`matroots.solvers.auto_csv.read_columns` types them
    (int64, float64, or object arrays of text), in the file's order. The lookups run on these columns:
    the solver layer never imports pandas; :attr:`df` is the same table as a DataFrame, for the study
    layer."""

    def __init__(
        self, columns: dict[str, np.ndarray], provenance: dict[str, Any] | None = None, source: str = ""
    ) -> None:
        self.columns = columns
        self.provenance = provenance or {}
        self.source = source
        self.n_rows = len(next(iter(columns.values()))) if columns else 0
        self._memo: dict[tuple, tuple[np.ndarray | None, str]] = {}
        self._edges: dict[tuple, np.ndarray] = {}
        self._lookups: dict[tuple, Lookup] = {}
        self._df: pd.DataFrame | None = None
        # what method="auto" derived from this table per question (matroots.solvers.auto._Plan)
        self.plans: dict[tuple, Any] = {}
        self.targets = sorted({float(t) for t in columns["target"]}) if self.n_rows else []

    @classmethod
    def load(cls, path: str | Path) -> SelectionTable:
        """Read ``<name>.csv`` and its ``<name>.json`` provenance (when present), without pandas
        (:mod:`matroots.solvers.auto_csv`)."""
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"no selection table {p}; run `matroots tune CONFIG --out DIR` first")
        cols = read_columns(p)
        missing = [c for c in LOOKUP_COLUMNS if c not in cols]
        if missing:
            raise InvalidArgumentError(
                f"{p} is not a selection table CSV (written by `matroots tune`): "
                f"it lacks the columns {missing}"
            )
        for col in ("choice", "runner_up", "best_effort", "method"):  # a missing label reads "NA"
            if col in cols:
                cols[col] = _filled(cols[col], "NA")
        cols["options"] = _filled(cols["options"], "")
        if "missing_cases" not in cols:  # a table written before the column existed: not recorded
            cols["missing_cases"] = np.full(len(cols["options"]), np.nan)
        jp = p.with_suffix(".json")
        prov = json.loads(jp.read_text()) if jp.exists() else {}
        return cls(cols, prov, str(p))

    @property
    def df(self) -> pd.DataFrame:
        """The table as a pandas DataFrame (built on first use; imports pandas): text columns as
        pandas' string dtype, the label and options columns as objects, as ``read_csv`` gave them."""
        if self._df is None:
            import pandas as pd

            frame = pd.DataFrame({k: v for k, v in self.columns.items()})
            for col in ("choice", "runner_up", "best_effort", "method", "options"):
                if col in frame:
                    frame[col] = frame[col].astype(object)
            self._df = frame
        return self._df

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as a dict of Python values (int, float, str; a missing text field is NaN)."""
        return {k: v[i].item() if isinstance(v[i], np.generic) else v[i] for k, v in self.columns.items()}

    def first_row_where(self, column: str, value: Any) -> dict[str, Any] | None:
        """The first row whose ``column`` equals ``value``, or None."""
        hit = np.flatnonzero(self.columns[column] == value)
        return self.row(int(hit[0])) if len(hit) else None

    def describe(self) -> str:
        """One line naming the table: source, date, commit."""
        g = self.provenance.get("git", {})
        return (
            f"{self.source or 'table'} ({self.provenance.get('name', '?')}, {self.provenance.get('date', '?')}, "
            f"commit {str(g.get('commit', '?'))[:10]})"
        )

    def _rows_for(self, device: str, dtype: Any, n: int, p: Any) -> tuple[np.ndarray | None, str]:
        """The row indices of the (device, dtype, p, n band) or (None, why there are none); memoised."""
        key = (device, precision.info(dtype).name, int(n), float(p))
        if key not in self._memo:
            self._memo[key] = self._find_rows(device, dtype, n, p)
        return self._memo[key]

    def kappa_edges(self, *, device: str, dtype: Any, n: int, p: Any) -> np.ndarray:
        """Sorted kappa band edges of the cells of (device, dtype, n, p) (empty outside the table):
        problems whose kappa falls between the same two edges get the same lookup."""
        key = (device, precision.info(dtype).name, int(n), float(p))
        if key not in self._edges:
            idx, _ = self._rows_for(device, dtype, n, p)
            c = self.columns
            self._edges[key] = (
                np.empty(0)
                if idx is None
                else np.unique(
                    np.concatenate([c["kappa_lo"][idx].astype(float), c["kappa_hi"][idx].astype(float)])
                )
            )
        return self._edges[key]

    def _find_rows(self, device: str, dtype: Any, n: int, p: Any) -> tuple[np.ndarray | None, str]:
        name = precision.info(dtype).name
        c = self.columns
        if not self.n_rows:
            return None, "the selection table is empty"
        idx = np.flatnonzero(c["device"] == device)
        if not len(idx):
            return None, f"the table has no rows for device {device!r}"
        idx = idx[c["dtype"][idx] == name]
        if not len(idx):
            return None, f"the table has no rows for dtype {name}"
        pf = float(p)
        ps = c["p"][idx].astype(int)
        if not pf.is_integer() or int(pf) not in set(ps.tolist()):
            return None, f"p={p} is not in the table (tuned p: {sorted(set(ps.tolist()))})"
        idx = idx[ps == int(pf)]
        n_lo, n_hi = c["n_lo"][idx], c["n_hi"][idx]
        hit = idx[(n_lo <= n) & (n < n_hi)]
        if not len(hit):
            return None, f"n={n} is outside the tuned n bands [{int(n_lo.min())}, {int(n_hi.max())})"
        return hit, ""

    def coverage(self, *, device: str, dtype: Any, n: int, p: Any) -> str:
        """Empty when the table has cells for (device, dtype, n, p) (kappa then decides), else why not."""
        return self._rows_for(device, dtype, n, p)[1]

    def lookup(self, *, device: str, dtype: Any, n: int, kappa: float, p: Any, target: float) -> Lookup:
        """The row for one problem: the cell containing (device, dtype, n, kappa, p) at the loosest
        table target that is still <= ``target`` (meeting a tighter target meets the requested one).

        Memoised per (device, dtype, n, p, kappa band, target): a Shampoo run asks the same
        questions every round."""
        edges = self.kappa_edges(device=device, dtype=dtype, n=n, p=p)
        band = int(np.searchsorted(edges, kappa, side="right")) if math.isfinite(kappa) else -1
        key = (device, precision.info(dtype).name, int(n), float(p), band, float(target))
        hit = self._lookups.get(key)
        if hit is None:
            hit = self._lookups[key] = self._lookup(device, dtype, n, kappa, p, target)
        return hit

    def _lookup(self, device: str, dtype: Any, n: int, kappa: float, p: Any, target: float) -> Lookup:
        idx, why = self._rows_for(device, dtype, n, p)
        if idx is None:
            return Lookup("outside", why)
        if not math.isfinite(kappa):
            return Lookup("outside", "the estimated kappa is not finite (matrix not positive definite?)")
        c = self.columns
        lo, hi = c["kappa_lo"][idx], c["kappa_hi"][idx]
        dk = idx[(lo <= kappa) & (kappa < hi)]
        if not len(dk):
            return Lookup(
                "outside",
                f"kappa~{kappa:.2g} is outside the tuned kappa bands at n={n} [{lo.min():g}, {hi.max():g})",
            )
        targets = c["target"][dk]
        usable = [x for x in sorted(set(targets.tolist())) if x <= target * (1 + 1e-12)]
        if not usable:
            return Lookup(
                "outside",
                f"target {target:g} is tighter than every tuned target (tightest {targets.min():g})",
            )
        tu = float(max(usable))
        row = self.row(int(dk[targets == tu][0]))
        if row["choice"] == "NA":
            return Lookup("unattainable", str(row["reason"]), row, tu)
        return Lookup("chosen", str(row["reason"]), row, tu)


def _filled(col: np.ndarray, fill: str) -> np.ndarray:
    """``col`` as objects with its missing entries (NaN) replaced by ``fill`` (pandas:
    ``astype(object).where(notna, fill)``)."""
    out = col.astype(object)
    for i, v in enumerate(out):
        if isinstance(v, float) and math.isnan(v):
            out[i] = fill
    return out


def options_of(entry_options: str) -> dict[str, Any]:
    """The options dict of a table row (JSON text in the CSV)."""
    return json.loads(entry_options) if entry_options else {}


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime: float) -> SelectionTable:
    return SelectionTable.load(path)


_RECENT: dict[str, tuple[float, SelectionTable]] = {}
_RECHECK_SECONDS = 1.0


def load_table(path: str | Path | None = None, device: str = "cpu") -> SelectionTable:
    """The table at ``path`` (default: the shipped table of ``device``), cached per file version (the
    file's modification time is checked at most once a second)."""
    key = f"{path}|{device}"
    hit = _RECENT.get(key)
    now = time.monotonic()
    if hit is not None and now - hit[0] < _RECHECK_SECONDS:
        return hit[1]
    p = Path(path) if path is not None else shipped_path(device)
    if not p.exists():
        if path is None:
            raise InvalidArgumentError(
                f"no shipped selection table for device {device!r} ({p}); generate one with "
                "`matroots tune experiments/configs/tune_default.toml --out runs/NAME --install`"
            )
        raise FileNotFoundError(f"no selection table {p}")
    tab = _load_cached(str(p), p.stat().st_mtime)
    _RECENT[key] = (now, tab)
    return tab


__all__ = ["DATA_DIR", "Lookup", "SelectionTable", "load_table", "options_of", "shipped_path"]
