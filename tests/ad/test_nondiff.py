"""`NonDifferentiable`, `freeze` and `unfreeze`."""

from __future__ import annotations

import copy
import operator
import pickle

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import filterax as fx

# ------------------------------------------------------------------ as a pytree


def test_is_a_pytree_node_with_the_value_as_child():
    array = jnp.ones(3)
    wrapped = fx.NonDifferentiable(array)
    leaves, treedef = jtu.tree_flatten(wrapped)
    assert leaves == [array] and leaves[0] is array
    rebuilt = jtu.tree_unflatten(treedef, [jnp.zeros(3)])
    assert isinstance(rebuilt, fx.NonDifferentiable)
    np.testing.assert_array_equal(rebuilt.value, [0.0, 0.0, 0.0])


def test_key_path_of_its_child_is_value():
    [(path, _)] = jtu.tree_flatten_with_path(fx.NonDifferentiable(1.0))[0]
    assert path == (jtu.GetAttrKey("value"),)
    assert jtu.keystr(path) == ".value"


def test_whole_pytree_as_contents():
    contents = {"a": jnp.ones(2), "b": [1, None]}
    wrapped = fx.NonDifferentiable(contents)
    assert len(jtu.tree_leaves(wrapped)) == 2  # `None` is an empty node
    assert wrapped.value["b"] == [1, None]


def test_scalar_contents():
    wrapped = fx.NonDifferentiable(2.0)
    assert wrapped.value == 2.0
    assert wrapped + 1 == 3.0
    assert wrapped.shape == () and wrapped.ndim == 0 and wrapped.size == 1


def test_is_immutable():
    wrapped = fx.NonDifferentiable(1.0)
    with pytest.raises(AttributeError, match="immutable"):
        wrapped.x = 2


def test_is_unhashable_like_arrays():
    with pytest.raises(TypeError):
        hash(fx.NonDifferentiable(1.0))


def test_is_non_differentiable():
    assert fx.is_non_differentiable(fx.NonDifferentiable(1.0))
    assert not fx.is_non_differentiable(1.0)


def test_repr():
    assert repr(fx.NonDifferentiable(jnp.ones(3))) == "NonDifferentiable(f32[3])"
    assert (
        repr(fx.NonDifferentiable(jnp.ones((2, 2), jnp.int8)))
        == "NonDifferentiable(i8[2,2])"
    )


# ------------------------------------------------------------------ under transforms


def test_contents_are_dynamic_under_jit():
    traces = []

    @jax.jit
    def f(wrapped):
        traces.append(None)
        return wrapped.value * 2

    np.testing.assert_array_equal(f(fx.NonDifferentiable(jnp.ones(2))), [2.0, 2.0])
    np.testing.assert_array_equal(f(fx.NonDifferentiable(jnp.ones(2) * 3)), [6.0, 6.0])
    assert len(traces) == 1


def test_can_be_returned_from_jit():
    out = jax.jit(lambda w: w)(fx.NonDifferentiable(jnp.ones(2)))
    assert isinstance(out, fx.NonDifferentiable)


def test_contents_are_batched_by_vmap():
    out = jax.vmap(lambda w: w.value.sum())(fx.NonDifferentiable(jnp.ones((3, 2))))
    np.testing.assert_array_equal(out, [2.0, 2.0, 2.0])


def test_value_stops_gradients_under_jax_grad():
    def loss(x):
        return (fx.NonDifferentiable(x).value ** 2).sum() + x.sum()

    np.testing.assert_array_equal(jax.grad(loss)(jnp.ones(2)), [1.0, 1.0])


def test_arithmetic_stops_gradients_under_jax_grad():
    def loss(x):
        wrapped = fx.NonDifferentiable(x)
        return (wrapped * x).sum()

    # d/dx (stop_gradient(x) * x) = x
    np.testing.assert_array_equal(jax.grad(loss)(jnp.full(2, 3.0)), [3.0, 3.0])


def test_value_stops_gradients_inside_a_pytree():
    def loss(x):
        return fx.NonDifferentiable({"a": x, "n": 3}).value["a"].sum()

    np.testing.assert_array_equal(jax.grad(loss)(jnp.ones(2)), [0.0, 0.0])


def test_value_outside_transforms_is_the_same_object():
    array = jnp.ones(2)
    assert fx.NonDifferentiable(array).value is array


def test_value_leaves_integer_tracers_alone():
    @jax.jit
    def f(x):
        return fx.NonDifferentiable(x).value + 1

    np.testing.assert_array_equal(f(jnp.arange(2)), [1, 2])


# ------------------------------------------------------------------ delegation

BINARY = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.floordiv,
    operator.mod,
    operator.pow,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    operator.eq,
    operator.ne,
]


@pytest.mark.parametrize("op", BINARY, ids=lambda op: op.__name__)
def test_binary_operators_delegate_to_the_value(op):
    a, b = jnp.array([1.0, 2.0]), jnp.array([2.0, 2.0])
    np.testing.assert_array_equal(op(fx.NonDifferentiable(a), b), op(a, b))
    np.testing.assert_array_equal(op(a, fx.NonDifferentiable(b)), op(a, b))


@pytest.mark.parametrize("op", [operator.and_, operator.or_, operator.xor])
def test_bitwise_operators_delegate_to_the_value(op):
    a, b = jnp.array([1, 2]), jnp.array([3, 3])
    np.testing.assert_array_equal(op(fx.NonDifferentiable(a), b), op(a, b))
    np.testing.assert_array_equal(op(a, fx.NonDifferentiable(b)), op(a, b))


def test_reflected_operators_with_python_numbers():
    wrapped = fx.NonDifferentiable(jnp.array([1.0, 2.0]))
    np.testing.assert_array_equal(1.0 - wrapped, [0.0, -1.0])
    np.testing.assert_array_equal(2.0 / wrapped, [2.0, 1.0])
    np.testing.assert_array_equal(2.0**wrapped, [2.0, 4.0])


def test_operators_between_two_wrappers():
    a = fx.NonDifferentiable(jnp.array([1.0, 2.0]))
    np.testing.assert_array_equal(a + a, [2.0, 4.0])


def test_matmul_delegates():
    a = jnp.eye(2)
    np.testing.assert_array_equal(fx.NonDifferentiable(a) @ a, a)
    np.testing.assert_array_equal(a @ fx.NonDifferentiable(a), a)


@pytest.mark.parametrize("op", [operator.neg, operator.pos, operator.abs])
def test_unary_operators_delegate(op):
    a = jnp.array([-1.0, 2.0])
    np.testing.assert_array_equal(op(fx.NonDifferentiable(a)), op(a))


def test_invert_delegates():
    a = jnp.array([True, False])
    np.testing.assert_array_equal(~fx.NonDifferentiable(a), ~a)


def test_indexing_shape_dtype_len():
    a = jnp.arange(6.0).reshape(2, 3)
    wrapped = fx.NonDifferentiable(a)
    np.testing.assert_array_equal(wrapped[1], a[1])
    assert wrapped.shape == (2, 3) and wrapped.dtype == jnp.float32
    assert wrapped.ndim == 2 and wrapped.size == 6 and len(wrapped) == 2


def test_numpy_asarray():
    a = jnp.arange(3.0)
    out = np.asarray(fx.NonDifferentiable(a))
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, a)
    assert np.asarray(fx.NonDifferentiable(a), dtype=np.int32).dtype == np.int32


def test_jnp_functions_take_the_value():
    wrapped = fx.NonDifferentiable(jnp.arange(3.0))
    np.testing.assert_array_equal(jnp.sin(wrapped.value), jnp.sin(jnp.arange(3.0)))


# ------------------------------------------------------------------ freeze, unfreeze


def test_freeze_wraps_the_selected_node():
    params = {"encoder": jnp.ones(2), "head": jnp.zeros(2)}
    frozen = fx.freeze(params, lambda p: p["encoder"])
    assert isinstance(frozen["encoder"], fx.NonDifferentiable)
    assert frozen["encoder"].value is params["encoder"]
    assert frozen["head"] is params["head"]


def test_freeze_a_whole_subtree():
    params = {"encoder": [jnp.ones(2), jnp.ones(1)], "head": jnp.zeros(2)}
    frozen = fx.freeze(params, lambda p: p["encoder"])
    assert isinstance(frozen["encoder"], fx.NonDifferentiable)
    assert jtu.tree_leaves(frozen["encoder"]) == jtu.tree_leaves(params["encoder"])


def test_freeze_a_sequence_of_nodes():
    params = [jnp.ones(1), jnp.ones(2), jnp.ones(3)]
    frozen = fx.freeze(params, lambda p: (p[0], p[2]))
    assert [fx.is_non_differentiable(x) for x in frozen] == [True, False, True]


def test_freeze_does_not_double_wrap():
    params = {"encoder": jnp.ones(2)}
    once = fx.freeze(params, lambda p: p["encoder"])
    twice = fx.freeze(once, lambda p: p["encoder"])
    assert twice["encoder"] is once["encoder"]
    assert not fx.is_non_differentiable(twice["encoder"].value)


def test_freeze_a_sequence_with_an_already_frozen_node():
    params = [fx.NonDifferentiable(jnp.ones(1)), jnp.ones(2)]
    frozen = fx.freeze(params, lambda p: [p[0], p[1]])
    assert frozen[0] is params[0]
    assert fx.is_non_differentiable(frozen[1])
    assert not fx.is_non_differentiable(frozen[1].value)


def test_freeze_a_none_leaf():
    frozen = fx.freeze([None, 1], lambda p: p[0])
    assert fx.is_non_differentiable(frozen[0]) and frozen[0].value is None


def test_freeze_a_module_field():
    class Linear(fx.Module):
        weight: jax.Array
        bias: jax.Array

    model = Linear(jnp.ones(2), jnp.zeros(2))
    frozen = fx.freeze(model, lambda m: m.weight)
    assert type(frozen) is Linear
    assert repr(frozen) == "Linear(weight=NonDifferentiable(f32[2]), bias=f32[2])"


def test_freeze_rejects_a_node_not_in_the_tree():
    with pytest.raises(ValueError, match="not a node of `pytree`"):
        fx.freeze([jnp.ones(1)], lambda p: jnp.ones(1))


def test_unfreeze_removes_every_wrapper():
    array = jnp.ones(2)
    tree = {"a": fx.NonDifferentiable(array), "b": [fx.NonDifferentiable(1.0), 2.0]}
    assert fx.unfreeze(tree) == {"a": array, "b": [1.0, 2.0]}
    assert fx.unfreeze(tree)["a"] is array


def test_unfreeze_removes_nested_wrappers():
    nested = fx.NonDifferentiable({"x": fx.NonDifferentiable(1.0)})
    assert fx.unfreeze(nested) == {"x": 1.0}


def test_unfreeze_inverts_freeze():
    params = {"encoder": [jnp.ones(2)], "head": jnp.zeros(2)}
    restored = fx.unfreeze(fx.freeze(params, lambda p: [p["encoder"], p["head"]]))
    assert jtu.tree_structure(restored) == jtu.tree_structure(params)
    assert all(
        a is b for a, b in zip(jtu.tree_leaves(restored), jtu.tree_leaves(params))
    )


def test_trainable_has_the_structure_of_filter_grad_output():
    import optax

    model = {
        "w": jnp.ones(2),
        "buffer": fx.NonDifferentiable(jnp.zeros(2)),
        "steps": jnp.arange(3),
        "name": "layer",
    }
    grads = fx.filter_grad(lambda m: (m["w"] * m["buffer"].value).sum() + 1.0)(model)
    assert jax.tree.structure(fx.trainable(model)) == jax.tree.structure(grads)
    optimiser = optax.sgd(0.1)
    state = optimiser.init(fx.trainable(model))
    updates, _ = optimiser.update(grads, state)
    updated = fx.apply_updates(model, updates)
    assert updated["buffer"] is model["buffer"] and updated["name"] == "layer"


def test_optimiser_state_built_from_filter_points_to_trainable():
    import optax

    class Model(fx.Module):
        w: jax.Array
        buffer: fx.NonDifferentiable

    model = Model(jnp.ones(2), fx.NonDifferentiable(jnp.zeros(2)))
    optimiser = optax.adam(1e-3)
    grads = fx.filter_grad(lambda m: (m.w**2).sum())(model)
    wrong = optimiser.init(fx.filter(model, fx.is_inexact_array))
    with pytest.raises(ValueError, match=r"filterax\.trainable\(model\)"):
        optimiser.update(grads, wrong, fx.filter(model, fx.is_inexact_array))
    right = optimiser.init(fx.trainable(model))
    updates, _ = optimiser.update(grads, right, fx.trainable(model))
    assert updates.buffer is None


def test_a_frozen_layer_is_called_and_read_as_before() -> None:
    model = fx.nn.Sequential(
        [
            fx.nn.Linear(3, 4, key=jax.random.key(0)),
            fx.nn.Lambda(jax.nn.relu),
            fx.nn.Linear(4, 1, key=jax.random.key(1)),
        ]
    )
    frozen = fx.freeze(model, where=lambda m: m.layers[0])
    x = jnp.arange(3.0)
    assert isinstance(frozen.layers[0], fx.NonDifferentiable)
    assert frozen(x).tolist() == model(x).tolist()
    assert frozen.layers[0].in_features == 3
    assert frozen.layers[0].weight.shape == (4, 3)

    grads = fx.filter_grad(lambda m: m(x).sum())(frozen)
    assert grads.layers[0] is None
    assert grads.layers[2].weight.shape == (1, 4)
    # Even plain jax.grad sees no gradient for the weights of a frozen layer's
    # call (the input's gradient still flows through it).
    dense = jax.grad(lambda layer: layer(x).sum())(frozen.layers[0])
    assert not jnp.any(dense.value.weight)
    assert jnp.any(jax.grad(lambda x: frozen.layers[0](x).sum())(x))


def test_the_wrapper_claims_no_protocol_of_its_contents() -> None:
    wrapped = fx.NonDifferentiable(jnp.ones(2))
    assert not hasattr(wrapped, "__jax_array__")
    with pytest.raises(AttributeError):
        _ = wrapped.no_such_attribute


def test_copies_and_pickles_are_equal_wrappers() -> None:
    wrapped = fx.NonDifferentiable(jnp.arange(2.0))
    for copied in (
        copy.copy(wrapped),
        copy.deepcopy(wrapped),
        pickle.loads(pickle.dumps(wrapped)),
    ):
        assert isinstance(copied, fx.NonDifferentiable)
        assert copied.value.tolist() == [0.0, 1.0]
