"""Train a small model with Shampoo (or AdamW), in one process or data-parallel under torchrun.

The same command line works both ways::

    python experiments/train.py --task digits --steps 200
    torchrun --standalone --nproc_per_node=2 experiments/train.py --task digits --steps 200

Under torchrun (``WORLD_SIZE`` > 1) the script initialises ``torch.distributed`` (gloo on CPU, nccl on
GPU), splits every global batch across the ranks, wraps the model in ``DistributedDataParallel``
(``--grad-sync allreduce``: a plain loop that all-reduces the gradients instead) and gives Shampoo a
``DDPConfig``: each rank computes the roots and search directions of its blocks, one all-gather
shares them. The losses printed match the single-process run to floating-point tolerance.

``--fsdp`` shards the model with FSDP2 (``fully_shard`` on each top-level submodule, then the
model) and gives Shampoo an ``FSDPConfig``: each rank preconditions blocks of its own rows
(:mod:`shampoo.fsdp`); ``--hsdp R`` does the same on an R x (world / R) mesh (replicate x shard).
The same run on one process is ``--row-shards W`` (the blocking the W shards make).
``--fsdp-strategy owner`` keeps the single-process blocks instead, each on one owner rank (the
same run on one process is then the plain one; checkpoints load at any world size). Under --fsdp,
``--save`` writes a ``torch.distributed.checkpoint`` directory; ``--resume DIR`` reads one at any
world size whose shards split the saved blocks (one process included; pass the saving run's
``--row-shards``).

Tasks:

* ``digits``: an MLP on scikit-learn's 8x8 digits (shipped with scikit-learn, no download);
* ``w1``: workload W1 of docs/design.md §8, a 4-layer transformer encoder (d_model 256, 4 heads, ff 1024,
  vocabulary 512, sequences of 128) on synthetic next-token data from a fixed random Markov chain.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import shampoo
import shampoo.distributed
from matroots.core.options import EPS_MODES
from matroots.study import atomic

log = logging.getLogger("train")

VOCAB, D_MODEL, HEADS, FF, LAYERS, SEQ = 512, 256, 4, 1024, 4, 128


class W1Model(nn.Module):
    """W1 (docs/design.md §8): token + position embedding, a 4-layer encoder and an LM head."""

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(SEQ, D_MODEL))
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.pos[:n]
        return self.head(self.encoder(h, mask=self.mask[:n, :n], is_causal=True))


def markov_tokens(batch: int, step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A global batch of sequences from a fixed sparse Markov chain (4 likely successors per token)."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    toks = torch.empty(batch, SEQ + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, VOCAB, (batch,), generator=g)
    choice = torch.randint(0, 4, (batch, SEQ), generator=g)
    for t in range(SEQ):
        toks[:, t + 1] = succ[toks[:, t], choice[:, t]]
    return toks[:, :-1], toks[:, 1:]


def digits_data() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.long)


def build(task: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)  # the same initial weights on every rank
    if task == "w1":
        return W1Model()
    return nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 64), nn.Tanh(), nn.Linear(64, 10))


def make_optimizer(model: nn.Module, args: argparse.Namespace, distributed: bool) -> torch.optim.Optimizer:
    if args.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if args.fsdp:
        cfg: object = shampoo.FSDPConfig(
            strategy=args.fsdp_strategy, communication_dtype=args.comm_dtype, timeout=args.timeout
        )
    elif distributed:
        cfg = shampoo.DDPConfig(
            communication_dtype=args.comm_dtype, cost_model=args.cost_model, timeout=args.timeout
        )
    else:
        cfg = None
    return shampoo.Shampoo(
        # unnamed under FSDP: torch.optim's integer keys, which torch.distributed.checkpoint maps to FQNs
        model.parameters() if args.fsdp or args.dcp else model.named_parameters(),
        lr=args.lr,
        betas=(0.9, 0.999),
        eps=args.eps,
        eps_mode=args.eps_mode,
        psd=None if args.psd == "config" else args.psd,
        weight_decay=args.weight_decay,
        max_preconditioner_dim=args.max_preconditioner_dim,
        precondition_frequency=args.precondition_frequency,
        start_preconditioning_step=args.precondition_frequency,
        grafting="adam",
        root_solver=args.root_solver,
        distributed=cfg,
        row_shards=args.row_shards,
        diagnostics=shampoo.DiagnosticsConfig(dump_every=args.dump_factors_every, dump_dir=args.dump_dir)
        if args.dump_factors_every
        else None,
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=["digits", "w1"], default="digits")
    p.add_argument("--optimizer", choices=["shampoo", "adamw"], default="shampoo")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=None, help="global batch (default: 64 digits, 16 w1)")
    p.add_argument("--lr", type=float, default=None, help="default: 3e-3 digits, 1e-3 w1")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--root-solver", default="eigh")
    p.add_argument("--eps", type=float, default=1e-12)
    p.add_argument("--eps-mode", choices=EPS_MODES, default="absolute")
    p.add_argument(
        "--psd",
        choices=["shift", "meta", "none", "config"],
        default="shift",
        help="rank-deficiency policy of the factors (matroots.core.psd); 'meta' = DistributedShampoo's rule",
    )
    p.add_argument("--dump-factors-every", type=int, default=0, help="dump Kronecker factors every N steps")
    p.add_argument(
        "--dump-dir", type=Path, default=Path("runs/factors"), help="where --dump-factors-every writes"
    )
    p.add_argument("--precondition-frequency", type=int, default=10)
    p.add_argument("--max-preconditioner-dim", type=int, default=256)
    p.add_argument("--comm-dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--cost-model", choices=["roots", "memory"], default="roots")
    p.add_argument("--grad-sync", choices=["ddp", "allreduce"], default="ddp")
    p.add_argument(
        "--fsdp", action="store_true", help="shard the model with FSDP2 (fully_shard) under torchrun"
    )
    p.add_argument("--hsdp", type=int, default=None, metavar="R", help="--fsdp on an R x (world/R) mesh")
    p.add_argument(
        "--fsdp-strategy",
        choices=["local_shard", "owner"],
        default="local_shard",
        help="FSDPConfig(strategy=): blocks of each rank's rows, or single-process blocks on owner ranks",
    )
    p.add_argument(
        "--row-shards", type=int, default=None, help="block as W row shards do (Shampoo row_shards)"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a stuck rank is an error")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--save", type=Path, default=None, help="write model + optimizer state here at the end")
    p.add_argument("--resume", type=Path, default=None, help="start from a checkpoint written by --save")
    args = p.parse_args(argv)
    args.batch = args.batch or (16 if args.task == "w1" else 64)
    args.lr = args.lr or (1e-3 if args.task == "w1" else 3e-3)
    return args


def main(argv: list[str] | None = None) -> float:
    """Train; returns the final loss (averaged over ranks)."""
    args = parse(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world > 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    if distributed:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    rank = dist.get_rank() if distributed else 0
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    if world > 1 and args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be divisible by the number of ranks {world}")
    model = build(args.task, args.seed).to(device)
    net: nn.Module = model
    if args.hsdp:
        args.fsdp = True
    # torch.distributed.checkpoint directories: written under --fsdp, read by any run (one process too)
    args.dcp = args.fsdp or (args.resume is not None and Path(args.resume).is_dir())
    if args.fsdp:
        if not distributed:
            raise SystemExit("--fsdp needs torchrun with more than one process (use --row-shards on one)")
        shard_model(model, device, world, args.hsdp)
    elif distributed and args.grad_sync == "ddp":
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    opt = make_optimizer(model, args, distributed)
    start = 0
    if args.resume is not None and args.dcp:
        start = dcp_load(args.resume, model, opt)
    elif args.resume is not None:
        ckpt = load_checkpoint(args.resume, device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        start = int(ckpt["step"])
    if args.task == "digits":
        X, Y = digits_data()
        X, Y = X.to(device), Y.to(device)
    shard = slice(rank * args.batch // world, (rank + 1) * args.batch // world)
    loss_val = float("nan")
    t0 = time.perf_counter()
    for step in range(start, start + args.steps):
        if args.task == "w1":
            xb, yb = markov_tokens(args.batch, step, args.seed)
        else:
            idx = torch.randint(0, X.shape[0], (args.batch,), generator=torch.Generator().manual_seed(step))
            xb, yb = X[idx.to(device)], Y[idx.to(device)]
        xb, yb = xb[shard].to(device), yb[shard].to(device)
        opt.zero_grad(set_to_none=True)
        out = net(xb)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1))
        loss.backward()
        if distributed and args.grad_sync == "allreduce":
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch._utils._flatten_dense_tensors(grads)  # one collective for all gradients
            dist.all_reduce(flat)
            flat.div_(world)
            for g, f in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
                g.copy_(f)
        opt.step()
        lv = loss.detach()
        if distributed:
            dist.all_reduce(lv)
            lv /= world
        loss_val = float(lv)
        if (step + 1) % args.log_every == 0 or step == start:
            log.info(
                "step %5d  loss %.4f  %.3fs/step",
                step + 1,
                loss_val,
                (time.perf_counter() - t0) / (step + 1 - start),
            )
    if args.save is not None and args.fsdp:
        dcp_save(args.save, model, opt, start + args.steps)
        log.info("saved %s (torch.distributed.checkpoint)", args.save)
    elif args.save is not None:
        optim_state = opt.state_dict()  # collective under distributed Shampoo: every rank calls it
        if rank == 0:
            # Atomic (temp file in the same folder, fsync, rename): a kill mid-save keeps the previous
            # checkpoint, which may be the --resume file itself.
            atomic.remove_stale(args.save)
            atomic.torch_save(
                args.save, {"model": model.state_dict(), "optim": optim_state, "step": start + args.steps}
            )
            log.info("saved %s", args.save)
    sharding = opt.sharding if isinstance(opt, shampoo.Shampoo) else None
    if sharding is not None:
        log.info(
            "rank %d: %d all-gathers, %.3fs communication, optimizer state %.2f MB", rank,
            sharding.comm.calls, sharding.comm.seconds, shampoo.distributed.state_bytes(opt)["total"] / 1e6,
        )  # fmt: skip
    if distributed:
        del net, opt, sharding
        shutdown_distributed()
    return loss_val


def shard_model(model: nn.Module, device: torch.device, world: int, replicas: int | None) -> None:
    """FSDP2: ``fully_shard`` every top-level submodule with parameters, then the model; on an
    ``replicas`` x (world / replicas) mesh (HSDP) when given."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = None
    if replicas:
        if world % replicas:
            raise SystemExit(f"--hsdp {replicas} must divide the number of ranks {world}")
        mesh = init_device_mesh(
            device.type, (replicas, world // replicas), mesh_dim_names=("replicate", "shard")
        )
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)


def dcp_save(path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """Model and optimizer state as a torch.distributed.checkpoint directory (every rank writes its
    shards)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, opt),
        "step": step,
    }
    dcp.save(state, checkpoint_id=str(path))


def dcp_load(path: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """The inverse of :func:`dcp_save`, resharded to this run's mesh; returns the saved step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if not Path(path).is_dir():
        raise CheckpointError(
            f"--resume {path}: not a torch.distributed.checkpoint directory (--fsdp --save)"
        )
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt), "step": 0}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])
    return int(state["step"])


def load_checkpoint(path: Path, device: torch.device) -> dict:
    """A checkpoint written by ``--save``; a missing, truncated or foreign file is a one-line error."""
    import pickle
    import zipfile

    if not path.is_file():
        raise CheckpointError(f"--resume {path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except (EOFError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, OSError) as exc:
        raise CheckpointError(
            f"--resume {path} is not a readable checkpoint ({type(exc).__name__}: {str(exc)[:120]}); "
            "give a file written by --save"
        ) from None
    if not isinstance(ckpt, dict) or not {"model", "optim", "step"} <= set(ckpt):
        raise CheckpointError(f"--resume {path} is not a train.py checkpoint (keys model, optim, step)")
    return ckpt


class CheckpointError(ValueError):
    """A --resume file that cannot be used."""


def shutdown_distributed() -> None:
    """Tear torch.distributed down in order, so no rank aborts at exit.

    Every rank reaches a barrier (nobody closes its connections while a peer still talks), then the
    objects holding the process group (DDP's reducer, Shampoo's direction exchange) are collected, and
    the group is destroyed while the interpreter is fully alive. Left to interpreter exit, gloo's
    background threads were destroyed during C++ static teardown in an arbitrary order, which aborted
    the process now and then ("terminate called without an active exception", SIGABRT)."""
    import gc

    dist.barrier()
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


def cli(argv: list[str] | None = None) -> int:
    """``main`` with the project's error contract: a user mistake or a full disk is one line, exit 2."""
    from matroots.core.errors import MatrootsError

    try:
        main(argv)
    except (MatrootsError, CheckpointError) as exc:
        print(f"train.py: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
