"""Dump Kronecker factors of Shampoo from real training tasks, and curate the set shipped with matroots.

Trains each task with Shampoo (eigh roots, fp32 factors, the README defaults otherwise) and writes the
factor statistics at an early (rank-deficient), a mid and a late step with ``Shampoo.dump_factors``
(the .npz layout of :mod:`matroots.study.matrices`). Tasks (all offline, nothing downloaded):

* ``digits``: an MLP 64-64-32-10 on scikit-learn's bundled 8x8 digits
  (:class:`matroots.study.validation.tasks.DigitsTask`);
* ``bytes_lm``: a small byte-level transformer LM on the Python standard library's own sources
  (:class:`matroots.study.validation.tasks.ByteLMTask`, d_model 32, 2 heads, ff 64, 1 layer, seq 32);
* ``wide1``: an MLP 64-32-1 regressing the digit's value from the digits images: a 1-wide output
  layer, whose factors stay rank deficient.

``--curate DIR`` writes the shipped set instead: per task and stage, the factors of order
<= ``--max-n``, one file per (task, stage), each factor's meta extended by task, stage, factor_dtype and
the command that made it (provenance), plus ``PROVENANCE.json``. Loaded by
``matroots.study.matrices.generate("shampoo", n, ...)``.

    python experiments/dump_factors.py --out runs/factors                  # raw dumps, all factors
    python experiments/dump_factors.py --curate matroots/data/shampoo_factors
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import shampoo
from matroots.study.matrices import load_shampoo_factors, save_shampoo_factors
from matroots.study.validation.tasks import get_task

log = logging.getLogger("dump_factors")

STAGES = {"early": 2, "mid": 60, "late": 300}
SEED = 0


class Wide1Task:
    """MLP 64-32-1 regressing (digit value)/9 from the digits images (mean squared error)."""

    name = "wide1"

    def __init__(self, batch_size: int = 64) -> None:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        self.X = torch.tensor(X / 16.0, dtype=torch.float32)
        self.y = torch.tensor(y / 9.0, dtype=torch.float32).unsqueeze(1)
        self.batch_size = batch_size

    def build_model(self, seed: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 1))

    def batches(self, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        while True:
            idx = torch.randint(0, self.X.shape[0], (self.batch_size,), generator=g)
            yield self.X[idx], self.y[idx]

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.mse_loss(model(batch[0]), batch[1])


def make_task(name: str):
    if name == "wide1":
        return Wide1Task()
    if name == "digits":
        return get_task("digits", hidden=64)
    if name == "bytes_lm":
        return get_task(
            "bytes_lm", d_model=32, heads=2, ff=64, layers=1, seq=32, batch_size=16, max_train_bytes=2_000_000
        )
    raise ValueError(f"unknown task {name!r}; choose from digits, bytes_lm, wide1")


def dump_task(name: str, out: Path, stages: dict[str, int], lr: float = 1e-3) -> dict[str, Path]:
    """Train ``name`` with Shampoo and dump its factors at each stage's step; returns stage -> file."""
    task = make_task(name)
    model = task.build_model(SEED)
    opt = shampoo.Shampoo(
        model.named_parameters(),
        lr=lr,
        eps=1e-12,
        precondition_frequency=10,
        start_preconditioning_step=10,
        max_preconditioner_dim=128,
        grafting="adam",
        root_solver="eigh",
    )
    files: dict[str, Path] = {}
    by_step = {s: k for k, s in stages.items()}
    batches = task.batches(SEED)
    for step in range(1, max(stages.values()) + 1):
        opt.zero_grad(set_to_none=True)
        loss = task.loss(model, next(batches))
        loss.backward()
        opt.step()
        if step in by_step:
            files[by_step[step]] = opt.dump_factors(out / name / by_step[step])
            log.info(
                "%s step %d (%s): loss %.4f -> %s",
                name,
                step,
                by_step[step],
                float(loss),
                files[by_step[step]],
            )
    return files


def curate(directory: Path, tasks: list[str], max_n: int, raw: Path) -> None:
    """Write the shipped set: factors of order <= max_n per (task, stage), with provenance."""
    directory.mkdir(parents=True, exist_ok=True)
    command = "python experiments/dump_factors.py --curate " + str(directory) + f" --max-n {max_n}"
    index = []
    for name in tasks:
        for stage, path in dump_task(name, raw, STAGES).items():
            kept = []
            for A, meta in load_shampoo_factors(path):
                if A.shape[0] > max_n:
                    continue
                stored = {
                    k: v
                    for k, v in meta.items()
                    if k
                    not in ("family", "source", "index", "symmetric", "eigenvalues", "kappa", "kappa_source")
                }
                stored.update(task=name, stage=stage, factor_dtype="float32", command=command)
                kept.append((A, stored))
            target = directory / f"{name}_{stage}.npz"
            save_shampoo_factors(target, kept, compress=True)
            for A, m in kept:
                lam = np.linalg.eigvalsh(A)
                index.append(
                    {
                        "file": target.name,
                        "task": name,
                        "stage": stage,
                        "step": m["step"],
                        "param": m["param"],
                        "block": m["block"],
                        "dim": m["dim"],
                        "n": int(A.shape[0]),
                        "lambda_max": float(lam[-1]),
                        "lambda_min_fp64": float(lam[0]),
                        "numerical_rank": int((lam > A.shape[0] * 2.0**-24 * lam[-1]).sum()),
                    }
                )
    prov = {
        "what": "Kronecker factor statistics L = sum beta2-EMA of G G^T (before bias correction and eps), "
        "accumulated in float32 by shampoo.Shampoo, stored exactly as float64",
        "optimizer": "Shampoo(lr=1e-3, eps=1e-12, precondition_frequency=10, max_preconditioner_dim=128, "
        "grafting='adam', root_solver='eigh', betas=(0.9, 0.999))",
        "stages": STAGES,
        "seed": SEED,
        "command": command,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "factors": index,
    }
    (directory / "PROVENANCE.json").write_text(json.dumps(prov, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=["digits", "bytes_lm", "wide1"])
    ap.add_argument("--out", type=Path, default=Path("runs/factors"), help="raw dumps (all factors)")
    ap.add_argument("--curate", type=Path, default=None, help="write the curated, shipped set here")
    ap.add_argument("--max-n", type=int, default=64, help="largest factor order kept by --curate")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(2)
    if args.curate is not None:
        with tempfile.TemporaryDirectory() as tmp:
            curate(args.curate, args.tasks, args.max_n, Path(tmp))
        return
    for name in args.tasks:
        dump_task(name, args.out, STAGES)


if __name__ == "__main__":
    main()
