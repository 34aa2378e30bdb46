"""Atomic file writes: every file a user resumes from is either its previous version or the new one.

A write goes to a hidden temp file in the target's folder (``.tmp-<name>.<random>``), is flushed and
``fsync``-ed, then renamed over the target with :func:`os.replace` (atomic on POSIX within one file
system) and the folder is ``fsync``-ed so the rename itself survives a power cut. A process killed at
any point leaves the previous file intact; at worst a temp file remains, which readers ignore (hidden
name) and :func:`remove_stale` or the runner's resume removes.

The data are serialised in memory first (parquet, CSV, JSON, ``torch.save``), so the number of bytes
the write needs is known: when the disk is full (``ENOSPC``, ``EDQUOT``) the temp file is removed and
:class:`DiskFullError` says which folder and how much free space the write needs. Used for run
provenance, parts and tables (:mod:`matroots.study.runner`), tune tables and ``--install``, reports, and
``experiments/train.py``'s checkpoints.
"""

from __future__ import annotations

import errno
import io
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from ..core.errors import MatrootsError

TMP_PREFIX = ".tmp-"
_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(MatrootsError, OSError):
    """A file could not be written because its file system is full; nothing half-written is left.
    The message names the folder and the free space the write needs."""


def _file_mode() -> int:
    """0o666 masked by the process umask: what open() would give a new file (mkstemp gives 0o600)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def disk_full_error(folder: Path, needed: int) -> DiskFullError:
    """The one-line error of a write of ``needed`` bytes into ``folder`` that found the disk full."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = 0
    return DiskFullError(
        f"no space left on the device of {folder}: writing needs {_size(needed)} free there, "
        f"{_size(free)} is free; free some space (or choose another folder) and rerun with --resume"
    )


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a folder; the rename is still atomic
    finally:
        os.close(fd)


def _hold_for_tests(path: Path) -> None:
    """Test hook: with MATROOTS_WRITE_HOLD naming a file, a write pauses half-way (for at most 120 s)
    while that file exists, so a test can kill the writer mid-write."""
    hold = os.environ.get("MATROOTS_WRITE_HOLD")
    if not hold:
        return
    import time

    marker = Path(hold)
    (marker.parent / f"{marker.name}.writing").write_text(str(path))
    deadline = time.monotonic() + 120
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _write_all(fd: int, view: memoryview) -> None:
    while len(view):
        view = view[os.write(fd, view[: 1 << 24]) :]


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync of the folder).

    Raises :class:`DiskFullError` when the file system is full (the temp file is removed first).
    """
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{TMP_PREFIX}{path.name}.{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _file_mode())
        try:
            view = memoryview(data)
            half = len(view) // 2
            _write_all(fd, view[:half])
            _hold_for_tests(path)
            _write_all(fd, view[half:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in _FULL:
            raise disk_full_error(folder, len(data)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(folder)
    return path


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def write_parquet(path: str | Path, df: Any) -> Path:
    """A pandas DataFrame as parquet (no index)."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return write_bytes(path, buf.getvalue())


def write_csv(path: str | Path, df: Any, **to_csv: Any) -> Path:
    """A pandas DataFrame as CSV (``to_csv`` keyword arguments, e.g. ``index=False``)."""
    return write_text(path, df.to_csv(**to_csv))


def torch_save(path: str | Path, obj: Any) -> Path:
    """``torch.save(obj)`` to ``path`` atomically: a kill mid-save leaves the previous file intact."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return write_bytes(path, buf.getvalue())


def copy_file(src: str | Path, dest: str | Path) -> Path:
    """Copy ``src`` to ``dest`` atomically."""
    return write_bytes(dest, Path(src).read_bytes())


def remove_stale(path: str | Path) -> int:
    """Remove temp files a killed writer of ``path`` left beside it; return how many."""
    path = Path(path)
    n = 0
    for tmp in path.parent.glob(f"{TMP_PREFIX}{path.name}.*"):
        tmp.unlink(missing_ok=True)
        n += 1
    return n


__all__ = [
    "TMP_PREFIX",
    "DiskFullError",
    "copy_file",
    "disk_full_error",
    "remove_stale",
    "torch_save",
    "write_bytes",
    "write_csv",
    "write_json",
    "write_parquet",
    "write_text",
]
