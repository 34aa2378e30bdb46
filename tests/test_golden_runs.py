"""The golden runs (experiments/golden_runs.py) reproduce their record: bitwise on the machine that
recorded it, within the derived cross-machine tolerance (golden_runs.TOL, see its comment) elsewhere.
Never skipped: a machine without its own record compares with a stored one.

Re-record on this machine only for an intended numerical change: ``python experiments/golden_runs.py
--record`` (and say so in the commit message).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import golden_runs


@pytest.fixture(scope="module")
def stored():
    return golden_runs.any_record()


@pytest.mark.parametrize("name", [c.name for c in golden_runs.cases()])
def test_case_matches_record(name, stored):
    meta, arrays, same_machine = stored
    assert golden_runs.check_case(name, meta, arrays, same_machine) == []


def test_every_case_is_recorded(stored):
    meta, _, _ = stored
    assert sorted(meta["cases"]) == sorted(c.name for c in golden_runs.cases())


def test_cross_machine_comparison_rejects_a_change(stored):
    """The tolerance path is a comparison, not a pass: it accepts the record itself and rejects an
    array moved by 3 TOL relative (norm-wise)."""
    _, arrays, _ = stored
    key = next(k for k in arrays if "|param/" in k)
    a = arrays[key].astype(np.float64)
    assert golden_runs.close(a, a)
    rng = np.random.default_rng(0)
    d = rng.standard_normal(a.shape)
    moved = a + 3 * golden_runs.TOL * np.linalg.norm(a) * d / np.linalg.norm(d)
    assert not golden_runs.close(moved, a)
    assert not golden_runs.close(np.where(np.arange(a.size).reshape(a.shape) == 0, np.nan, a), a)


def test_digest_sees_one_ulp():
    import torch

    x = torch.ones(3)
    y = x.clone()
    y[1] = torch.nextafter(y[1], torch.tensor(2.0))
    assert golden_runs.digest({"a": x}) != golden_runs.digest({"a": y})
    assert golden_runs.digest({"a": x}) == golden_runs.digest({"a": x.clone()})


def test_fingerprint_names_what_decides_the_bits():
    """A virtual machine's CPU model name ("AMD EPYC") covers CPUs whose BLAS kernels differ (scipy's
    OpenBLAS picked SkylakeX on a Zen 4, whose schur_newton case then differed from a record made
    under the same name): the fingerprint also carries family/model/stepping, the vector
    extensions and the BLAS libraries' versions and kernels."""
    fp = golden_runs.fingerprint()
    assert {"cpu", "cpu_id", "cpu_vector", "blas", "torch", "aten_capability", "mkl_cbwr", "threads"} <= set(
        fp
    )
    assert "openblas" in fp["blas"] or "mkl" in fp["blas"], fp["blas"]
    other = {**fp, "blas": fp["blas"] + ";openblas/0.0/Haswell"}
    assert golden_runs.fingerprint_id(other) != golden_runs.fingerprint_id(fp)
