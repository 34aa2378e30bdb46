"""Input robustness: one test per class of mistake or extreme input that used to go wrong.

Each class was a silent wrong result, a raw traceback or an untyped error before (issue 9):

* a non-symmetric matrix whose norm over/underflows passed eigh's symmetry check (inf/inf = NaN);
* eigenvalue + eps overflowing the compute format gave a zero root flagged converged (fp16 prescale);
* tol=inf (and other unchecked arguments) returned the starting guess flagged converged;
* transposed views crashed ("refer to a single memory location") and could write into the caller's
  storage; fp16 prescaling of tiny input raised OverflowError; lists, object arrays, meta tensors,
  wrong warm starts raised TypeError/RuntimeError; requires_grad input was silently detached.

References are closed forms or mpmath (tests/_refs.py), never the code under test.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from _refs import ref_inverse_root, ref_power, rel_err, spd_matrix

import matroots
from matroots import (
    FormatRangeError,
    InvalidArgumentError,
    MatrootsInputError,
    NotSymmetricError,
    UnsupportedDtypeError,
)
from matroots.core.inputs import symmetry_defect

METHODS = ("eigh", "coupled_newton", "schur_newton")
NEWTON = ("coupled_newton", "schur_newton")
U64, U32 = 2.0**-53, 2.0**-24


def _mp_power(x: float, e: Fraction) -> float:
    """x^e in mpmath with the exact rational exponent (a float -1/5 is off by ~1e-17, which costs
    ~1e-14 relative at x ~ 1e-273, where log x ~ -628)."""
    with mpmath.workdps(40):
        return float(mpmath.power(mpmath.mpf(x), mpmath.mpf(e.numerator) / e.denominator))


def _spd(n: int = 6, kappa: float = 10.0) -> torch.Tensor:
    return torch.from_numpy(spd_matrix(n, kappa, seed=0))


# --- silent wrong #3: the symmetry check must hold at any scale ---------------------------------------


@pytest.mark.parametrize(
    "scale,dtype",
    [(1e200, torch.float64), (1e-200, torch.float64), (1e19, torch.float32), (1e-25, torch.float32)],
)
def test_nonsymmetric_input_is_refused_at_any_scale(scale, dtype):
    A = (torch.tensor([[3.0, 1.0], [-1.0, 3.0]], dtype=torch.float64) * scale).to(dtype)
    assert math.isclose(float(symmetry_defect(A)), math.sqrt(8 / 20), rel_tol=1e-6)  # ||A-A^T||/||A||
    with pytest.raises(NotSymmetricError, match=r"6\.325e-01"):
        matroots.inverse_root(A, 2)
    S = A + A.mT  # symmetric at the same scale: accepted, and correct
    res = matroots.inverse_root(S.double(), 2)
    assert rel_err(res.root, ref_inverse_root(S.double().numpy(), 2)) < 10 * U64


def test_symmetry_defect_is_never_nan():
    for scale in (1e300, 1e-300, 5e-324):
        A = torch.tensor([[1.0, 2.0], [0.0, 1.0]], dtype=torch.float64) * scale
        d = float(symmetry_defect(A))
        assert not math.isnan(d) and d > 0.5


# --- silent wrong #4: eigenvalue + eps must fit the compute format ----------------------------------


def test_fp16_absolute_eps_on_a_tiny_matrix_is_correct():
    A = torch.tensor([[1e-300]], dtype=torch.float64)
    res = matroots.inverse_root(A, 3, dtype="fp16", eps=0.01)
    assert res.converged
    exact = (0.01 + 1e-300) ** (-1 / 3)
    assert abs(float(res.root) - exact) / exact < 2 * 2.0**-11  # fp16 rounding of the answer


def test_fp64_eigenvalue_plus_eps_overflow_is_correct():
    A = torch.tensor([[1e308]], dtype=torch.float64)
    res = matroots.inverse_root(A, 3, eps=1e308)  # A + eps I = 2e308 > float64 max
    # (2e308 as a Python float would be inf; mpmath holds it)
    assert res.converged
    assert math.isclose(float(res.root), _mp_power(1e308, Fraction(-1, 3)) * 2.0 ** (-1 / 3), rel_tol=4 * U64)


@pytest.mark.parametrize(
    "A,p,dtype",
    [
        (torch.diag(torch.tensor([1.0, 1e-300], dtype=torch.float64)), 0.25, None),  # 1e1200
        (torch.diag(torch.tensor([1.0, 1e-30])), 0.5, None),  # fp32: 1e60
        (torch.tensor([[1e-300]], dtype=torch.float64), 2, "fp16"),  # 1e150 in fp16
        (torch.tensor([[1e300]], dtype=torch.float64), 1, "fp16"),  # 1e-300 in fp16
    ],
    ids=["fp64-overflow", "fp32-overflow", "fp16-overflow", "fp16-underflow"],
)
def test_root_outside_the_format_is_a_format_range_error(A, p, dtype):
    with pytest.raises(FormatRangeError, match=r"range|underflow|overflow"):
        matroots.inverse_root(A, p, dtype=dtype)


def test_fp16_prescale_of_subnormal_input_is_typed():
    with pytest.raises(FormatRangeError, match="fp16"):
        matroots.inverse_root(torch.tensor([[1e-320]], dtype=torch.float64), 2, dtype="fp16")


@pytest.mark.parametrize("method", NEWTON)
def test_fp16_batch_whose_small_element_underflows_is_not_converged_zero(method):
    A = torch.tensor([[[3.3e201]], [[3.2e193]]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FormatRangeError, match="underflow"):
            matroots.inverse_root(A, 4, method=method, dtype="fp16", eps=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_prescale_undo_is_exact_at_extreme_scale(method):
    A = torch.tensor([[1.7e-273]], dtype=torch.float64)  # prescaled by 2^906; 906/5 is not a float
    res = matroots.inverse_root(A, 5, method=method)
    assert math.isclose(float(res.root), _mp_power(1.7e-273, Fraction(-1, 5)), rel_tol=4 * U64)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("scale", [1e-250, 1e250])
def test_extreme_scales_in_fp64_are_correct(method, scale):
    S = _spd(5, 100.0) * scale
    res = matroots.inverse_root(S, 2, method=method)
    assert res.converged
    ref = ref_inverse_root(S.numpy() / scale, 2) / math.sqrt(scale)
    assert rel_err(res.root, ref) < 100 * 100 * U64


# --- silent wrong #6 and every argument: typed, naming the argument, the value and what is allowed ----


@pytest.mark.parametrize("method", NEWTON)
@pytest.mark.parametrize("tol", [math.inf, math.nan, 0.0, -1e-8, 1.0, 1e10, True, "1e-8", [1e-8]])
def test_bad_tol(method, tol):
    with pytest.raises(InvalidArgumentError, match=r"tol must be .*\(0, 1\).*got"):
        matroots.inverse_root(_spd(), 2, method=method, tol=tol)


@pytest.mark.parametrize("max_iter", [0, -3, 2.5, 3.0, True, "10", math.inf, np.int64(0)])
def test_bad_max_iter(max_iter):
    with pytest.raises(InvalidArgumentError, match="max_iter must be an int >= 1"):
        matroots.inverse_root(_spd(), 2, method="coupled_newton", max_iter=max_iter)


@pytest.mark.parametrize("eps", [-1.0, math.nan, math.inf, True, "0.1", [0.1], torch.tensor([0.1, 0.2]), 1j])
def test_bad_eps(eps):
    with pytest.raises(InvalidArgumentError, match="eps must be a finite real number >= 0"):
        matroots.inverse_root(_spd(), 2, eps=eps)


@pytest.mark.parametrize("eps_mode", ["Relative", "percent", None, 1])
def test_bad_eps_mode(eps_mode):
    with pytest.raises(InvalidArgumentError, match=r"eps_mode must be one of \('absolute', 'relative'\)"):
        matroots.inverse_root(_spd(), 2, eps=0.1, eps_mode=eps_mode)


@pytest.mark.parametrize("kw", [{"strict": 1}, {"strict": "yes"}, {"record_history": None}])
def test_bad_flags(kw):
    name = next(iter(kw))
    with pytest.raises(InvalidArgumentError, match=f"{name} must be True or False"):
        matroots.inverse_root(_spd(), 2, method="coupled_newton", **kw)


@pytest.mark.parametrize("method", METHODS)
def test_numpy_and_torch_scalars_are_accepted_like_floats(method):
    A = _spd()
    base = matroots.inverse_root(A, 2, method=method, eps=float(np.float32(0.1)), tol=1e-10, max_iter=50)
    for eps, tol, it in [
        (np.float32(0.1), np.float64(1e-10), np.int64(50)),
        (torch.tensor(0.1, dtype=torch.float32), torch.tensor(1e-10), torch.tensor(50)),
    ]:
        if method == "eigh":
            res = matroots.inverse_root(A, 2, method=method, eps=eps)
        else:
            res = matroots.inverse_root(A, 2, method=method, eps=eps, tol=tol, max_iter=it)
        assert torch.equal(
            res.root,
            base.root if method != "eigh" else matroots.inverse_root(A, 2, eps=float(np.float32(0.1))).root,
        )


@pytest.mark.parametrize(
    "cls,kw,name",
    [
        (matroots.EighConfig, {"rank_policy": "ignore"}, "rank_policy"),
        (matroots.EighConfig, {"atol": math.nan}, "atol"),
        (matroots.EighConfig, {"atol": -1.0}, "atol"),
        (matroots.EighConfig, {"rtol": math.inf}, "rtol"),
        (matroots.EighConfig, {"symmetry_tol": -1e-3}, "symmetry_tol"),
        (matroots.EighConfig, {"atol": True}, "atol"),
        (matroots.CoupledNewtonConfig, {"scaling": "fastest"}, "scaling"),
        (matroots.CoupledNewtonConfig, {"lanczos_steps": 1}, "lanczos_steps"),
        (matroots.CoupledNewtonConfig, {"lanczos_steps": 10.0}, "lanczos_steps"),
        (matroots.CoupledNewtonConfig, {"lanczos_steps": "a"}, "lanczos_steps"),
        (matroots.CoupledNewtonConfig, {"power_iters": 0}, "power_iters"),
        (matroots.CoupledNewtonConfig, {"power_iters": True}, "power_iters"),
        (matroots.CoupledNewtonConfig, {"stagnation_accept": math.inf}, "stagnation_accept"),
        (matroots.CoupledNewtonConfig, {"stagnation_accept": 0.5}, "stagnation_accept"),
        (matroots.CoupledNewtonConfig, {"symmetry_tol": math.nan}, "symmetry_tol"),
        (matroots.SchurNewtonConfig, {"stagnation_accept": -1.0}, "stagnation_accept"),
        (matroots.SchurNewtonConfig, {"symmetry_tol": "tight"}, "symmetry_tol"),
    ],
)
def test_bad_config_fields(cls, kw, name):
    with pytest.raises(InvalidArgumentError, match=f"{name} must be") as info:
        cls(**kw)
    assert repr(next(iter(kw.values()))) in str(info.value) or "bool" in str(info.value)
    # the same through inverse_root(**options)
    with pytest.raises(InvalidArgumentError, match=f"{name} must be"):
        matroots.inverse_root(_spd(), 2, method=cls.name, **kw)


def test_config_fields_accept_numpy_scalars_and_store_python_types():
    cfg = matroots.CoupledNewtonConfig(lanczos_steps=np.int64(10), stagnation_accept=np.float32(8.0))
    assert type(cfg.lanczos_steps) is int and type(cfg.stagnation_accept) is float
    assert cfg == matroots.CoupledNewtonConfig(lanczos_steps=10, stagnation_accept=8.0)


def test_unknown_method_or_option_is_a_typed_input_error():
    with pytest.raises(InvalidArgumentError, match="available"):
        matroots.inverse_root(_spd(), 2, method="eig")
    with pytest.raises(InvalidArgumentError, match="its options are"):
        matroots.inverse_root(_spd(), 2, method="eigh", scaling="frobenius")
    with pytest.raises(InvalidArgumentError, match="registry name"):
        matroots.inverse_root(_spd(), 2, method=3)


# --- crashes: views never written, any container typed ----------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int64 if t.dtype == torch.float64 else torch.int32).clone()


def _nonsymmetric(n: int = 6) -> torch.Tensor:
    rng = np.random.default_rng(3)
    return torch.from_numpy(np.eye(n) * 3 + 0.3 * rng.standard_normal((n, n)))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "make",
    [
        lambda: _spd().mT,  # exactly symmetric, transposed storage
        lambda: (_spd() + 1e-17 * torch.triu(torch.ones(6, 6, dtype=torch.float64), 1)).mT,  # nearly
        lambda: _nonsymmetric().mT,  # B.T, general
        lambda: torch.stack([_spd(), 2 * _spd()]).mT,  # batched transposed
        lambda: torch.from_numpy(np.kron(spd_matrix(6, 10.0, 0), np.ones((2, 2))))[::2, ::2],  # strided
        lambda: _spd().float().mT,
    ],
    ids=["sym-T", "nearly-sym-T", "general-T", "batch-T", "strided", "fp32-T"],
)
def test_views_are_solved_and_never_written(method, make):
    A = make()
    before = _bits(A)
    try:
        res = matroots.inverse_root(A, 2, method=method)
    except NotSymmetricError:
        assert method == "eigh"  # the general matrix is refused by eigh only
    else:
        assert res.all_converged
        ref = [ref_inverse_root(Ai.double().numpy(), 2) for Ai in A.reshape(-1, 6, 6)]
        u = U32 if A.dtype == torch.float32 else U64
        tol = 1e3 * u if method != "eigh" or not torch.equal(A, A.mT) else 100 * u
        for X, R in zip(res.root.reshape(-1, 6, 6), ref, strict=True):
            assert rel_err(X, R) < tol
    assert torch.equal(_bits(A), before)


@pytest.mark.parametrize("method", ("eigh", "coupled_newton"))
def test_large_transposed_spd_view(method):
    rng = np.random.default_rng(0)
    G = rng.standard_normal((512, 600))
    B = torch.from_numpy(G @ G.T / 600 + np.eye(512))
    B = B + 1e-16 * torch.triu(B, 1)  # rounding-level asymmetry: takes the A - A^T path (n >= 512)
    A = B.mT
    before = _bits(A)
    res = matroots.inverse_root(A, 1, method=method)
    assert res.converged
    ref = torch.linalg.inv(0.5 * (A + A.mT))
    assert float(torch.linalg.matrix_norm(res.root - ref) / torch.linalg.matrix_norm(ref)) < 1e-12
    assert torch.equal(_bits(A), before)


def test_batched_large_symmetric_part_does_not_touch_the_input():
    from matroots.core.inputs import symmetric_part

    rng = np.random.default_rng(1)
    M = torch.from_numpy(rng.standard_normal((2, 300, 300)))
    for A in (M, M.mT):
        before = _bits(A)
        S, _ = symmetric_part(A)
        assert torch.allclose(S, 0.5 * (A + A.mT), rtol=0, atol=1e-15)
        assert torch.equal(_bits(A), before)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "A,err",
    [
        ([[2.0, 0.0], [0.0, 2.0]], InvalidArgumentError),
        (((2.0, 0.0), (0.0, 2.0)), InvalidArgumentError),
        (np.array([[2.0, 0.0], [0.0, 2.0]], dtype=object), UnsupportedDtypeError),
        (np.array([["a", "b"], ["c", "d"]]), UnsupportedDtypeError),
        (torch.eye(2, dtype=torch.float64, device="meta"), InvalidArgumentError),
        (torch.eye(2, dtype=torch.float64).to_sparse(), InvalidArgumentError),
        (2.0, InvalidArgumentError),
    ],
    ids=["list", "tuple", "object-array", "str-array", "meta", "sparse", "scalar"],
)
def test_wrong_containers_are_typed(method, A, err):
    with pytest.raises(err) as info:
        matroots.inverse_root(A, 2, method=method)
    assert isinstance(info.value, MatrootsInputError)


def test_readonly_and_big_endian_numpy_arrays_are_accepted():
    A = spd_matrix(4, 10.0, seed=1)
    ref = ref_inverse_root(A, 2)
    ro = A.copy()
    ro.flags.writeable = False
    for arr in (ro, A.astype(">f8")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "non-writable tensor" warning
            res = matroots.inverse_root(arr, 2)
        assert rel_err(res.root, ref) < 20 * U64


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("warm", ["previous", 3, [[1.0]], np.array([["x"]])])
def test_warm_start_of_the_wrong_type(method, warm):
    with pytest.raises(InvalidArgumentError, match="warm_start must be"):
        matroots.inverse_root(_spd(), 2, method=method, warm_start=warm)


# --- requires_grad: eigh differentiates, the Newton methods refuse ----------------------------------


def _sym(M: torch.Tensor) -> torch.Tensor:
    return 0.5 * (M + M.mT)  # exactly symmetric, so the perturbations of gradcheck stay symmetric


@pytest.mark.parametrize(
    "kw",
    [{}, {"eps": 0.1}, {"eps": 0.05, "eps_mode": "relative"}, {"dtype": "fp32"}],
    ids=["plain", "abs-eps", "rel-eps", "fp32"],
)
@pytest.mark.parametrize("inverse", [True, False])
def test_eigh_gradient_matches_finite_differences(kw, inverse):
    M = _spd(4, 50.0).requires_grad_(True)
    fn = matroots.inverse_root if inverse else matroots.root

    def f(X):
        return fn(_sym(X), 3, **kw).root.double()

    if kw.get("dtype") == "fp32":  # fp32 forward: compare with the fp64 gradient instead
        G = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        (g32,) = torch.autograd.grad((f(M) * G).sum(), M)
        (g64,) = torch.autograd.grad((fn(_sym(M), 3).root * G).sum(), M)
        assert float(torch.linalg.matrix_norm(g32 - g64) / torch.linalg.matrix_norm(g64)) < 1e-4
    else:
        assert torch.autograd.gradcheck(f, (M,), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_eigh_gradient_is_finite_for_repeated_eigenvalues():
    c, p = 2.0, 2
    A = (c * torch.eye(4, dtype=torch.float64)).requires_grad_(True)
    G = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (matroots.inverse_root(A, p).root * G).sum().backward()
    # d(A^{-1/2}) at cI is -1/2 c^{-3/2} E: the gradient is that times sym(G)
    assert torch.allclose(A.grad, -0.5 * c**-1.5 * _sym(G), rtol=1e-12, atol=0)


def test_eigh_root_is_attached_to_the_graph_only_when_grad_is_needed():
    A = _spd().requires_grad_(True)
    assert matroots.inverse_root(A, 2).root.requires_grad
    with torch.no_grad():
        assert not matroots.inverse_root(A, 2).root.requires_grad


@pytest.mark.parametrize("method", NEWTON)
def test_newton_methods_refuse_input_that_requires_grad(method):
    A = _spd().requires_grad_(True)
    with pytest.raises(InvalidArgumentError, match=r"requires grad.*detach"):
        matroots.inverse_root(A, 2, method=method)
    with torch.no_grad():
        assert matroots.inverse_root(A, 2, method=method).converged
    assert matroots.inverse_root(A.detach(), 2, method=method).converged


def test_eigh_rank_policies_other_than_perturb_refuse_grad():
    A = _spd().requires_grad_(True)
    with pytest.raises(InvalidArgumentError, match="rank_policy='clamp'"):
        matroots.inverse_root(A, 2, rank_policy="clamp", atol=1e-3)


def test_reference_power_helper_agrees_for_forward_roots():
    # the forward-root path of the prescale undo (sign of the exponent) against mpmath
    A = spd_matrix(3, 10.0, seed=2) * 1e-280
    res = matroots.root(torch.from_numpy(A), 3)
    assert rel_err(res.root, ref_power(A, Fraction(1, 3))) < 50 * U64


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_eigh_gradient_through_low_precision_and_prescale(dtype):
    # fp16 input is pre-scaled by 2^k before rounding; the gradient must carry that factor
    A0 = _spd(4, 20.0) * 1e-3
    G = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def grad(**kw):
        M = A0.clone().requires_grad_(True)
        (matroots.inverse_root(M, 2, **kw).root.double() * G).sum().backward()
        return M.grad

    g, g64 = grad(dtype=dtype), grad()
    u = 2.0**-11 if dtype == "fp16" else 2.0**-8
    assert float(torch.linalg.matrix_norm(g - g64) / torch.linalg.matrix_norm(g64)) < 20 * 20 * u


@pytest.mark.parametrize("method", METHODS)
def test_fp16_compute_dtype_with_entries_beyond_fp16_range(method):
    A = _spd(8, 100.0) * 1e6  # entries ~1e6 > 65504: pre-scaled into fp16's range, root rescaled
    res = matroots.inverse_root(A, 2, method=method, compute_dtype="fp16")
    assert res.converged and "prescale" in res.info
    ref = ref_inverse_root(A.numpy(), 2)
    assert rel_err(res.root, ref) < 10 * 8 * (1 + 100 / 2) * 2.0**-11
