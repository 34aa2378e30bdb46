"""Shared test setup: make the helper modules in tests/ (``_refs``, ...) importable in any import mode.

Matrix builders and the independent mpmath reference live in ``tests/_refs.py``.
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# The numerics-sensitive files: solvers, psd policies, eigh, Newton, batching and Shampoo's root rounds,
# whose assertions compare floating-point results (bounds, bitwise-by-construction equalities).
# ``.ci/run`` runs them (``pytest -m numerics``) a second time under another CPU kernel path
# (ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE, shown by .ci/kernel_paths.py to change GEMM, syevd
# and root results bitwise), so a test that holds on one kernel path only fails in CI.
NUMERICS_FILES = frozenset(
    {
        "test_batching.py",
        "test_coupled_newton.py",
        "test_coupled_newton_batch_bound.py",
        "test_coupled_newton_direct.py",
        "test_coupled_newton_warm.py",
        "test_cond_root.py",
        "test_eigh.py",
        "test_eigh_unscale.py",
        "test_eigh_warm.py",
        "test_halley.py",
        "test_matmul_roots_common.py",
        "test_newton_batch.py",
        "test_newton_regressions.py",
        "test_newton_schulz_sign.py",
        "test_polar_express.py",
        "test_psd_policy.py",
        "test_schur_newton.py",
        "test_shampoo_failure_policy.py",
        "test_shampoo_legacy_checkpoint.py",
        "test_shampoo_roots.py",
        "test_shampoo_trusted.py",
        "test_solvers_lowprec.py",
    }
)


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.path.name in NUMERICS_FILES:
            item.add_marker(pytest.mark.numerics)
