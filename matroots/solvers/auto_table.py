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
    """A selection table (rows of :data:`matroots.study.tuning.select.TABLE_COLUMNS`) with its provenance."""

    def __init__(self, df: pd.DataFrame, provenance: dict[str, Any] | None = None, source: str = "") -> None:
        self.df = df.reset_index(drop=True)
        self.provenance = provenance or {}
        self.source = source
        self._memo: dict[tuple, tuple[pd.DataFrame | None, str]] = {}
        self._edges: dict[tuple, np.ndarray] = {}
        self._lookups: dict[tuple, Lookup] = {}
        # what method="auto" derived from this table per question (matroots.solvers.auto._Plan)
        self.plans: dict[tuple, Any] = {}
        self.targets = sorted(float(t) for t in df["target"].unique()) if len(df) else []

    @classmethod
    def load(cls, path: str | Path) -> SelectionTable:
        """Read ``<name>.csv`` and its ``<name>.json`` provenance (when present)."""
        import pandas as pd  # on the first table read: `import matroots` stays free of pandas

        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"no selection table {p}; run `matroots tune CONFIG --out DIR` first")
        try:
            df = pd.read_csv(p, keep_default_na=True, na_values=["NA"], dtype={"options": str})
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as exc:
            detail = " ".join(str(exc).split())
            raise InvalidArgumentError(
                f"{p} is not a selection table CSV (written by `matroots tune`): {detail}"
            ) from None
        missing = [c for c in LOOKUP_COLUMNS if c not in df.columns]
        if missing:
            raise InvalidArgumentError(
                f"{p} is not a selection table CSV (written by `matroots tune`): "
                f"it lacks the columns {missing}"
            )
        for col in ("choice", "runner_up", "best_effort", "method"):
            if col in df:
                df[col] = df[col].astype(object).where(df[col].notna(), "NA")
        df["options"] = df["options"].astype(object).where(df["options"].notna(), "")
        if "missing_cases" not in df:  # a table written before the column existed: not recorded
            df["missing_cases"] = np.nan
        jp = p.with_suffix(".json")
        prov = json.loads(jp.read_text()) if jp.exists() else {}
        return cls(df, prov, str(p))

    def describe(self) -> str:
        """One line naming the table: source, date, commit."""
        g = self.provenance.get("git", {})
        return (
            f"{self.source or 'table'} ({self.provenance.get('name', '?')}, {self.provenance.get('date', '?')}, "
            f"commit {str(g.get('commit', '?'))[:10]})"
        )

    def _rows_for(self, device: str, dtype: Any, n: int, p: Any) -> tuple[pd.DataFrame | None, str]:
        """The rows of the (device, dtype, p, n band) or (None, why there are none); memoised."""
        key = (device, precision.info(dtype).name, int(n), float(p))
        if key not in self._memo:
            self._memo[key] = self._find_rows(device, dtype, n, p)
        return self._memo[key]

    def kappa_edges(self, *, device: str, dtype: Any, n: int, p: Any) -> np.ndarray:
        """Sorted kappa band edges of the cells of (device, dtype, n, p) (empty outside the table):
        problems whose kappa falls between the same two edges get the same lookup."""
        key = (device, precision.info(dtype).name, int(n), float(p))
        if key not in self._edges:
            dn, _ = self._rows_for(device, dtype, n, p)
            self._edges[key] = (
                np.empty(0)
                if dn is None
                else np.unique(
                    np.concatenate([dn["kappa_lo"].to_numpy(float), dn["kappa_hi"].to_numpy(float)])
                )
            )
        return self._edges[key]

    def _find_rows(self, device: str, dtype: Any, n: int, p: Any) -> tuple[pd.DataFrame | None, str]:
        name = precision.info(dtype).name
        t = self.df
        if not len(t):
            return None, "the selection table is empty"
        d = t[t["device"] == device]
        if d.empty:
            return None, f"the table has no rows for device {device!r}"
        d = d[d["dtype"] == name]
        if d.empty:
            return None, f"the table has no rows for dtype {name}"
        pf = float(p)
        if not pf.is_integer() or int(pf) not in set(d["p"].astype(int)):
            return None, f"p={p} is not in the table (tuned p: {sorted(set(d['p'].astype(int)))})"
        d = d[d["p"].astype(int) == int(pf)]
        dn = d[(d["n_lo"] <= n) & (n < d["n_hi"])]
        if dn.empty:
            return (
                None,
                f"n={n} is outside the tuned n bands [{int(d['n_lo'].min())}, {int(d['n_hi'].max())})",
            )
        return dn, ""

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
        dn, why = self._rows_for(device, dtype, n, p)
        if dn is None:
            return Lookup("outside", why)
        if not math.isfinite(kappa):
            return Lookup("outside", "the estimated kappa is not finite (matrix not positive definite?)")
        dk = dn[(dn["kappa_lo"] <= kappa) & (kappa < dn["kappa_hi"])]
        if dk.empty:
            return Lookup(
                "outside",
                f"kappa~{kappa:.2g} is outside the tuned kappa bands at n={n} "
                f"[{dn['kappa_lo'].min():g}, {dn['kappa_hi'].max():g})",
            )
        usable = [x for x in sorted(dk["target"].unique()) if x <= target * (1 + 1e-12)]
        if not usable:
            return Lookup(
                "outside",
                f"target {target:g} is tighter than every tuned target (tightest {dk['target'].min():g})",
            )
        tu = float(max(usable))
        row = dk[dk["target"] == tu].iloc[0].to_dict()
        if row["choice"] == "NA":
            return Lookup("unattainable", str(row["reason"]), row, tu)
        return Lookup("chosen", str(row["reason"]), row, tu)


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
