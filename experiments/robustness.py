"""Robustness table: per solver, how every call ends over a fixed-seed fuzz run.

Each case is drawn by :func:`matroots.study.robustness.random_case` (random shape, batch, working dtype,
input layout, scale 1e-300..1e300, spectra incl. zero/negative/clustered/non-symmetric, eps, p,
forward/inverse) and solved by every registered solver (:func:`matroots.study.robustness.solver_names`, so
a new solver joins without a change here); :func:`matroots.study.robustness.classify` sorts the outcome
into typed refusals (input / numerical), flagged non-convergence, correct (within
C n (1 + cond(f, A)) u of the mpmath root of the matrix actually solved) and silent wrong, plus crashes
(exceptions outside MatrootsError) and writes into the caller's tensor.

    .venv/bin/python experiments/robustness.py --cases 2000 --seed 0 [--out runs/robustness.csv]
    .venv/bin/python experiments/robustness.py --warm --cases 1000 --seed 1

``--warm``: the warm-start fuzz (:func:`matroots.study.robustness.random_warm_case`,
:func:`~matroots.study.robustness.classify_warm`): for every solver that declares a warm start, the previous
matrix (another conditioning, rank or scale) is solved, the current case warm-started from that
result and judged like a cold one; ``no_previous`` counts cases whose previous solve was refused.

Prints the table (and the silent-wrong / crash cases in full, to reproduce); ``--out`` writes one row
per (case, method) as CSV. Silent-wrong, crash and mutated must be 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time

import numpy as np
import pandas as pd
from tqdm import tqdm

from matroots.study import robustness


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default=None, help="comma-separated (default: every registered solver)")
    ap.add_argument("--warm", action="store_true", help="the warm-start fuzz (solvers with a warm start)")
    ap.add_argument("--out", default=None, help="CSV of every (case, method) outcome")
    args = ap.parse_args(argv)
    logging.getLogger("matroots").setLevel(logging.ERROR)  # non-convergence is counted, not logged
    if args.methods:
        methods = tuple(args.methods.split(","))
    else:
        methods = robustness.warm_solver_names() if args.warm else robustness.solver_names()
    rng = np.random.default_rng(args.seed)
    rows = []
    t0 = time.perf_counter()
    for i in tqdm(range(args.cases), desc="cases", file=sys.stderr):
        if args.warm:
            wcase = robustness.random_warm_case(rng)
            case = wcase.current
            outs = [robustness.classify_warm(wcase, m) for m in methods]
            warm = {"change": wcase.change, **{f"prev_{k}": v for k, v in _fields(wcase.previous).items()}}
        else:
            case = robustness.random_case(rng)
            outs = robustness.check_all(case, methods)
            warm = {}
        for out in outs:
            rows.append(
                {
                    "case": i,
                    **_fields(case),
                    **warm,
                    "method": out.method,
                    "outcome": out.outcome,
                    "branch": _branch(out),
                    "error": out.error,
                    "bound": out.bound,
                    "cond": out.cond,
                    "detail": out.detail,
                    "exception": out.exception,
                    "outside_capabilities": out.extra.get("outside_capabilities", ""),
                }
            )
    df = pd.DataFrame(rows)
    mode = "warm-start" if args.warm else "cold"
    print(f"robustness ({mode}): {args.cases} cases, seed {args.seed}, {time.perf_counter() - t0:.0f} s")
    print(table(df).to_string())
    if args.warm:
        print("\nby change of the previous matrix:")
        print(df.groupby(["change", "outcome"]).size().unstack("outcome").fillna(0).astype(int).to_string())
    outside = df[df.outside_capabilities != ""]
    if len(outside):
        print("\noutside the declared capabilities (typed refusals expected):")
        print(
            outside.groupby(["method", "outcome"]).size().unstack("outcome").fillna(0).astype(int).to_string()
        )
    print("\nrefusals by error class:")
    print(
        df[df.outcome.str.startswith("refused")]
        .groupby(["method", "branch"])
        .size()
        .unstack(0)
        .fillna(0)
        .astype(int)
        .to_string()
    )
    bad = df[df.outcome.isin(["silent_wrong", "crash", "mutated"])]
    for _, r in bad.iterrows():
        print(f"\n{r.method} {r.outcome}: {r.detail} {r.exception}")
        print("   ", {k: r[k] for k in [f.name for f in dataclasses.fields(robustness.Case)]})
        if args.warm:
            print("    previous", r.change, {k: r[f"prev_{k}"] for k in _fields(case)})
    if args.out:
        df.to_csv(args.out, index=False)
    return 1 if len(bad) else 0


def _fields(case: robustness.Case) -> dict:
    return {k: str(v) if k in ("batch", "p") else v for k, v in dataclasses.asdict(case).items()}


def _branch(out: robustness.Outcome) -> str:
    """The exception class of a refusal or crash ("" otherwise)."""
    return out.exception.split(":", 1)[0] if out.exception else ""


def table(df: pd.DataFrame) -> pd.DataFrame:
    """Counts per method and outcome (columns in :data:`matroots.study.robustness.OUTCOMES` order)."""
    cols = list(robustness.OUTCOMES)
    if (df.outcome == robustness.NO_PREVIOUS).any():
        cols.insert(0, robustness.NO_PREVIOUS)
    t = df.groupby(["method", "outcome"]).size().unstack("outcome").reindex(columns=cols)
    t = t.fillna(0).astype(int)
    ill = df[df.detail == robustness.ILL_POSED].groupby("method").size()
    t.insert(
        t.columns.get_loc("correct") + 1, "of_which_ill_posed", ill.reindex(t.index).fillna(0).astype(int)
    )
    t["total"] = t[cols].sum(axis=1)
    return t


if __name__ == "__main__":
    raise SystemExit(main())
