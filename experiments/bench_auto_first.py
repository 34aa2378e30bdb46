"""method="auto" decomposing first (matroots.solvers.auto_first) against the paths it replaced, as auto /
chosen solver cost (process CPU time, medians over interleaved rounds of --reps calls), n = 128, p = 4:

  chosen          the configuration auto picked, called directly with the same solve options
  estimate_first  the float64 estimate first, then the chosen solve (auto_first disabled)
  weyl_only       decomposing first with Weyl's bound on the computed eigenvalues alone (the
                  eigenpairs' certificate, matroots.solvers.auto_certificate, disabled; all else as
                  auto: where Weyl decides, the same path)
  cholesky_test   (--cholesky-test) decomposing first only where a Cholesky of A - c I passes (until
                  2026-12-03: c = ||A||_F (1 / K + 4 (n + 2) u), K the lowest band edge whose solve
                  cannot reuse the decomposition; the function is kept here, `_likely_certain`)
  auto            method="auto" as it is (decomposing first, the certificate where Weyl's bound is open)
  cert_free       (--certificate-parts) auto with the certificate replaced by its answer (the floor of a
                  certificate that cost nothing)
  copy_potrf      (--certificate-parts) the same after one float64 copy of A and one dpotrf of
                  A - 0.9 w_1 I (what the certificate cannot do without where the Cholesky decides)

Cases: ``default`` (fp32 G G^T / 2n + 1e-3 I, bench_call_overhead's factor), randsvd matrices of each
--dtypes x --kappas (exactly symmetric), and fp32 rank-deficient Shampoo-like factors
G G^T + eps I (G: n x n/4, fp32, baddbmm; eps for kappa ~K) for each --ggt-kappas K. Every variant's
root is asserted bitwise the chosen one's.

  OMP_NUM_THREADS=1 PYTHONPATH=. python experiments/bench_auto_first.py --rounds 31
  OMP_NUM_THREADS=1 PYTHONPATH=. python experiments/bench_auto_first.py --dtypes fp32 fp64 \\
      --kappas 10 300 3000 9000 1.3e4 3e4 3e5 1e6 --ggt-kappas 9000 1.3e4 --rounds 21 --reps 3
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from scipy.linalg import lapack

from matroots.core import precision
from matroots.solvers.auto import AutoConfig
from matroots.solvers.auto_candidates import candidate
from matroots.solvers.auto_first import first_decision, reuses
from matroots.solvers.auto_table import load_table
from matroots.study import matrices

DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def _cases(n: int, dtypes: list[str], kappas: list[float], ggt: list[float]) -> dict[str, torch.Tensor]:
    G = torch.randn(n, 2 * n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    default = (G @ G.T / (2 * n) + 1e-3 * torch.eye(n, dtype=torch.float64)).float()
    out = {"default": torch.maximum(default, default.mT)}
    for dt in dtypes:
        for k in kappas:
            A = torch.from_numpy(matrices.generate("randsvd", n, k, np.random.default_rng(1))[0]).to(
                DTYPES[dt]
            )
            out[f"{dt}-{k:g}"] = torch.maximum(A, A.mT)
    for k in ggt:
        G = torch.randn(1, n, n // 4, generator=torch.Generator().manual_seed(1))
        eps = float(np.linalg.eigvalsh((G @ G.mT).double().numpy())[0, -1]) / k
        F = torch.baddbmm(eps * torch.eye(n).expand(1, n, n), G, G.mT)[0]
        out[f"ggt32-{k:g}"] = torch.maximum(F, F.mT)
    return out


def _limit(plan, first) -> float:
    """The lowest band edge from which the table decides a solve that cannot reuse ``first``'s."""
    for edge in plan.edges.tolist():
        if edge > 1.0 and not reuses(plan.decision(edge), first):
            return float(edge)
    return float("inf")


def _likely_certain(det: torch.Tensor, limit: float, dt: torch.dtype) -> bool:
    """The Cholesky test auto ran before decomposing first until 2026-12-03 (fp32 / fp64, CPU)."""
    n = det.shape[-1]
    scale = 1.0 / limit + 4.0 * (n + 2) * precision.unit_roundoff(dt)
    potrf = lapack.spotrf if dt == torch.float32 else lapack.dpotrf
    for a in det.numpy():
        m = np.array(a.T, order="F")
        flat = a.reshape(-1)
        m.T.reshape(-1)[:: n + 1] -= float(np.sqrt(flat.dot(flat))) * scale
        if potrf(m, lower=1, clean=0, overwrite_a=1)[1] != 0:
            return False
    return True


def _with_test(cfg: AutoConfig) -> AutoConfig:
    def first_if_test_passes(call, plan, opts):
        psd = opts.psd if opts.psd is not None else cfg.psd
        first = first_decision(plan, call.b, call.n, psd, call.exact_sym, call.wdtype != call.t.dtype)
        if first is None:
            return None
        lap = precision.lapack_dtype(call.wdtype)
        return first if _likely_certain(call.det, _limit(plan, first), lap) else None

    object.__setattr__(cfg, "_first_decision", first_if_test_passes)  # shadows the method
    return cfg


def _answering(cfg: AutoConfig, answers: dict, potrf: bool) -> AutoConfig:
    """``cfg`` whose certificate returns ``answers["rows"]`` (the real one's, recorded), after one float64
    copy and potrf of the first element where ``potrf``."""

    def certifier(plan, prob, dec, lapack_dtype):
        def certify(rows):
            if potrf:
                a = dec.A[0].numpy().astype(np.float64)
                a.reshape(-1)[:: a.shape[0] + 1] -= 0.9 * float(dec.w[0, 0])
                lapack.dpotrf(a.T, lower=0, clean=0, overwrite_a=1)
            return answers["rows"]

        return certify

    object.__setattr__(cfg, "_certifier", certifier)  # shadows the static method
    return cfg


def _recording(answers: dict) -> AutoConfig:
    cfg = AutoConfig()
    real = AutoConfig._certifier

    def certifier(plan, prob, dec, lapack_dtype):
        inner = real(plan, prob, dec, lapack_dtype)

        def certify(rows):
            answers["rows"] = inner(rows)
            return answers["rows"]

        return certify

    object.__setattr__(cfg, "_certifier", certifier)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-p", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "fp64"], choices=sorted(DTYPES))
    ap.add_argument("--kappas", type=float, nargs="+", default=[1e5, 1e3])
    ap.add_argument("--ggt-kappas", type=float, nargs="*", default=[])
    ap.add_argument("--cholesky-test", action="store_true", help="also time the pre-test path")
    ap.add_argument(
        "--certificate-parts",
        action="store_true",
        help="also time auto with a free certificate / its potrf only",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    estimate_first = AutoConfig()
    object.__setattr__(estimate_first, "_first_decision", lambda *a: None)  # always the estimate first
    weyl_only = AutoConfig()
    object.__setattr__(weyl_only, "_certifier", lambda *a: None)  # spectrum_estimate without certify
    tested, auto = _with_test(AutoConfig()), AutoConfig()
    answers: dict = {}
    free, potrf_only = _answering(AutoConfig(), answers, False), _answering(AutoConfig(), answers, True)
    for name, A in _cases(args.n, args.dtypes, args.kappas, args.ggt_kappas).items():
        answers["rows"] = None
        res = _recording(answers).solve(A, args.p)
        label = res.info["auto"]["chosen"][0]
        cfg, sopts = candidate(load_table(), label)
        direct = cfg.solve(A, args.p, **sopts)
        for other in (estimate_first, weyl_only, tested, free, potrf_only):
            assert torch.equal(other.solve(A, args.p).root, direct.root), name
        assert torch.equal(res.root, direct.root), name
        calls = {
            "chosen": lambda A=A, cfg=cfg, sopts=sopts: cfg.solve(A, args.p, **sopts),
            "estimate_first": lambda A=A: estimate_first.solve(A, args.p),
            "weyl_only": lambda A=A: weyl_only.solve(A, args.p),
            "cholesky_test": lambda A=A: tested.solve(A, args.p),
            "auto": lambda A=A: auto.solve(A, args.p),
            "cert_free": lambda A=A: free.solve(A, args.p),
            "copy_potrf": lambda A=A: potrf_only.solve(A, args.p),
        }
        if not args.cholesky_test:
            del calls["cholesky_test"]
        if not args.certificate_parts or answers["rows"] is None:  # no certificate ran: nothing to split
            del calls["cert_free"], calls["copy_potrf"]
        times: dict[str, list[float]] = {k: [] for k in calls}
        for f in calls.values():
            f()
        for r in range(args.rounds):
            keys = list(calls)
            keys = keys[r % len(keys) :] + keys[: r % len(keys)]  # rotate the order
            for k in keys:
                t0 = time.process_time()
                for _ in range(args.reps):
                    calls[k]()
                times[k].append((time.process_time() - t0) / args.reps)
        med = {k: float(np.median(v)) for k, v in times.items()}
        rel = {k: med[k] / med["chosen"] for k in calls}
        others = ", ".join(f"{k} {rel[k]:.3f}" for k in calls if k != "chosen")
        print(
            f"{name:12s} {label:32s} chosen {med['chosen'] * 1e3:7.3f} ms  auto/chosen: {others}"
            f"  [{res.info['auto']['kappa_source'][:40]}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
