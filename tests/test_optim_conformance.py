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
    # two (5, 5) weights stack in one Shampoo bucket and three (5,) biases in another: a copy must keep
    # each block's state a view of its bucket's stack (plain pickle copies every storage apart)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(6, 5), torch.nn.Linear(5, 5), torch.nn.Linear(5, 5), torch.nn.Linear(5, 3)]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.Tanh())][:-1])
    opt = _make(kind, model.named_parameters())
    _train(model, opt, range(3))
    if kind == "shampoo":
        assert max(len(b) for b in opt._engines[0].buckets) >= 2
    # copy model and optimizer together (one memo): the copy's optimizer holds the copy's parameters
    if how == "deepcopy":
        model2, opt2 = copy.deepcopy((model, opt))
    else:
        model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    assert all(p2 is q for p2, q in zip(opt2.param_groups[0]["params"], model2.parameters(), strict=True))
    _train(model, opt, range(3, 8))  # crosses the root rounds at steps 4, 6 and 8
    _train(model2, opt2, range(3, 8))
    _assert_bitwise(_params(model), _params(model2))
    _assert_same_state(opt2.state_dict(), opt.state_dict())  # the block views, read by state_dict()


def _assert_same_state(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _assert_same_state(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_state(x, y)
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, float) and a != a:  # NaN (diagnostics of a factor without a root yet)
        assert isinstance(b, float) and b != b
    else:
        assert a == b


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
    from matroots.core.errors import InvalidArgumentError

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

    from shampoo.arguments import IMPL_FLAGS
    from shampoo.config import GroupOptions

    sig = inspect.signature(shampoo.Shampoo.__init__)
    optimizer_wide = {"diagnostics", "implementation", "distributed", "root_schedule", "max_root_delay"}
    optimizer_wide |= {"root_threads", "root_timeout"}
    args = set(sig.parameters) - {"self", "params", "unknown", *optimizer_wide, *IMPL_FLAGS}
    fields = {f.name for f in dataclasses.fields(GroupOptions)}
    assert args == fields
    opt = shampoo.Shampoo([torch.nn.Parameter(torch.randn(3))])
    assert set(opt.defaults) == fields
    with pytest.raises(ValueError, match="maximize must be True or False"):
        shampoo.Shampoo([torch.nn.Parameter(torch.randn(3))], maximize="yes")


# -- issue 23, item 6: the rest of torch.optim's state-dict and state behaviour ---------------------


def _equal_entries(a: dict, b: dict) -> bool:
    """Two flat state entries equal, tensors bitwise, NaN bookkeeping equal to NaN."""
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if isinstance(v, torch.Tensor):
            if not torch.equal(v, w):
                return False
        elif v != w and not (v != v and w != w):
            return False
    return True


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_state_dict_keeps_param_names_and_loads_back(kind: str) -> None:
    """torch.optim keeps ``param_names`` in the saved groups of an optimizer built on
    ``named_parameters()``; loading keeps the optimizer's names (Shampoo's state keys)."""
    model = _model()
    opt = _make(kind, model.named_parameters())
    _train(model, opt, range(3))
    sd = copy.deepcopy(opt.state_dict())
    names = [n for n, _ in model.named_parameters()]
    assert sd["param_groups"][0]["param_names"] == names
    model2 = copy.deepcopy(model)
    opt2 = _make(kind, model2.named_parameters())
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["param_names"] == names
    assert opt2.state_dict()["param_groups"][0]["param_names"] == names
    _train(model, opt, range(3, 6))
    _train(model2, opt2, range(3, 6))
    _assert_bitwise(_params(model), _params(model2))


@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_added_param_groups_keep_consistent_keys(kind: str, named: bool) -> None:
    """A group added after steps: every saved group has the same keys, the state keys are the
    parameters' (names, or global positions across groups, as torch's), and it reloads."""
    model = _model()
    ps = list(model.named_parameters()) if named else list(model.parameters())
    opt = _make(kind, ps[:2])
    _train(model, opt, range(2))
    opt.add_param_group({"params": ps[2:], "lr": 5e-3})
    _train(model, opt, range(2, 4))
    sd = opt.state_dict()
    g0, g1 = sd["param_groups"]
    assert g0.keys() == g1.keys() and g1["lr"] == 5e-3
    keys = [n for n, _ in model.named_parameters()] if named else [0, 1, 2, 3]
    assert [*g0["params"], *g1["params"]] == (keys if kind == "shampoo" or not named else [0, 1, 2, 3])
    assert sorted(map(str, sd["state"])) == sorted(map(str, g0["params"] + g1["params"]))
    model2 = copy.deepcopy(model)
    ps2 = list(model2.named_parameters()) if named else list(model2.parameters())
    opt2 = _make(kind, ps2[:2])
    opt2.add_param_group({"params": ps2[2:], "lr": 1.0})
    opt2.load_state_dict(copy.deepcopy(sd))
    assert opt2.param_groups[1]["lr"] == 5e-3
    _train(model, opt, range(4, 7))
    _train(model2, opt2, range(4, 7))
    _assert_bitwise(_params(model), _params(model2))


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_a_repeated_parameter(kind: str) -> None:
    """torch warns about a parameter repeated in a group (and steps it twice, one state); Shampoo
    refuses it with a ValueError that names both positions."""
    p, q = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))
    if kind == "adamw":
        with pytest.warns(UserWarning, match="duplicate parameters"):
            _make(kind, [p, p, q])
        return
    with pytest.raises(ValueError, match="parameter 1 of the group is parameter 0 again"):
        _make(kind, [p, p, q])


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_state_dict_hooks_as_torchs_own_test(kind: str) -> None:
    """PyTorch's test_state_dict_pre_hook / post hook / load hooks: a key a state_dict pre hook puts
    into ``opt.state`` is saved under ``state``; a post hook sees and edits it; a load pre hook's
    returned dict is the one loaded; a load post hook sees the loaded options and may add state."""
    model = _model()
    opt = _make(kind, model.parameters())
    _train(model, opt, range(2))
    opt.register_state_dict_pre_hook(lambda o: o.state.__setitem__("test", 1))

    def post(o, sd):
        sd["ran_state_dict_pre_hook"] = sd["state"].pop("test", None) == 1
        return sd

    def load_pre(o, sd):
        sd = copy.deepcopy(sd)
        sd["param_groups"][0]["lr"] = 0.003
        sd["state"]["user"] = "kept"
        return sd

    def load_post(o):
        o.state["ran_load_post"] = o.param_groups[0]["lr"] == 0.003

    opt.register_state_dict_post_hook(post)
    sd = opt.state_dict()
    assert sd["ran_state_dict_pre_hook"] is True and "test" not in sd["state"]
    opt.register_load_state_dict_pre_hook(load_pre)
    opt.register_load_state_dict_post_hook(load_post)
    opt.load_state_dict(sd)
    assert opt.state["user"] == "kept" and opt.state["ran_load_post"] is True
    assert opt.state_dict()["state"]["user"] == "kept"  # non-parameter state round-trips
    _train(model, opt, range(2, 4))  # and does not disturb the step


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_len_and_iteration_of_per_parameter_state(kind: str) -> None:
    """``len(opt.state[p])``, iteration and ``opt.state[p][name]`` as for AdamW's dict: the
    entries of the parameter's saved state."""
    model = _model()
    opt = _make(kind, model.named_parameters())
    _train(model, opt, range(3))
    flat = opt.state_dict()["state"]
    for (name, p), key in zip(model.named_parameters(), range(4), strict=True):
        st = opt.state[p]
        saved = flat[name if kind == "shampoo" else key]
        assert len(st) == len(saved) > 0 and list(st) == list(saved)
        assert _equal_entries(dict(st.items()), saved)
        assert "step" in st and int(st["step"]) == 3
    assert all(len(v) > 0 for v in opt.state.values())


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_two_state_dicts_of_the_same_state_are_equal(kind: str) -> None:
    """PyTorch's test_state_dict_deterministic: two runs of the same steps save equal state dicts
    (Shampoo's wall-clock root ``seconds`` are diagnostics, not state)."""
    runs = []
    for _ in range(2):
        model = _model()
        opt = _make(kind, model.named_parameters())
        _train(model, opt, range(5))  # crosses the root rounds at steps 2 and 4
        runs.append(opt)
    a, b = (o.state_dict() for o in runs)
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    assert all(_equal_entries(a["state"][k], b["state"][k]) for k in a["state"])
    if kind == "shampoo":
        assert not any(name.endswith("seconds") for entry in a["state"].values() for name in entry)
        assert all(f.seconds > 0 for d in runs[0].diagnostics() for f in d.factors)


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_zero_grad_closure_and_frozen_parameters(kind: str) -> None:
    """zero_grad(set_to_none=False) zeros, zero_grad() drops the gradients; step(closure) returns
    the closure's loss; a parameter with requires_grad=False gets no state and does not move."""
    model = _model()
    params = list(model.parameters())
    params[0].requires_grad_(False)
    w0 = params[0].detach().clone()
    opt = _make(kind, params)
    x, y = _batch(0)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0
    _train(model, opt, range(1, 4))
    assert torch.equal(params[0], w0) and params[0] not in opt.state and len(opt.state) == 3
    assert len(opt.state_dict()["state"]) == 3
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in params[1:])
    opt.zero_grad()
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_load_casts_state_to_the_parameters_dtype(kind: str) -> None:
    """torch.optim casts a loaded floating state to its parameter's dtype: fp64 state into an
    fp32 model loads and trains, the state in fp32."""
    model = _model().double()
    opt = _make(kind, model.parameters())
    for k in range(3):
        x, y = _batch(k)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.double()), y.double()).backward()
        opt.step()
    model32 = _model()
    opt32 = _make(kind, model32.parameters())
    opt32.load_state_dict(opt.state_dict())
    _train(model32, opt32, range(3, 5))
    dtypes = {
        v.dtype
        for entry in opt32.state_dict()["state"].values()
        for name, v in entry.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point() and name != "step"
    }
    assert dtypes == {torch.float32}
