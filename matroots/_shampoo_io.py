"""Reading and writing Kronecker factor dumps of the Shampoo optimizer.

The .npz layout (version 1) is documented in :mod:`matroots.matrices`, which re-exports these functions,
and the ``"shampoo"`` test-matrix family (:func:`shampoo_factors`) serves the curated set shipped in
``matroots/data/shampoo_factors``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import tempfile
from typing import Any

import numpy as np

SHAMPOO_FORMAT_VERSION = 1
Meta = dict[str, Any]


def _sym(A: np.ndarray) -> np.ndarray:
    return 0.5 * (A + A.T)


def save_shampoo_factors(
    path: str | os.PathLike[str], factors: list[tuple[np.ndarray, dict[str, Any]]], *, compress: bool = False
) -> None:
    """Write Kronecker factors in the documented .npz layout (version 1), atomically.

    ``compress=True`` writes a deflated .npz (``np.savez_compressed``; the loader reads both).

    ``factors`` is a list of (matrix, meta) pairs; each meta must have the keys param, block, dim,
    step, beta2, eps (further JSON-serialisable keys are kept). The file appears complete or not at all
    (written to a temporary file in the same folder, then ``os.replace``).
    """
    required = ("param", "block", "dim", "step", "beta2", "eps")
    arrays: dict[str, np.ndarray] = {}
    metas: list[str] = []
    for k, (F, meta) in enumerate(factors):
        missing = [key for key in required if key not in meta]
        if missing:
            raise ValueError(f"factor {k}: meta lacks {missing}")
        F = np.asarray(F, dtype=np.float64)
        if F.ndim != 2 or F.shape[0] != F.shape[1]:
            raise ValueError(f"factor {k}: expected a square matrix, got shape {F.shape}")
        arrays[f"factor_{k}"] = F
        metas.append(json.dumps({**meta, "param": str(meta["param"])}, sort_keys=True))
    arrays["meta"] = np.array(metas, dtype=np.str_)
    arrays["format_version"] = np.array(SHAMPOO_FORMAT_VERSION)
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            (np.savez_compressed if compress else np.savez)(fh, **arrays)  # type: ignore[arg-type]
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def load_shampoo_factors(path: str | os.PathLike[str]) -> list[tuple[np.ndarray, Meta]]:
    """Load Kronecker factors dumped by Shampoo (layout in the module docstring).

    ``path`` is one ``.npz`` file or a folder of them (read in name order). Each factor comes back as
    ``(A, meta)`` with ``A`` float64 and ``meta`` holding the stored keys plus family="shampoo", n,
    source (file name), index, symmetric, eigenvalues (float64 ``eigvalsh``) and kappa
    (lambda_max / lambda_min of those, inf when lambda_min <= 0: the factors are only semidefinite).
    """
    p = pathlib.Path(path)
    files = sorted(p.glob("*.npz")) if p.is_dir() else [p]
    if not files:
        raise FileNotFoundError(f"no .npz files in {p}")
    out: list[tuple[np.ndarray, Meta]] = []
    for f in files:
        with np.load(f, allow_pickle=False) as z:
            version = int(z["format_version"]) if "format_version" in z.files else SHAMPOO_FORMAT_VERSION
            if version != SHAMPOO_FORMAT_VERSION:
                raise ValueError(f"{f}: unsupported Shampoo dump format_version {version}")
            if "meta" not in z.files:
                raise ValueError(f"{f}: missing the 'meta' array of the Shampoo dump layout")
            metas = [json.loads(str(s)) for s in z["meta"]]
            for k, stored in enumerate(metas):
                name = f"factor_{k}"
                if name not in z.files:
                    raise ValueError(f"{f}: meta lists {len(metas)} factors but {name} is missing")
                A = np.array(z[name], dtype=np.float64)
                sym = bool(np.array_equal(A, A.T))
                lam = np.linalg.eigvalsh(_sym(A)) if A.size else np.zeros(0)
                kappa = float(lam[-1] / lam[0]) if lam.size and lam[0] > 0 else math.inf
                meta: Meta = {
                    **stored,
                    "family": "shampoo",
                    "n": A.shape[0],
                    "source": f.name,
                    "index": k,
                    "symmetric": sym,
                    "eigenvalues": lam,
                    "kappa": kappa,
                    "kappa_source": "computed",
                }
                out.append((A, meta))
    return out


SHAMPOO_DATA = pathlib.Path(__file__).resolve().parent / "data" / "shampoo_factors"
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
    from .matrices import _check_n, _meta, _rng, exact_spectrum  # helpers of the families (no cycle)

    n = _check_n(n)
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
        k = int(_rng(rng, "shampoo").integers(len(pool)))
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
    meta = _meta("shampoo", n, lam, "computed", **keep)
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
