"""The trusted fast path (``SolveOptions.trusted``) and the root round's cheaper equivalents.

* Shampoo's root round declares its own factors trusted; with ``ShampooImplementation(trust_factors=False)``
  the same run re-validates every factor. Both give bitwise the same parameters and state, for
  every registered root solver, fp32 and fp64, on rank-deficient factors (a layer with more rows
  than the batch, a 1-wide layer), over several root rounds; and the validated run really did
  validate (the symmetry test ran), the trusted one did not.
* A direct matroots call validates by default: an asymmetric or non-finite matrix raises the typed
  error. With ``trusted=True`` a non-finite matrix still raises (the max|A| pass sees it), an
  asymmetric one is solved as the method reads it (eigh: its lower triangle), and the checks of the
  result still flag a non-finite root.
* The cheaper computations that replaced the old ones in every solve are bitwise the old ones:
  ``rescale_root`` against check_root_range + scale_by_power_of_two, ``max_abs`` against
  ``vector_norm(ord=inf)``, the in-place psd shift against the copying one; and the kappa diagnostic
  taken from eigh's spectrum matches an independent float64 eigendecomposition of the matrix solved.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from torch import nn

import matroots
import shampoo
from matroots import SolveOptions
from matroots.core import psd
from matroots.core.errors import NonFiniteInputError, NotSymmetricError
from matroots.core.inputs import check_root_range, max_abs, prepare, rescale_root, scale_by_power_of_two
from matroots.solvers import available
from matroots.solvers.base import RawResult, SolverConfig

SOLVERS = available()  # every registered root solver, "auto" included


def factor_batch(b: int, n: int, rank: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank-deficient PSD factors as Shampoo builds them: baddbmm of G G^T, the upper triangle
    mirrored bitwise (exactly symmetric)."""
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(b, n, rank, generator=g, dtype=dtype) * 1e-2
    F = torch.baddbmm(torch.zeros(b, n, n, dtype=dtype), G, G.mT)
    lower = torch.ones(n, n, dtype=torch.bool).tril_(-1)
    return torch.where(lower, F.mT, F)


class Net(nn.Module):
    """12 -> 32 -> 1 -> 2: the 32 x 12 weight has more rows than the batch of 6 (rank-deficient
    factors), and the 1 x 32 / 2 x 1 layers are 1 wide."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 32)
        self.b = nn.Linear(32, 1)
        self.c = nn.Linear(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def train(
    solver: str, dtype: torch.dtype, steps: int = 5, trusted: bool = True
) -> tuple[nn.Module, shampoo.Shampoo]:
    torch.manual_seed(0)
    model = Net().to(dtype)
    g = torch.Generator().manual_seed(1)
    opt = shampoo.Shampoo(
        model.parameters(),
        lr=1e-2,
        precondition_frequency=2,
        start_preconditioning_step=1,
        max_preconditioner_dim=32,  # no merging: factors 32 and 12 of rank 6, the 1 x 32 layer as 32
        root_solver=solver,
        factor_dtype=dtype,
        root_dtype=dtype,
        implementation=shampoo.ShampooImplementation(trust_factors=trusted),
    )
    for _ in range(steps):  # roots at steps 1, 3, 5
        x = torch.randn(6, 12, generator=g, dtype=dtype)
        y = torch.randint(0, 2, (6,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, opt


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if not a.is_floating_point():
            return torch.equal(a, b)
        nan = a.isnan()
        return (
            torch.equal(nan, b.isnan())
            and torch.equal(a[~nan], b[~nan])
            and torch.equal(a.signbit(), b.signbit())
        )
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _strip_timing(state: dict) -> dict:
    """The optimizer state without wall-clock timings (the only entries allowed to differ)."""
    return {k: v for k, v in state.items() if not k.endswith("seconds")}


@pytest.fixture
def symmetry_tests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the input symmetry tests of the solvers (``symmetric_part``, the exact-symmetry pass that
    ``symmetric_input(zero_defect=False)`` makes on its own, schur_newton's and auto's)."""
    import matroots.core.inputs as inputs_mod
    from matroots.solvers import auto as auto_mod
    from matroots.solvers import schur_newton as schur_mod

    calls: list[int] = []
    for owner, name in (
        (inputs_mod, "symmetric_part"),
        (inputs_mod, "_exactly_symmetric"),
        (schur_mod, "is_symmetric"),
    ):
        orig = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _o=orig, **k: (calls.append(1), _o(*a, **k))[1])
    orig_auto = auto_mod.AutoConfig._symmetric
    monkeypatch.setattr(
        auto_mod.AutoConfig, "_symmetric", staticmethod(lambda *a: (calls.append(1), orig_auto(*a))[1])
    )
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("solver", SOLVERS)
def test_trusted_round_is_bitwise_the_validated_one(
    solver: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch, symmetry_tests: list[int]
) -> None:
    m_val, o_val = train(solver, dtype, trusted=False)
    validated_tests = len(symmetry_tests)
    symmetry_tests.clear()
    m_tr, o_tr = train(solver, dtype, trusted=True)
    assert validated_tests > 0, "the validated run did not test symmetry: the comparison would be vacuous"
    assert not symmetry_tests, f"the trusted run re-tested symmetry {len(symmetry_tests)} times"
    assert o_tr.timing.root_rounds == o_val.timing.root_rounds >= 3
    for (name, p), q in zip(m_tr.named_parameters(), m_val.parameters(), strict=True):
        assert torch.equal(p, q), name
    s_tr, s_val = o_tr.state_dict(), o_val.state_dict()
    assert s_tr["param_groups"] == s_val["param_groups"]
    assert s_tr["state"].keys() == s_val["state"].keys()
    for k in s_tr["state"]:
        assert _same(_strip_timing(s_tr["state"][k]), _strip_timing(s_val["state"][k])), k
    diags = [f for d in o_tr.diagnostics() for f in d.factors]
    assert diags and all(f.has_root and f.failures == 0 and math.isfinite(f.kappa) for f in diags)


@pytest.mark.filterwarnings("ignore:method='auto'")  # the tiny factors are outside auto's table
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("solver", SOLVERS)
def test_direct_trusted_solve_is_bitwise_the_validated_one(solver: str, dtype: torch.dtype) -> None:
    A = factor_batch(3, 24, rank=5, seed=2, dtype=dtype)  # rank 5 of 24, exactly symmetric
    kw = dict(eps=1e-12, psd="shift", quiet=True, dtype=dtype)
    validated = matroots.inverse_root(A, 4, solver, **kw)
    trusted = matroots.inverse_root(A, 4, solver, trusted=True, **kw)
    assert torch.equal(trusted.root, validated.root)
    assert torch.equal(torch.as_tensor(trusted.converged), torch.as_tensor(validated.converged))
    timing = lambda info: {k for k in info if "seconds" in k}  # noqa: E731
    keys = set(validated.info) - timing(validated.info) - {"auto"}
    assert keys == set(trusted.info) - timing(trusted.info) - {"auto"}
    for k in keys:
        assert _same(trusted.info[k], validated.info[k]), k
    if solver == "auto":
        assert trusted.info["auto"]["chosen"] == validated.info["auto"]["chosen"]


def test_direct_calls_validate_by_default() -> None:
    A = factor_batch(1, 16, rank=16, seed=3, dtype=torch.float64)[0] + torch.eye(16, dtype=torch.float64)
    asym = A.clone()
    asym[0, 1] += 1e-3
    with pytest.raises(NotSymmetricError, match="symmetry defect"):
        matroots.inverse_root(asym, 2, "eigh")
    nan = A.clone()
    nan[2, 3] = nan[3, 2] = math.nan
    for trusted in (False, True):  # the max|A| pass that prescaling needs sees it either way
        with pytest.raises(NonFiniteInputError, match="non-finite"):
            matroots.inverse_root(nan, 2, "eigh", trusted=trusted)
        with pytest.raises(NonFiniteInputError):
            matroots.inverse_root(nan, 2, "coupled_newton", trusted=trusted)


def test_trusted_asymmetric_input_is_solved_as_eigh_reads_it() -> None:
    """The documented outcome of a broken promise: no error, eigh uses the lower triangle."""
    A = factor_batch(1, 16, rank=16, seed=4, dtype=torch.float64)[0] + torch.eye(16, dtype=torch.float64)
    asym = A.clone()
    asym[0, 5] += 0.5  # upper triangle only
    got = matroots.inverse_root(asym, 2, "eigh", trusted=True)
    lower = torch.tril(asym) + torch.tril(asym, -1).mT
    assert torch.equal(got.root, matroots.inverse_root(lower, 2, "eigh").root)


class NaNRoot(SolverConfig):
    """A broken method behind the shared pipeline: a NaN root for element 0, claimed converged."""

    name = "nan_root"

    def _run(self, prob, *, inverse, warm_start):  # type: ignore[no-untyped-def]
        b, n = prob.A.shape[0], prob.n
        X = torch.eye(n, dtype=prob.A.dtype).expand(b, n, n).clone()
        X[0, 0, 0] = math.nan
        return RawResult(
            root=X,
            converged=torch.ones(b, dtype=torch.bool),
            iterations=torch.ones(b, dtype=torch.int64),
            residual=torch.zeros(b, dtype=torch.float64),
            matmuls=0.0,
        )


@pytest.mark.parametrize("trusted", [False, True])
def test_result_checks_are_never_skipped(trusted: bool) -> None:
    A = factor_batch(2, 8, rank=8, seed=5, dtype=torch.float64) + torch.eye(8, dtype=torch.float64)
    res = NaNRoot().solve(A, 2, trusted=trusted, quiet=True)
    assert res.converged.tolist() == [False, True]
    assert res.info["non_finite_root"] == 1


def test_shampoo_counts_a_non_finite_trusted_root_as_a_failure() -> None:
    torch.manual_seed(0)
    model = nn.Linear(6, 4)
    opt = shampoo.Shampoo(
        model.parameters(),
        lr=1e-2,
        precondition_frequency=1,
        start_preconditioning_step=1,
        root_solver=NaNRoot(),
    )
    assert opt.implementation.trust_factors  # the default
    with pytest.warns(shampoo.RootFailureWarning):
        model(torch.randn(16, 6)).sum().backward()
        opt.step()
    fs = [f for d in opt.diagnostics() for f in d.factors]
    assert sum(f.primary_failures for f in fs) >= 1
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _reference_rescale(root: torch.Tensor, dtype: torch.dtype, lf: Fraction) -> torch.Tensor:
    check_root_range(root, dtype, log2_factor=lf)
    return scale_by_power_of_two(root.double(), lf).to(dtype)


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.int32 if a.dtype == torch.float32 else torch.int64),
                                              b.view(torch.int32 if b.dtype == torch.float32 else torch.int64))  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_rescale_root_is_bitwise_the_reference_composition(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for trial in range(40):
        b, n = 1 + trial % 3, (1, 7, 40, 130)[trial % 4]
        X = torch.randn(b, n, n, generator=g) * 10.0 ** float(torch.randint(-30, 30, (1,), generator=g))
        X[0, 0, 0] = (0.0, -0.0, 1e-45, math.nan, math.inf)[trial % 5]  # zeros, a subnormal, NaN, inf
        p = int(torch.randint(1, 9, (1,), generator=g))
        lf = Fraction(int(torch.randint(-450, 450, (1,), generator=g)), -p)
        for dtype in (torch.float32, torch.float64):
            try:
                want = _reference_rescale(X, dtype, lf)
            except matroots.FormatRangeError:
                with pytest.raises(matroots.FormatRangeError):
                    rescale_root(X, dtype, lf)
                continue
            assert _bitwise(rescale_root(X, dtype, lf), want), (trial, dtype, lf)


def test_max_abs_is_the_infinity_norm() -> None:
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        X = (torch.randn(3, 9, 9, generator=g) * 50).to(dtype)
        assert max_abs(X) == float(torch.linalg.vector_norm(X.float(), ord=math.inf))
        assert max_abs(X.mT) == max_abs(X)
    assert max_abs(torch.tensor([1.0, -math.inf])) == math.inf
    assert math.isnan(max_abs(torch.tensor([math.nan, 1.0])))
    assert max_abs(torch.tensor([-0.0, 0.0])) == 0.0


def test_in_place_psd_shift_equals_the_copying_one() -> None:
    A = factor_batch(6, 32, rank=3, seed=6)  # rank-deficient: shifted
    opts = SolveOptions(eps=1e-12, psd="shift", dtype=torch.float32)
    private = prepare(A, 4, integer_p=False, method="eigh", options=opts)
    copying = prepare(A, 4, integer_p=False, method="eigh", options=opts)
    copying.private = False
    kept, before = copying.A, copying.A.clone()
    assert private.private  # prescaled: a buffer of the solve
    psd.apply(private, "shift")
    psd.apply(copying, "shift")
    assert bool((private.info["psd_shift"] > 0).any())
    assert torch.equal(private.A, copying.A) and torch.equal(
        private.info["psd_shift"], copying.info["psd_shift"]
    )
    assert torch.equal(kept, before)  # the non-private input was not written
    same = prepare(A[0] * 0 + torch.eye(32), 4, integer_p=False, method="eigh", options=opts)
    assert not same.private  # no rounding, scaling or copy: the caller's storage


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_kappa_from_eigh_matches_the_matrix_solved(dtype: torch.dtype) -> None:
    """The diagnostic against float64 numpy eigenvalues of A + (psd_shift + eps_abs) I, A the
    bias-corrected factor that was solved."""
    _, opt = train("eigh", dtype, steps=3)
    beta2 = opt.param_groups[0]["betas"][1]
    eng = opt._engines[0]  # the typed per-factor state
    factors = [f for st in eng.states for blk in st.blocks for f in blk.factors]
    assert len(factors) >= 4
    for f in factors:
        assert f.root_step == 3 and f.solver == "eigh"
        A = f.matrix.double().numpy() / (1.0 - beta2**f.root_step)
        w = np.linalg.eigvalsh(A + f.regularisation * np.eye(f.n))
        want = w[-1] / w[0]
        # the computed w_min carries an absolute error ~u ||A||, i.e. a relative one ~u kappa (bounded
        # in fp32, where w_min sits at the psd floor n u ||A||_F, by a few percent)
        u = torch.finfo(dtype).eps / 2
        tol = min(0.2, 8 * f.n * u * want) + 1e-12
        assert f.kappa >= 1.0 and abs(f.kappa - want) <= tol * want, (f.n, f.kappa, want, tol)
