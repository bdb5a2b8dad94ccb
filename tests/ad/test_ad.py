"""Filtered differentiation: filter_grad, filter_value_and_grad, filter_vjp,
filter_jvp, filter_jacfwd, filter_jacrev, filter_hessian."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import filterax as fx


def flops(fun: Any, *args: Any) -> float:
    compiled = jax.jit(fun).lower(*args).compile()
    return float(compiled.cost_analysis().get("flops", 0.0))


def assert_trees_close(actual: Any, expected: Any, **tolerances: float) -> None:
    assert jtu.tree_structure(actual) == jtu.tree_structure(expected)
    for a, e in zip(jtu.tree_leaves(actual), jtu.tree_leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), **tolerances)


class Pair(fx.Module):
    first: Any
    second: Any


class Labelled(fx.Module):
    value: Any
    label: str = fx.field(static=True)


# ---------------------------------------------------------------------------
# Random nested pytrees (dicts, lists, tuples, Modules, NonDifferentiable) of
# tiny float arrays, integer and key arrays, and Python objects.

_FLOATS = st.floats(-2.0, 2.0, allow_nan=False, width=32)
_FLOAT_LEAVES = st.one_of(
    _FLOATS.map(lambda v: jnp.asarray(v, jnp.float32)),
    st.lists(_FLOATS, min_size=2, max_size=2).map(
        lambda v: jnp.asarray(v, jnp.float32)
    ),
)
_OTHER_LEAVES = st.sampled_from(
    [jnp.arange(2), jnp.array(True), jax.random.key(1), "relu", 3, 0.5, None]
)
_LEAVES = st.one_of(_FLOAT_LEAVES, _FLOAT_LEAVES, _OTHER_LEAVES)


def _nodes(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abc"), children, max_size=3),
        st.tuples(children, children).map(lambda c: Pair(*c)),
        children.map(lambda c: Labelled(c, "layer")),
        children.map(fx.NonDifferentiable),
    )


TREES = st.recursive(_LEAVES, _nodes, max_leaves=8)


def _loss(tree: Any) -> jax.Array:
    """A scalar using every leaf: a different weight per float leaf, so every
    gradient is distinct; integer leaves contribute constants."""
    total = jnp.zeros(())
    for index, leaf in enumerate(jtu.tree_leaves(tree)):
        if fx.is_inexact_array(leaf):
            total = total + (index + 1) * jnp.sin(leaf).sum()
        elif fx.is_array(leaf) and not fx.is_key_array(leaf):
            total = total + leaf.sum()
    return total


def _reference_grad(tree: Any) -> Any:
    """`jax.grad` over the list of differentiable arrays, substituted back by
    position: independent of filterax's partitioning."""
    leaves, treedef = jtu.tree_flatten(tree, is_leaf=fx.is_non_differentiable)
    positions = [i for i, leaf in enumerate(leaves) if fx.is_inexact_array(leaf)]

    def of_arrays(arrays: list) -> jax.Array:
        new = list(leaves)
        for i, array in zip(positions, arrays):
            new[i] = array
        return _loss(jtu.tree_unflatten(treedef, new))

    grads = jax.grad(of_arrays)([leaves[i] for i in positions])
    expected: list[Any] = [None] * len(leaves)
    for i, grad in zip(positions, grads):
        expected[i] = grad
    return jtu.tree_unflatten(treedef, expected)


# Random trees may hold no differentiable leaf: that warning is not what is tested.
@pytest.mark.filterwarnings("ignore::filterax.NoDifferentiableLeafWarning")
@settings(max_examples=25, deadline=None)
@given(TREES)
def test_grad_matches_jax_grad_on_partitioned_arrays(tree):
    assert_trees_close(fx.filter_grad(_loss)(tree), _reference_grad(tree), rtol=1e-6)


# Random trees may hold no differentiable leaf: that warning is not what is tested.
@pytest.mark.filterwarnings("ignore::filterax.NoDifferentiableLeafWarning")
@settings(max_examples=25, deadline=None)
@given(TREES, st.integers(0, 2**31 - 1))
def test_grad_matches_finite_differences(tree, seed):
    grad = fx.filter_grad(_loss)(tree)
    diff, rest = fx.partition(
        tree, fx.is_inexact_array, is_leaf=fx.is_non_differentiable
    )
    direction = jtu.tree_map(
        lambda x: jax.random.normal(jax.random.key(seed), x.shape), diff
    )
    eps = 1e-2

    def shifted(sign: float) -> float:
        moved = jtu.tree_map(lambda x, d: x + sign * eps * d, diff, direction)
        return float(_loss(fx.combine(moved, rest)))

    finite_difference = (shifted(1.0) - shifted(-1.0)) / (2 * eps)
    directional = sum(
        float((g * d).sum())
        for g, d in zip(jtu.tree_leaves(grad), jtu.tree_leaves(direction))
    )
    assert directional == pytest.approx(finite_difference, rel=1e-2, abs=1e-2)


# Random trees may hold no differentiable leaf: that warning is not what is tested.
@pytest.mark.filterwarnings("ignore::filterax.NoDifferentiableLeafWarning")
@settings(max_examples=25, deadline=None)
@given(TREES)
def test_vjp_matches_grad_on_random_trees(tree):
    out, vjp_fn = fx.filter_vjp(_loss, tree)
    (grad,) = vjp_fn(jnp.ones(()))
    assert_trees_close(grad, _reference_grad(tree), rtol=1e-6)


# ---------------------------------------------------------------------------
# filter_grad / filter_value_and_grad


def _params() -> dict:
    return {
        "w": jnp.array([1.0, 2.0]),
        "steps": jnp.array(3),
        "mask": jnp.array([True, False]),
        "key": jax.random.key(0),
        "act": "tanh",
        "frozen": fx.NonDifferentiable(jnp.array([5.0, 6.0])),
    }


def _params_loss(params: dict, scale: Any = 1.0) -> jax.Array:
    frozen = params["frozen"].value
    return scale * (params["w"] ** 2 * frozen).sum() + params["steps"]


def test_grad_has_none_at_every_non_differentiable_leaf():
    grad = fx.filter_grad(_params_loss)(_params())
    assert grad["steps"] is None and grad["mask"] is None and grad["key"] is None
    assert grad["act"] is None and grad["frozen"] is None
    assert jnp.allclose(grad["w"], jnp.array([10.0, 24.0]))


def test_grad_decorator_forms_agree():
    plain = fx.filter_grad(_params_loss)
    decorated = fx.filter_grad()(_params_loss)
    with_aux = fx.filter_grad(has_aux=True)(lambda p: (_params_loss(p), "aux"))
    expected = plain(_params())["w"]
    assert jnp.array_equal(decorated(_params())["w"], expected)
    grad, aux = with_aux(_params())
    assert jnp.array_equal(grad["w"], expected) and aux == "aux"


def test_grad_other_arguments_are_not_differentiated():
    grad = fx.filter_grad(_params_loss)(_params(), jnp.array(2.0))
    assert jtu.tree_structure(grad) == jtu.tree_structure(
        fx.filter_grad(_params_loss)(_params())
    )
    assert jnp.allclose(grad["w"], jnp.array([20.0, 48.0]))


def test_grad_aux_may_hold_arrays_and_python_objects():
    def loss(x):
        return (x**2).sum(), {"pred": x * 2, "name": "sq", "n": 3}

    grad, aux = fx.filter_grad(loss, has_aux=True)(jnp.ones(2))
    assert jnp.array_equal(grad, 2 * jnp.ones(2))
    assert aux["name"] == "sq" and aux["n"] == 3
    assert jnp.array_equal(aux["pred"], 2 * jnp.ones(2))


def test_value_and_grad_returns_both():
    value, grad = fx.filter_value_and_grad(_params_loss)(_params())
    assert value == pytest.approx(float(_params_loss(_params())))
    assert jnp.allclose(grad["w"], jnp.array([10.0, 24.0]))
    (value, aux), grad = fx.filter_value_and_grad(has_aux=True)(
        lambda p: (_params_loss(p), p["act"])
    )(_params())
    assert aux == "tanh"


def test_grad_of_module_method_differentiates_the_instance():
    class Model(fx.Module):
        w: jax.Array
        label: str = fx.field(static=True)

        @fx.filter_grad
        def grad(self, x):
            return (self.w * x).sum()

    model = Model(jnp.array([1.0, 2.0]), "m")
    grad = model.grad(jnp.array([3.0, 4.0]))
    assert isinstance(grad, Model) and grad.label == "m"
    assert jnp.array_equal(grad.w, jnp.array([3.0, 4.0]))


def test_grad_wrapper_is_a_pytree_whose_child_is_the_function():
    scale = jnp.array(3.0)
    wrapped = fx.filter_grad(fx.Partial(lambda s, x: s * x**2, scale))
    assert any(leaf is scale for leaf in jax.tree.leaves(wrapped))
    rebuilt = jtu.tree_unflatten(*reversed(jtu.tree_flatten(wrapped)))
    assert jnp.array_equal(rebuilt(jnp.array(2.0)), jnp.array(12.0))


@pytest.mark.parametrize(
    ("output", "fragment"),
    [
        (lambda x: x, "shape (3,) and dtype float32"),
        (lambda x: x.sum().astype(jnp.int32), "shape () and dtype int32"),
        (lambda x: x.sum() * 1j, "dtype complex64"),
        (lambda x: "loss", "str"),
        (lambda x: (x.sum(), 1), "pass has_aux=True"),
    ],
)
def test_grad_rejects_non_real_scalar_outputs(output, fragment):
    with pytest.raises(TypeError, match="real floating-point scalar") as info:
        fx.filter_grad(output)(jnp.ones(3))
    assert fragment in str(info.value)


def test_grad_with_has_aux_requires_a_pair():
    with pytest.raises(TypeError, match=r"has_aux=True.*pair"):
        fx.filter_grad(lambda x: x.sum(), has_aux=True)(jnp.ones(3))


def test_grad_rejects_first_argument_by_keyword():
    with pytest.raises(TypeError, match=r"first argument passed positionally.*\(x\)"):
        fx.filter_grad(lambda x: x.sum())(x=jnp.ones(2))


def test_grad_rejects_missing_first_argument():
    with pytest.raises(TypeError, match="called with no arguments"):
        fx.filter_value_and_grad(lambda: 0.0)()


# ---------------------------------------------------------------------------
# filter_vjp


def _named_losses(params: dict, data: jax.Array) -> dict:
    return {
        "alpha": (jnp.sin(params["w"] * data)).sum(),
        "beta": (params["w"] ** 2).sum() * params["b"],
        "count": params["n"] + 1,
        "key": params["key"],
        "tag": "losses",
        "frozen": fx.NonDifferentiable(params["w"] * 2),
    }


def _vjp_params() -> dict:
    return {
        "w": jnp.array([0.5, -1.0]),
        "b": jnp.array(2.0, jnp.float32),
        "n": jnp.array(1),
        "key": jax.random.key(0),
    }


def _cotangent(**given: Any) -> dict:
    ct: dict = {
        "alpha": None,
        "beta": None,
        "count": None,
        "key": None,
        "tag": None,
        "frozen": None,
    }
    ct.update(given)
    return ct


def test_vjp_returns_output_unchanged():
    out, _ = fx.filter_vjp(_named_losses, _vjp_params(), jnp.ones(2))
    assert out["tag"] == "losses" and out["count"] == 2
    assert fx.is_key_array(out["key"])
    assert isinstance(out["frozen"], fx.NonDifferentiable)


def test_vjp_returns_one_cotangent_per_primal():
    _, vjp_fn = fx.filter_vjp(_named_losses, _vjp_params(), jnp.ones(2))
    grads = vjp_fn(_cotangent(alpha=jnp.ones(())))
    assert isinstance(grads, tuple) and len(grads) == 2
    params_grad, data_grad = grads
    assert params_grad["n"] is None and params_grad["key"] is None
    assert data_grad.shape == (2,)


def test_vjp_matches_jax_vjp_on_the_live_outputs():
    params, data = _vjp_params(), jnp.array([0.3, 0.7])
    _, vjp_fn = fx.filter_vjp(_named_losses, params, data)
    (params_grad, data_grad) = vjp_fn(_cotangent(alpha=jnp.array(2.0, jnp.float32)))

    def alpha(w, b, data):
        return _named_losses({**params, "w": w, "b": b}, data)["alpha"]

    _, reference = jax.vjp(alpha, params["w"], params["b"], data)
    expected_w, expected_b, expected_data = reference(jnp.array(2.0, jnp.float32))
    assert jnp.allclose(params_grad["w"], expected_w)
    assert jnp.allclose(params_grad["b"], expected_b)
    assert jnp.allclose(data_grad, expected_data)


@pytest.mark.parametrize(
    "dead",
    [None, fx.SymbolicZero((), jnp.float32)],
    ids=["none", "symbolic-zero"],
)
def test_vjp_dead_outputs_contribute_nothing(dead):
    params, data = _vjp_params(), jnp.ones(2)
    _, vjp_fn = fx.filter_vjp(_named_losses, params, data)
    only_alpha = vjp_fn(_cotangent(alpha=jnp.ones(()), beta=dead))
    materialised = vjp_fn(_cotangent(alpha=jnp.ones(()), beta=jnp.zeros(())))
    assert_trees_close(only_alpha, materialised)


def test_vjp_none_cotangent_gives_zeros():
    _, vjp_fn = fx.filter_vjp(_named_losses, _vjp_params(), jnp.ones(2))
    params_grad, data_grad = vjp_fn(None)
    assert jnp.array_equal(params_grad["w"], jnp.zeros(2))
    assert jnp.array_equal(data_grad, jnp.zeros(2))


def test_vjp_cotangent_may_be_a_prefix_with_none_subtrees():
    def f(x):
        return {"head": {"a": x * 2, "b": x * 3}, "tail": [x, x]}

    _, vjp_fn = fx.filter_vjp(f, jnp.ones(2))
    (grad,) = vjp_fn({"head": {"a": jnp.ones(2), "b": None}, "tail": None})
    assert jnp.array_equal(grad, 2 * jnp.ones(2))
    (grad,) = vjp_fn({"head": fx.SymbolicZero((2,), jnp.float32), "tail": None})
    assert jnp.array_equal(grad, jnp.zeros(2))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("count", jnp.array(1.0, jnp.float32)),
        ("key", jnp.ones(())),
        ("tag", jnp.ones(())),
        ("frozen", fx.NonDifferentiable(jnp.ones(2))),
    ],
)
def test_vjp_non_differentiable_outputs_only_accept_none(name, value):
    _, vjp_fn = fx.filter_vjp(_named_losses, _vjp_params(), jnp.ones(2))
    with pytest.raises(ValueError, match="must be None, a SymbolicZero") as info:
        vjp_fn(_cotangent(**{name: value}))
    assert f"out['{name}']" in str(info.value)


def test_vjp_bool_output_only_accepts_none():
    _, vjp_fn = fx.filter_vjp(lambda x: {"ok": x > 0, "y": x}, jnp.ones(2))
    with pytest.raises(ValueError, match=r"out\['ok'\].*non-differentiable"):
        vjp_fn({"ok": jnp.ones(2, bool), "y": None})
    (grad,) = vjp_fn({"ok": fx.SymbolicZero((2,), jnp.bool_), "y": jnp.ones(2)})
    assert jnp.array_equal(grad, jnp.ones(2))


def test_vjp_wrong_shape_names_path_and_expected_shape():
    _, vjp_fn = fx.filter_vjp(_named_losses, _vjp_params(), jnp.ones(2))
    with pytest.raises(ValueError) as info:
        vjp_fn(_cotangent(alpha=jnp.ones(3)))
    message = str(info.value)
    assert "out['alpha']" in message and "shape (3,)" in message
    assert "expected shape () and dtype float32" in message


def test_vjp_wrong_dtype_names_path_and_expected_dtype():
    _, vjp_fn = fx.filter_vjp(_named_losses, _vjp_params(), jnp.ones(2))
    with pytest.raises(ValueError, match=r"out\['beta'\].*float16.*dtype float32"):
        vjp_fn(_cotangent(beta=jnp.ones((), jnp.float16)))


def test_numpy_float64_perturbations_count_as_float32_without_x64():
    # As `jax.vjp` and `jax.jvp` take them: NumPy's default float64 is
    # float32 once canonicalised, for cotangents, tangents and primals.
    x = jnp.array([1.0, 3.0])
    _, vjp_fn = fx.filter_vjp(lambda x: x * 2, x)
    (cotangent,) = vjp_fn(np.ones(2))
    assert cotangent.dtype == jnp.float32
    np.testing.assert_array_equal(cotangent, np.full(2, 2.0))
    for primal, tangent in [(x, np.ones(2)), (np.ones(2), jnp.ones(2))]:
        _, t_out = fx.filter_jvp(lambda x: x * 2, (primal,), (tangent,))
        assert t_out.dtype == jnp.float32
        np.testing.assert_array_equal(t_out, np.full(2, 2.0))
    _, t_out = fx.filter_jvp(lambda x: x * 2, (np.ones(2),), (np.ones(2),))
    np.testing.assert_array_equal(t_out, np.full(2, 2.0))


def test_vjp_wrong_symbolic_zero_names_path():
    _, vjp_fn = fx.filter_vjp(_named_losses, _vjp_params(), jnp.ones(2))
    with pytest.raises(ValueError, match=r"out\['alpha'\].*expected SymbolicZero"):
        vjp_fn(_cotangent(alpha=fx.SymbolicZero((2,), jnp.float32)))


def test_vjp_wrong_structure_names_path():
    _, vjp_fn = fx.filter_vjp(_named_losses, _vjp_params(), jnp.ones(2))
    with pytest.raises(
        ValueError,
        match=r"out\['alpha'\] has a list of length 1 where the output has f32\[\]",
    ):
        vjp_fn(_cotangent(alpha=[jnp.ones(())]))
    with pytest.raises(ValueError, match="Missing keys: 'beta'"):
        vjp_fn({"alpha": jnp.ones(()), "count": None})


def test_vjp_wrong_structure_inside_a_module_names_path():
    def f(x):
        return Pair(x, [x, x * 2])

    _, vjp_fn = fx.filter_vjp(f, jnp.ones(2))
    with pytest.raises(ValueError, match=r"out\.second") as info:
        vjp_fn(Pair(None, [jnp.ones(2)]))
    assert "a list of length 1 where the output has a list of length 2" in str(
        info.value
    )
    (grad,) = vjp_fn(Pair(None, [None, jnp.ones(2)]))
    assert jnp.array_equal(grad, 2 * jnp.ones(2))


def test_vjp_has_aux():
    def f(x):
        return x * 2, {"note": "aux", "x": x}

    out, vjp_fn, aux = fx.filter_vjp(f, jnp.ones(2), has_aux=True)
    assert aux["note"] == "aux" and jnp.array_equal(aux["x"], jnp.ones(2))
    (grad,) = vjp_fn(jnp.ones(2))
    assert jnp.array_equal(grad, 2 * jnp.ones(2))


def test_vjp_differentiates_all_primals_with_module_structure():
    model = Labelled(Pair(jnp.array([1.0, 2.0]), jnp.arange(2)), "net")
    _, vjp_fn = fx.filter_vjp(lambda m, x: (m.value.first * x).sum(), model, 3.0)
    model_grad, x_grad = vjp_fn(jnp.ones(()))
    assert isinstance(model_grad, Labelled) and model_grad.label == "net"
    assert model_grad.value.second is None
    assert jnp.array_equal(model_grad.value.first, 3 * jnp.ones(2))
    assert x_grad is None  # a Python float is not a differentiable leaf


def test_vjp_fn_is_a_pytree_that_crosses_jit_boundaries():
    def forward(params, data):
        def losses(p, d):
            return {"alpha": jnp.sin(p["w"] * d).sum(), "beta": p["b"] * 2, "tag": "t"}

        return fx.filter_vjp(losses, params, data)

    params, data = {"w": jnp.ones(2), "b": jnp.ones(()), "act": "sin"}, jnp.ones(2)
    out, vjp_fn = fx.filter_jit(forward)(params, data)
    assert out["tag"] == "t" and len(jax.tree.leaves(vjp_fn)) > 0
    cotangent = {"alpha": jnp.ones(()), "beta": None, "tag": None}
    grads = fx.filter_jit(lambda f, ct: f(ct))(vjp_fn, cotangent)
    assert grads[0]["act"] is None
    expected = fx.filter_vjp(lambda p: jnp.sin(p["w"] * data).sum(), params)[1](
        jnp.ones(())
    )[0]
    assert_trees_close(grads[0], expected, rtol=1e-6)


def test_vjp_inside_scan_under_jit():
    def step(params, x):
        def losses(p):
            return {"fit": ((p["w"] * x - 1.0) ** 2).sum(), "reg": (p["w"] ** 2).sum()}

        out, vjp_fn = fx.filter_vjp(losses, params)
        (grad,) = vjp_fn({"fit": jnp.ones(()), "reg": None})
        return jtu.tree_map(lambda p, g: p - 0.1 * g, params, grad), out["fit"]

    @fx.filter_jit
    def train(params, xs):
        return jax.lax.scan(step, params, xs)

    params, fits = train({"w": jnp.zeros(2)}, jnp.ones((20, 2)))
    assert fits[-1] < fits[0]
    assert jnp.allclose(params["w"], 1 - 0.8**20)  # w <- w - 0.2 (w - 1)


def test_vjp_skipped_outputs_cost_no_backward_flops():
    def both(x):
        return {
            "live": (jnp.sin(x @ x) @ x).sum(),
            "dead": (jnp.tanh(x @ x.T) @ x @ x).sum(),
        }

    def live_only(x):
        return {"live": both(x)["live"]}

    one = jnp.ones(())
    x = jnp.ones((32, 32))
    partial = flops(lambda x: fx.filter_vjp(both, x)[1]({"live": one, "dead": None}), x)
    restricted = flops(lambda x: fx.filter_vjp(live_only, x)[1]({"live": one}), x)
    materialised = flops(
        lambda x: fx.filter_vjp(both, x)[1]({"live": one, "dead": jnp.zeros(())}), x
    )
    assert restricted > 0
    assert partial == pytest.approx(restricted, rel=0.01)
    assert materialised > 1.5 * restricted


# ---------------------------------------------------------------------------
# filter_jvp


def _jvp_fun(params: dict) -> dict:
    return {
        "y": jnp.sin(params["w"]) * params["b"],
        "n": params["n"] * 2,
        "tag": params["tag"],
        "frozen": fx.NonDifferentiable(params["w"]),
    }


def _jvp_params() -> dict:
    return {
        "w": jnp.array([0.1, 0.2]),
        "b": jnp.array(3.0, jnp.float32),
        "n": jnp.array(2),
        "tag": "t",
        "key": jax.random.key(0),
    }


def test_jvp_matches_jax_jvp():
    params = _jvp_params()
    tangent = {"w": jnp.array([1.0, -1.0]), "b": jnp.array(0.5, jnp.float32)}
    out, t_out = fx.filter_jvp(
        _jvp_fun, (params,), ({**tangent, "n": None, "tag": None, "key": None},)
    )

    def y(w, b):
        return jnp.sin(w) * b

    _, expected = jax.jvp(y, (params["w"], params["b"]), (tangent["w"], tangent["b"]))
    assert jnp.allclose(t_out["y"], expected)
    assert out["tag"] == "t" and out["n"] == 4


def test_jvp_non_differentiable_outputs_have_none_tangent():
    _, t_out = fx.filter_jvp(_jvp_fun, (_jvp_params(),), (None,))
    assert t_out["n"] is None and t_out["tag"] is None and t_out["frozen"] is None
    assert t_out["y"] is None  # no tangent reaches it: symbolically zero, as Equinox


def test_jvp_accepts_symbolic_zeros_anywhere():
    params = _jvp_params()
    tangents = fx.zero_cotangent(params)
    tangents["w"] = jnp.ones(2)
    _, t_out = fx.filter_jvp(_jvp_fun, (params,), (tangents,))
    assert jnp.allclose(t_out["y"], jnp.cos(params["w"]) * 3.0)


def test_jvp_tangent_for_non_differentiable_leaf_names_path():
    with pytest.raises(ValueError) as info:
        fx.filter_jvp(_jvp_fun, (_jvp_params(),), ({"n": jnp.ones(())},))
    assert "Missing keys" in str(info.value)
    tangents = {"w": None, "b": None, "n": jnp.ones(()), "tag": None, "key": None}
    with pytest.raises(ValueError, match="must be None, a SymbolicZero") as info:
        fx.filter_jvp(_jvp_fun, (_jvp_params(),), (tangents,))
    assert "tangents[0]['n']" in str(info.value)


def test_jvp_and_vjp_take_jax_float0_zeros_at_integer_leaves():
    # What `jax.jvp` and `jax.vjp` themselves take there: code ported from
    # them keeps working.
    def f(pair):
        return jnp.sum(pair[0] ** 2) + jnp.sum(pair[1]), pair[1]

    primal = (jnp.arange(3.0), jnp.array([1, 2], jnp.int32))
    zero = np.zeros((2,), jax.dtypes.float0)
    out, t_out = fx.filter_jvp(f, (primal,), ((jnp.ones(3), zero),))
    assert float(t_out[0]) == float(jax.jvp(f, (primal,), ((jnp.ones(3), zero),))[1][0])
    _, vjp_fn = fx.filter_vjp(f, primal)
    (grads,) = vjp_fn((jnp.ones(()), zero))
    assert jnp.array_equal(grads[0], 2 * primal[0]) and grads[1] is None
    with pytest.raises(
        ValueError, match=r"tangents\[0\]\[1\].*float0 zero of its shape"
    ):
        fx.filter_jvp(f, (primal,), ((None, np.zeros((3,), jax.dtypes.float0)),))


def test_jvp_python_scalar_tangent_stays_weakly_typed():
    _, t_out = fx.filter_jvp(lambda a: a * 2, (1.5,), (1.0,))
    _, expected = jax.jvp(lambda a: a * 2, (1.5,), (1.0,))
    assert t_out.weak_type and expected.weak_type
    assert (jnp.float16(1) * t_out).dtype == jnp.float16


def test_jvp_tangent_for_non_differentiable_wrapper_names_path():
    params = {"w": fx.NonDifferentiable(jnp.ones(2))}
    tangents = ({"w": fx.NonDifferentiable(jnp.ones(2))},)
    with pytest.raises(ValueError, match=r"tangents\[0\]\['w'\]\.value"):
        fx.filter_jvp(lambda p: p["w"].value, (params,), tangents)
    _, t_out = fx.filter_jvp(lambda p: p["w"].value * 2, (params,), ({"w": None},))
    assert t_out is None  # symbolically zero: nothing perturbed reaches it


def test_jvp_wrong_tangent_shape_names_path():
    with pytest.raises(ValueError, match=r"tangents\[1\].*expected shape \(2,\)"):
        fx.filter_jvp(
            lambda x, y: x * y, (jnp.ones(2), jnp.ones(2)), (None, jnp.ones(3))
        )


def test_jvp_requires_sequences_of_equal_length():
    with pytest.raises(TypeError, match="tuples"):
        fx.filter_jvp(jnp.sin, jnp.ones(2), jnp.ones(2))
    with pytest.raises(TypeError, match="2 primals but 1 tangents"):
        fx.filter_jvp(jnp.add, (jnp.ones(2), jnp.ones(2)), (None,))


def test_jvp_has_aux():
    out, t_out, aux = fx.filter_jvp(
        lambda x: (x**2, {"note": "n", "x": x}),
        (jnp.ones(2),),
        (jnp.ones(2),),
        has_aux=True,
    )
    assert aux["note"] == "n" and jnp.array_equal(t_out, 2 * jnp.ones(2))


def test_jvp_unperturbed_inputs_cost_no_tangent_flops():
    def f(x, y):
        return jnp.sin(x @ x) @ x + jnp.tanh(y @ y.T) @ y @ y

    x = jnp.ones((32, 32))
    partial = flops(lambda x, y: fx.filter_jvp(f, (x, y), (x, None))[1], x, x)
    closed = flops(lambda x, y: fx.filter_jvp(lambda x: f(x, y), (x,), (x,))[1], x, x)
    assert partial == pytest.approx(closed, rel=0.01)


# ---------------------------------------------------------------------------
# Jacobians and Hessians


@pytest.mark.parametrize("jac", [fx.filter_jacfwd, fx.filter_jacrev])
def test_jacobian_matches_jax_and_has_none_elsewhere(jac):
    def f(p):
        return {"y": jnp.sin(p["w"]) * p["n"], "n": p["n"], "tag": "t"}

    params = {"w": jnp.array([0.1, 0.2, 0.3]), "n": jnp.array(2), "tag": "t"}
    result = jac(f)(params)
    expected = jax.jacfwd(lambda w: jnp.sin(w) * 2)(params["w"])
    assert result["n"] is None and result["tag"] is None
    assert result["y"]["n"] is None and result["y"]["tag"] is None
    assert jnp.allclose(result["y"]["w"], expected)


@pytest.mark.parametrize("jac", [fx.filter_jacfwd, fx.filter_jacrev])
def test_jacobian_has_aux(jac):
    result, aux = jac(lambda x: (x * 2, "aux"), has_aux=True)(jnp.ones(2))
    assert aux == "aux" and jnp.array_equal(result, 2 * jnp.eye(2))


@pytest.mark.parametrize("jac", [fx.filter_jacfwd, fx.filter_jacrev])
def test_jacobian_without_differentiable_inputs_or_outputs(jac):
    assert jac(lambda p: jnp.ones(2) * p["n"])({"n": 2, "w": None}) == {
        "n": None,
        "w": None,
    }
    assert jac(lambda x: {"count": 3})(jnp.ones(2)) == {"count": None}


@pytest.mark.parametrize("jac", [fx.filter_jacfwd, fx.filter_jacrev])
def test_jacobian_of_a_python_float_output_is_zeros(jac):
    # As `jax.jacfwd` gives (and Equinox): a constant, not a missing block.
    result = jac(lambda x: (2.0, x * 3))(jnp.ones(2))
    assert jnp.array_equal(result[0], jnp.zeros(2))
    assert jnp.array_equal(result[1], 3 * jnp.eye(2))
    assert jnp.array_equal(
        fx.filter_hessian(lambda x: 2.0)(jnp.ones(2)), jnp.zeros((2, 2))
    )


def test_hessian_matches_jax_hessian():
    def loss(p):
        return (p["w"] ** 3).sum() * p["b"] + p["n"]

    params = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(2.0, jnp.float32), "n": 1}
    result = fx.filter_hessian(loss)(params)
    expected = jax.hessian(lambda w, b: loss({"w": w, "b": b, "n": 1}), (0, 1))(
        params["w"], params["b"]
    )
    assert result["n"] is None and result["w"]["n"] is None
    assert jnp.allclose(result["w"]["w"], expected[0][0])
    assert jnp.allclose(result["w"]["b"], expected[0][1])
    assert jnp.allclose(result["b"]["w"], expected[1][0])


def test_hessian_has_aux():
    hessian, aux = fx.filter_hessian(lambda x: ((x**2).sum(), "aux"), has_aux=True)(
        jnp.ones(2)
    )
    assert aux == "aux" and jnp.array_equal(hessian, 2 * jnp.eye(2))


# ---------------------------------------------------------------------------
# Nesting


def test_grad_of_vjp():
    def pulled_back(x):
        _, vjp_fn = fx.filter_vjp(lambda x: {"a": jnp.sin(x), "b": x**2}, x)
        (grad,) = vjp_fn({"a": jnp.ones(2), "b": None})
        return grad.sum()

    x = jnp.array([0.1, 0.2])
    expected = jax.grad(lambda x: jax.vjp(jnp.sin, x)[1](jnp.ones(2))[0].sum())(x)
    assert jnp.allclose(fx.filter_grad(pulled_back)(x), expected)


def test_jvp_of_grad_is_hessian_vector_product():
    def loss(p):
        return (jnp.sin(p["w"]) * p["w"]).sum() + p["n"]

    params = {"w": jnp.array([0.3, 0.4]), "n": jnp.array(1)}
    v = {"w": jnp.array([1.0, 2.0]), "n": None}
    _, hvp = fx.filter_jvp(fx.filter_grad(loss), (params,), (v,))
    hessian = fx.filter_hessian(loss)(params)
    assert hvp["n"] is None
    assert jnp.allclose(hvp["w"], hessian["w"]["w"] @ v["w"])


def test_vmap_of_grad_gives_per_example_gradients():
    def loss(params, x):
        return jnp.sin(params["w"] * x).sum()

    params = {"w": jnp.array([0.5, 1.5]), "n": jnp.array(3)}
    xs = jnp.arange(6.0).reshape(3, 2)
    batched = jax.vmap(fx.filter_grad(loss), in_axes=(None, 0))(params, xs)
    for i in range(3):
        single = fx.filter_grad(loss)(params, xs[i])
        assert jnp.allclose(batched["w"][i], single["w"])
    assert batched["n"] is None


def test_grad_inside_jit():
    params = {
        "w": jnp.array([1.0, 2.0]),
        "n": jnp.array(3),
        "key": jax.random.key(0),
        "act": "square",
    }
    grad = fx.filter_jit(fx.filter_grad(lambda p: (p["w"] ** 2).sum() * p["n"]))(params)
    assert grad["n"] is None and grad["key"] is None and grad["act"] is None
    assert jnp.array_equal(grad["w"], jnp.array([6.0, 12.0]))


def test_grad_inside_scan():
    def step(w, x):
        grad = fx.filter_grad(lambda p: ((p["w"] - x) ** 2).sum())({"w": w, "n": 1})
        return w - 0.25 * grad["w"], None

    w, _ = jax.lax.scan(step, jnp.zeros(2), jnp.ones((30, 2)))
    assert jnp.allclose(w, jnp.ones(2), atol=1e-3)


# ---------------------------------------------------------------------------
# NonDifferentiable and key arrays are never differentiated


def test_non_differentiable_inputs_get_none_from_every_transform():
    params = {"w": jnp.ones(2), "frozen": fx.NonDifferentiable(jnp.ones(2))}

    def loss(p):
        return (p["w"] * p["frozen"].value).sum()

    assert fx.filter_grad(loss)(params)["frozen"] is None
    assert fx.filter_vjp(loss, params)[1](jnp.ones(()))[0]["frozen"] is None
    assert fx.filter_jacfwd(loss)(params)["frozen"] is None
    assert fx.filter_jacrev(loss)(params)["frozen"] is None
    assert fx.filter_hessian(loss)(params)["w"]["frozen"] is None


def test_non_differentiable_contents_are_constant_even_when_read_raw():
    # `_value` skips the stop_gradient of `.value`: the transform itself must
    # hold the contents constant.
    params = {"w": jnp.ones(2), "frozen": fx.NonDifferentiable(jnp.full(2, 3.0))}
    grad = fx.filter_grad(lambda p: (p["w"] * p["frozen"]._value ** 2).sum())(params)
    assert jnp.array_equal(grad["w"], jnp.full(2, 9.0))
    assert grad["frozen"] is None


def test_key_arrays_pass_through_every_transform():
    def f(p):
        noise = jax.random.normal(p["key"], (2,))
        return (p["w"] * noise).sum()

    params = {"w": jnp.ones(2), "key": jax.random.key(0)}
    assert fx.filter_grad(f)(params)["key"] is None
    _, vjp_fn = fx.filter_vjp(lambda p: {"y": f(p), "key": p["key"]}, params)
    assert vjp_fn({"y": jnp.ones(()), "key": None})[0]["key"] is None
    _, t_out = fx.filter_jvp(lambda p: p, (params,), (None,))
    assert t_out["key"] is None


# --- Refs under differentiation ---------------------------------------------------------


class RunningMean(fx.Module):
    weight: jax.Array
    mean: Any  # a jax.Ref: state, never differentiated

    def __call__(self, x):
        self.mean[...] = 0.9 * self.mean[...] + 0.1 * x  # a differentiated value
        return (self.weight * x).sum()


def _running_mean() -> RunningMean:
    return RunningMean(jnp.full(2, 2.0), jax.new_ref(jnp.zeros(2)))


def test_grad_lets_the_function_write_refs_and_gives_them_no_gradient():
    model = _running_mean()
    grad = fx.filter_grad(lambda m, x: m(x))(model, jnp.ones(2))
    np.testing.assert_allclose(grad.weight, [1.0, 1.0])
    assert grad.mean is None
    np.testing.assert_allclose(model.mean[...], [0.1, 0.1])


def test_value_and_grad_with_aux_returns_the_refs_themselves():
    model = _running_mean()

    def loss(m, x):
        return m(x), m

    (value, aux), _ = fx.filter_value_and_grad(loss, has_aux=True)(model, jnp.ones(2))
    assert aux.mean is model.mean
    np.testing.assert_allclose(value, 4.0)


def test_writes_under_grad_are_the_same_as_without_it():
    with_grad, without = _running_mean(), _running_mean()
    x = jnp.arange(2.0)
    fx.filter_grad(lambda m: m(x))(with_grad)
    without(x)
    np.testing.assert_array_equal(with_grad.mean[...], without.mean[...])


def test_vjp_and_jvp_let_the_function_write_refs():
    model = _running_mean()
    out, vjp_fn = fx.filter_vjp(lambda m, x: m(x), model, jnp.ones(2))
    grads, _ = vjp_fn(jnp.ones(()))
    assert grads.mean is None
    np.testing.assert_allclose(grads.weight, 1.0)
    _, t_out = fx.filter_jvp(
        lambda m, x: m(x), (model, jnp.ones(2)), (None, jnp.ones(2))
    )
    np.testing.assert_allclose(t_out, 4.0)
    np.testing.assert_allclose(model.mean[...], 0.19)


def test_grad_of_a_jitted_step_writing_refs():
    model = _running_mean()
    step = fx.filter_jit(fx.filter_grad(lambda m, x: m(x)))
    grads = step(model, jnp.ones(2))
    grads = step(model, jnp.ones(2))
    assert grads.mean is None
    np.testing.assert_allclose(model.mean[...], 0.19)


def test_a_complex_cotangent_for_a_real_output_names_the_path_and_says_why():
    _, vjp_fn = fx.filter_vjp(lambda x: {"y": x * 2}, jnp.ones(2))
    with pytest.raises(
        ValueError, match=r"out\['y'\].*real output takes a real cotangent"
    ):
        vjp_fn({"y": jnp.ones(2, jnp.complex64)})


def test_a_python_complex_cotangent_for_a_real_scalar_output_names_the_path():
    _, vjp_fn = fx.filter_vjp(lambda x: {"y": (x**2).sum()}, jnp.ones(2))
    with pytest.raises(
        ValueError, match=r"out\['y'\] is a Python complex.*real output takes a real"
    ):
        vjp_fn({"y": 1j})


def test_a_python_complex_tangent_for_a_real_primal_names_the_path():
    with pytest.raises(ValueError, match=r"tangents\[0\] is a Python complex"):
        fx.filter_jvp(lambda x: x * 2, (jnp.ones(()),), (1j,))


def test_an_eager_vjp_function_builds_one_transpose_per_live_set(monkeypatch):
    built = []
    original = jax.linear_transpose

    def counting(*args, **kwargs):
        built.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(jax, "linear_transpose", counting)

    def f(x):
        return {"a": jnp.sin(x).sum(), "b": (x * x).sum()}

    x = jnp.arange(3.0)
    _, vjp_fn = fx.filter_vjp(f, x)
    both = {"a": jnp.ones(()), "b": jnp.ones(())}
    only_a = {"a": jnp.ones(()), "b": None}
    for _ in range(5):
        (grad,) = vjp_fn(both)
    assert len(built) == 1
    assert jnp.allclose(grad, jnp.cos(x) + 2 * x)
    for _ in range(5):
        (grad,) = vjp_fn(only_a)
    assert len(built) == 2
    assert jnp.allclose(grad, jnp.cos(x))
    vjp_fn(both)
    assert len(built) == 2
