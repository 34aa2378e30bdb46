"""The ``"shampoo"`` test-matrix family: real Kronecker factors of the Shampoo optimizer.

:func:`shampoo_factors` serves the curated set shipped in ``matroots/data/shampoo_factors``. The .npz
dump layout (version 1), its reader and writer live in :mod:`matroots.core.factor_dump` (re-exported here
and by :mod:`matroots.study.matrices`).
"""

from __future__ import annotations

import functools
import math
import pathlib

import numpy as np

from ..core.factor_dump import SHAMPOO_FORMAT_VERSION, Meta, load_shampoo_factors, save_shampoo_factors
from .family_helpers import check_n, exact_spectrum, make_meta, rng_for

SHAMPOO_DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "shampoo_factors"
"""The curated Kronecker factors shipped with matroots (``experiments/dump_factors.py --curate``)."""


@functools.lru_cache(maxsize=4)
def _shipped_factors(path: str) -> tuple[tuple[np.ndarray, Meta], ...]:
    return tuple(load_shampoo_factors(path))


def shampoo_factors(
    n: int,
    kappa: float | None = None,
    rng: np.random.Generator | int | None = None,
    *,
    task: str | None = None,
    stage: str | None = None,
    index: int | None = None,
    path: str | None = None,
) -> tuple[np.ndarray, Meta]:
    """A real Shampoo Kronecker factor of order ``n`` from the shipped set (or the dumps at ``path``).

    The shipped set (``matroots/data/shampoo_factors``, provenance in its ``PROVENANCE.json``) holds
    fp32-accumulated factors, stored exactly as float64, of three real tasks (``task``: "digits" MLP,
    "bytes_lm" byte-level transformer on the stdlib sources, "wide1" MLP with a 1-wide output) at an
    early (rank-deficient), mid and late step (``stage``). Among the factors of order ``n`` matching
    ``task`` / ``stage``, ``index`` picks one (in file order), else ``rng`` (a seed or Generator) draws
    one, else the first is taken. ``kappa`` cannot be prescribed (recorded as ``kappa_requested``);
    ``meta["kappa"]`` is the factor's own, from high-precision eigenvalues (inf when singular), and
    the dump's keys (task, stage, step, param, block, dim, factor_dtype, ...) are passed through.
    """
    n = check_n(n)
    pool = [
        (A, m)
        for A, m in _shipped_factors(str(path or SHAMPOO_DATA))
        if A.shape[0] == n
        and (task is None or m.get("task") == task)
        and (stage is None or m.get("stage") == stage)
    ]
    if not pool:
        orders = sorted({A.shape[0] for A, _ in _shipped_factors(str(path or SHAMPOO_DATA))})
        raise ValueError(
            f"no shipped Shampoo factor of order n={n} (task={task!r}, stage={stage!r}); orders available: {orders}"
        )
    if index is not None:
        if not (isinstance(index, int | np.integer) and 0 <= int(index) < len(pool)):
            raise ValueError(f"index must be in 0..{len(pool) - 1} for n={n}, got {index!r}")
        k = int(index)
    elif rng is not None:
        k = int(rng_for(rng, "shampoo").integers(len(pool)))
    else:
        k = 0
    A, stored = pool[k]
    A = A.copy()
    lam = exact_spectrum(A)
    keep = {
        key: v
        for key, v in stored.items()
        if key not in ("eigenvalues", "kappa", "kappa_source", "family", "n")
    }
    keep["file"] = keep.pop("source", None)
    keep["symmetric"] = bool(np.array_equal(A, A.T))
    meta = make_meta("shampoo", n, lam, "computed", **keep)
    meta["kappa"] = float(lam[-1] / lam[0]) if lam[0] > 0 else math.inf
    meta["pool_size"], meta["pool_index"] = len(pool), k
    if kappa is not None:
        meta["kappa_requested"] = float(kappa)
    return A, meta


__all__ = [
    "SHAMPOO_DATA",
    "SHAMPOO_FORMAT_VERSION",
    "load_shampoo_factors",
    "save_shampoo_factors",
    "shampoo_factors",
]
