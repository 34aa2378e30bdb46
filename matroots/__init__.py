"""matroots: inverse p-th roots of matrices across precisions, with honest diagnostics.

>>> import torch, matroots
>>> A = torch.diag(torch.tensor([1.0, 16.0], dtype=torch.float64))
>>> res = matroots.inverse_root(A, 4, method="coupled_newton")
>>> torch.allclose(res.root, torch.diag(torch.tensor([1.0, 0.5], dtype=torch.float64)))
True
"""

from . import precision, solvers
from .api import inverse_root, resolve_method, root
from .errors import (
    ConvergenceError,
    ConvergenceWarning,
    EigensolverError,
    EmptyMatrixError,
    FormatRangeError,
    InvalidArgumentError,
    MatrootsError,
    MatrootsInputError,
    MatrootsNumericalError,
    NegativeRealEigenvalueError,
    NonFiniteInputError,
    NotPositiveDefiniteError,
    NotSquareError,
    NotSymmetricError,
    UnsupportedDtypeError,
    UnsupportedExponentError,
)
from .options import SolveOptions
from .result import RootResult
from .solvers import CoupledNewtonConfig, EighConfig, SchurNewtonConfig, SolverConfig
from .solvers.base import Capabilities

__version__ = "0.1.0"

# Submodules reachable as attributes after `import matroots` (matroots.metrics, matroots.reference, ...),
# imported on first use so that `import matroots` stays cheap (PEP 562).
_LAZY_SUBMODULES = frozenset(
    {
        "conditioning",
        "grid",
        "matrices",
        "metrics",
        "plots",
        "reference",
        "regularize",
        "report",
        "runner",
        "spectral",
        "sweep",
    }
)


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'matroots' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES)


__all__ = [
    "Capabilities",
    "ConvergenceError",
    "ConvergenceWarning",
    "CoupledNewtonConfig",
    "EigensolverError",
    "EighConfig",
    "EmptyMatrixError",
    "FormatRangeError",
    "InvalidArgumentError",
    "MatrootsError",
    "MatrootsInputError",
    "MatrootsNumericalError",
    "NegativeRealEigenvalueError",
    "NonFiniteInputError",
    "NotPositiveDefiniteError",
    "NotSquareError",
    "NotSymmetricError",
    "RootResult",
    "SchurNewtonConfig",
    "SolveOptions",
    "SolverConfig",
    "UnsupportedDtypeError",
    "UnsupportedExponentError",
    "inverse_root",
    "precision",
    "resolve_method",
    "root",
    "solvers",
]
