"""shampoo: the Shampoo optimizer for PyTorch, with any matroots solver as its root solver.

>>> import torch, shampoo
>>> model = torch.nn.Linear(8, 4)
>>> opt = shampoo.Shampoo(model.named_parameters(), lr=1e-2, precondition_frequency=10)
>>> model(torch.randn(16, 8)).square().mean().backward()
>>> opt.step()
"""

from .blocking import BlockKind, BlockSpec, ParamLayout, layout_param
from .config import (
    AdaGradGrafting,
    AdamGrafting,
    DiagnosticsConfig,
    ExponentOverride,
    FailurePolicy,
    GraftingConfig,
    GroupOptions,
    NoGrafting,
    RMSpropGrafting,
    SGDGrafting,
)
from .diagnostics import BlockDiagnostics, FactorDiagnostics, StepTiming
from .distributed import DDPConfig
from .errors import (
    FactorResetWarning,
    InconsistentPickleError,
    InvalidShampooArgumentError,
    NonFiniteGradientWarning,
    RootComputationError,
    RootFailureWarning,
    ShampooError,
    StateDictError,
    UnknownOptionError,
)
from .fsdp import FSDPConfig
from .implementation import ShampooImplementation
from .optimizer import Shampoo
from .transforms.soap import SOAP

__all__ = [
    "SOAP",
    "AdaGradGrafting",
    "AdamGrafting",
    "BlockDiagnostics",
    "BlockKind",
    "BlockSpec",
    "DDPConfig",
    "DiagnosticsConfig",
    "ExponentOverride",
    "FSDPConfig",
    "FactorDiagnostics",
    "FactorResetWarning",
    "FailurePolicy",
    "GraftingConfig",
    "GroupOptions",
    "InconsistentPickleError",
    "InvalidShampooArgumentError",
    "NoGrafting",
    "NonFiniteGradientWarning",
    "ParamLayout",
    "RMSpropGrafting",
    "RootComputationError",
    "RootFailureWarning",
    "SGDGrafting",
    "Shampoo",
    "ShampooError",
    "ShampooImplementation",
    "StateDictError",
    "StepTiming",
    "UnknownOptionError",
    "layout_param",
]
