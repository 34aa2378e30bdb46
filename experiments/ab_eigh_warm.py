"""eigh_warm before/after: the module at a git commit against the working tree, interleaved in one process.

Issue 15, item 1 (cost per update). ``git show <commit>:matroots/solvers/eigh_warm.py`` is loaded as a
separate module (relative imports made absolute, not registered), so both versions run on the same
factors, with the same eigh/psd/input code, interleaved (the order alternates), each timed as the
minimum process CPU time of ``--repeats`` runs with one thread and divided by one batched GEMM of the
same shape timed alongside. Two factor sources:

* ``--source digits`` (default): the digits-MLP Shampoo factors of :mod:`bench_eigh_warm` (``--models``
  MLPs, a root round every ``--every`` steps from step 600), rank_policy "clamp";
* ``--source bytes_lm`` / ``w1``: the exact solves of a real Shampoo(root_solver="eigh_warm") run of that
  validation task (precondition_frequency ``--every``, psd "shift", eps, fp32), recorded from step
  ``--start`` to ``--steps`` by wrapping the solver, then replayed: each version chains its own bases,
  as Shampoo does (the eigenvector tensor as the next round's warm start).

Per version: paths (accepted / refined / fallback / cold), and the worst forward error of the root
against a float64 eigendecomposition of the matrix actually solved (psd shift and eps included), in
units of the cold eigh's level (1 + cond) u sqrt(n) (cond: the root's relative condition number).

    python experiments/ab_eigh_warm.py --before f0c60a2             # fp32 and fp64, n = 64/128/256
    python experiments/ab_eigh_warm.py --before f0c60a2 --dtypes fp32 --rounds 8
    python experiments/ab_eigh_warm.py --before f0c60a2 --source bytes_lm --start 900 --steps 1000
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import importlib.util
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import numpy as np  # noqa: E402
from bench_eigh_warm import factor_sequence, reference  # noqa: E402

from matroots.core import precision  # noqa: E402
from matroots.solvers import EighConfig, EighWarmConfig  # noqa: E402
from matroots.solvers import eigh_warm as eigh_warm_module  # noqa: E402


def load_before(commit: str):
    src = subprocess.run(
        ["git", "show", f"{commit}:matroots/solvers/eigh_warm.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    src = re.sub(r"^from \.\. import", "from matroots import", src, flags=re.M)
    src = re.sub(r"^from \.\.(\w+) import", r"from matroots.\1 import", src, flags=re.M)
    src = re.sub(r"^from \.(\w+) import", r"from matroots.solvers.\1 import", src, flags=re.M)
    src = re.sub(r"^@register\n", "", src, flags=re.M).replace(
        'name = "eigh_warm"', 'name = "eigh_warm_before"'
    )
    path = Path(tempfile.mkdtemp()) / "eigh_warm_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("eigh_warm_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["eigh_warm_before"] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod.EighWarmConfig


def error_in_cold_units(cfg, prob, inverse: bool, root: torch.Tensor) -> list[float]:
    """||X - X_ref||_F / ||X_ref||_F / ((1 + cond) u sqrt(n)) per element, X_ref from a float64 eigh of the
    matrix solved (the psd shift and eps of the cold fp32 solve added to its eigenvalues); rank_policy
    'perturb' only (a clamp reference is :func:`bench_eigh_warm.reference`)."""
    A, _ = cfg._working_matrix(dataclasses.replace(prob, info=dict(prob.info)))
    w = torch.linalg.eigh(A).eigenvalues
    sub = dataclasses.replace(prob, A=A, info={})
    wr, _, e, _, _ = cfg._root_eigenvalues(sub, w, sub.info, inverse=inverse)
    w64, V = torch.linalg.eigh(A.double())
    z = w64 + (wr - w).double()[..., :1]
    f = z.pow(e)
    ref = (V * f.unsqueeze(-2)) @ V.mT
    cond = (abs(e) * f / z).amax(-1) * z.norm(dim=-1) / f.norm(dim=-1)
    n, u = A.shape[-1], precision.unit_roundoff(A.dtype)
    err = torch.linalg.matrix_norm(root.reshape(A.shape).double() - ref) / torch.linalg.matrix_norm(ref)
    return (err / ((1 + cond) * u * math.sqrt(n))).tolist()


def record_shampoo(task_name: str, steps: int, start: int, every: int) -> list[dict]:
    """The eigh_warm solves (Problem, inverse) of a Shampoo(root_solver="eigh_warm") run from ``start``."""
    import shampoo
    from matroots.study.validation.tasks import get_task

    calls: list[dict] = []
    step = [0]
    orig = eigh_warm_module.EighWarmConfig._run

    def rec(self, prob, *, inverse, warm_start):
        if step[0] >= start:
            calls.append({"prob": copy.deepcopy(prob), "inverse": inverse, "cfg": self})
        return orig(self, prob, inverse=inverse, warm_start=warm_start)

    eigh_warm_module.EighWarmConfig._run = rec
    try:
        task = get_task(task_name, **({"batch_size": 8} if task_name == "w1" else {}))
        model = task.build_model(0)
        opt = shampoo.Shampoo(
            model.named_parameters(), root_solver="eigh_warm", grafting="adam", lr=1e-3,
            precondition_frequency=every, start_preconditioning_step=1, max_preconditioner_dim=256,
        )  # fmt: skip
        batches = task.batches(1)
        for t in range(1, steps + 1):
            step[0] = t
            opt.zero_grad(set_to_none=True)
            task.loss(model, next(batches)).backward()
            opt.step()
    finally:
        eigh_warm_module.EighWarmConfig._run = orig
    return calls


def _solve(cfg, prob, inverse: bool, warm_start):
    return cfg._run(dataclasses.replace(prob, info=dict(prob.info)), inverse=inverse, warm_start=warm_start)


def replay(before_cls, calls: list[dict], repeats: int) -> None:
    """Both versions on the recorded solves, each chaining its own bases per solve group (shape)."""
    groups: dict[tuple, list[dict]] = {}
    for c in calls:
        groups.setdefault(tuple(c["prob"].A.shape), []).append(c)
    for key, seq in sorted(groups.items()):
        cfg0 = seq[0]["cfg"]
        fields = {f.name: getattr(cfg0, f.name) for f in dataclasses.fields(cfg0) if f.init}
        cfgs = {"before": before_cls(**fields), "after": EighWarmConfig(**fields)}
        prev: dict[str, object] = dict.fromkeys(cfgs)
        ge: dict[str, list[float]] = {"before": [], "after": [], "eigh": []}
        paths = {k: {} for k in cfgs}
        worst = dict.fromkeys(cfgs, 0.0)
        G = torch.randn(*key, dtype=seq[0]["prob"].A.dtype)
        for i, c in enumerate(seq):
            prob, inv = c["prob"], c["inverse"]
            out = {}

            fns = {
                "before": functools.partial(_solve, cfgs["before"], prob, inv, prev["before"]),
                "after": functools.partial(_solve, cfgs["after"], prob, inv, prev["after"]),
                "eigh": functools.partial(_solve, cfgs["after"], prob, inv, None),
                "gemm": functools.partial(torch.bmm, G, G),
            }
            best = dict.fromkeys(fns, math.inf)
            for r in range(repeats):
                for k in fns if r % 2 else list(fns)[::-1]:
                    t0 = time.process_time()
                    out[k] = fns[k]()
                    best[k] = min(best[k], time.process_time() - t0)
            for k in cfgs:
                raw = out[k]
                if i > 0:  # the first solve of a group is cold for both
                    ge[k].append(best[k] / best["gemm"])
                    for st in raw.info["warm"]:
                        name = st.split(":")[0].split(" (")[0]
                        paths[k][name] = paths[k].get(name, 0) + 1
                    worst[k] = max(worst[k], max(error_in_cold_units(cfgs[k], prob, inv, raw.root)))
                prev[k] = raw.info["eigenvectors"]  # Shampoo passes the basis tensor
            if i > 0:
                ge["eigh"].append(best["eigh"] / best["gemm"])
        med = {k: statistics.median(v) for k, v in ge.items() if v}
        if not med:
            continue
        print(
            f"{key[0]} x n={key[-1]:3d}, {len(seq) - 1} warm rounds: GEMM-eq before {med['before']:6.1f}  after "
            f"{med['after']:6.1f}  eigh {med['eigh']:5.1f} | worst err / cold level: before {worst['before']:.2f}"
            f" after {worst['after']:.2f} | paths before {paths['before']} after {paths['after']}",
            flush=True,
        )


def time_round(
    cfgs: dict, prev: dict, cold, seq: torch.Tensor, G: torch.Tensor, t: int, repeats: int
) -> dict:
    """Minimum CPU seconds of the round-t update (both versions), the cold eigh and one batched GEMM."""
    fns = {
        "before": lambda: cfgs["before"].solve(seq[t], 4, warm_start=prev["before"][t]),
        "after": lambda: cfgs["after"].solve(seq[t], 4, warm_start=prev["after"][t]),
        "eigh": lambda: cold.solve(seq[t], 4),
        "gemm": lambda: torch.bmm(G, G),
    }
    best = dict.fromkeys(fns, float("inf"))
    for r in range(repeats):
        for k in fns if r % 2 else list(fns)[::-1]:
            t0 = time.process_time()
            fns[k]()
            best[k] = min(best[k], time.process_time() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git commit of the 'before' eigh_warm.py")
    ap.add_argument("--dtypes", default="fp32,fp64")
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--source", default="digits", choices=["digits", "bytes_lm", "w1"])
    ap.add_argument("--start", type=int, default=900, help="first recorded step (--source task)")
    ap.add_argument("--steps", type=int, default=1000, help="training steps (--source task)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    Before = load_before(args.before)
    if args.source != "digits":
        print(f"# eigh_warm {args.before} (before) vs working tree (after) on Shampoo's {args.source} solves, "
              f"steps {args.start}-{args.steps}, frequency {args.every}; 1 thread, load {os.getloadavg()[0]:.1f}")  # fmt: skip
        replay(Before, record_shampoo(args.source, args.steps, args.start, args.every), args.repeats)
        return
    per_model = [
        factor_sequence(600 + args.every * (args.rounds - 1), args.every, 600, seed=m)
        for m in range(args.models)
    ]
    seqs = {n: torch.cat([s[n] for s in per_model], dim=1) for n in per_model[0]}
    print(
        f"# eigh_warm {args.before} (before) vs working tree (after), GEMM-equivalents per update, 1 thread"
    )
    for dname in args.dtypes.split(","):
        dt = {"fp32": torch.float32, "fp64": torch.float64}[dname]
        for n in sorted(seqs):
            seq = seqs[n].to(dt)
            if dt == torch.float64:
                seq = 0.5 * (seq + seq.mT)
            b = seq.shape[1]
            cfgs = {"before": Before(rank_policy="clamp"), "after": EighWarmConfig(rank_policy="clamp")}
            cold = EighConfig(rank_policy="clamp")
            prev = {k: [None] for k in cfgs}
            for t in range(seq.shape[0]):
                for k, cfg in cfgs.items():
                    prev[k].append(cfg.solve(seq[t], 4, warm_start=prev[k][-1]))
            G = torch.randn(b, n, n, dtype=dt)
            ge = {"before": [], "after": [], "eigh": []}
            paths: dict[str, dict[str, int]] = {"before": {}, "after": {}}
            worst = {"before": 0.0, "after": 0.0}
            for t in range(1, seq.shape[0]):
                best = time_round(cfgs, prev, cold, seq, G, t, args.repeats)
                for k in ge:
                    ge[k].append(best[k] / best["gemm"])
                ref, conds = reference(seq[t], 4, precision.unit_roundoff(dt), dname)
                for k in ("before", "after"):
                    res = prev[k][t + 1]
                    for key, v in res.info["warm_counts"].items():
                        paths[k][key] = paths[k].get(key, 0) + v
                    for i in range(b):
                        err = float(
                            np.linalg.norm(res.root[i].double().numpy() - ref[i]) / np.linalg.norm(ref[i])
                        )
                        level = (1 + conds[i]) * precision.unit_roundoff(dt) * math.sqrt(n)
                        worst[k] = max(worst[k], err / level)
            med = {k: statistics.median(v) for k, v in ge.items()}
            nz = {k: {a: v for a, v in paths[k].items() if v} for k in paths}
            print(
                f"{dname} n={n:3d} b={b}: GEMM-eq before {med['before']:6.1f}  after {med['after']:6.1f}  eigh "
                f"{med['eigh']:5.1f} | worst err / cold level: before {worst['before']:.2f} after {worst['after']:.2f}"
                f" | paths before {nz['before']} after {nz['after']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
