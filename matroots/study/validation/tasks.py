"""Offline training tasks for end-to-end optimizer validation, all CPU-sized and on real data.

Every task has the same small API (stable: ``experiments/dump_factors.py`` and the validation
runner use it)::

    task = get_task("digits", hidden=64)      # size options are keyword arguments
    model = task.build_model(seed)            # same seed -> same initial weights
    for step, batch in zip(range(100), task.batches(seed)):  # same seed -> same data order
        loss = task.loss(model, batch)
    task.evaluate(model)                      # {"val_loss": ..., <task.metric>: ...}

Every task takes ``holdout=True`` (the tuning protocol, :mod:`matroots.study.validation.protocol`): its
validation data is then cut in two disjoint halves, a *validation* split that hyperparameters are
chosen on (``val_loss``, the metric) and a *held-out* split that results are reported on
(``test_loss``, ``test_metric``); the training data is the same either way.

Tasks (``TASKS``):

* ``digits``: an MLP (64-hidden-hidden-10, tanh) on scikit-learn's bundled 8x8 digits; a fixed
  80/20 split; metric: validation accuracy.
* ``lsq``: an ill-conditioned least-squares problem on real data: the digits images, PCA-whitened,
  given an input covariance with eigenvalues ``geomspace(1, 1/kappa)`` (kappa = 1e4) in a random
  rotated basis, regressed linearly onto their one-hot labels. The optimum is known in closed form
  (the least-squares fit of the training set); metric: excess validation MSE over it.
* ``bytes_lm``: a small causal transformer byte-level LM on the Python standard library's sources
  (:mod:`matroots.study.validation.corpus`, split by file); metric: validation bits per byte.
* ``w1``: workload W1 of the benchmarks (4-layer transformer encoder, d_model 256, 4 heads,
  ff 1024, sequences of 128; vocabulary 256 for bytes) on the same text; metric: bits per byte.

Dropout is off everywhere, so a run is a deterministic function of (seed, optimizer).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from .corpus import load_corpus, split_at_file_boundary

Batch = tuple[torch.Tensor, torch.Tensor]
DATA_SEED = 20_241_201  # fixes train/validation splits and validation windows, independent of run seeds


def _batch_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(1_000_003 * int(seed) + 17)


class Task(ABC):
    """A model, its data, a validation metric and the target the runner compares optimizers on.

    ``target`` is the column steps-to-target is measured on (lower is better); ``metric`` names the
    task's own metric in :meth:`evaluate` and ``metric_goal`` whether higher ("max") or lower ("min")
    is better.
    """

    name: str = ""
    metric: str = ""
    metric_goal: str = "min"
    target: str = "val_loss"
    default_steps: int = 200
    default_eval_every: int = 20

    def __init__(self, **size: Any) -> None:
        self.size = dict(size)
        self.holdout = bool(size.get("holdout", False))

    def build_model(self, seed: int) -> nn.Module:
        """The model with the initial weights of ``seed`` (global RNG state is left untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            return self._model()

    @abstractmethod
    def _model(self) -> nn.Module: ...

    @abstractmethod
    def batches(self, seed: int) -> Iterator[Batch]:
        """An endless, deterministic stream of training batches for ``seed``."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor: ...

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Validation loss (``val_loss``) and the task metric, in eval mode without gradients; with
        ``holdout``, also the held-out split's ``test_loss`` and ``test_metric``."""
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = self._evaluate(model, "val")
                if self.holdout:
                    test = self._evaluate(model, "test")
                    out["test_loss"] = test["val_loss"]
                    out["test_metric"] = test[self.metric]
        finally:
            model.train(was)
        return out

    @abstractmethod
    def _evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """``val_loss`` and the metric on ``split`` ("val" or "test") in the keys of the val split."""

    def info(self) -> dict[str, Any]:
        """What the task is (for provenance)."""
        return {"task": self.name, "metric": self.metric, **self.size}


# ----------------------------------------------------------------------------------------------------
# digits


def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(DATA_SEED).permutation(len(y))
    n_val = len(y) // 5
    va, tr = perm[:n_val], perm[n_val:]
    return X[tr] / 16.0, y[tr], X[va] / 16.0, y[va]


def halves(n: int, holdout: bool) -> tuple[slice, slice]:
    """The validation and held-out slices of ``n`` validation examples (all and none without holdout)."""
    if not holdout:
        return slice(0, n), slice(0, 0)
    return slice(0, n // 2), slice(n // 2, n)


class DigitsTask(Task):
    """MLP classifier on scikit-learn's 8x8 digits (1437 train / 360 validation images)."""

    name = "digits"
    metric = "val_accuracy"
    metric_goal = "max"
    default_steps = 300
    default_eval_every = 20

    def __init__(self, hidden: int = 128, batch_size: int = 64, holdout: bool = False) -> None:
        super().__init__(hidden=hidden, batch_size=batch_size, **({"holdout": True} if holdout else {}))
        self.hidden, self.batch_size = int(hidden), int(batch_size)
        xt, yt, xv, yv = _digits_split()
        self.x_train = torch.tensor(xt, dtype=torch.float32)
        self.y_train = torch.tensor(yt, dtype=torch.long)
        v, t = halves(len(yv), self.holdout)
        self.splits = {
            name: (torch.tensor(xv[sl], dtype=torch.float32), torch.tensor(yv[sl], dtype=torch.long))
            for name, sl in (("val", v), ("test", t))
        }
        self.x_val, self.y_val = self.splits["val"]

    def _model(self) -> nn.Module:
        h = self.hidden
        return nn.Sequential(
            nn.Linear(64, h), nn.Tanh(), nn.Linear(h, h // 2), nn.Tanh(), nn.Linear(h // 2, 10)
        )

    def batches(self, seed: int) -> Iterator[Batch]:
        g = _batch_generator(seed)
        n = self.x_train.shape[0]
        while True:
            idx = torch.randint(0, n, (self.batch_size,), generator=g)
            yield self.x_train[idx], self.y_train[idx]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    def _evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        x, y = self.splits[split]
        out = model(x)
        return {
            "val_loss": float(nn.functional.cross_entropy(out, y)),
            "val_accuracy": float((out.argmax(-1) == y).float().mean()),
        }


# ----------------------------------------------------------------------------------------------------
# ill-conditioned least squares


class LeastSquaresTask(Task):
    """Linear regression of one-hot digit labels on digits images with a shaped input covariance.

    The images are centred and PCA-whitened on the training split (components with variance below
    1e-6 of the largest dropped, leaving r ~ 60 inputs), then multiplied by
    ``diag(geomspace(1, kappa^-1/2)) Q^T`` with a random orthogonal Q: the training inputs have
    covariance with condition number exactly ``kappa`` in a basis that no diagonal (Adam-like)
    preconditioner sees. The model is ``Linear(r, 10)``; the loss is the mean squared error (summed
    over the 10 outputs). ``optimum_val_loss`` is the validation loss of the exact least-squares fit
    of the training set; the metric is the excess over it.
    """

    name = "lsq"
    metric = "val_excess_loss"
    metric_goal = "min"
    default_steps = 300
    default_eval_every = 20

    def __init__(self, kappa: float = 1e4, batch_size: int = 128, holdout: bool = False) -> None:
        super().__init__(kappa=kappa, batch_size=batch_size, **({"holdout": True} if holdout else {}))
        self.kappa, self.batch_size = float(kappa), int(batch_size)
        xt, yt, xv, yv = _digits_split()
        mean = xt.mean(0)
        cov = np.cov(xt - mean, rowvar=False)
        ev, V = np.linalg.eigh(cov)
        order = np.argsort(ev)[::-1]
        ev, V = ev[order], V[:, order]
        keep = ev > 1e-6 * ev[0]
        W = V[:, keep] / np.sqrt(ev[keep])  # whitening (PCA order: largest variance first)
        r = int(keep.sum())
        rng = np.random.default_rng(DATA_SEED + 1)
        Q, _ = np.linalg.qr(rng.standard_normal((r, r)))
        shape = np.geomspace(1.0, self.kappa**-0.5, r)  # std devs: covariance eigenvalues 1 .. 1/kappa
        T = W @ np.diag(shape) @ Q.T

        def feats(x: np.ndarray) -> torch.Tensor:
            return torch.tensor((x - mean) @ T, dtype=torch.float32)

        def onehot(y: np.ndarray) -> torch.Tensor:
            return torch.tensor(np.eye(10)[y], dtype=torch.float32)

        self.x_train, self.y_train = feats(xt), onehot(yt)
        v, t = halves(len(yv), self.holdout)
        self.splits = {name: (feats(xv[sl]), onehot(yv[sl])) for name, sl in (("val", v), ("test", t))}
        self.x_val, self.y_val = self.splits["val"]
        self.inputs = r
        xtr = np.c_[self.x_train.double().numpy(), np.ones(len(yt))]
        coef, *_ = np.linalg.lstsq(xtr, self.y_train.double().numpy(), rcond=None)
        self.optimum = {}
        for name, (x, y) in self.splits.items():
            xs = np.c_[x.double().numpy(), np.ones(len(y))]
            self.optimum[name] = (
                float(((xs @ coef - y.double().numpy()) ** 2).sum(1).mean()) if len(y) else 0.0
            )
        self.optimum_val_loss = self.optimum["val"]
        c = np.cov(self.x_train.double().numpy(), rowvar=False)
        e = np.linalg.eigvalsh(c)
        self.input_condition_number = float(e[-1] / e[0])

    def _model(self) -> nn.Module:
        return nn.Linear(self.inputs, 10)

    def batches(self, seed: int) -> Iterator[Batch]:
        g = _batch_generator(seed)
        n = self.x_train.shape[0]
        while True:
            idx = torch.randint(0, n, (self.batch_size,), generator=g)
            yield self.x_train[idx], self.y_train[idx]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return (model(batch[0]) - batch[1]).square().sum(-1).mean()

    def _evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        x, y = self.splits[split]
        v = float((model(x) - y).square().sum(-1).mean())
        return {"val_loss": v, "val_excess_loss": v - self.optimum[split]}

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "inputs": self.inputs,
            "input_condition_number": self.input_condition_number,
            "optimum_val_loss": self.optimum_val_loss,
        }


# ----------------------------------------------------------------------------------------------------
# byte-level language models on the stdlib sources


class ByteTransformer(nn.Module):
    """Token + learned position embedding, a causal post-norm transformer encoder and an LM head."""

    def __init__(self, vocab: int, d_model: int, heads: int, ff: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:n]
        return self.head(self.encoder(h, mask=self.mask[:n, :n], is_causal=True))


class ByteLMTask(Task):
    """Next-byte prediction on the Python standard library's sources; metric: bits per byte.

    Training batches are windows of ``seq + 1`` bytes at uniformly random offsets of the training
    files (a generator seeded by the run seed); validation is a fixed set of ``val_windows`` windows
    of the validation files (seeded by a constant), so every run is scored on the same bytes.
    """

    name = "bytes_lm"
    metric = "val_bits_per_byte"
    metric_goal = "min"
    default_steps = 300
    default_eval_every = 25
    _arch: ClassVar[dict[str, int]] = {"d_model": 64, "heads": 4, "ff": 256, "layers": 2, "seq": 64}

    def __init__(
        self,
        *,
        batch_size: int = 16,
        val_windows: int = 64,
        max_train_bytes: int | None = None,
        max_val_bytes: int | None = None,
        holdout: bool = False,
        **arch: int,
    ) -> None:
        unknown = set(arch) - set(self._arch)
        if unknown:
            raise TypeError(
                f"{self.name}: unknown size options {sorted(unknown)}; allowed {sorted(self._arch)}"
            )
        self.arch = {**self._arch, **{k: int(v) for k, v in arch.items()}}
        super().__init__(
            batch_size=batch_size,
            val_windows=val_windows,
            max_train_bytes=max_train_bytes,
            max_val_bytes=max_val_bytes,
            **({"holdout": True} if holdout else {}),
            **self.arch,
        )
        self.batch_size, self.seq = int(batch_size), self.arch["seq"]
        self.corpus = load_corpus(max_train_bytes, max_val_bytes)
        self.train_bytes = torch.from_numpy(self.corpus.train.astype(np.int64))
        parts = {"val": self.corpus.val}
        if self.holdout:  # whole validation files on each side: cut at the file boundary after the middle
            parts = dict(zip(("val", "test"), split_at_file_boundary(self.corpus.val), strict=True))
        self.windows = {}
        for i, (name, arr) in enumerate(parts.items()):
            data = torch.from_numpy(arr.astype(np.int64))
            g = torch.Generator().manual_seed(DATA_SEED + i)
            starts = torch.randint(0, data.numel() - self.seq - 1, (int(val_windows),), generator=g)
            self.windows[name] = torch.stack([data[s : s + self.seq + 1] for s in starts.tolist()])
        self.val_windows = self.windows["val"]

    def _model(self) -> nn.Module:
        a = self.arch
        return ByteTransformer(256, a["d_model"], a["heads"], a["ff"], a["layers"], a["seq"])

    def batches(self, seed: int) -> Iterator[Batch]:
        g = _batch_generator(seed)
        n = self.train_bytes.numel() - self.seq - 1
        offs = torch.arange(self.seq + 1)
        while True:
            starts = torch.randint(0, n, (self.batch_size, 1), generator=g)
            w = self.train_bytes[starts + offs]
            yield w[:, :-1], w[:, 1:]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        out = model(batch[0])
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), batch[1].reshape(-1))

    def _evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        windows = self.windows[split]
        total = 0.0
        for chunk in windows.split(32):
            out = model(chunk[:, :-1])
            total += float(
                nn.functional.cross_entropy(out.reshape(-1, 256), chunk[:, 1:].reshape(-1), reduction="sum")
            )
        v = total / (windows.shape[0] * self.seq)
        return {"val_loss": v, "val_bits_per_byte": v / math.log(2)}

    def info(self) -> dict[str, Any]:
        return {**super().info(), **self.corpus.info()}


class W1Task(ByteLMTask):
    """Workload W1 (4-layer encoder, d_model 256, 4 heads, ff 1024, seq 128) as a byte-level LM."""

    name = "w1"
    default_steps = 300
    default_eval_every = 50
    _arch: ClassVar[dict[str, int]] = {"d_model": 256, "heads": 4, "ff": 1024, "layers": 4, "seq": 128}

    def __init__(self, *, batch_size: int = 16, val_windows: int = 32, **kw: Any) -> None:
        super().__init__(batch_size=batch_size, val_windows=val_windows, **kw)


TASKS: dict[str, type[Task]] = {t.name: t for t in (DigitsTask, LeastSquaresTask, ByteLMTask, W1Task)}


def get_task(name: str, **size: Any) -> Task:
    """The task called ``name`` (see ``TASKS``), built with the given size options."""
    try:
        cls = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown validation task {name!r}; available: {sorted(TASKS)}") from None
    return cls(**size)


__all__ = [
    "TASKS",
    "ByteLMTask",
    "ByteTransformer",
    "DigitsTask",
    "LeastSquaresTask",
    "Task",
    "W1Task",
    "get_task",
]
