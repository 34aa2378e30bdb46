"""Golden runs of the Shampoo optimizer: fixed short runs whose final parameters and state are recorded,
so that a refactor that must not change the numbers (issue 23) can prove it did not.

Each case trains a tiny model (two linear layers, a 3-D parameter, biases) for :data:`STEPS` steps on
fixed data: every registered root solver, SOAP with each basis update, each grafting method,
``statistics_frequency`` 2, momentum, beta1 = 0, a failing primary solver (the fallback path), a
gradient whose statistics overflow (the reset path, Shampoo and SOAP), 2 gloo ranks, and the fast
paths (fused Adam grafting, the update from the buckets, trusted factors, round chunks) on and off.
A case's result is every parameter and every state entry of ``state_dict()`` (the wall-clock
``seconds`` fields dropped), digested with SHA-256 over the raw bytes, and the arrays themselves.

Records live in ``experiments/golden/`` keyed by a machine fingerprint (:func:`fingerprint`: CPU model,
family/model/stepping and vector extensions, numpy's and scipy's BLAS kernels, torch version, ATen
CPU capability, MKL_CBWR, and the thread count 1 the runs use). On the recording machine the
check is bitwise; elsewhere the arrays are compared with the tolerance of :func:`close` (see there).

    python experiments/golden_runs.py --check           # compare every case with the record
    python experiments/golden_runs.py --check CASE ...  # some cases
    python experiments/golden_runs.py --record          # (re)write this machine's record
    python experiments/golden_runs.py --list

A case's fast-path setting becomes the optimizer's implementation in one place,
:func:`implementation` (the optimizer's ``implementation=`` setting).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import shampoo
from matroots.solvers import CoupledNewtonConfig, SolverConfig, registry
from matroots.study import forkserver

GOLDEN_DIR = Path(__file__).parent / "golden"
STEPS = 6
LR = 1e-2
EPS = 1e-3  # relative: every matrix solved has kappa <= ~1/EPS (see close())
BATCH = 8

#: The fast paths as a case names them; all on is the optimizer's default.
FAST_DEFAULT = {
    "fused_adam": True,
    "apply_from_buckets": True,
    "trust_factors": True,
    "round_chunk_bytes": None,
}
FAST_OFF = {"fused_adam": False, "apply_from_buckets": False, "trust_factors": False, "round_chunk_bytes": 1}


@dataclass(frozen=True)
class Case:
    name: str
    options: dict[str, Any] = field(default_factory=dict)  # Shampoo keyword arguments over BASE
    fast: dict[str, Any] = field(default_factory=lambda: dict(FAST_DEFAULT))
    ranks: int = 1
    overflow_step: int | None = None  # the step whose gradient is scaled by 1e30 (statistics overflow)


BASE: dict[str, Any] = dict(
    lr=LR, betas=(0.9, 0.99), eps=EPS, eps_mode="relative", weight_decay=1e-3, max_preconditioner_dim=4,
    precondition_frequency=2, start_preconditioning_step=2, grafting="adam", root_solver="eigh",
    exponent_override={3: 0.25},  # p = 4 for the 3-D parameter: newton_schulz needs a power of two
)  # fmt: skip


@contextlib.contextmanager
def implementation(fast: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Make ``fast`` the optimizer's implementation for the block; yields the extra Shampoo keyword
    arguments it needs: ``implementation=shampoo.ShampooImplementation(...)`` (a
    ``round_chunk_bytes`` of None here means the default chunk, 8 MiB)."""
    kw = {k: v for k, v in fast.items() if not (k == "round_chunk_bytes" and v is None)}
    yield {"implementation": shampoo.ShampooImplementation(**kw)}


class FailsInFp32(SolverConfig):
    """Coupled Newton stopped after one iteration in fp32 (not converged): every primary solve fails
    and the fallback (fp64 eigh) supplies the root."""

    name = "fails_in_fp32"

    def solve(self, A, p, *, dtype=None, **kw):  # type: ignore[no-untyped-def, override]
        max_iter = 1 if dtype == torch.float32 else None
        return CoupledNewtonConfig().solve(A, p, dtype=dtype, max_iter=max_iter, **kw)


def cases() -> list[Case]:
    out = [Case(f"solver_{s}", {"root_solver": s}) for s in registry.available()]
    out += [Case(f"graft_{g}", {"grafting": g}) for g in ("none", "sgd", "adagrad", "rmsprop")]
    out += [
        Case(f"soap_{b}", {"preconditioner": shampoo.SOAP(basis_update=b)})
        for b in shampoo.transforms.soap.BASIS_UPDATES
    ]
    out += [
        Case(
            "soap_published", {"preconditioner": "soap", "grafting": "none", "start_preconditioning_step": 1}
        ),
        Case("statistics_frequency_2", {"statistics_frequency": 2}),
        Case("statistics_frequency_3_soap", {"statistics_frequency": 3, "preconditioner": "soap"}),
        Case("momentum_nesterov", {"momentum": 0.5, "nesterov": True}),
        Case("beta1_0", {"betas": (0.0, 0.99)}),
        Case("no_bias_correction", {"use_bias_correction": False, "grafting": "adam"}),
        Case("fast_off", {}, dict(FAST_OFF)),
        Case("fast_off_coupled_newton", {"root_solver": "coupled_newton"}, dict(FAST_OFF)),
        Case("fast_off_soap", {"preconditioner": "soap"}, dict(FAST_OFF)),
        Case("fused_adam_off", {}, {**FAST_DEFAULT, "fused_adam": False}),
        Case("apply_from_buckets_off", {}, {**FAST_DEFAULT, "apply_from_buckets": False}),
        Case("fallback", {"root_solver": FailsInFp32()}),
        Case("overflow_reset", {}, overflow_step=3),
        Case("overflow_reset_soap", {"preconditioner": "soap"}, overflow_step=3),
        Case("ddp2", {}, ranks=2),
        Case("ddp2_soap", {"preconditioner": "soap"}, ranks=2),
    ]
    return out


# ----------------------------------------------------------------------------------------------------
# the run


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 6)
        self.fc2 = nn.Linear(6, 3)
        self.cube = nn.Parameter(torch.randn(2, 3, 4) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        # the cube's gradient, sum_b x_i r_j x_k, has full-rank unfoldings (no degenerate eigenbases)
        return self.fc2(h) + torch.einsum("bi,ijk,bk->bj", x[:, :2], self.cube, x[:, 2:6])


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH, 8, generator=g), torch.randn(STEPS, BATCH, 3, generator=g)


def _train(case: Case, rank: int = 0, ranks: int = 1) -> dict[str, Any]:
    # torch.einsum contracts left to right unless the opt_einsum package is installed, which then
    # picks another order (other roundings): pinned off, so the record does not depend on it
    torch.backends.opt_einsum.enabled = False
    torch.manual_seed(0)
    model = Tiny()
    X, Y = _data()
    shard = slice(rank * BATCH // ranks, (rank + 1) * BATCH // ranks)
    with implementation(case.fast) as extra, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reset and failure warnings are expected in some cases
        dist = shampoo.DDPConfig(timeout=60) if ranks > 1 else None
        opt = shampoo.Shampoo(model.named_parameters(), **{**BASE, **case.options}, **extra, distributed=dist)
        for t in range(STEPS):
            opt.zero_grad()
            nn.functional.mse_loss(model(X[t, shard]), Y[t, shard]).backward()
            if ranks > 1:
                for p in model.parameters():
                    torch.distributed.all_reduce(p.grad)
                    p.grad.div_(ranks)
            if case.overflow_step == t + 1:
                for p in model.parameters():
                    p.grad.mul_(1e30)  # finite, but G G^T and g^2 overflow fp32 by far
            opt.step()
        sd = opt.state_dict()
    return flatten_result(model, sd)


def flatten_result(model: nn.Module, sd: dict[str, Any]) -> dict[str, Any]:
    """{key: array or scalar} of the parameters and the state (``seconds`` fields dropped)."""
    out: dict[str, Any] = {f"param/{n}": p.detach().clone() for n, p in model.named_parameters()}
    for key, entries in sd["state"].items():
        for name, v in entries.items():
            if name.endswith("seconds"):
                continue
            if name.endswith(".error"):  # whether a factor reports an error; the wording may change
                v = bool(v)
            out[f"state/{key}/{name}"] = v.detach().clone() if isinstance(v, torch.Tensor) else v
    return out


def _rank_body(rank: int, ranks: int, case: Case, port: int, outdir: str) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    try:
        res = _train(case, rank, ranks)
        if rank == 0:
            torch.save(res, Path(outdir) / "result.pt")
    finally:
        torch.distributed.destroy_process_group()
    os._exit(0)  # gloo's threads may abort at interpreter teardown after the result is written


def run_case(case: Case) -> dict[str, Any]:
    """The flattened final parameters and state of ``case`` (one intra-op thread, as the ranks)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if case.ranks == 1:
            return _train(case)
        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        # ranks fork from a forkserver that imported torch and shampoo once, not fresh interpreters
        # (seconds of CPU each); the ranks' computation is the same either way
        method = forkserver.start_method(["torch", "torch.distributed", "shampoo", __name__])
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                _rank_body, args=(case.ranks, case, port, tmp), nprocs=case.ranks, start_method=method
            )
            return torch.load(Path(tmp) / "result.pt", weights_only=False)
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------------
# records


def _cpuinfo() -> dict[str, str]:
    """The first processor's /proc/cpuinfo fields ({} where there is none)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            k, _, v = line.partition(":")
            out[k.strip()] = v.strip()
    return out


def _blas() -> str:
    """The BLAS libraries numpy and scipy load, with the kernel each chose for this CPU (OpenBLAS's
    ``architecture``): scipy's LAPACK (schur_newton, the references) rounds as that kernel does."""
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS)
    from threadpoolctl import threadpool_info

    libs = {(i["internal_api"], i.get("version") or "", i.get("architecture") or "")
            for i in threadpool_info() if i["user_api"] == "blas"}  # fmt: skip
    return ";".join("/".join(x) for x in sorted(libs))


def fingerprint() -> dict[str, str]:
    """What decides the bits of a run: the CPU (a virtual machine's model name, e.g. "AMD EPYC", names
    several generations, so family/model/stepping and the vector extensions too), torch and its ATen
    kernel path, MKL's CBWR mode, numpy's and scipy's BLAS kernels, and the thread count 1."""
    info = _cpuinfo()
    vector = sorted(f for f in info.get("flags", "").split() if f.startswith(("avx", "fma", "amx", "sse")))
    return {
        "cpu": info.get("model name", platform.processor()),
        "cpu_id": "/".join(info.get(k, "") for k in ("cpu family", "model", "stepping")),
        "cpu_vector": hashlib.sha256(" ".join(vector).encode()).hexdigest()[:12],
        "blas": _blas(),
        "torch": torch.__version__,
        "aten_capability": os.environ.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "threads": "1",
    }


def fingerprint_id(fp: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:12]


def _array(v: torch.Tensor) -> np.ndarray:
    v = v.detach().cpu().contiguous()
    if v.dtype in (torch.bfloat16, torch.float16):
        return v.view(torch.int16).numpy()
    return v.numpy()


def _scalar(v: Any) -> Any:
    if isinstance(v, float):
        return repr(v)  # exact, and NaN-safe in JSON
    if isinstance(v, tuple | list):
        return [_scalar(x) for x in v]
    return v


def digest(result: dict[str, Any]) -> str:
    """SHA-256 of the raw bytes of every array (with its key, dtype and shape) and every scalar."""
    h = hashlib.sha256()
    for key in sorted(result):
        v = result[key]
        h.update(key.encode())
        if isinstance(v, torch.Tensor):
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            h.update(_array(v).tobytes())
        else:
            h.update(json.dumps(_scalar(v)).encode())
    return h.hexdigest()


def record_paths(fp_id: str) -> tuple[Path, Path]:
    return GOLDEN_DIR / f"record_{fp_id}.json", GOLDEN_DIR / f"record_{fp_id}.npz"


def record(names: list[str] | None = None) -> Path:
    """Run the cases and write this machine's record (digests, scalars, arrays)."""
    fp = fingerprint()
    meta_path, npz_path = record_paths(fingerprint_id(fp))
    meta = {"fingerprint": fp, "steps": STEPS, "cases": {}}
    arrays: dict[str, np.ndarray] = {}
    if meta_path.exists() and names:  # update some cases of an existing record
        meta = json.loads(meta_path.read_text())
        arrays = dict(np.load(npz_path))
    for case in cases():
        if names and case.name not in names:
            continue
        res = run_case(case)
        scalars = {k: _scalar(v) for k, v in res.items() if not isinstance(v, torch.Tensor)}
        meta["cases"][case.name] = {"digest": digest(res), "scalars": scalars}
        arrays = {k: a for k, a in arrays.items() if not k.startswith(case.name + "|")}
        arrays.update({f"{case.name}|{k}": _array(v) for k, v in res.items() if isinstance(v, torch.Tensor)})
        print(f"{case.name}: {meta['cases'][case.name]['digest'][:16]}")
    GOLDEN_DIR.mkdir(exist_ok=True)
    meta_path.write_text(json.dumps(meta, sort_keys=True, separators=(",", ":")) + "\n")
    np.savez_compressed(npz_path, **arrays)
    return meta_path


def any_record() -> tuple[dict[str, Any], dict[str, np.ndarray], bool]:
    """(meta, arrays, same_machine): this machine's record, else the first stored one."""
    own_meta, own_npz = record_paths(fingerprint_id(fingerprint()))
    if own_meta.exists():
        return json.loads(own_meta.read_text()), dict(np.load(own_npz)), True
    stored = sorted(GOLDEN_DIR.glob("record_*.json"))
    if not stored:
        raise FileNotFoundError(f"no golden record in {GOLDEN_DIR}: run --record on the reference machine")
    return json.loads(stored[0].read_text()), dict(np.load(stored[0].with_suffix(".npz"))), False


#: Cross-machine tolerance, norm-wise relative per array: ||a - b|| <= TOL ||b|| + ATOL sqrt(size).
#: Another CPU rounds the GEMMs, eigh and the reductions differently (fp32, u = 6e-8). Every matrix
#: solved is regularised relatively (EPS = 1e-3), so its kappa is at most ~1 / EPS = 1e3 and an inverse
#: root's relative error is at most ~n kappa u / p <= 4 * 1e3 * 6e-8 = 2.4e-4 per round (n <= 4), for a
#: backward-stable solver; the iterative solvers stop at their own tolerance, which the same
#: kappa times u bounds. Three rounds in STEPS = 6 steps, carried through the gradients of a tiny
#: model (Lipschitz O(1) over lr * STEPS = 0.06 of motion), give < 1e-3 on the parameters and the
#: statistics; TOL = 1e-2 leaves a factor 10 for the grafting norms and the SOAP second moments,
#: whose rotated coordinates inherit the bases' error. ATOL covers entries that are zero on one
#: machine and u-sized on the other.
TOL = 1e-2
ATOL = 1e-6

#: Arrays with no cross-machine tolerance: eigenvectors are determined only up to sign and within the
#: eigenspace of a (near-)repeated eigenvalue (the error of a computed eigenvector is ~u / gap,
#: Davis-Kahan), and rank-deficient factors early in training have repeated zero eigenvalues. So the
#: kept eigenbases (eigh_warm's ``basis``, SOAP's ``eigenbasis``) and SOAP's second moments, which
#: live in those bases' coordinates, are compared bitwise on the recording machine only; elsewhere
#: what they produce (parameters, statistics, roots, first moments) is compared.
BASIS_DEPENDENT = (".basis", ".eigenbasis", ".second_moment")


def structure_only(case: Case) -> bool:
    """Whether the case's numbers have no cross-machine tolerance at all: SOAP runs Adam per coordinate
    in the factors' eigenbasis, and where a factor is rank deficient (every factor at its first
    refresh from one gradient) the basis of its null space is arbitrary, so rounding noise in those
    coordinates is normalised by Adam to O(1) entries of the direction: the update itself depends on
    the kernel that chose the basis (measured: 1e-2 on the parameters between AVX-512 and the default
    ATen kernels after 6 steps). Elsewhere such a case is checked for its keys, shapes, finite
    entries and exact integer state only."""
    return case.options.get("preconditioner") is not None


def close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if not np.issubdtype(b.dtype, np.floating):
        return bool(np.array_equal(a, b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fin = np.isfinite(b64)
    if not np.array_equal(fin, np.isfinite(a64)) or not np.array_equal(a64[~fin], b64[~fin]):
        return False
    err = np.linalg.norm(a64[fin] - b64[fin])
    return bool(err <= TOL * np.linalg.norm(b64[fin]) + ATOL * np.sqrt(max(b64.size, 1)))


def check_case(
    name: str, meta: dict[str, Any], arrays: dict[str, np.ndarray], same_machine: bool
) -> list[str]:
    """The differences of case ``name`` from the record ([] when it matches)."""
    case = next(c for c in cases() if c.name == name)
    if name not in meta["cases"]:
        return [f"{name}: not in the record (run --record {name})"]
    res = run_case(case)
    if same_machine:
        if digest(res) == meta["cases"][name]["digest"]:
            return []
        problems = [f"{name}: digest differs from the record (same machine: must be bitwise equal)"]
    else:
        problems = []
    stored = {k.split("|", 1)[1]: a for k, a in arrays.items() if k.startswith(name + "|")}
    tensors = {k: _array(v) for k, v in res.items() if isinstance(v, torch.Tensor)}
    if set(stored) != set(tensors):
        problems.append(f"{name}: keys differ: {sorted(set(stored) ^ set(tensors))[:5]}")
    for k in sorted(set(stored) & set(tensors)):
        a, b = tensors[k], stored[k]
        if same_machine:
            ok = np.array_equal(a, b)
        elif structure_only(case) or k.endswith(BASIS_DEPENDENT):
            floating = np.issubdtype(b.dtype, np.floating)
            ok = a.shape == b.shape and (
                np.array_equal(np.isfinite(a), np.isfinite(b)) if floating else np.array_equal(a, b)
            )
        else:
            ok = close(a, b)
        if not ok:
            problems.append(f"{name}: {k} differs")
    if same_machine:
        scal = {k: _scalar(v) for k, v in res.items() if not isinstance(v, torch.Tensor)}
        diff = [k for k in sorted(set(scal) | set(meta["cases"][name]["scalars"]))
                if scal.get(k) != meta["cases"][name]["scalars"].get(k)]  # fmt: skip
        problems += [
            f"{name}: {k} = {scal.get(k)!r}, recorded {meta['cases'][name]['scalars'].get(k)!r}"
            for k in diff[:10]
        ]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(c.name for c in cases()))
        return 0
    if args.record:
        print(record(args.names or None))
        return 0
    meta, arrays, same = any_record()
    print(f"record of {meta['fingerprint']} ({'bitwise' if same else f'tolerance {TOL}'})")
    problems: list[str] = []
    for c in cases():
        if not args.names or c.name in args.names:
            p = check_case(c.name, meta, arrays, same)
            print(f"{c.name}: {'ok' if not p else 'DIFFERS'}")
            problems += p
    print("\n".join(problems) if problems else "all cases match the record")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
