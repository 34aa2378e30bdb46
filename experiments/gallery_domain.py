"""Refusals and false alarms of the Newton solvers on the classical gallery (issue 22, class 4).

For every gallery matrix (the symmetric families of :mod:`matroots.matrices` and the classical
nonsymmetric test matrices frank, chebspec(n, 1), grcar, the Al-Mohy-Higham 4 x 4 triangle and a
Jordan-like block), working format (fp64, fp32), p in {2, 3, 4} and direction (inverse, forward),
each of schur_newton and coupled_newton is run and its outcome judged against the high-precision
reference (:mod:`matroots.reference`) of fl(A), the matrix actually solved:

* well-conditioned: the reference exists and cond(f, fl(A)) u <= 0.01 (:func:`cond_root`);
* ``refused``: a MatrootsError on a well-conditioned case;
* ``refused_with_root``: a MatrootsError on any case whose matrix solved has a principal root (the
  reference exists), however ill-conditioned: a refusal whose reason ("no principal root") is wrong;
* ``false alarm``: converged=False on a well-conditioned case although the root is within the bound
  below (the flag is wrong, the root is not);
* ``failed``: converged=False on a well-conditioned case with the root outside the bound (an honest
  failure of the method, e.g. coupled Newton diverging on a strongly non-normal matrix);
* ``silent wrong``: converged=True with error > C sqrt(n) (cond + 1) u, C = 5 (any case with a reference).

Usage: ``python experiments/gallery_domain.py`` (prints the cases counted and the counts per method).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

import matroots
from matroots.core import conditioning
from matroots.study import matrices
from matroots.truth import metrics, reference

C = 5.0
U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24}


def frank(n: int) -> np.ndarray:
    """Frank matrix: F_ij = n + 1 - max(i, j) for j >= i - 1 (1-based), else 0 (ill-conditioned eigenvalues)."""
    i = np.arange(1, n + 1)
    F = (n + 1 - np.maximum.outer(i, i)).astype(float)
    return np.where(i[None, :] >= i[:, None] - 1, F, 0.0)


def chebspec1(n: int) -> np.ndarray:
    """MATLAB gallery('chebspec', n, 1): the Chebyshev differentiation matrix of order n + 1 on
    x_j = cos(pi j / n) with its first row and column removed (nonsingular, eigenvalues Re < 0)."""
    x = np.cos(np.pi * np.arange(n + 1) / n)
    c = np.where((np.arange(n + 1) == 0) | (np.arange(n + 1) == n), 2.0, 1.0) * (-1.0) ** np.arange(n + 1)
    X = x[:, None] - x[None, :]
    D = np.outer(c, 1 / c) / (X + np.eye(n + 1))
    D -= np.diag(D.sum(axis=1))
    return D[1:, 1:]


def grcar(n: int, k: int = 3) -> np.ndarray:
    """Grcar matrix: -1 on the subdiagonal, 1 on the diagonal and k superdiagonals (sensitive spectrum)."""
    return np.eye(n, k=-1) * -1 + sum(np.eye(n, k=j) for j in range(k + 1))


def gallery() -> list[tuple[str, np.ndarray]]:
    out = []
    for name, n in (("hilbert", 6), ("hilbert", 8), ("lehmer", 10), ("kms", 10), ("pascal", 6), ("moler", 6)):
        out.append((f"{name}({n})", matrices.generate(name, n, None, None)[0]))
    for name, n in (("minij", 10), ("tridiag", 10)):
        out.append((f"{name}({n})", matrices.generate(name, n, None, None)[0]))
    out.append(("frank(10)", frank(10)))
    out.append(("frank(6)", frank(6)))
    out.append(("chebspec(10,1)", chebspec1(10)))
    out.append(("grcar(10)", grcar(10)))
    out.append(
        (
            "al-mohy-higham(4)",
            np.array(
                [
                    [3.2346e-1, 3e4, 3e4, 3e4],
                    [0, 3.0089e-1, 3e4, 3e4],
                    [0, 0, 3.2210e-1, 3e4],
                    [0, 0, 0, 3.0744e-1],
                ]
            ),
        )
    )
    out.append(("jordan-like(4)", np.eye(4) + np.eye(4, k=1) + np.diag([0, 1e-8, 2e-8, 3e-8])))
    return out


def run(methods=("schur_newton", "coupled_newton"), ps=(2, 3, 4)) -> dict:
    counts = {
        m: {
            "cases": 0,
            "well": 0,
            "refused": 0,
            "refused_with_root": 0,
            "false_alarm": 0,
            "failed": 0,
            "silent_wrong": 0,
        }
        for m in methods
    }
    rows = []
    for label, A in gallery():
        n = A.shape[0]
        for dtype in (torch.float64, torch.float32):
            u = U[dtype]
            Aw = torch.from_numpy(A).to(dtype).double().numpy()
            for p in ps:
                for inverse in (True, False):
                    try:
                        ref = (reference.inverse_root if inverse else reference.root)(Aw, p)
                        cond = conditioning.cond_root(Aw, p, inverse=inverse)
                    except (matroots.MatrootsError, ZeroDivisionError):  # no root, or mpmath gave up
                        ref, cond = None, math.inf
                    well = ref is not None and cond * u <= 0.01
                    bound = C * math.sqrt(n) * (cond + 1.0) * u
                    for method in methods:
                        c = counts[method]
                        c["cases"] += 1
                        c["well"] += well
                        fn = matroots.inverse_root if inverse else matroots.root
                        try:
                            with warnings.catch_warnings():
                                warnings.simplefilter("ignore")
                                res = fn(torch.from_numpy(A), p, method=method, dtype=dtype, quiet=True)
                        except matroots.MatrootsError as exc:
                            c["refused_with_root"] += ref is not None
                            if well:
                                c["refused"] += 1
                                rows.append(
                                    (method, label, dtype, p, inverse, cond, "REFUSED", str(exc)[:90])
                                )
                            continue
                        err = (
                            metrics.relative_forward_error(res.root, ref.root)
                            if ref is not None
                            else math.nan
                        )
                        if not bool(res.converged):
                            if well:
                                what = "false_alarm" if err <= bound else "failed"
                                c[what] += 1
                                why = res.info.get("stop_reason")
                                rows.append(
                                    (
                                        method,
                                        label,
                                        dtype,
                                        p,
                                        inverse,
                                        cond,
                                        what.upper().replace("_", " "),
                                        f"{why} err {err:.1e}",
                                    )
                                )
                        elif ref is not None and not err <= bound:
                            c["silent_wrong"] += 1
                            rows.append(
                                (
                                    method,
                                    label,
                                    dtype,
                                    p,
                                    inverse,
                                    cond,
                                    "SILENT WRONG",
                                    f"err {err:.1e} > {bound:.1e}",
                                )
                            )
    for r in rows:
        m, label, dt, p, inv, cond, what, note = r
        print(
            f"{m:15s} {label:18s} {str(dt)[6:]:8s} p={p} {'inv' if inv else 'fwd'} cond={cond:.1e} {what}: {note}"
        )
    return counts


if __name__ == "__main__":
    for method, c in run().items():
        print(method, c)
