"""Import layering: the optimizer does not import the study layer (issue 14; docs/design.md §2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


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
