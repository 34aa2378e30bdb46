"""Root solvers: one module per published algorithm, each with a frozen keyword-only config."""

from .auto import AutoConfig
from .base import SolverConfig
from .coupled_newton import CoupledNewtonConfig
from .eigh import EighConfig
from .eigh_warm import EighWarmConfig
from .halley import HalleyConfig
from .newton_schulz_sign import NewtonSchulzSignConfig
from .polar_express import PolarExpressConfig
from .registry import available, get, register
from .schur_newton import SchurNewtonConfig

__all__ = [
    "AutoConfig",
    "CoupledNewtonConfig",
    "EighConfig",
    "EighWarmConfig",
    "HalleyConfig",
    "NewtonSchulzSignConfig",
    "PolarExpressConfig",
    "SchurNewtonConfig",
    "SolverConfig",
    "available",
    "get",
    "register",
]
