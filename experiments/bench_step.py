"""Step time of Shampoo side by side with AdamW and the peers users would pick instead.

Models: the W1 family of experiments/bench_models.py (a 4-layer ``nn.TransformerEncoder`` LM,
d_model 128 / 256 (= workload W1, docs/design.md §8) / 512 / 1024, head dim 64, feed-forward
4 d_model, seq 128, batch 16, vocab 512). Optimizers: AdamW; this project's Shampoo (blocks 256, Adam
grafting) with eigh roots at each ``--frequencies`` and with every registered root solver at
``--frequency``; its SOAP variant when ``shampoo`` has one; the peers (heavyball SOAP and KL-Shampoo,
pytorch-optimizer Shampoo and ScalableShampoo; ``pip install -e '.[peers]'``) with settings matched to
ours, printed with the results.

Threads: 1 by default (a shared machine; docs/design.md §8's W1 setting is ``--threads 2``).

Method: at each size every configuration trains its own copy of the model from the same initial
weights on the same batches, in one process; configurations run in chunks of ``--chunk`` steps,
interleaved ABC CBA ... for ``--rounds`` rounds, so machine noise hits them alike. Each step is timed
with process CPU time and wall time (CUDA: events around the step, synchronised), the optimizer step
and the root computations (wrapped around ``shampoo``'s ``compute_roots``) separately. The headline is
a contention-robust estimate: the median over chunks of the per-step time without root work, plus the
median root round of the same solver divided by the frequency (peers: the median chunk, roots
included; ``--chunk`` must be a multiple of their frequency). Minima and plain means are kept too.

Reported per size: time per step, ratio to AdamW (CPU and wall; the optimizer step alone), the roots'
share of the step, the ratio to each peer, and two floors (experiments/bench_floor.py): the flop floor
(model flops 6 x tokens x matmul params + attention vs Shampoo's statistics, preconditioning and
amortised eigh roots, eigh in GEMM equivalents measured in the same process) and the time floor (the
same extra work at this machine's measured GEMM and eigh speed over AdamW's measured step), each with
its gap, ratio - floor.
Results go to ``--out`` as bench_step.csv (columns: CSV_COLUMNS, then ``ratio_to_<peer>``),
bench_step.md and bench_step.json.

    nice -n 5 python experiments/bench_step.py --quick                     # smoke run, tiny model
    nice -n 5 python experiments/bench_step.py --sizes 256 --out runs/bench   # W1, every configuration
    python experiments/bench_step.py --device cuda --threads 8 --out runs/gpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_floor import compute_floor, factor_sizes, matmul_params, measure_kernels
from bench_models import (
    PEERS,
    SIZES,
    W1,
    Common,
    EncoderLM,
    OptSpec,
    adamw_spec,
    format_settings,
    make_batches,
    peer_specs,
    shampoo_spec,
    soap_spec,
)

import shampoo
from matroots import solvers

# W1's constants and model, as other scripts import them (experiments/bench_step_ab.py)
VOCAB, D_MODEL, HEADS, FF, LAYERS, SEQ, BATCH = (
    W1.vocab,
    W1.d_model,
    W1.heads,
    W1.ff,
    W1.layers,
    W1.seq,
    W1.batch,
)


class W1Model(EncoderLM):
    """Workload W1: d_model 256, 4 heads, ff 1024, 4 layers, seq 128, vocab 512."""

    def __init__(self) -> None:
        super().__init__(W1)


CSV_COLUMNS = [
    "size", "d_model", "heads", "ff", "layers", "seq", "batch", "vocab", "matmul_params", "tokens",
    "config", "kind", "solver", "frequency", "status",
    "cpu_total_s", "cpu_optim_s", "wall_total_s", "wall_optim_s", "root_cpu_s_per_step", "root_wall_s_per_step",
    "root_share",
    "ratio_adamw_cpu", "ratio_adamw_wall", "optim_ratio_adamw_cpu", "best_ratio_adamw_cpu",
    "mean_ratio_adamw_cpu", "floor_ratio", "floor_ratio_6tp", "floor_root_share", "floor_gap",
    "floor_time_ratio", "floor_time_gap",
    "final_loss", "load_min", "load_max", "device", "threads", "clock", "settings",
]  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# Root timing: every module attribute bound to shampoo.roots.compute_roots is wrapped while a run lasts


@dataclass
class RootClock:
    cpu: float = 0.0
    wall: float = 0.0
    hooked: list[str] = field(default_factory=list)


@contextlib.contextmanager
def root_clock(device: torch.device) -> Iterator[RootClock]:
    import shampoo.roots as roots_mod

    clock = RootClock()
    orig = getattr(roots_mod, "compute_roots", None)
    sites = []
    if orig is not None:
        for name, mod in list(sys.modules.items()):
            if (name == "shampoo" or name.startswith("shampoo.")) and getattr(
                mod, "compute_roots", None
            ) is orig:
                sites.append(mod)

    def timed(*args: Any, **kwargs: Any) -> Any:
        sync(device)
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            return orig(*args, **kwargs)  # type: ignore[misc]
        finally:
            sync(device)
            clock.cpu += time.process_time() - c0
            clock.wall += time.perf_counter() - w0

    for mod in sites:
        mod.compute_roots = timed  # type: ignore[attr-defined]
        clock.hooked.append(mod.__name__)
    try:
        yield clock
    finally:
        for mod in sites:
            mod.compute_roots = orig  # type: ignore[attr-defined]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------------------
# One configuration's run


@dataclass
class Run:
    spec: OptSpec
    model: nn.Module
    opt: torch.optim.Optimizer
    device: torch.device
    clock: RootClock
    cpu_total: list[float] = field(default_factory=list)
    cpu_optim: list[float] = field(default_factory=list)
    wall_total: list[float] = field(default_factory=list)
    wall_optim: list[float] = field(default_factory=list)
    root_cpu: list[float] = field(default_factory=list)
    root_wall: list[float] = field(default_factory=list)
    loss: float = float("nan")

    @property
    def name(self) -> str:
        return self.spec.name

    def _root_wall(self) -> float:
        t = getattr(self.opt, "timing", None)
        return t.root_seconds if isinstance(self.opt, shampoo.Shampoo) and t is not None else 0.0

    def step(self, batch: torch.Tensor) -> None:
        cuda = self.device.type == "cuda"
        rc0, rw0, rt0 = self.clock.cpu, self.clock.wall, self._root_wall()
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record()
        c0, w0 = time.process_time(), time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = self.model.loss(batch)  # type: ignore[operator]
        loss.backward()
        if cuda:
            ev[1].record()
        c1, w1 = time.process_time(), time.perf_counter()
        self.opt.step()
        if cuda:
            ev[2].record()
            torch.cuda.synchronize(self.device)
        c2, w2 = time.process_time(), time.perf_counter()
        self.cpu_total.append(c2 - c0)
        self.cpu_optim.append(c2 - c1)
        if cuda:
            self.wall_total.append(ev[0].elapsed_time(ev[2]) / 1e3)
            self.wall_optim.append(ev[1].elapsed_time(ev[2]) / 1e3)
        else:
            self.wall_total.append(w2 - w0)
            self.wall_optim.append(w2 - w1)
        if self.clock.hooked:
            self.root_cpu.append(self.clock.cpu - rc0)
            self.root_wall.append(self.clock.wall - rw0)
        else:  # no hook (renamed internals): the optimizer's own wall clock for both
            dt = self._root_wall() - rt0
            self.root_cpu.append(dt)
            self.root_wall.append(dt)
        self.loss = float(loss.detach())

    def clear(self) -> None:
        for x in (
            self.cpu_total,
            self.cpu_optim,
            self.wall_total,
            self.wall_optim,
            self.root_cpu,
            self.root_wall,
        ):
            x.clear()


def estimate(
    total: list[float], optim: list[float], roots: list[float], chunk: int, frequency: int | None,
    rounds: list[float], pick: Callable[[list[float]], float],
) -> tuple[float, float]:  # fmt: skip
    """Per-step (total, optimizer) time: ``pick`` (median or min) over chunks of the per-step time
    without root work, plus ``pick`` over the root rounds (the same work in every run of one solver) /
    frequency. With no root rounds (AdamW, peers) the chunks are taken as they are."""
    ch_t, ch_o = [], []
    for i in range(0, len(total) // chunk * chunk, chunk):
        sl = slice(i, i + chunk)
        r = sum(roots[sl])
        ch_t.append((sum(total[sl]) - r) / chunk)
        ch_o.append((sum(optim[sl]) - r) / chunk)
    t, o = pick(ch_t), pick(ch_o)
    if frequency and rounds:
        t += pick(rounds) / frequency
        o += pick(rounds) / frequency
    return t, o


def build_specs(args: argparse.Namespace, c: Common) -> list[OptSpec]:
    specs = [adamw_spec(c)]
    specs += [shampoo_spec(c, f, "eigh") for f in args.frequencies]
    names = (
        solvers.available() if args.solvers == ["all"] else [] if args.solvers == ["none"] else args.solvers
    )
    for s in names:
        if s not in solvers.available():
            raise SystemExit(f"--solvers: unknown solver {s!r}; registered: {', '.join(solvers.available())}")
        if s != "eigh" or c.frequency not in args.frequencies:
            specs.append(shampoo_spec(c, c.frequency, s))
    if args.soap != "off":
        specs.append(soap_spec(c, c.frequency))
    peers = list(PEERS) if args.peers == ["all"] else [] if args.peers == ["none"] else args.peers
    specs += peer_specs(peers, c)
    if args.only:
        specs = [s for s in specs if s.name in args.only or s.kind == "adamw"]
    return specs


def git_describe(path: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "log", "-1", "--format=%h %cI"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() + (" (modified)" if dirty.stdout.strip() else "")


def run_size(
    size_name: str, specs: list[OptSpec], args: argparse.Namespace, c: Common
) -> list[dict[str, Any]]:
    size = SIZES[size_name]
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    init = EncoderLM(size).state_dict()
    batches = make_batches(size, args.seed, device=args.device)
    timed = args.rounds * args.chunk
    eq = args.eigh_gemm_eq
    probe = EncoderLM(size)
    ns = sorted(factor_sizes([tuple(p.shape) for p in probe.parameters()], c.block))
    kernels = measure_kernels(ns, device=args.device)
    eigh_eq = {n: eq if eq is not None else te / tg for n, (te, tg) in kernels.items()}
    rows: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    print(
        f"\n=== d_model {size.d_model} ({size_name}): {size.heads} heads, ff {size.ff}, {size.layers} layers, "
        f"seq {size.seq}, batch {size.batch}, vocab {size.vocab}; eigh = "
        + ", ".join(f"{v:.1f} GEMMs at n={n}" for n, v in eigh_eq.items())
        + (" (given)" if eq is not None else " (measured)")
        + f"; GEMM {2 * ns[-1] ** 3 / kernels[ns[-1]][1] / 1e9:.0f} GFLOP/s at n={ns[-1]}",
        flush=True,
    )
    runs: list[Run] = []
    skipped: dict[str, str] = {s.name: f"unavailable: {s.unavailable}" for s in specs if s.build is None}
    with root_clock(dev) as clock:
        if not clock.hooked:
            print("note: shampoo.roots.compute_roots not found; root time is the optimizer's wall clock")
        for spec in specs:
            if spec.build is None:
                print(f"  {spec.name}: {skipped[spec.name]}")
                continue
            m = EncoderLM(size)
            m.load_state_dict(init)
            m.to(dev)
            try:
                run = Run(spec, m, spec.build(m), dev, clock)
                for i in range(args.warmup):  # includes Shampoo's first, cold, root round
                    run.step(batches[i % len(batches)])
            except Exception as exc:  # a peer or solver that cannot run here: reported, not fatal
                skipped[spec.name] = f"failed: {type(exc).__name__}: {exc}"[:300]
                print(f"  {spec.name}: {skipped[spec.name]}")
                continue
            per_step = statistics.median(run.cpu_total[1:] or run.cpu_total)
            if args.max_config_seconds and per_step * timed > args.max_config_seconds:
                skipped[spec.name] = (
                    f"too slow: {per_step:.2f} s/step in warm-up, ~{per_step * timed:.0f} s for {timed} timed steps "
                    f"> --max-config-seconds {args.max_config_seconds:g}"
                )
                print(f"  {spec.name}: {skipped[spec.name]}")
                continue
            run.clear()
            runs.append(run)
        for f in {r.spec.frequency for r in runs if r.spec.frequency}:
            if timed % f:
                print(
                    f"warning: {timed} timed steps is not a multiple of frequency {f}; roots enter at the wrong rate"
                )
        for r in range(args.rounds):
            order = list(runs) if r % 2 == 0 else runs[::-1]
            for run in order:
                try:
                    for i in range(args.chunk):
                        run.step(batches[(r * args.chunk + i) % len(batches)])
                except Exception as exc:  # e.g. a peer diverging into a failed decomposition
                    skipped[run.name] = f"failed in round {r + 1}: {type(exc).__name__}: {exc}"[:300]
                    print(f"  {run.name}: {skipped[run.name]}")
                    runs.remove(run)
            load.append(os.getloadavg()[0])
            print(
                f"round {r + 1}/{args.rounds} (load {load[-1]:.1f}): "
                + ", ".join(f"{x.name} {statistics.fmean(x.cpu_total[-args.chunk :]):.3f}s" for x in runs),
                flush=True,
            )

    again = measure_kernels(ns, device=args.device)  # the floor is optimistic: the faster of two takes
    kernels = {n: (min(kernels[n][0], again[n][0]), min(kernels[n][1], again[n][1])) for n in ns}
    if eq is None:
        eigh_eq = {n: te / tg for n, (te, tg) in kernels.items()}

    def rounds_of(run: Run, attr: str) -> list[float]:  # root rounds of every run with this solver
        same = [x for x in runs if x.spec.kind == run.spec.kind and x.spec.solver == run.spec.solver]
        return [t for x in same for t in getattr(x, attr) if t > 0]

    est: dict[str, dict[str, Any]] = {}
    for run in runs:
        f = run.spec.frequency if run.spec.kind in ("shampoo", "soap") else None
        rc, rw = (rounds_of(run, "root_cpu"), rounds_of(run, "root_wall")) if f else ([], [])
        med = statistics.median
        cpu = estimate(run.cpu_total, run.cpu_optim, run.root_cpu, args.chunk, f, rc, med)
        wall = estimate(run.wall_total, run.wall_optim, run.root_wall, args.chunk, f, rw, med)
        best = estimate(run.cpu_total, run.cpu_optim, run.root_cpu, args.chunk, f, rc, min)
        est[run.name] = {
            "cpu": cpu, "wall": wall, "best": best, "mean": statistics.fmean(run.cpu_total),
            "root_cpu": med(rc) / f if f and rc else 0.0, "root_wall": med(rw) / f if f and rw else 0.0,
        }  # fmt: skip
    base = est.get("adamw")
    hc = args.clock  # the headline clock: floors' gaps, root share and peer ratios use it
    peer_names = [r.name for r in runs if r.spec.kind == "peer"]
    model_info = {
        "size": size_name, "d_model": size.d_model, "heads": size.heads, "ff": size.ff, "layers": size.layers,
        "seq": size.seq, "batch": size.batch, "vocab": size.vocab, "tokens": size.tokens,
    }  # fmt: skip
    for spec in specs:
        floor = compute_floor(
            probe, tokens=size.tokens, layers=size.layers, batch=size.batch, seq=size.seq, d_model=size.d_model,
            block=c.block, frequency=spec.frequency or c.frequency, eigh_gemm_eq=eigh_eq, kernel_seconds=kernels,
        )  # fmt: skip
        row: dict[str, Any] = {
            **model_info, "matmul_params": matmul_params(probe), "config": spec.name,
            "kind": spec.kind, "solver": spec.solver or "", "frequency": spec.frequency or "",
            "status": skipped.get(spec.name, "ok"), "device": args.device, "threads": args.threads,
            "settings": format_settings(spec.settings), "load_min": min(load), "load_max": max(load), "clock": hc,
        }  # fmt: skip
        if spec.kind != "adamw":
            row.update(
                floor_ratio=floor.ratio, floor_ratio_6tp=floor.ratio_6tp, floor_root_share=floor.root_share
            )
        else:
            row.update(floor_ratio=1.0, floor_ratio_6tp=1.0, floor_root_share=0.0)
        e = est.get(spec.name)
        if e is not None:
            run = next(r for r in runs if r.name == spec.name)
            row.update(
                cpu_total_s=e["cpu"][0], cpu_optim_s=e["cpu"][1], wall_total_s=e["wall"][0],
                wall_optim_s=e["wall"][1], root_cpu_s_per_step=e["root_cpu"], root_wall_s_per_step=e["root_wall"],
                final_loss=run.loss,
                # roots measured only where they run through shampoo's compute_roots (not inside a
                # peer's step nor SOAP's basis refresh: blank there, never a false 0)
                root_share=e[f"root_{hc}"] / e[hc][0] if e["root_cpu"] or spec.kind == "adamw" else "",
            )  # fmt: skip
            if base is not None:
                row.update(
                    ratio_adamw_cpu=e["cpu"][0] / base["cpu"][0], ratio_adamw_wall=e["wall"][0] / base["wall"][0],
                    optim_ratio_adamw_cpu=e["cpu"][1] / base["cpu"][1],
                    best_ratio_adamw_cpu=e["best"][0] / base["best"][0], mean_ratio_adamw_cpu=e["mean"] / base["mean"],
                )  # fmt: skip
                row["floor_gap"] = row[f"ratio_adamw_{hc}"] - row["floor_ratio"]
                ft = floor.time_ratio(base[hc][0]) if spec.kind != "adamw" else 1.0
                row.update(floor_time_ratio=ft, floor_time_gap=row[f"ratio_adamw_{hc}"] - ft)
            for p in peer_names:
                row[f"ratio_to_{p}"] = e[hc][0] / est[p][hc][0]
        rows.append(row)
    print_size(rows, peer_names, load)
    return rows


def _f(x: Any, fmt: str) -> str:
    """``x`` formatted, or "-" right-aligned to the format's width when there is no number."""
    if isinstance(x, (int, float)):
        return format(x, fmt)
    width = "".join(ch for ch in fmt.lstrip("+").split(".")[0] if ch.isdigit())
    return "-".rjust(int(width or 0))


def print_size(rows: list[dict[str, Any]], peers: list[str], load: list[float]) -> None:
    r0 = rows[0]
    print(
        f"\nd_model {r0['d_model']}: {r0['matmul_params'] / 1e6:.2f} M matmul params, {r0['tokens']} tokens/step, "
        f"load average {min(load):.1f}-{max(load):.1f}; per step, robust estimate (median chunk without roots + "
        f"median root round / frequency); /AdamW: CPU time, wall: wall time; floors' gaps, root % and peer "
        f"ratios of {r0['clock']} time"
    )
    head = (
        f"{'config':<28}{'cpu ms':>9}{'wall ms':>9}{'optim ms':>9}{'root ms':>8}{'root %':>7}{'/AdamW':>8}"
        f"{'wall':>7}{'optim':>7}{'floor':>7}{'gap':>7}{'tfloor':>7}{'tgap':>7}"
        + "".join(f"{'/' + p[:10]:>12}" for p in peers)
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['config']:<28}{r['status']}")
            continue
        print(
            f"{r['config']:<28}{_f(1e3 * r['cpu_total_s'], '9.1f')}{_f(1e3 * r['wall_total_s'], '9.1f')}"
            f"{_f(1e3 * r['cpu_optim_s'], '9.1f')}{_f(1e3 * r['root_cpu_s_per_step'], '8.1f')}"
            f"{_f(100 * r['root_share'] if r['root_share'] != '' else None, '6.1f')}%{_f(r.get('ratio_adamw_cpu'), '7.3f')}x"
            f"{_f(r.get('ratio_adamw_wall'), '6.3f')}x{_f(r.get('optim_ratio_adamw_cpu'), '6.2f')}x"
            f"{_f(r['floor_ratio'], '7.3f')}{_f(r.get('floor_gap'), '+7.3f')}"
            f"{_f(r.get('floor_time_ratio'), '7.3f')}{_f(r.get('floor_time_gap'), '+7.3f')}"
            + "".join(f"{_f(r.get(f'ratio_to_{p}'), '11.3f')}x" for p in peers)
        )
    print("settings:")
    for r in rows:
        print(f"  {r['config']}: {r['settings']}")


def write_outputs(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    import csv

    out.mkdir(parents=True, exist_ok=True)
    extra = sorted({k for r in rows for k in r if k.startswith("ratio_to_")})
    with open(out / "bench_step.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS + extra, restval="")
        w.writeheader()
        w.writerows(rows)
    (out / "bench_step.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    lines = [
        f"Step time per configuration, ratio to AdamW ({meta['clock']} time, robust estimate) and "
        f"[flop floor / time floor]; "
        f"{meta['device']}, {meta['threads']} thread(s), {meta['rounds']} rounds x {meta['chunk']} steps, "
        f"load average {meta['load']}; shampoo {meta['shampoo']}.",
        "",
        "| config | " + " | ".join(f"d {SIZES[s].d_model}" for s in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for name in dict.fromkeys(r["config"] for r in rows):
        cells = []
        for s in sizes:
            r = next((x for x in rows if x["config"] == name and x["size"] == s), None)
            if r is None or r["status"] != "ok":
                cells.append("-" if r is None else r["status"].split(":")[0])
            else:
                share = f", roots {100 * r['root_share']:.1f}%" if r.get("root_share") else ""
                fl = f"{r['floor_ratio']:.3f} / {_f(r.get('floor_time_ratio'), '.3f')}"
                cells.append(f"{_f(r.get('ratio_adamw_' + r['clock']), '.3f')} [{fl}]{share}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for p in extra:
        lines += ["", f"Ratio to {p[len('ratio_to_') :]} ({meta['clock']} time):", "", "| config | " + " | ".join(f"d {SIZES[s].d_model}" for s in sizes) + " |", "|---|" + "---|" * len(sizes)]  # fmt: skip
        for name in dict.fromkeys(r["config"] for r in rows if r["kind"] in ("shampoo", "soap")):
            cells = [
                _f(next((x.get(p) for x in rows if x["config"] == name and x["size"] == s), None), ".3f")
                for s in sizes
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (out / "bench_step.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes",
        nargs="+",
        default=None,
        choices=list(SIZES),
        help="d_model sizes (default 128 256 512 1024)",
    )
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 10)")
    ap.add_argument("--chunk", type=int, default=None, help="steps per configuration per round (default 10)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per configuration (default 3)")
    ap.add_argument(
        "--frequencies", type=int, nargs="+", default=None, help="eigh Shampoo frequencies (default 1 10 100)"
    )
    ap.add_argument(
        "--frequency", type=int, default=None, help="frequency of the solver comparison and the peers (10)"
    )
    ap.add_argument(
        "--solvers",
        nargs="+",
        default=["all"],
        help="root solvers at --frequency: all (default), none, or names",
    )
    ap.add_argument(
        "--soap", choices=["auto", "off"], default="auto", help="shampoo's SOAP variant if it has one"
    )
    ap.add_argument(
        "--peers", nargs="+", default=["all"], help=f"all (default), none, or names: {', '.join(PEERS)}"
    )
    ap.add_argument("--only", nargs="+", default=None, help="keep only these configuration names (and AdamW)")
    ap.add_argument(
        "--max-config-seconds",
        type=float,
        default=None,
        help="skip (and say so) a configuration whose timed run would take longer",
    )
    ap.add_argument(
        "--eigh-gemm-eq",
        type=float,
        default=None,
        help="eigh cost in n^3 GEMMs for the floor (default: measured)",
    )
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:i]")
    ap.add_argument(
        "--clock", choices=["cpu", "wall"], default=None, help="headline clock (cpu; wall on cuda)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: tiny model, 2 rounds x 2 steps, frequencies 1 2"
    )
    ap.add_argument("--out", type=Path, default=None, help="directory for bench_step.csv / .md / .json")
    args = ap.parse_args(argv)
    q = args.quick
    for key, normal, quick in (
        ("sizes", ["128", "256", "512", "1024"], ["tiny"]), ("rounds", 10, 2), ("chunk", 10, 2),
        ("warmup", 3, 1), ("frequencies", [1, 10, 100], [1, 2]), ("frequency", 10, 2),
    ):  # fmt: skip
        if getattr(args, key) is None:
            setattr(args, key, quick if q else normal)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(
            f"--device {args.device}: CUDA is not available here (torch {torch.__version__}, "
            f"cuda build {torch.version.cuda or 'none'}); run on a machine with a GPU and a CUDA build of torch, "
            "or use --device cpu"
        )
    args.clock = args.clock or ("cpu" if args.device == "cpu" else "wall")
    torch.set_num_threads(args.threads)
    c = Common(frequency=args.frequency)
    specs = build_specs(args, c)
    for s in specs:
        if s.kind == "peer" and s.build is not None and args.chunk % c.frequency:
            print(f"warning: --chunk {args.chunk} is not a multiple of the peers' frequency {c.frequency}")
            break
    meta = {
        "device": args.device, "threads": args.threads, "clock": args.clock, "rounds": args.rounds, "chunk": args.chunk,
        "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "shampoo": f"{Path(shampoo.__file__).parent} @ {git_describe(Path(shampoo.__file__).parent)}",
        "argv": sys.argv[1:] if argv is None else argv,
    }  # fmt: skip
    print(
        f"bench_step: {args.device}, {args.threads} thread(s), torch {meta['torch']}, shampoo from {meta['shampoo']}; "
        f"{args.rounds} rounds x {args.chunk} steps per configuration, {args.warmup} warm-up steps; "
        f"configurations: {', '.join(s.name for s in specs)}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    loads = []
    for s in args.sizes:
        rows += run_size(s, specs, args, c)
        loads += [rows[-1]["load_min"], rows[-1]["load_max"]]
        meta["load"] = f"{min(loads):.1f}-{max(loads):.1f}"
        if args.out is not None:  # after every size, so a long run keeps what it has measured
            write_outputs(args.out, rows, meta)
            print(f"\nwrote {args.out}/bench_step.csv, .md, .json", flush=True)
    return rows


if __name__ == "__main__":
    main()
