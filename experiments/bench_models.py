"""Models and optimizer configurations of the step-time benchmark (experiments/bench_step.py).

Models: the W1 family (docs/design.md §8, workload W1): token + position embedding, a 4-layer
``nn.TransformerEncoder`` (torch's default dropout 0.1) and an LM head over a vocabulary of 512,
sequences of 128 tokens, batch 16. Sizes scale d_model with a head dimension of 64 and a
feed-forward width of 4 d_model; W1 itself is d_model 256 (4 heads, ff 1024) exactly as before:

    d_model   heads   ff     matmul params
    128       2       512    0.85 M
    256 (W1)  4       1024   3.28 M
    512       8       2048   12.8 M
    1024      16      4096   50.9 M

``tiny`` (d 32, 2 heads, ff 64, 2 layers, seq 16, batch 4, vocab 64) is for smoke runs and tests.

Optimizers: AdamW; this project's Shampoo (``shampoo.Shampoo``) at a precondition frequency with a
registered root solver; its eigenvalue-corrected (SOAP) variant when ``shampoo`` exposes one; and the
peers users would pick instead, each behind an adapter (:class:`PeerAdapter`) that builds it with
settings matched to ours (:class:`Common`): heavyball's SOAP and KL-Shampoo, pytorch-optimizer's
Shampoo and ScalableShampoo. A peer whose package is not importable is reported as unavailable
(``pip install -e '.[peers]'``), never silently dropped.
"""

from __future__ import annotations

import enum
import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import shampoo


@dataclass(frozen=True)
class ModelSize:
    """Shape of one W1-family model and of its batches."""

    d_model: int
    heads: int
    ff: int
    layers: int = 4
    seq: int = 128
    batch: int = 16
    vocab: int = 512

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(32, 2, 64, layers=2, seq=16, batch=4, vocab=64),
    "128": ModelSize(128, 2, 512),
    "256": ModelSize(256, 4, 1024),  # W1
    "512": ModelSize(512, 8, 2048),
    "1024": ModelSize(1024, 16, 4096),
}
W1 = SIZES["256"]


class EncoderLM(nn.Module):
    """Token + position embedding, an ``nn.TransformerEncoder`` and an LM head."""

    def __init__(self, size: ModelSize = W1) -> None:
        super().__init__()
        self.size = size
        self.embed = nn.Embedding(size.vocab, size.d_model)
        self.pos = nn.Parameter(torch.zeros(size.seq, size.d_model))
        layer = nn.TransformerEncoderLayer(size.d_model, size.heads, size.ff, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        self.head = nn.Linear(size.d_model, size.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.pos))

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Next-token cross entropy of a ``(batch, seq + 1)`` token tensor."""
        logits = self(batch[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, self.size.vocab), batch[:, 1:].reshape(-1))


def make_batches(size: ModelSize, seed: int, count: int = 8, device: str = "cpu") -> list[torch.Tensor]:
    """``count`` random token batches of shape ``(batch, seq + 1)`` (the same for every configuration)."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, size.vocab, (size.batch, size.seq + 1), generator=g).to(device) for _ in range(count)
    ]


# ----------------------------------------------------------------------------------------------------
# Optimizer configurations


@dataclass(frozen=True)
class Common:
    """Hyperparameters every configuration shares (peers get the nearest equivalent of each)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8  # Adam / grafting epsilon
    root_eps: float = 1e-12  # added to factors before a root (Shampoo's ``eps``)
    weight_decay: float = 0.01
    block: int = 256  # max preconditioner dimension / block size
    frequency: int = 10  # precondition frequency of the peers and of the solver comparison


@dataclass
class OptSpec:
    """One optimizer configuration of the benchmark.

    ``build(model)`` returns the optimizer; ``settings`` is what is printed next to the results;
    ``unavailable`` says why the configuration cannot run (it is then reported, not timed).
    """

    name: str
    kind: str  # "adamw" | "shampoo" | "soap" | "peer"
    build: Callable[[nn.Module], torch.optim.Optimizer] | None
    settings: dict[str, Any] = field(default_factory=dict)
    frequency: int | None = None
    solver: str | None = None
    unavailable: str | None = None


def adamw_spec(c: Common) -> OptSpec:
    settings = {"lr": c.lr, "betas": c.betas, "eps": c.eps, "weight_decay": c.weight_decay}
    return OptSpec(
        "adamw",
        "adamw",
        lambda m: torch.optim.AdamW(m.parameters(), **settings),
        settings,  # type: ignore[arg-type]
    )


def _shampoo_settings(c: Common, frequency: int, solver: str) -> dict[str, Any]:
    return {
        "lr": c.lr,
        "betas": c.betas,
        "eps": c.root_eps,
        "weight_decay": c.weight_decay,
        "max_preconditioner_dim": c.block,
        "precondition_frequency": frequency,
        "start_preconditioning_step": 1,
        "grafting": shampoo.AdamGrafting(beta2=c.betas[1], eps=c.eps),
        "root_solver": solver,
    }


def shampoo_spec(c: Common, frequency: int, solver: str = "eigh") -> OptSpec:
    settings = _shampoo_settings(c, frequency, solver)
    name = f"shampoo_f{frequency}" + ("" if solver == "eigh" else f"_{solver}")
    return OptSpec(
        name,
        "shampoo",
        lambda m: shampoo.Shampoo(m.named_parameters(), **settings),
        settings,
        frequency=frequency,
        solver=solver,
    )


def find_soap_preconditioner() -> type | None:
    """The eigenvalue-corrected (SOAP) per-block transform of ``shampoo``, if this version has one
    (``shampoo.SOAP``, or a class named SOAP / EigenvalueCorrected* in ``shampoo.transforms``)."""
    cls = getattr(shampoo, "SOAP", None)
    if inspect.isclass(cls):
        return cls
    try:
        mod = importlib.import_module("shampoo.transforms")
    except ImportError:
        return None
    for name, obj in vars(mod).items():
        if (
            inspect.isclass(obj)
            and ("SOAP" in name or "EigenvalueCorrected" in name)
            and hasattr(obj, "init")
        ):
            return obj
    return None


def soap_spec(c: Common, frequency: int) -> OptSpec:
    """Shampoo with its eigenvalue-corrected transform as the group's ``preconditioner``, as published:
    no grafting, Adam (eps, the factors' beta2) in the factors' eigenbasis, refreshed every frequency."""
    name = f"shampoo_soap_f{frequency}"
    cls = find_soap_preconditioner()
    if cls is None:
        return OptSpec(name, "soap", None, unavailable="this shampoo has no SOAP transform")
    accepted = inspect.signature(cls).parameters
    kwargs = {k: v for k, v in (("eps", c.eps),) if k in accepted}
    settings = {**_shampoo_settings(c, frequency, "eigh"), "grafting": "none"}
    del settings["root_solver"]

    def build(m: nn.Module) -> torch.optim.Optimizer:
        group = {"params": list(m.parameters()), "preconditioner": cls(**kwargs)}
        return shampoo.Shampoo([group], **settings)

    pre = cls(**kwargs)
    shown = {**settings, "preconditioner": f"{cls.__module__}.{pre!r}"}
    return OptSpec(name, "soap", build, shown, frequency=frequency, solver="soap")


# ----------------------------------------------------------------------------------------------------
# Peers


@dataclass(frozen=True)
class PeerAdapter:
    """How to build one peer optimizer with settings matched to :class:`Common`.

    ``settings(c)`` returns the keyword arguments passed to ``module.<cls>(params, **settings)``;
    ``setup(module)`` runs once before building (e.g. switching a library to eager mode).
    """

    name: str
    module: str
    cls: str
    settings: Callable[[Common], dict[str, Any]]
    note: str = ""
    setup: Callable[[Any], None] | None = None
    named_params: bool = False
    dist: str = ""  # distribution name for the version (default: the module name)


def _heavyball_eager(mod: Any) -> None:
    # heavyball compiles its fused kernels with torch.compile by default; this benchmark runs every
    # optimizer eagerly (ours has no compiled path), so the comparison is of the same execution model.
    mod.utils.compile_mode = None
    mod.utils.compile_mode_recommended_to_none = None


def _heavyball(c: Common) -> dict[str, Any]:
    return {
        "lr": c.lr,
        "betas": c.betas,
        "shampoo_beta": c.betas[1],
        "eps": c.eps,
        "weight_decay": c.weight_decay,
        "precondition_frequency": c.frequency,
        "use_precond_schedule": False,
        "max_precond_dim": c.block,
        "split": True,  # cut dims > max_precond_dim into blocks of max_precond_dim (as ours does)
        "compile_step": False,
    }


def _po_shampoo(c: Common) -> dict[str, Any]:
    return {
        "lr": c.lr,
        "momentum": c.betas[0],
        "weight_decay": c.weight_decay,
        "weight_decouple": True,
        "preconditioning_compute_steps": c.frequency,
        # its factors start at matrix_eps * I and are never regularised again: at our 1e-12 the first
        # inverse roots are ~1e3 and W1 diverges to a failed SVD within 20 steps, so its default
        "matrix_eps": 1e-6,
    }


def _po_scalable(c: Common) -> dict[str, Any]:
    from pytorch_optimizer.optimizer.utils.graft import LayerWiseGrafting

    return {
        "lr": c.lr,
        "betas": c.betas,
        "weight_decay": c.weight_decay,
        "decoupled_weight_decay": True,
        "start_preconditioning_step": 1,
        "preconditioning_compute_steps": c.frequency,
        "statistics_compute_steps": 1,
        "block_size": c.block,
        "graft_type": LayerWiseGrafting.RMSPROP,  # nearest to Adam grafting (it has no Adam graft)
        "nesterov": False,
        "matrix_eps": c.root_eps,
        "diagonal_eps": c.eps,
    }


PEERS: dict[str, PeerAdapter] = {
    a.name: a
    for a in (
        PeerAdapter("heavyball_soap", "heavyball", "SOAP", _heavyball, "eager", _heavyball_eager),
        PeerAdapter(
            "heavyball_klshampoo",
            "heavyball",
            "KLShampoo",
            _heavyball,
            "eager; heavyball's only Shampoo (KL-corrected factors)",
            _heavyball_eager,
        ),
        PeerAdapter(
            "po_shampoo",
            "pytorch_optimizer",
            "Shampoo",
            _po_shampoo,
            "no blocking (one factor per full dim), SVD roots, no grafting",
            dist="pytorch-optimizer",
        ),
        PeerAdapter(
            "po_scalable_shampoo",
            "pytorch_optimizer",
            "ScalableShampoo",
            _po_scalable,
            "RMSprop grafting (it has no Adam grafting)",
            dist="pytorch-optimizer",
        ),
    )
}


def peer_spec(
    adapter: PeerAdapter, c: Common, importer: Callable[[str], Any] = importlib.import_module
) -> OptSpec:
    """The configuration of one peer; ``unavailable`` when its package does not import."""
    try:
        mod = importer(adapter.module)
        cls = getattr(mod, adapter.cls)
    except (ImportError, AttributeError) as exc:
        return OptSpec(
            adapter.name,
            "peer",
            None,
            unavailable=f"{adapter.module}.{adapter.cls} not importable ({exc}); pip install -e '.[peers]'",
        )
    settings = adapter.settings(c)
    version = getattr(mod, "__version__", None) or _dist_version(adapter.dist or adapter.module)

    def build(m: nn.Module) -> torch.optim.Optimizer:
        if adapter.setup is not None:
            adapter.setup(mod)
        params: Iterable[Any] = m.named_parameters() if adapter.named_params else m.parameters()
        return cls(params, **settings)

    shown = {"class": f"{adapter.module}.{adapter.cls} {version}", **settings}
    if adapter.note:
        shown["note"] = adapter.note
    return OptSpec(adapter.name, "peer", build, shown, frequency=c.frequency)


def _dist_version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def peer_specs(
    names: Iterable[str], c: Common, importer: Callable[[str], Any] = importlib.import_module
) -> list[OptSpec]:
    out = []
    for n in names:
        if n not in PEERS:
            raise ValueError(f"unknown peer {n!r}; known: {', '.join(PEERS)}")
        out.append(peer_spec(PEERS[n], c, importer))
    return out


def format_settings(settings: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, enum.Enum):
            return f"{type(v).__name__}.{v.name}"
        if isinstance(v, float):
            return f"{v:g}"
        if isinstance(v, tuple):
            return "(" + ", ".join(fmt(x) for x in v) + ")"
        return str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in settings.items())


__all__ = [
    "PEERS",
    "SIZES",
    "W1",
    "Common",
    "EncoderLM",
    "ModelSize",
    "OptSpec",
    "PeerAdapter",
    "adamw_spec",
    "find_soap_preconditioner",
    "format_settings",
    "make_batches",
    "peer_spec",
    "peer_specs",
    "shampoo_spec",
    "soap_spec",
]
