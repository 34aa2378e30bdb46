"""torch.optim conformance of :class:`shampoo.Shampoo`, each check run against ``torch.optim.AdamW``.

Modelled on PyTorch's own optimizer tests (test/optim/test_optim.py, OptimizerInfo): hooks, deepcopy and
pickle round trips that continue bitwise, the per-parameter state, named/unnamed state dicts (with the
``_orig_mod.`` prefix of a ``torch.compile``d model), ``maximize``, complex and meta-device parameters,
and the implementation flags. Where Shampoo differs on purpose (typed state, complex refused) the test
pins the documented behaviour and the message.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import shampoo

OPTIMIZERS = ("adamw", "shampoo")


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _make(kind: str, params, **kw) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, **kw)
    # roots from step 2 every 2 steps: the checks cross root computations and warm starts
    return shampoo.Shampoo(params, lr=1e-2, precondition_frequency=2, start_preconditioning_step=2, **kw)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for k in steps:
        x, y = _batch(k)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _assert_bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_state_dict_and_load_hooks_run(kind: str) -> None:
    model = _model()
    opt = _make(kind, model.named_parameters())
    _train(model, opt, range(3))
    calls: list[str] = []

    def post(o, sd):
        calls.append("post")
        sd["extra"] = "from post hook"
        return sd

    def load_pre(o, sd):
        calls.append("load_pre")
        assert sd["extra"] == "from post hook"
        sd = dict(sd)
        del sd["extra"]
        return sd

    opt.register_state_dict_pre_hook(lambda o: calls.append("pre"))
    opt.register_state_dict_post_hook(post)
    opt.register_load_state_dict_pre_hook(load_pre)
    handle = opt.register_load_state_dict_post_hook(lambda o: calls.append("load_post"))
    sd = opt.state_dict()
    assert sd["extra"] == "from post hook"
    opt.load_state_dict(sd)
    assert calls == ["pre", "post", "load_pre", "load_post"]
    handle.remove()
    opt.load_state_dict(opt.state_dict())
    assert calls[-1] == "load_pre"


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_deepcopy_and_pickle_continue_bitwise(kind: str, how: str) -> None:
    model = _model()
    opt = _make(kind, model.named_parameters())
    _train(model, opt, range(3))
    # copy model and optimizer together (one memo): the copy's optimizer holds the copy's parameters
    if how == "deepcopy":
        model2, opt2 = copy.deepcopy((model, opt))
    else:
        model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    assert all(
        p2 is q for p2, q in zip(opt2.param_groups[0]["params"], list(model2.parameters())[:2], strict=False)
    )
    _train(model, opt, range(3, 8))  # crosses the root rounds at steps 4, 6 and 8
    _train(model2, opt2, range(3, 8))
    _assert_bitwise(_params(model), _params(model2))


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_state_per_parameter(kind: str) -> None:
    """AdamW: ``opt.state[p]`` is a dict. Shampoo (documented in :class:`shampoo.Shampoo`): a typed
    ParamState; the flat mapping is ``state_dict()["state"][key]``. In both, ``opt.state`` maps each
    stepped parameter, and only those, to its state."""
    model = _model()
    opt = _make(kind, model.named_parameters())
    params = list(model.parameters())
    assert len(opt.state) == 0
    _train(model, opt, range(2))
    assert len(opt.state) == len(params)
    assert set(map(id, opt.state.keys())) == set(map(id, params))
    flat = opt.state_dict()["state"]
    assert len(flat) == len(params)
    if kind == "adamw":
        st = opt.state[params[0]]
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
        assert set(flat[0]) == set(st)
    else:
        st = opt.state[params[0]]
        assert isinstance(st, shampoo.state.ParamState)
        assert st.step == 2 and st.key == "0.weight"
        entry = flat["0.weight"]
        assert entry["step"] == 2 and tuple(entry["shape"]) == (5, 6)
        tensors = [k for k, v in entry.items() if isinstance(v, torch.Tensor)]
        assert len(tensors) > 0 and len(entry) == len(list(entry.keys()))


def _named(model: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Parameter]]:
    return [(prefix + n, p) for n, p in model.named_parameters()]


@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize(
    "save_as, load_as",
    [("named", "unnamed"), ("unnamed", "named"), ("named", "compiled"), ("compiled", "named")],
)
def test_state_dict_named_unnamed_and_compiled(kind: str, save_as: str, load_as: str) -> None:
    def params(model: torch.nn.Module, how: str):
        if how == "unnamed":
            return model.parameters()
        return _named(model, "_orig_mod." if how == "compiled" else "")  # torch.compile's module prefix

    model = _model()
    opt = _make(kind, params(model, save_as))
    _train(model, opt, range(3))
    sd = copy.deepcopy(opt.state_dict())
    model2 = copy.deepcopy(model)
    opt2 = _make(kind, params(model2, load_as))
    opt2.load_state_dict(sd)
    _train(model, opt, range(3, 7))
    _train(model2, opt2, range(3, 7))
    _assert_bitwise(_params(model), _params(model2))


def test_state_dict_with_different_names_is_refused() -> None:
    model = _model()
    opt = _make("shampoo", model.named_parameters())
    _train(model, opt, range(1))
    sd = opt.state_dict()
    opt2 = _make("shampoo", _named(_model(), "other."))
    with pytest.raises(shampoo.errors.StateDictError, match="parameters differ"):
        opt2.load_state_dict(sd)


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_maximize(kind: str) -> None:
    """maximize=True on f is minimize on -f, bitwise (the gradient's sign is the only difference)."""
    torch.manual_seed(1)
    w0 = torch.randn(4, 3)
    target = torch.randn(4, 3)
    runs = []
    for maximize in (False, True):
        w = torch.nn.Parameter(w0.clone())
        opt = _make(kind, [w], maximize=maximize, weight_decay=0.1)
        for _ in range(5):
            opt.zero_grad()
            loss = ((w - target) ** 2).sum()
            (-loss if maximize else loss).backward()
            opt.step()
        runs.append(w.detach())
    _assert_bitwise([runs[0]], [runs[1]])
    assert not torch.equal(runs[0], w0)


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_complex_parameters(kind: str) -> None:
    """AdamW optimises a complex parameter as its real view; Shampoo refuses it clearly (its
    Kronecker factors are real) rather than dropping the imaginary part."""
    torch.manual_seed(2)
    z = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.complex64))
    if kind == "shampoo":
        with pytest.raises(ValueError, match=r"complex parameters.*imaginary part"):
            _make(kind, [z])
        opt = _make(kind, [torch.nn.Parameter(torch.randn(3))])
        with pytest.raises(ValueError, match="complex parameters"):
            opt.add_param_group({"params": [z]})
        return
    opt = _make(kind, [z])
    z0 = z.detach().clone()
    (z.abs() ** 2).sum().backward()
    opt.step()
    assert not torch.equal(z.detach().imag, z0.imag)


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_meta_device_parameters(kind: str) -> None:
    """Both build on meta parameters (deferred init); AdamW's step produces meta values, Shampoo's
    first step (or state load) raises and says how to materialise the model."""
    w = torch.nn.Parameter(torch.empty(4, 3, device="meta"))
    opt = _make(kind, [w])
    w.grad = torch.empty_like(w)
    if kind == "adamw":
        opt.step()
        assert w.device.type == "meta"
        return
    with pytest.raises(ValueError, match=r"meta device.*materialise"):
        opt.step()


@pytest.mark.parametrize("kind", OPTIMIZERS)
@pytest.mark.parametrize(
    "flag, value, supported_by_shampoo",
    [
        ("foreach", None, True),
        ("foreach", True, True),
        ("foreach", False, False),
        ("differentiable", False, True),
        ("differentiable", True, False),
        ("fused", False, True),
        ("fused", True, False),
        ("capturable", False, True),
        ("capturable", True, False),
    ],
)
def test_implementation_flags(kind: str, flag: str, value, supported_by_shampoo: bool) -> None:
    model = _model()
    if kind == "adamw":  # accepts every flag (fused/capturable/differentiable steps need CUDA or graphs)
        opt = _make(kind, model.parameters(), **{flag: value})
        assert opt.defaults[flag] == value
        if flag == "foreach" or value is False:
            _train(model, opt, range(1))
        return
    if supported_by_shampoo:
        opt = _make(kind, model.parameters(), **{flag: value})
        _train(model, opt, range(2))
        return
    with pytest.raises(ValueError, match=f"{flag}={value!r}"):
        _make(kind, model.parameters(), **{flag: value})
    opt = _make(kind, [torch.nn.Parameter(torch.randn(3))])
    with pytest.raises(ValueError, match=f"{flag}={value!r}"):  # per-group flags are checked too
        opt.add_param_group({"params": list(model.parameters()), flag: value})


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("precondition_frequncy", "precondition_frequency"), ("root_sovler", "root_solver"), ("beta", "betas")],
)
def test_a_mistyped_keyword_is_a_typed_one_line_error_with_the_closest_option(typo: str, meant: str) -> None:
    from matroots.errors import InvalidArgumentError

    with pytest.raises(shampoo.UnknownOptionError) as info:
        shampoo.Shampoo([torch.nn.Parameter(torch.randn(3))], **{typo: 1})
    assert isinstance(info.value, TypeError) and isinstance(info.value, InvalidArgumentError)
    msg = str(info.value)
    assert "\n" not in msg and repr(typo) in msg and f"did you mean {meant!r}?" in msg


def test_hyperparameters_have_one_definition() -> None:
    """The optimizer's keyword arguments are GroupOptions' fields (plus the optimizer-wide and
    implementation options), and its defaults validate through GroupOptions."""
    import dataclasses
    import inspect

    from shampoo.config import GroupOptions
    from shampoo.optim_compat import IMPL_FLAGS

    sig = inspect.signature(shampoo.Shampoo.__init__)
    args = set(sig.parameters) - {"self", "params", "diagnostics", "distributed", "unknown", *IMPL_FLAGS}
    fields = {f.name for f in dataclasses.fields(GroupOptions)}
    assert args == fields
    opt = shampoo.Shampoo([torch.nn.Parameter(torch.randn(3))])
    assert set(opt.defaults) == fields
    with pytest.raises(ValueError, match="maximize must be True or False"):
        shampoo.Shampoo([torch.nn.Parameter(torch.randn(3))], maximize="yes")
