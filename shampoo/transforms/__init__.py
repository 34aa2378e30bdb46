"""Per-block transforms of the Shampoo step (first moment, preconditioners; grafting in
:mod:`shampoo.grafting`) and the :class:`Pipeline` that composes them per bucket."""

from ..refresh import RootJob
from .base import (
    Grafting,
    Pipeline,
    PipelineState,
    Preconditioner,
    Stack,
    StepContext,
    StepOptions,
    block_norms,
    per_block,
)
from .diagonal import Diagonal, DiagonalState
from .kronecker import Kronecker, KroneckerState, kronecker_for, matricize, precondition
from .moments import FirstMoment, FirstMomentState
from .soap import SOAP, SOAPState, preconditioner_named, rotate

__all__ = [
    "SOAP",
    "Diagonal",
    "DiagonalState",
    "FirstMoment",
    "FirstMomentState",
    "Grafting",
    "Kronecker",
    "KroneckerState",
    "Pipeline",
    "PipelineState",
    "Preconditioner",
    "RootJob",
    "SOAPState",
    "Stack",
    "StepContext",
    "StepOptions",
    "block_norms",
    "kronecker_for",
    "matricize",
    "per_block",
    "precondition",
    "preconditioner_named",
    "rotate",
]
