"""`filterax.nn.SpectralNorm`, against the largest singular value from
`jnp.linalg.svd`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def _largest_singular_value(matrix):
    return jnp.linalg.svd(matrix, compute_uv=False)[0]


def _make(in_features=5, out_features=4, **kwargs):
    k1, k2 = jax.random.split(jax.random.key(0))
    linear = fx.nn.Linear(in_features, out_features, key=k1)
    return fx.nn.make_with_state(fx.nn.SpectralNorm)(linear, "weight", key=k2, **kwargs)


def test_estimate_converges_to_the_largest_singular_value():
    layer, state = _make()
    weight = layer.layer.weight
    u, v = state.get(layer.uv_index)
    # The constructor already ran power iterations.
    np.testing.assert_allclose(
        u @ weight @ v, _largest_singular_value(weight), rtol=1e-4
    )
    np.testing.assert_allclose(jnp.linalg.norm(u), 1.0, rtol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(v), 1.0, rtol=1e-6)


def test_output_is_the_layer_with_its_weight_divided_by_the_estimate():
    layer, state = _make()
    x = jnp.linspace(-1.0, 1.0, 5)
    y, new_state = layer(x, state)
    u, v = new_state.get(layer.uv_index)
    linear = layer.layer
    sigma = u @ linear.weight @ v
    np.testing.assert_allclose(y, linear.weight @ x / sigma + linear.bias, rtol=1e-5)
    # So the weight used has spectral norm one.
    np.testing.assert_allclose(
        _largest_singular_value(linear.weight / sigma), 1.0, rtol=1e-4
    )


def test_training_refines_the_estimate_after_the_weight_changes():
    layer, state = _make()
    layer = fx.tree_at(lambda s: s.layer.weight, layer, layer.layer.weight + 1)
    x = jnp.ones(5)
    for _ in range(30):
        _, state = layer(x, state)
    u, v = state.get(layer.uv_index)
    weight = layer.layer.weight
    np.testing.assert_allclose(
        u @ weight @ v, _largest_singular_value(weight), rtol=1e-4
    )


def test_each_call_is_num_power_iterations_steps_of_the_power_method():
    layer, state = _make(num_power_iterations=2)
    weight = layer.layer.weight
    u, v = state.get(layer.uv_index)
    for _ in range(2):
        u = weight @ v
        u = u / jnp.linalg.norm(u)
        v = weight.T @ u
        v = v / jnp.linalg.norm(v)
    _, state = layer(jnp.ones(5), state)
    new_u, new_v = state.get(layer.uv_index)
    np.testing.assert_allclose(new_u, u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_v, v, rtol=1e-5, atol=1e-6)


def test_inference_keeps_the_estimate():
    layer, state = _make()
    layer = fx.tree_at(lambda s: s.layer.weight, layer, layer.layer.weight * 3)
    before = state.get(layer.uv_index)
    _, state = fx.nn.inference_mode(layer)(jnp.ones(5), state)
    for a, b in zip(state.get(layer.uv_index), before):
        np.testing.assert_array_equal(a, b)
    _, state = layer(jnp.ones(5), state, inference=True)
    for a, b in zip(state.get(layer.uv_index), before):
        np.testing.assert_array_equal(a, b)


def test_gradient_flows_through_sigma_but_not_the_iteration():
    layer, state = _make()
    x = jnp.linspace(-1.0, 2.0, 5)
    _, trained = layer(x, jax.tree_util.tree_map(lambda a: a, state))
    u, v = trained.get(layer.uv_index)
    linear = layer.layer

    def loss(layer):
        y, _ = layer(x, jax.tree_util.tree_map(lambda a: a, state))
        return jnp.sum(y**2)

    def loss_by_hand(weight, bias):
        return jnp.sum((weight @ x / (u @ weight @ v) + bias) ** 2)

    grads = fx.filter_grad(loss)(layer)
    dw, db = jax.grad(loss_by_hand, argnums=(0, 1))(linear.weight, linear.bias)
    np.testing.assert_allclose(grads.layer.weight, dw, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads.layer.bias, db, rtol=1e-5)


class Tensor3(fx.Module):
    """A layer with a three-dimensional weight, like a convolution's."""

    kernel: jax.Array

    def __call__(self, x):
        return jnp.einsum("oab,ab->o", self.kernel, x)


def test_weights_of_more_dimensions_are_reshaped_to_matrices():
    kernel = jax.random.normal(jax.random.key(2), (4, 2, 3))
    layer, state = fx.nn.make_with_state(fx.nn.SpectralNorm)(
        Tensor3(kernel), "kernel", key=jax.random.key(3)
    )
    u, v = state.get(layer.uv_index)
    assert u.shape == (4,) and v.shape == (6,)
    matrix = kernel.reshape(4, 6)
    np.testing.assert_allclose(
        u @ matrix @ v, _largest_singular_value(matrix), rtol=1e-4
    )
    x = jnp.ones((2, 3))
    y, state = layer(x, state)
    u, v = state.get(layer.uv_index)
    np.testing.assert_allclose(y, Tensor3(kernel / (u @ matrix @ v))(x), rtol=1e-5)


def test_float64_under_x64():
    with jax.enable_x64(True):
        layer, state = _make()
        assert {a.dtype for a in state.get(layer.uv_index)} == {jnp.dtype(jnp.float64)}
        y, _ = layer(jnp.ones(5, jnp.float64), state)
        assert y.dtype == jnp.float64


def test_under_filter_jit_and_lax_scan():
    layer, state = _make()
    step = fx.filter_jit(lambda layer, x, state: layer(x, state))
    xs = jax.random.normal(jax.random.key(5), (4, 5))
    loop_state = jax.tree_util.tree_map(lambda a: a, state)
    loop_ys = []
    for x in xs:
        y, loop_state = step(layer, x, loop_state)
        loop_ys.append(y)

    def body(state, x):
        y, state = layer(x, state)
        return state, y

    state, ys = jax.lax.scan(body, state, xs)
    np.testing.assert_allclose(ys, jnp.stack(loop_ys), rtol=1e-6)
    for a, b in zip(state.get(layer.uv_index), loop_state.get(layer.uv_index)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_bad_weights():
    linear = fx.nn.Linear(3, 2, key=jax.random.key(0))
    with pytest.raises(ValueError, match="at least two dimensions"):
        fx.nn.SpectralNorm(linear, "bias", key=jax.random.key(1))
    with pytest.raises(ValueError, match="no array attribute 'kernel'"):
        fx.nn.SpectralNorm(linear, "kernel", key=jax.random.key(1))
    with pytest.raises(AttributeError, match="kernel"):  # as Equinox raises
        fx.nn.SpectralNorm(linear, "kernel", key=jax.random.key(1))


def test_fields_are_equinox_s():
    assert [f.name for f in dataclasses.fields(fx.nn.SpectralNorm)] == [
        "layer",
        "weight_name",
        "uv_index",
        "num_power_iterations",
        "eps",
        "inference",
    ]
    layer, state = _make()
    assert layer.uv_index.marker == "SpectralNorm.uv_index"
    assert repr(state) == "State(SpectralNorm.uv_index=(f32[4], f32[5]))"


def test_a_frozen_weight_is_normalised_and_gets_no_gradient():
    key = jax.random.key(0)
    layer = fx.nn.Linear(3, 2, key=key)
    frozen = fx.tree_at(lambda m: m.weight, layer, replace_fn=fx.NonDifferentiable)
    x = jnp.arange(3.0)
    outputs, grads = [], []
    for wrapped in (layer, frozen):
        model, state = fx.nn.make_with_state(fx.nn.SpectralNorm)(
            wrapped, "weight", key=key
        )
        fresh = jax.tree.map(lambda v: v, state)  # the call uses `state` up
        outputs.append(model(x, state)[0])
        grads.append(fx.filter_grad(lambda m, s: m(x, s)[0].sum())(model, fresh))
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-6)
    assert grads[1].layer.weight is None
    np.testing.assert_allclose(grads[1].layer.bias, grads[0].layer.bias, rtol=1e-6)
