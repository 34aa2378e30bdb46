"""Real text every machine here has: the Python standard library's own source files.

The corpus is the ``*.py`` files under ``sysconfig.get_paths()["stdlib"]`` (``site-packages`` and
``__pycache__`` excluded), read as bytes in sorted relative-path order. It is split into train and
validation **by file**: a file is a validation file when the first byte of the SHA-256 of its relative
path is below ``256 * val_fraction`` -- a rule that does not depend on which other files exist, so the
split of a file is the same on every machine. The corpus differs between Python versions; its
fingerprint (file count, byte count, hash of the file list) is part of every run's provenance.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEPARATOR = b"\n\x00\n"  # between files: a byte sequence that never occurs in source text


@dataclass(frozen=True)
class Corpus:
    """Train and validation bytes (uint8 arrays) and where they came from."""

    train: np.ndarray
    val: np.ndarray
    train_files: int
    val_files: int
    fingerprint: str
    root: str

    def info(self) -> dict[str, object]:
        return {
            "corpus_root": self.root,
            "corpus_fingerprint": self.fingerprint,
            "train_files": self.train_files,
            "val_files": self.val_files,
            "train_bytes": int(self.train.size),
            "val_bytes": int(self.val.size),
        }


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The corpus files in deterministic (sorted relative path) order."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files = [
        p
        for p in base.rglob("*.py")
        if "site-packages" not in p.relative_to(base).parts and "__pycache__" not in p.parts and p.is_file()
    ]
    return sorted(files, key=lambda p: p.relative_to(base).as_posix())


def is_validation_file(rel_path: str, val_fraction: float) -> bool:
    return hashlib.sha256(rel_path.encode()).digest()[0] < round(256 * val_fraction)


@functools.lru_cache(maxsize=4)
def load_corpus(
    max_train_bytes: int | None = None,
    max_val_bytes: int | None = None,
    val_fraction: float = 0.1,
    root: str | None = None,
) -> Corpus:
    """Read the corpus; ``max_*_bytes`` keep a deterministic prefix (whole files, in order) of each split.

    Raises FileNotFoundError when the directory holds no source files (a stripped Python install).
    """
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files = stdlib_files(base)
    if not files:
        raise FileNotFoundError(f"no *.py files under {base}: the byte-level tasks need the stdlib sources")
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    sizes = {False: 0, True: 0}
    limits = {False: max_train_bytes, True: max_val_bytes}
    h = hashlib.sha256()
    for p in files:
        rel = p.relative_to(base).as_posix()
        val = is_validation_file(rel, val_fraction)
        lim = limits[val]
        if lim is not None and sizes[val] >= lim:
            continue
        data = p.read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\n")
        parts[val].append(data)
        sizes[val] += len(data) + len(SEPARATOR)
    if not parts[True] or not parts[False]:
        raise FileNotFoundError(f"the corpus under {base} is too small to split into train and validation")

    def join(chunks: list[bytes]) -> np.ndarray:
        return np.frombuffer(SEPARATOR.join(chunks), dtype=np.uint8).copy()

    return Corpus(
        train=join(parts[False]),
        val=join(parts[True]),
        train_files=len(parts[False]),
        val_files=len(parts[True]),
        fingerprint=h.hexdigest()[:16],
        root=str(base),
    )


def split_at_file_boundary(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``data`` (files joined by :data:`SEPARATOR`) cut in two at the first file boundary at or after
    its middle, so each part holds whole files; raises FileNotFoundError when it holds a single file."""
    sep = np.frombuffer(SEPARATOR, dtype=np.uint8)
    cand = np.flatnonzero(data[: data.size - sep.size + 1] == sep[0])
    starts = [int(i) for i in cand if np.array_equal(data[i : i + sep.size], sep)]
    if starts:
        mid = data.size // 2
        after = [i for i in starts if i >= mid]
        i = after[0] if after else starts[-1]
        return data[:i].copy(), data[i + sep.size :].copy()
    raise FileNotFoundError(
        "the validation files are one file: they cannot be split into validation and held-out"
    )


__all__ = ["Corpus", "is_validation_file", "load_corpus", "split_at_file_boundary", "stdlib_files"]
