"""Import layering (docs/design.md §2): no layer imports one above it, and the optimizer loads neither
the study nor the truth layer (issues 14 and 23)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# docs/design.md §2, from the ground up: a module may import its own layer and the ones below it.
RANK = {"core": 0, "solvers": 1, "truth": 2, "study": 3, "facade": 4}
# What the optimizer (shampoo) may import of matroots: the solver and core layers, and the package face
# itself (`import matroots`, whose __init__ and api load just those two; checked at run time below).
OPTIMIZER_MAY_IMPORT = {"core", "solvers", "package"}


def _layer(module: str) -> str | None:
    """The layer of a dotted module name of this checkout (None: not one of ours)."""
    parts = module.split(".")
    if parts[0] == "shampoo":
        return "optimizer"
    if parts[0] != "matroots":
        return None
    if len(parts) == 1:
        return "package"
    if parts[1] in RANK:
        return parts[1]
    return "facade"  # matroots/__init__.py, api, cli


def _module_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _lazy_submodules(root: Path) -> dict[str, str]:
    """matroots' lazy attributes (``from matroots import reference`` loads matroots.truth.reference)."""
    tree = ast.parse((root / "matroots" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_LAZY_SUBMODULES" for t in node.targets
        ):
            return {k: f"matroots.{v}" for k, v in ast.literal_eval(node.value).items()}
    return {}


def _imports(path: Path, root: Path, lazy: dict[str, str]) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file: top-level, function-local and
    TYPE_CHECKING ones alike, relative ones resolved, ``from P import name`` as P.name where that is a
    module (or one of matroots' lazy attributes)."""
    module = _module_of(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                as_path = root.joinpath(*sub.split("."))
                if as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists():
                    out.append((node.lineno, sub))
                elif target == "matroots" and a.name in lazy:
                    out.append((node.lineno, lazy[a.name]))
                else:
                    out.append((node.lineno, target))
    return out


def upward_imports(root: Path) -> list[str]:
    """Every import in matroots/ and shampoo/ of ``root`` that breaks docs/design.md §2."""
    lazy = _lazy_submodules(root)
    bad = []
    for path in sorted([*root.joinpath("matroots").rglob("*.py"), *root.joinpath("shampoo").rglob("*.py")]):
        here = _layer(_module_of(path, root))
        here = "facade" if here == "package" else here  # matroots/__init__.py
        for line, target in _imports(path, root, lazy):
            there = _layer(target)
            if there is None or here == "facade":
                continue
            where = f"{path.relative_to(root)}:{line} ({here}) imports {target} ({there})"
            if here == "optimizer":
                if there != "optimizer" and there not in OPTIMIZER_MAY_IMPORT:
                    bad.append(where)
            elif there == "optimizer":
                if here != "study":  # the study layer's validation trains with the optimizer
                    bad.append(where)
            elif there == "package" or RANK[there] > RANK[here]:
                bad.append(where)
    return bad


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports(ROOT) == []


def test_a_shampoo_step_with_every_root_solver_loads_no_study_or_truth_module() -> None:
    code = textwrap.dedent(
        """
        import sys, torch, shampoo
        from matroots.solvers import registry
        loaded = {}
        for name in registry.available():
            torch.manual_seed(0)
            w = torch.nn.Parameter(torch.randn(6, 5))
            opt = shampoo.Shampoo([w], precondition_frequency=1, start_preconditioning_step=1, root_solver=name)
            for _ in range(2):
                w.grad = torch.randn(6, 5)
                opt.step()
            used = {f.solver.partition(":")[0] for b in opt.diagnostics() for f in b.factors}
            assert used == {name}, (name, used)  # the root was computed, by the solver asked for
            loaded[name] = sorted(m for m in sys.modules if m.startswith(("matroots.study", "matroots.truth")))
        print("auto" in loaded, {k: v for k, v in loaded.items() if v})
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True {}", out.stdout + out.stderr


def test_shampoo_dumps_factors_without_importing_the_study_layer(tmp_path) -> None:
    code = textwrap.dedent(
        f"""
        import sys, torch, shampoo
        from matroots.core.factor_dump import load_shampoo_factors
        w = torch.nn.Parameter(torch.randn(4, 3))
        opt = shampoo.Shampoo([w], precondition_frequency=1)
        w.grad = torch.randn(4, 3)
        opt.step()
        path = opt.dump_factors({str(tmp_path)!r})
        assert len(load_shampoo_factors(path)) >= 1
        study = sorted(m for m in sys.modules if m in ("matroots.study.matrices", "matroots.study.sweep", "matroots.study.report"))
        print(study)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_matrices_reexports_the_dump_format() -> None:
    import matroots.core.factor_dump as fd
    import matroots.study.matrices as mm

    assert mm.save_shampoo_factors is fd.save_shampoo_factors
    assert mm.load_shampoo_factors is fd.load_shampoo_factors
    assert mm.SHAMPOO_FORMAT_VERSION == fd.SHAMPOO_FORMAT_VERSION == 1
