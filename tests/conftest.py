"""Shared test setup: make the helper modules in tests/ (``_refs``, ...) importable in any import mode.

Matrix builders and the independent mpmath reference live in ``tests/_refs.py``.
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
