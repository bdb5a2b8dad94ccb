"""`apply_updates`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import filterax as fx


class Linear(fx.Module):
    weight: jax.Array
    bias: jax.Array | None
    frozen: fx.NonDifferentiable | None = None
    name: str = "linear"


def test_adds_array_updates():
    out = fx.apply_updates([jnp.ones(2), jnp.zeros(1)], [jnp.full(2, 0.5), jnp.ones(1)])
    np.testing.assert_array_equal(out[0], [1.5, 1.5])
    np.testing.assert_array_equal(out[1], [1.0])


def test_none_update_leaves_the_value_alone():
    value = jnp.ones(2)
    out = fx.apply_updates([value, jnp.ones(1)], [None, jnp.ones(1)])
    assert out[0] is value


def test_none_update_for_a_whole_subtree():
    subtree = {"a": jnp.ones(2), "b": [jnp.ones(1)]}
    out = fx.apply_updates(
        {"s": subtree, "t": jnp.ones(1)}, {"s": None, "t": jnp.ones(1)}
    )
    assert out["s"] is subtree


def test_python_number_updates_are_added_as_in_equinox():
    out = fx.apply_updates([jnp.ones(1), 3, "relu"], [0.5, 1, None])
    assert out[1:] == [4, "relu"]
    np.testing.assert_array_equal(out[0], [1.5])


def test_an_update_for_a_non_number_names_the_key_path():
    with pytest.raises(TypeError, match=r"update at \[1\] is a str.*holds str"):
        fx.apply_updates([jnp.ones(1), "relu"], [None, "tanh"])
    with pytest.raises(TypeError, match=r"update at \[0\] is a int.*holds object"):
        fx.apply_updates([object()], [0])


def test_the_parameter_dtype_is_kept():
    out = fx.apply_updates(jnp.ones(2, jnp.bfloat16), jnp.full(2, 0.5, jnp.float32))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(out.astype(jnp.float32), [1.5, 1.5])


def test_refs_are_never_updated():
    state = jax.new_ref(jnp.zeros(2))
    out = fx.apply_updates([state, jnp.ones(1)], [jnp.ones(2), jnp.ones(1)])
    assert out[0] is state
    np.testing.assert_array_equal(state[...], [0.0, 0.0])


def test_non_differentiable_is_untouched_with_a_none_update():
    frozen = fx.NonDifferentiable(jnp.ones(2))
    out = fx.apply_updates([frozen, jnp.ones(1)], [None, jnp.ones(1)])
    assert out[0] is frozen


def test_non_differentiable_is_untouched_whatever_the_update():
    frozen = fx.NonDifferentiable(jnp.ones(2))
    assert fx.apply_updates([frozen], [fx.NonDifferentiable(jnp.ones(2))])[0] is frozen
    assert fx.apply_updates([frozen], [jnp.ones(2)])[0] is frozen


def test_numpy_updates_are_applied():
    out = fx.apply_updates(jnp.ones(2), np.ones(2, np.float32))
    np.testing.assert_array_equal(out, [2.0, 2.0])


def test_array_update_to_a_python_number():
    out = fx.apply_updates({"scale": 1.0}, {"scale": jnp.array(0.5)})
    assert float(out["scale"]) == 1.5


def test_on_a_module_with_filter_grad_updates():
    model = Linear(jnp.ones(2), jnp.zeros(2), fx.NonDifferentiable(jnp.ones(2)))
    updates = Linear(jnp.ones(2), None, None, None)
    out = fx.apply_updates(model, updates)
    assert type(out) is Linear
    np.testing.assert_array_equal(out.weight, [2.0, 2.0])
    assert out.bias is model.bias and out.frozen is model.frozen
    assert out.name == "linear"


def test_with_optax():
    model = Linear(jnp.ones(2), jnp.zeros(2), fx.NonDifferentiable(jnp.ones(2)))
    # Shaped like `filter_grad` output: `None` for everything not differentiated.
    params = fx.filter(model, fx.is_inexact_array, is_leaf=fx.is_non_differentiable)
    grads = jax.tree.map(jnp.ones_like, params)
    optimizer = optax.sgd(0.1)
    state = optimizer.init(params)
    updates, _ = optimizer.update(grads, state, params)
    out = fx.apply_updates(model, updates)
    np.testing.assert_allclose(out.weight, [0.9, 0.9])
    np.testing.assert_allclose(out.bias, [-0.1, -0.1])
    assert out.frozen is model.frozen


def test_under_jit():
    out = jax.jit(fx.apply_updates)([jnp.ones(2), None], [jnp.ones(2), None])
    np.testing.assert_array_equal(out[0], [2.0, 2.0])


def test_structure_mismatch_names_the_key_path():
    with pytest.raises(ValueError, match=r"at \['b'\]\[1\] `updates` has a list"):
        fx.apply_updates({"a": 1.0, "b": [1.0, 2.0]}, {"a": None, "b": [None, [1.0]]})


def test_missing_key_is_a_structure_error():
    with pytest.raises(ValueError, match="at the root `updates` has a dict"):
        fx.apply_updates({"a": 1.0, "b": 2.0}, {"a": None})


def test_array_update_for_a_non_number_names_the_key_path():
    with pytest.raises(TypeError, match=r"update at \['act'\] is an array.*holds str"):
        fx.apply_updates({"act": "relu"}, {"act": jnp.ones(1)})


def test_array_update_for_a_subtree_names_the_key_path():
    with pytest.raises(TypeError, match=r"update at \[0\] is an array.*holds list"):
        fx.apply_updates([[1.0, 2.0]], [jnp.ones(2)])


def test_shape_mismatch_names_the_key_path():
    with pytest.raises(ValueError, match=r"update at \['w'\] has shape \(3,\).*\(2,\)"):
        fx.apply_updates({"w": jnp.ones(2)}, {"w": jnp.ones(3)})
