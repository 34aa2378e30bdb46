"""Other packages' coupled-Newton inverse p-th roots, called as their optimizers call them, for
``bench_solvers.py --to-target`` (issue 27: the same matrices, the same target, our reference).

* ``meta_coupled_newton``: Meta's ``distributed_shampoo.preconditioner.matrix_functions.matrix_inverse_root``
  with ``CoupledNewtonConfig`` (facebookresearch/optimizers; not on PyPI and never a dependency here:
  clone it and put the clone on ``PYTHONPATH``). Its defaults: ``max_iterations=100``, ``tolerance=1e-6``
  on max_ij |M - I|_ij, X_0 = c^{-1} I with c^p = 2 ||A||_F / (p + 1) (Frobenius scaling), ``epsilon``
  added to A (0 here: the same matrix is solved). Per iteration: X M', M'^p (binary powering), M'^p M.
* ``meta_higher_order``: the same function with ``CoupledHigherOrderConfig(order=3)`` (Lakić's
  higher-order coupled iteration; one Newton step first, trace scaling c^p = tr A; its defaults
  ``max_iterations=100``, ``tolerance=1e-20`` on max_ij |M - I|_ij, i.e. until stagnation; ``rel_epsilon``
  and ``abs_epsilon`` have no default and are 0 here). It raises ArithmeticError when its residual
  ||A X^p - I||_inf exceeds 0.1. Its product count is the one it logs itself (``Number of matmuls``).
* ``pytorch_optimizer_coupled_newton``: ``pytorch_optimizer.optimizer.utils.compute_power_schur_newton``
  (the ``peers`` extra; Google's scalable-Shampoo coupled Newton). Its defaults: ``max_iters=100``,
  ``error_tolerance=1e-3`` on max_ij |M - I|_ij, ``ridge_epsilon=1e-6`` times a power-iteration
  lambda_max (0 here), ``max_error_ratio=1.2`` (it returns the previous iterate when the error grows).
  The 100 power-iteration matrix-vector products are counted as 101/n GEMMs.

``solve(A, p, k)`` runs a peer with at most k iterations and its stopping tolerance switched off (0),
so that k alone decides and the benchmark can find the fewest products reaching a target, as it does
for matroots' methods; ``solve(A, p, None)`` runs it at its defaults (tolerance and iteration cap
included). Both return (X, GEMM-equivalents); X is None when the peer raised.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import torch


def power_products(p: int) -> int:
    """Products of ``torch.linalg.matrix_power`` (binary powering) for p >= 1."""
    return p.bit_length() - 1 + bin(p).count("1") - 1


@dataclass(frozen=True)
class PeerRoot:
    name: str
    module: str
    install: str
    defaults: str
    solve: Callable[[object, torch.Tensor, int, int | None], tuple[torch.Tensor | None, float]]


class _MatmulLog(logging.Handler):
    """Collects the ``Number of matmuls: N`` line Meta's higher-order iteration logs at DEBUG."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        m = re.match(r"Number of matmuls: (\d+)", record.getMessage())
        if m:
            self.count = float(m.group(1))


@contextlib.contextmanager
def _counted_powers():
    """Counts calls of ``torch.linalg.matrix_power`` (one per iteration of both coupled Newtons)."""
    calls = [0]
    original = torch.linalg.matrix_power

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    torch.linalg.matrix_power = counted
    try:
        yield calls
    finally:
        torch.linalg.matrix_power = original


def _meta_newton(mod, A: torch.Tensor, p: int, k: int | None):
    fn, types = mod
    cfg = (
        types.CoupledNewtonConfig()
        if k is None
        else types.CoupledNewtonConfig(max_iterations=k, tolerance=0.0)
    )
    logging.getLogger(fn.__name__).setLevel(logging.ERROR)  # its "did not converge" warning
    with _counted_powers() as iters:
        X = fn.matrix_inverse_root(A, Fraction(p), root_inv_config=cfg, epsilon=0.0)
    return X, float(iters[0] * (2 + power_products(p)))


def _meta_higher(mod, A: torch.Tensor, p: int, k: int | None):
    fn, types = mod
    kw = {} if k is None else {"max_iterations": k, "tolerance": 0.0}
    cfg = types.CoupledHigherOrderConfig(rel_epsilon=0.0, abs_epsilon=0.0, order=3, **kw)
    log = logging.getLogger(fn.__name__)
    handler = _MatmulLog()
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        X = fn.matrix_inverse_root(A, Fraction(p), root_inv_config=cfg)
    except ArithmeticError:
        return None, float("inf")
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return X, float(handler.count) if handler.count is not None else float("nan")


def _pytorch_optimizer(mod, A: torch.Tensor, p: int, k: int | None):
    kw = {} if k is None else {"max_iters": k, "error_tolerance": 0.0}
    with _counted_powers() as iters:
        X = mod.compute_power_schur_newton(A, p, ridge_epsilon=0.0, **kw)
    return X, float(iters[0] * (2 + power_products(p)) + 101 / A.shape[-1])


META_INSTALL = "git clone https://github.com/facebookresearch/optimizers and put the clone on PYTHONPATH"
PEERS = (
    PeerRoot(
        "meta_coupled_newton",
        "distributed_shampoo",
        META_INSTALL,
        "CoupledNewtonConfig(max_iterations=100, tolerance=1e-6), epsilon=0",
        _meta_newton,
    ),
    PeerRoot(
        "meta_higher_order",
        "distributed_shampoo",
        META_INSTALL,
        "CoupledHigherOrderConfig(order=3, max_iterations=100, tolerance=1e-20), epsilons 0",
        _meta_higher,
    ),
    PeerRoot(
        "pytorch_optimizer_coupled_newton",
        "pytorch_optimizer",
        "pip install -e '.[peers]'",
        "compute_power_schur_newton(max_iters=100, error_tolerance=1e-3, max_error_ratio=1.2), ridge_epsilon=0",
        _pytorch_optimizer,
    ),
)


def load(peer: PeerRoot, importer: Callable[[str], object] = importlib.import_module) -> object | None:
    """The peer's functions, or None when its package does not import."""
    try:
        if peer.module == "distributed_shampoo":
            return (
                importer("distributed_shampoo.preconditioner.matrix_functions"),
                importer("distributed_shampoo.preconditioner.matrix_functions_types"),
            )
        return importer("pytorch_optimizer.optimizer.utils")
    except ImportError:
        return None


def found(importer: Callable[[str], object] = importlib.import_module) -> dict[str, object | None]:
    """{peer name: its loaded functions or None}."""
    return {peer.name: load(peer, importer) for peer in PEERS}
