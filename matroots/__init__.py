"""matroots: inverse p-th roots of matrices across precisions, with honest diagnostics.

>>> import torch, matroots
>>> A = torch.diag(torch.tensor([1.0, 16.0], dtype=torch.float64))
>>> res = matroots.inverse_root(A, 4, method="coupled_newton")
>>> torch.allclose(res.root, torch.diag(torch.tensor([1.0, 0.5], dtype=torch.float64)))
True
"""

from . import solvers
from .api import inverse_root, resolve_method, root
from .core import precision
from .core.errors import (
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
from .core.options import SolveOptions
from .core.result import RootResult
from .solvers import CoupledNewtonConfig, EighConfig, SchurNewtonConfig, SolverConfig
from .solvers.base import Capabilities

__version__ = "0.1.0"

# Submodules reachable as attributes after `import matroots` (matroots.metrics, matroots.reference, ...),
# imported on first use so that `import matroots` stays cheap (PEP 562). Each lives in its layer's folder
# (docs/design.md §2); the attribute is its public name.
_LAZY_SUBMODULES = {
    "conditioning": "core.conditioning",
    "regularize": "core.regularize",
    "spectral": "core.spectral",
    "metrics": "truth.metrics",
    "reference": "truth.reference",
    "grid": "study.grid",
    "matrices": "study.matrices",
    "plots": "study.plots",
    "report": "study.report",
    "runner": "study.runner",
    "sweep": "study.sweep",
}


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f".{_LAZY_SUBMODULES[name]}", __name__)
    raise AttributeError(f"module 'matroots' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))


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
