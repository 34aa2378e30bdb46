"""What the solver template (validation, psd policy, finalisation, report) and ``method="auto"`` in
Shampoo's mode add around a method's own work, counted in dispatched torch operations and built
option objects (not timed: the counts are the same on every machine; issue 29 item 7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _opcount import OpCount, count_options_built

import matroots
from matroots.solvers.auto import AutoConfig
from matroots.solvers.eigh import EighConfig
from matroots.study import matrices


def _spd(n: int, dtype: torch.dtype) -> torch.Tensor:
    A = torch.from_numpy(matrices.generate("randsvd", n, 1e3, np.random.default_rng(1))[0]).to(dtype)
    return torch.maximum(A, A.mT)  # exactly symmetric (elementwise max commutes with the transpose)


# ops of a default direct eigh solve outside EighConfig._run: the input's detach and batch view,
# max|A| (aminmax and its two reads), the root's finiteness (fp32: eigh's certificate, its test and
# read; fp64: a sum and its read), one read of the convergence flags, the result's view, and
# regularisation_abs (one copy of eps_abs): 12 (fp32) and 14 (fp64). Before: 20 and 22 (the
# certificate tested twice, the not-converged count as three ops, regularisation_abs from two tensors
# built from lists and their sum).
TEMPLATE_OPS = 14


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_template_around_a_direct_eigh_solve_dispatches_few_operations(
    dtype: torch.dtype, monkeypatch
) -> None:
    A = _spd(64, dtype)
    A = A / A.abs().max()  # max|A| = 1, inside the no-prescale band: the plain path
    run = EighConfig._run
    inner: list[int] = []

    def counted(self, *args, **kwargs):
        with OpCount() as c:
            out = run(self, *args, **kwargs)
        inner.append(sum(c.ops.values()))
        return out

    monkeypatch.setattr(EighConfig, "_run", counted)
    matroots.inverse_root(A, 4, method="eigh")
    inner.clear()
    with OpCount() as total:
        res = matroots.inverse_root(A, 4, method="eigh")
    assert res.converged and "prescale" not in res.info
    template = sum(total.ops.values()) - inner[0]
    assert template <= TEMPLATE_OPS, (template, total.ops.most_common())
    assert res.info["regularisation_abs"].tolist() == res.info["eps_abs"].tolist()


def test_regularisation_abs_is_a_copy_of_eps_abs_without_a_psd_shift() -> None:
    A = _spd(16, torch.float64)
    res = matroots.inverse_root(A, 2, method="eigh", eps=1e-3)
    assert res.info["regularisation_abs"].tolist() == res.info["eps_abs"].tolist()
    assert res.info["regularisation_abs"] is not res.info["eps_abs"]
    shifted = matroots.inverse_root(A, 2, method="eigh", eps=1e-3, psd="shift")
    want = shifted.info["psd_shift"].double() + shifted.info["eps_abs"].double()
    assert shifted.info["regularisation_abs"].tolist() == want.tolist()


def test_auto_in_shampoos_mode_adds_no_options_object_and_no_scan_of_the_warm_start(monkeypatch) -> None:
    """Shampoo calls auto with ``trusted``, ``quiet``, the previous root as ``warm_start`` and a
    ``kappa_hint``. When the chosen method does not use a warm start (eigh), auto hands it the
    caller's options without the warm start by copying the validated object (before:
    ``dataclasses.replace``, which validated every field again) and does not test the previous
    root's finiteness (before: isfinite + all over it on every call)."""
    A = _spd(16, torch.float32)
    first = matroots.inverse_root(A, 2, method="auto")
    assert first.info["auto"]["chosen"][0].startswith("eigh")
    kw = {"trusted": True, "quiet": True, "warm_start": first.root,
          "kappa_hint": first.info["auto"]["kappa_estimate"]}  # fmt: skip
    built = count_options_built(monkeypatch)
    AutoConfig().solve(A, 2, **kw)
    built.clear()
    with OpCount() as c:
        res = AutoConfig().solve(A, 2, **kw)
    assert built["options"] == 1  # the one built from the keywords, as a direct solve builds
    assert c.ops["aten.isfinite.default"] == 0
    assert res.info["auto"]["kappa_source"] == "kappa_hint" and bool(res.converged)


def test_auto_outside_the_table_takes_no_estimate_and_reads_kappa_from_the_solve() -> None:
    """Where the table's answer does not depend on kappa (here n = 8, below its n bands: eigh for
    every kappa), auto solves without estimating kappa first (before: a float64 eigvalsh per call)
    and reports kappa from the spectrum eigh computed, exactly."""
    A = _spd(8, torch.float64)
    cfg = AutoConfig()
    cfg.solve(A, 2)
    with OpCount() as auto:
        res = cfg.solve(A, 2)
    chosen = EighConfig()
    chosen.solve(A, 2)
    with OpCount() as direct:
        chosen.solve(A, 2)
    a = res.info["auto"]
    assert a["groups"][0]["status"] == "outside" and a["chosen"] == ["eigh"]
    assert a["kappa_source"].startswith("eigenvalues of the matrix solved")
    assert auto.ops["aten._linalg_eigh.default"] == 1  # the solve's only: no estimate
    extra = auto.ops - direct.ops
    # its own look at the input (detach, batch view, the exact-symmetry test: transpose, equal) and
    # the views of the reported spectrum: 7 (before, on top: the estimate, a float64 eigvalsh, and a
    # finiteness test)
    assert sum(extra.values()) <= 8, extra.most_common()
    w = torch.linalg.eigvalsh(A)
    assert a["kappa_estimate"][0] == pytest.approx(float(w[-1] / w[0]), rel=1e-12)
