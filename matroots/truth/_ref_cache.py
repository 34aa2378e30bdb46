"""On-disk cache of :mod:`matroots.truth.reference` results (layout and guarantees in its docstring).

One entry is one ``.npz`` file ``<cache_dir>/references/<key[:2]>/<key>.npz`` holding ``root``,
``eigenvalues``, ``meta`` (a JSON string that repeats the key) and ``checksum`` (SHA-256 of the root
bytes, the eigenvalue bytes and the JSON). Writes: temporary file in the same folder, fsync, then
``os.replace`` (atomic on POSIX and Windows), so readers never see a partial entry and concurrent
writers of the same key simply replace one complete file by another.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import tempfile
import zipfile
from typing import Any

import numpy as np

logger = logging.getLogger("matroots.truth.reference")

CACHE_ENV = "MATROOTS_CACHE_DIR"


def cache_dir() -> pathlib.Path:
    """Folder of the reference cache: ``$MATROOTS_CACHE_DIR``, else ``$XDG_CACHE_HOME/matroots``, else
    ``~/.cache/matroots``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return pathlib.Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return base / "matroots"


def content_key(A: np.ndarray, header: dict[str, Any]) -> str:
    """SHA-256 of a JSON header (parameters) followed by the little-endian float64 bytes and shape of A."""
    h = hashlib.sha256(json.dumps({**header, "shape": list(A.shape)}, sort_keys=True).encode())
    h.update(np.ascontiguousarray(A, dtype="<f8").tobytes())
    return h.hexdigest()


def entry_path(key: str) -> pathlib.Path:
    """Where the entry of ``key`` lives."""
    return cache_dir() / "references" / key[:2] / f"{key}.npz"


def _checksum(root: np.ndarray, eig: np.ndarray, meta: str) -> str:
    h = hashlib.sha256(np.ascontiguousarray(root).tobytes())
    h.update(np.ascontiguousarray(eig).tobytes())
    h.update(meta.encode())
    return h.hexdigest()


def load(key: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]] | None:
    """(root, eigenvalues, meta) of a valid entry; None when absent. A corrupted entry (unreadable,
    truncated, wrong key or checksum) is logged, deleted and reported as absent."""
    path = entry_path(key)
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            root, eig, meta_s, check = z["root"], z["eigenvalues"], str(z["meta"]), str(z["checksum"])
        meta = json.loads(meta_s)
        if meta.get("key") != key or check != _checksum(root, eig, meta_s):
            raise ValueError("checksum or key mismatch")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        logger.warning("corrupted reference cache entry %s (%s): recomputing", path, exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return root, eig, meta


def store(key: str, root: np.ndarray, eig: np.ndarray, meta: dict[str, Any]) -> None:
    """Write an entry atomically; an unwritable cache is logged and otherwise ignored."""
    path = entry_path(key)
    meta_s = json.dumps({**meta, "key": key}, sort_keys=True)
    root = np.ascontiguousarray(root)
    eig = np.ascontiguousarray(eig)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(
                    fh,
                    root=root,
                    eigenvalues=eig,
                    meta=np.array(meta_s),
                    checksum=np.array(_checksum(root, eig, meta_s)),
                )
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        logger.warning("could not write the reference cache entry %s: %s", path, exc)


__all__ = ["CACHE_ENV", "cache_dir", "content_key", "entry_path", "load", "store"]
