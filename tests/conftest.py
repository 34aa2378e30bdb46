"""Shared test setup: make the helper modules in tests/ (``_refs``, ...) importable in any import mode.

Matrix builders and the independent mpmath reference live in ``tests/_refs.py``.
"""

import os
import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import _ordering  # noqa: E402  (a tests/ module: importable once the folder is on sys.path)


def _share_the_cores() -> None:
    """Under pytest-xdist (``make test`` runs the files on one process per core), each worker gets its
    share of the cores as torch's intra-op threads and as the BLAS threads of numpy and scipy (OpenBLAS;
    scipy.linalg.eigh/schur in schur_newton, the references), so N workers do not each start a thread
    per core (N x cores threads on cores cores). OpenBLAS threads on an oversubscribed core wait
    busily: a 256 x 256 ``scipy.linalg.eigh(driver="evd")`` took 5 ms on one thread and 100 ms on two
    beside one busy process (2 cores), and a byte-LM Shampoo test with schur_newton 141 s instead of
    about 10. Every result the suite asserts holds at any thread count: the tests that depend on it set
    the count themselves (tests/_dist.py, test_distributed_equivalence)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(share))  # read by OpenBLAS when it loads
        from matroots.study.threads import limit_threads  # torch's pool and the loaded BLAS pools

        limit_threads(share)


_share_the_cores()

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


#: fixture scopes whose value the tests of one file share: under ``--dist loadgroup`` (``make test``)
#: such a file's tests stay on one worker, so the fixture is built once, as in a one-process run
SHARED_SCOPES = frozenset({"class", "module", "package", "session"})


def _shares_a_fixture(item) -> bool:
    """True when ``item`` uses a fixture of a scope wider than one test."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope in SHARED_SCOPES for chain in defs for d in chain)


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.path.name in NUMERICS_FILES:
            item.add_marker(pytest.mark.numerics)
        # pytest-xdist (make test: --dist loadgroup) spreads the other tests one by one over the
        # workers, so one file's long cases (test_shampoo_training_grid's) do not all queue on one
        if _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    _ordering.longest_first(items, _group_of, _ordering.load())


def _group_of(item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None and mark.args else None


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        metavar="PATH",
        default=None,
        help="write each test's seconds (over 1 s) to PATH at the end: tests/durations.json orders "
        "make test's work longest first (tests/_ordering.py)",
    )


_RECORDER: _ordering.Recorder | None = None  # only with --store-durations, in the controller


def pytest_runtest_logreport(report):
    if _RECORDER is not None:
        _RECORDER.add(report)


def pytest_sessionfinish(session):
    path = session.config.getoption("--store-durations")
    if _RECORDER is not None:
        n = _RECORDER.write(Path(path))
        print(f"\nstored the durations of {n} tests in {path}")


def pytest_configure(config):
    """pytest-xdist's controller rebuilds every warning a worker reports by importing the module of its
    class. The first matroots warning (TargetWarning, ConvergenceWarning, ...) then imported torch and
    matroots inside the controller's event handling, and two such warnings arriving together raced on the
    half-imported package ("KeyError: 'matroots.solvers'", then "cannot import name 'TargetWarning' from
    partially initialized module": INTERNALERROR, a worker lost). Import the packages once, up front."""
    import matroots  # noqa: F401
    import shampoo  # noqa: F401

    global _RECORDER
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
        _RECORDER = _ordering.Recorder()  # the controller (or the one process) sees every report

    # xdist sorts the work units by their number of tests unless told not to; the order is
    # tests/_ordering.py's (measured cost, longest first)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
