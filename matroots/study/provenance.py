"""Provenance of results: package versions and machine, recorded in rows and JSON sidecars."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

_PACKAGES = ("matroots", "torch", "numpy", "scipy", "mpmath", "python-flint", "pandas")


def versions() -> dict[str, str]:
    """Installed versions of the packages results depend on ("absent" when not installed)."""
    out = {"python": sys.version.split()[0]}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def versions_string() -> str:
    """Compact one-line form of :func:`versions` for table columns."""
    return " ".join(f"{k}={v}" for k, v in versions().items())


def machine() -> dict[str, Any]:
    """Hostname, architecture, processor and CPU count."""
    return {
        "node": platform.node(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "system": platform.system(),
        "cpus": os.cpu_count(),
    }


def machine_string() -> str:
    m = machine()
    return f"{m['node']}/{m['machine']}/{m['cpus']}cpu"


def git() -> dict[str, Any]:
    """Commit and dirty flag of the source tree matroots is imported from ({} outside a git checkout)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {}
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "matroots"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def command_line() -> str:
    """The command line of this process, shell-quoted."""
    import shlex

    return shlex.join(sys.argv)


def now() -> str:
    """The current UTC time, ISO 8601 with seconds."""
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="seconds")
