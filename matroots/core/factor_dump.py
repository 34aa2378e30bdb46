"""The Kronecker-factor dump format (.npz layout, version 1): written by the Shampoo optimizer
(:func:`shampoo.Shampoo.dump_factors`), read by the accuracy studies (the ``"shampoo"`` test-matrix
family of :mod:`matroots.study.matrices`).

A neutral core module (numpy only): both the optimizer and the study layer import it, neither imports
the other for it.

Shampoo factor dumps (.npz layout, version 1)
---------------------------------------------
The Shampoo optimizer writes one ``.npz`` file per dump step, e.g. ``factors_step00000100.npz``
(:func:`save_shampoo_factors` writes this layout atomically). It holds:

* ``factor_0``, ``factor_1``, ..., ``factor_{K-1}``: the Kronecker factor statistics, each a
  float64 array of shape (d, d) (symmetric positive semidefinite; *before* adding epsilon);
* ``meta``: a 1-D unicode array (``np.str_``, so ``allow_pickle=False`` reads it) of K JSON strings,
  entry k describing ``factor_k`` with the keys

  - ``"param"`` (str): the parameter's name (or its index in the param groups, as a string),
  - ``"block"`` (int): the block index within the parameter after blocking,
  - ``"dim"`` (int): which tensor dimension of the block this factor preconditions (0 = left, ...),
  - ``"step"`` (int): the optimizer step of the dump,
  - ``"beta2"`` (float): the factor's exponential moving-average coefficient (1.0 = plain sum),
  - ``"eps"`` (float): the epsilon the optimizer adds before taking the root,

  and optionally any further keys (e.g. ``"shape"``, ``"root_p"``), which the loader passes through;
* ``format_version``: optional int scalar, 1.

:func:`load_shampoo_factors` reads one such file, or every ``*.npz`` in a folder (sorted by name).

:func:`load_shampoo_factors` reads one such file, or every ``*.npz`` in a folder (sorted by name).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import tempfile
import zipfile
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
        try:
            out.extend(_load_one(f))
        except zipfile.BadZipFile as exc:
            raise ValueError(f"{f}: not a readable .npz archive ({exc})") from exc
    return out


def _load_one(f: pathlib.Path) -> list[tuple[np.ndarray, Meta]]:
    out: list[tuple[np.ndarray, Meta]] = []
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


__all__ = ["SHAMPOO_FORMAT_VERSION", "Meta", "load_shampoo_factors", "save_shampoo_factors"]
