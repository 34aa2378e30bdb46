"""The structure measures of issue 23 for a checkout: import circles, largest functions and files, and
two parameter walks, so the numbers of a before and an after tree come from one command.

* **Circles**: strongly connected components (more than one module) of the import graph of
  ``matroots/`` and ``shampoo/``, counting every import: top-level, function-local and
  ``TYPE_CHECKING`` ones (a package's ``__init__`` is not counted as importing its own submodules'
  parent back). Layer arrows that run back up are tests/test_layers.py's ``upward_imports``.
* **Largest**: functions and methods by lines (``def`` to its last line), files by lines.
* **Walks** (run time, one Shampoo step with a root round on a 6 x 5 parameter): every Python call
  in the checkout's ``matroots/`` or ``shampoo/`` that receives the value as an argument is a stay;
  moves = changes of file between consecutive stays, returns = entering a file left before.

  - ``root_solver``: from ``Shampoo(..., root_solver="eigh")`` to the first ``torch.linalg.eigh``
    (LAPACK); the value is the name, the solver config it resolves to, or a holder of it (the param
    group dict, the ``GroupOptions``; ``self`` of their methods included).
  - ``opts``: the group's ``GroupOptions`` while ``GroupEngine.block_directions`` runs.

Usage (the before tree is a ``git archive`` of the old commit)::

    mkdir -p /tmp/before && git archive 8073193 | tar -x -C /tmp/before
    python experiments/house_metrics.py --repo /tmp/before
    python experiments/house_metrics.py
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("matroots", "shampoo")


def _sources(repo: Path) -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in sorted(repo.joinpath(pkg).rglob("*.py")):
            parts = list(p.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


def circles(repo: Path) -> list[list[str]]:
    """The import circles (module names) of ``repo``'s matroots/ and shampoo/."""
    mods = _sources(repo)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    t = ".".join(base + ([node.module] if node.module else []))
                else:
                    t = node.module or ""
                targets = [f"{t}.{a.name}" if f"{t}.{a.name}" in mods else t for a in node.names]
            for t in targets:
                r = resolve(t)
                if r and r != m and not (mods[r].name == "__init__.py" and m.startswith(r + ".")):
                    edges[m].add(r)
    # Tarjan's strongly connected components, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in mods:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def largest(repo: Path, k: int = 5) -> dict[str, object]:
    funcs: list[tuple[int, str]] = []
    files: list[tuple[int, str]] = []
    for p in _sources(repo).values():
        src = p.read_text()
        rel = str(p.relative_to(repo))
        files.append((len(src.splitlines()), rel))

        def visit(node: ast.AST, prefix: str, rel: str = rel) -> None:
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, ast.FunctionDef | ast.AsyncFunctionDef):
                    funcs.append((ch.end_lineno - ch.lineno + 1, f"{rel}:{ch.lineno} {prefix}{ch.name}"))
                    visit(ch, f"{prefix}{ch.name}.")
                elif isinstance(ch, ast.ClassDef):
                    visit(ch, f"{prefix}{ch.name}.")

        visit(ast.parse(src), "")
    return {
        "lines": sum(n for n, _ in files),
        "files": len(files),
        "functions": sorted(funcs, reverse=True)[:k],
        "largest_files": sorted(files, reverse=True)[:k],
    }


_WALK = textwrap.dedent(
    """
    import json, os, sys
    repo, what = sys.argv[1], sys.argv[2]
    sys.path.insert(0, repo)
    import torch
    import shampoo
    from matroots.solvers import SolverConfig
    from shampoo.config import GroupOptions
    assert os.path.abspath(shampoo.__file__).startswith(repo + os.sep), shampoo.__file__
    W = torch.nn.Parameter(torch.randn(6, 5, generator=torch.Generator().manual_seed(0)))
    seq, state = [], {"depth": 0, "done": False}

    def carries(v):
        if what == "opts":
            return isinstance(v, GroupOptions)
        if isinstance(v, SolverConfig) or (isinstance(v, str) and v == "eigh"):
            return True
        if isinstance(v, dict) and v.get("root_solver") is not None:
            return True
        return isinstance(v, GroupOptions)

    def prof(frame, event, arg):
        code = frame.f_code
        if state["done"]:
            return
        if what == "opts" and code.co_qualname == "GroupEngine.block_directions":
            state["depth"] += {"call": 1, "return": -1}.get(event, 0)
        if what == "root_solver" and event == "c_call" and arg is torch.linalg.eigh:
            seq.append(["torch.linalg.eigh (LAPACK)", os.path.relpath(code.co_filename, repo)])
            state["done"] = True
            return
        if event != "call" or (what == "opts" and not state["depth"]):
            return
        f = os.path.abspath(code.co_filename)
        if not f.startswith(repo + os.sep) or not f.endswith(".py"):  # "<string>": dataclass __init__
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(carries(frame.f_locals.get(n)) for n in names):
            seq.append([code.co_qualname, os.path.relpath(f, repo)])

    torch.set_num_threads(1)
    if what == "root_solver":
        sys.setprofile(prof)
    opt = shampoo.Shampoo([W], precondition_frequency=1, start_preconditioning_step=1, root_solver="eigh")
    W.grad = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    sys.setprofile(prof)
    opt.step()
    sys.setprofile(None)
    print(json.dumps(seq))
    """
)


def walk(repo: Path, what: str) -> dict[str, object]:
    """The run-time walk of ``what`` ("root_solver" or "opts") in ``repo`` (a subprocess that imports
    that checkout's packages)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", _WALK, str(repo), what], capture_output=True, text=True, env=env, check=True
    )
    seq = json.loads(out.stdout.strip().splitlines()[-1])
    path: list[str] = []
    seen: set[str] = set()
    moves = returns = 0
    prev = None
    for fn, f in seq:
        if f != prev:
            if prev is not None:
                moves += 1
                returns += f in seen
            path.append(f"{f} ({fn})")
            seen.add(f)
            prev = f
    return {"stays": len(seq), "moves": moves, "files": len(seen), "returns": returns, "path": path}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--path", action="store_true", help="print each walk's files in order")
    args = ap.parse_args(argv)
    repo = args.repo.resolve()
    circ = circles(repo)
    print(f"{repo}: import circles {len(circ)}")
    for c in circ:
        print(f"  {', '.join(c)}")
    big = largest(repo, args.top)
    print(f"library: {big['files']} files, {big['lines']} lines")
    for n, name in big["functions"]:  # type: ignore[attr-defined]
        print(f"  function {n:4d}  {name}")
    for n, name in big["largest_files"]:  # type: ignore[attr-defined]
        print(f"  file     {n:4d}  {name}")
    for what in ("root_solver", "opts"):
        w = walk(repo, what)
        print(
            f"walk {what}: {w['stays']} stays, {w['moves']} moves, {w['files']} files, {w['returns']} returns"
        )
        if args.path:
            for i, p in enumerate(w["path"], 1):  # type: ignore[arg-type]
                print(f"  {i:2d}. {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
