"""Grafting methods as per-block transforms on stacked blocks (Agarwal et al. 2020, "Disentangling
adaptive gradient methods from learning rates"): the preconditioned direction of each block is
rescaled to the norm of the grafting method's direction (:meth:`_Graft.graft`).

Each grafting config (:class:`GraftingConfig`, below its transform) builds its transform
(``config.transform()``). Every
transform works on a stack of same-shape blocks (b, *block_shape), so a whole bucket is one
elementwise kernel. ``grad`` is the (weight-decayed) gradient, ``m_hat`` the bias-corrected gradient
EMA that the optimizer preconditions (equal to ``grad`` when beta1 = 0; the transforms take the
uncorrected EMA and the pipeline folds 1/(1 - beta1^t) into its per-block output scale). The
formulas are torch.optim's, so that grafting alone reproduces it to rounding:

* none:     d = m_hat, and the preconditioned direction is not rescaled
* sgd:      d = m_hat
* adagrad:  v += g^2;                          d = m_hat / (sqrt(v) + eps)        (Adagrad, lr_decay 0)
* rmsprop:  v = beta2 v + (1 - beta2) g^2;     d = m_hat / (sqrt(v) + eps)        (RMSprop, alpha=beta2)
* adam:     v = beta2 v + (1 - beta2) g^2;     d = m_hat / (sqrt(v) / sqrt(1 - beta2^t) + eps)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from .checks import check_beta, check_eps
from .errors import InvalidShampooArgumentError
from .transforms.base import Grafting, Stack, StepContext, block_norms, constant, reuse_buffer
from .transforms.moments import SecondMoment

if TYPE_CHECKING:
    from .state import BlockState


@dataclass
class GraftState:
    v: torch.Tensor  # (b, *shape) second-moment accumulator
    work: torch.Tensor | None = None  # the direction's buffer, reused across steps (not state)
    # set by AdamGraft.fused_update: work holds this step's direction, and its per-block scale
    fused_scale: torch.Tensor | float | None = None

    def buffer(self, v: torch.Tensor) -> torch.Tensor:
        """:attr:`work`, kept while v's shape holds: the direction is written there (valid until the
        next step) instead of into a fresh (b, *shape) tensor each step, whose allocation costs page
        faults on CPU (glibc returns blocks of >= 128 KiB to the kernel)."""
        self.work = reuse_buffer(self.work, v.shape, v)
        return self.work


@dataclass(frozen=True)
class _Graft:
    """Grafting without state (sgd): d = m; the preconditioned direction gets d's norm."""

    # whether the preconditioned direction is rescaled to the grafting direction's norm
    rescales: ClassVar[bool] = True

    def init(self, stack: Stack) -> GraftState | None:
        return None

    def bind(self, state: GraftState | None, j: int, block: BlockState) -> None:
        block.graft_state = state.v[j] if state is not None else None

    def update(self, state: GraftState | None, G: torch.Tensor, ctx: StepContext) -> None:
        return None

    def direction(
        self, state: GraftState | None, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """The grafting direction of ``m`` as (d, s): the direction is s * d, with s a per-block
        factor (a float, or a (b,) tensor) that the caller folds into a later pass."""
        return m, 1.0

    def graft(
        self,
        pre: torch.Tensor,
        pre_scale: torch.Tensor | float,
        d: torch.Tensor,
        d_scale: torch.Tensor | float,
    ) -> torch.Tensor | float:
        """The per-block scale that gives the preconditioned direction ``pre`` the norm of s d."""
        return self._scale_and_norms(pre, pre_scale, d, d_scale)[0]

    def graft_with_norms(
        self,
        pre: torch.Tensor,
        pre_scale: torch.Tensor | float,
        d: torch.Tensor,
        d_scale: torch.Tensor | float,
    ) -> tuple[torch.Tensor | float, torch.Tensor | None, torch.Tensor | None]:
        """(scale, ||pre_j||, ||d_j||): :meth:`graft`'s scale and the block norms it was computed
        from (None where a method computes none: without :attr:`rescales`, ``pre_scale`` itself). A
        finite norm proves every entry of its block finite, which lets the optimizer skip a separate
        finiteness pass over the directions. This is the method the pipeline calls; a subclass that
        defines :meth:`graft` and not this method gets :meth:`_graft_without_norms` in its place
        (:meth:`__init_subclass__`): its own scale, and no norms."""
        return self._scale_and_norms(pre, pre_scale, d, d_scale)

    def _graft_without_norms(
        self,
        pre: torch.Tensor,
        pre_scale: torch.Tensor | float,
        d: torch.Tensor,
        d_scale: torch.Tensor | float,
    ) -> tuple[torch.Tensor | float, torch.Tensor | None, torch.Tensor | None]:
        """:meth:`graft_with_norms` of a class with its own :meth:`graft`: that scale, no norms."""
        return self.graft(pre, pre_scale, d, d_scale), None, None

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Fix once, when a subclass is defined, which :meth:`graft_with_norms` it has: one that
        defines its own :meth:`graft` and not :meth:`graft_with_norms` gets the scale-only one, so
        the pipeline uses its :meth:`graft` (the built-in norms would not be its scale)."""
        super().__init_subclass__(**kwargs)
        if "graft" in cls.__dict__ and "graft_with_norms" not in cls.__dict__:
            cls.graft_with_norms = _Graft._graft_without_norms  # type: ignore[method-assign]

    def _scale_and_norms(
        self,
        pre: torch.Tensor,
        pre_scale: torch.Tensor | float,
        d: torch.Tensor,
        d_scale: torch.Tensor | float,
    ) -> tuple[torch.Tensor | float, torch.Tensor | None, torch.Tensor | None]:
        if not self.rescales:
            return pre_scale, None, None
        gn = block_norms(d)
        gs = gn * d_scale if isinstance(d_scale, torch.Tensor) or d_scale != 1.0 else gn
        pn = block_norms(pre)
        return torch.where(pn > 0, gs / pn, constant(0.0, pn.dtype, pn.device)), pn, gn

    def fused_update(
        self, state: GraftState | None, m: torch.Tensor, G: torch.Tensor, ctx: StepContext, beta1: float
    ) -> bool:
        """Update the first moment ``m`` with this method's own state in one pass; False (nothing
        done, the default) where the method has no such pass (Adam grafting has: :class:`AdamGraft`)."""
        return False

    def accumulators(self, state: GraftState | None) -> list[torch.Tensor]:
        return [state.v] if state is not None else []


@dataclass(frozen=True)
class NoGraft(_Graft):
    """No grafting: the preconditioned direction keeps its own scale (plain SGD before preconditioning)."""

    rescales: ClassVar[bool] = False


@dataclass(frozen=True)
class SGDGraft(_Graft):
    """Graft to the norm of the (momentum-filtered) gradient."""


@dataclass(frozen=True)
class _SecondMomentGraft(_Graft):
    """Grafting to a diagonal second-moment method: the step's one rule,
    :class:`~shampoo.transforms.moments.SecondMoment`, on the grafting state v."""

    eps: float
    beta2: float = 1.0  # 1: AdaGrad's sum of squares
    # whether the direction divides v by 1 - beta2^t (Adam, under the group's use_bias_correction)
    bias_corrected: ClassVar[bool] = False

    def init(self, stack: Stack) -> GraftState:
        return GraftState(stack.zeros())

    def update(self, state: GraftState | None, G: torch.Tensor, ctx: StepContext) -> None:
        assert state is not None
        v = ctx.take(state.v)
        SecondMoment(self.beta2, self.eps).update(v, G)
        ctx.put(state.v, v)

    def direction(
        self, state: GraftState | None, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """The direction is written into the state's reused buffer (:meth:`GraftState.buffer`)."""
        assert state is not None
        v = ctx.take(state.v)
        bc = self.bias_corrected and ctx.opts.use_bias_correction
        return SecondMoment(self.beta2, self.eps).direction(
            v, m, ctx.steps, bias_correction=bc, out=state.buffer(v)
        )


@dataclass(frozen=True)
class AdaGradGraft(_SecondMomentGraft):
    """AdaGrad: v += g^2, d = m / (sqrt(v) + eps)."""


@dataclass(frozen=True)
class RMSpropGraft(_SecondMomentGraft):
    """RMSprop: v = beta2 v + (1 - beta2) g^2, d = m / (sqrt(v) + eps) (no bias correction)."""

    beta2: float = 0.99


@dataclass(frozen=True)
class AdamGraft(RMSpropGraft):
    """Adam: v as RMSprop, d = m_hat / (sqrt(v / (1 - beta2^t)) + eps)."""

    beta2: float = 0.999
    bias_corrected: ClassVar[bool] = True

    def fused_update(
        self, state: GraftState | None, m: torch.Tensor, G: torch.Tensor, ctx: StepContext, beta1: float
    ) -> bool:
        """Update the first moment ``m`` (the pipeline's, in place) and v, and compute the direction,
        in one pass, with torch's fused Adam kernel (``torch._fused_adam_``, the kernel of
        ``torch.optim.Adam(fused=True)``) applied to a zeroed buffer with lr = -1: the buffer becomes
        m_hat / (sqrt(v_hat) + eps), the graft direction. Same formulas, rounded in a different order
        than the separate passes (lerp_, mul_/addcmul_, sqrt/add/div), so equal to rounding, not
        bitwise. False (nothing done) where that does not apply: the optimizer's
        ``ShampooImplementation.fused_adam`` off, no bias correction, a selection of rows, or a device/dtype the kernel lacks."""
        if (
            not ctx.impl.fused_adam
            or state is None
            or ctx.sel is not None
            or not ctx.opts.use_bias_correction
            or G.dtype != m.dtype
            or G.device.type not in ("cpu", "cuda")
        ):
            return False
        v = state.v
        state.work = reuse_buffer(state.work, v.shape, v)
        P = state.work.zero_()
        steps = ctx.steps
        kw = dict(lr=-1.0, beta1=beta1, beta2=self.beta2, weight_decay=0.0, eps=self.eps)
        if all(t == steps[0] for t in steps):
            # torch._fused_adam_ reads the step, never writes it (torch.optim increments its own)
            step = [constant(float(steps[0]), torch.get_default_dtype(), v.device)]
            torch._fused_adam_([P], [G], [m], [v], [], step, amsgrad=False, maximize=False, **kw)
        else:  # per-block steps: one kernel over the blocks' views
            n = len(steps)
            step = [constant(float(t), torch.get_default_dtype(), v.device) for t in steps]
            torch._fused_adam_(
                [P[j] for j in range(n)], [G[j] for j in range(n)], [m[j] for j in range(n)],
                [v[j] for j in range(n)], [], step, amsgrad=False, maximize=False, **kw,
            )  # fmt: skip
        # the direction already holds 1 / (1 - beta1^t); the pipeline divides every scale by it
        state.fused_scale = ctx.per_block([1.0 - beta1**t for t in steps])
        return True

    def direction(
        self, state: GraftState | None, m: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """Adam's direction (the group's ``use_bias_correction`` applies); after :meth:`fused_update`
        the direction is the one it computed."""
        if state is not None and state.fused_scale is not None:
            scale, state.fused_scale = state.fused_scale, None
            assert state.work is not None
            return state.work, scale
        return super().direction(state, m, ctx)


@dataclass(frozen=True, kw_only=True)
class GraftingConfig:
    """Base of the grafting configs; ``kind`` names the method."""

    kind: ClassVar[str] = ""

    def transform(self) -> Grafting:
        """The per-block grafting transform of this method."""
        raise NotImplementedError(f"{type(self).__name__} does not define its grafting transform")


@dataclass(frozen=True, kw_only=True)
class NoGrafting(GraftingConfig):
    """No grafting: the Shampoo direction is used unscaled; before preconditioning starts, plain SGD."""

    kind: ClassVar[str] = "none"

    def transform(self) -> Grafting:
        return NoGraft()


@dataclass(frozen=True, kw_only=True)
class SGDGrafting(GraftingConfig):
    """Graft to the norm of the (momentum-filtered) gradient."""

    kind: ClassVar[str] = "sgd"

    def transform(self) -> Grafting:
        return SGDGraft()


@dataclass(frozen=True, kw_only=True)
class AdaGradGrafting(GraftingConfig):
    """Graft to AdaGrad, g / (sqrt(sum g^2) + eps) (Duchi et al. 2011; torch.optim.Adagrad's eps)."""

    kind: ClassVar[str] = "adagrad"
    eps: float = 1e-10

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps", check_eps(self.eps, "AdaGradGrafting.eps"))

    def transform(self) -> Grafting:
        return AdaGradGraft(eps=self.eps)


@dataclass(frozen=True, kw_only=True)
class RMSpropGrafting(GraftingConfig):
    """Graft to RMSprop, g / (sqrt(v) + eps), v = beta2 v + (1 - beta2) g^2, no bias correction
    (torch.optim.RMSprop with ``alpha=beta2``)."""

    kind: ClassVar[str] = "rmsprop"
    beta2: float = 0.99
    eps: float = 1e-8

    def __post_init__(self) -> None:
        check_beta(self.beta2, "RMSpropGrafting.beta2", allow_one=False)
        object.__setattr__(self, "eps", check_eps(self.eps, "RMSpropGrafting.eps"))

    def transform(self) -> Grafting:
        return RMSpropGraft(eps=self.eps, beta2=self.beta2)


@dataclass(frozen=True, kw_only=True)
class AdamGrafting(GraftingConfig):
    """Graft to Adam, m_hat / (sqrt(v / (1 - beta2^t)) + eps) (Kingma & Ba 2015; torch.optim.Adam).

    The bias correction of v follows the group's ``use_bias_correction``.
    """

    kind: ClassVar[str] = "adam"
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        check_beta(self.beta2, "AdamGrafting.beta2", allow_one=False)
        object.__setattr__(self, "eps", check_eps(self.eps, "AdamGrafting.eps"))

    def transform(self) -> Grafting:
        return AdamGraft(eps=self.eps, beta2=self.beta2)


GRAFTINGS: dict[str, type[GraftingConfig]] = {
    c.kind: c for c in (NoGrafting, SGDGrafting, AdaGradGrafting, RMSpropGrafting, AdamGrafting)
}


def resolve_grafting(value: str | GraftingConfig | None) -> GraftingConfig:
    """A grafting config from a name ("none", "sgd", "adagrad", "rmsprop", "adam") or a config."""
    if value is None:
        return NoGrafting()
    if isinstance(value, GraftingConfig):
        return value
    if isinstance(value, str) and value.lower() in GRAFTINGS:
        return GRAFTINGS[value.lower()]()
    raise InvalidShampooArgumentError("grafting", value, f"one of {sorted(GRAFTINGS)} or a GraftingConfig")


__all__ = [
    "GRAFTINGS",
    "AdaGradGraft",
    "AdaGradGrafting",
    "AdamGraft",
    "AdamGrafting",
    "GraftState",
    "GraftingConfig",
    "NoGraft",
    "NoGrafting",
    "RMSpropGraft",
    "RMSpropGrafting",
    "SGDGraft",
    "SGDGrafting",
    "resolve_grafting",
]
