"""`WeightNorm` against `g * v / ||v||`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

KEY = jax.random.key(0)


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def _field_names(module):
    return [f.name for f in dataclasses.fields(module)]


class Scale(fx.Module):
    """A minimal layer: `kernel * x`, elementwise, for any kernel shape."""

    kernel: jax.Array

    def __init__(self, kernel: jax.Array):
        self.kernel = kernel

    def __call__(self, x):
        return self.kernel * x


def row_norms(v, axis):
    """The Euclidean norm over every axis except `axis`, written with NumPy."""
    v = np.asarray(v, np.float64)
    if axis is None:
        return np.sqrt((v**2).sum()).reshape((1,) * v.ndim)
    moved = np.moveaxis(v, axis, 0).reshape(v.shape[axis], -1)
    norms = np.sqrt((moved**2).sum(axis=1))
    shape = [1] * v.ndim
    shape[axis] = v.shape[axis]
    return norms.reshape(shape)


def _linear():
    return fx.nn.Linear(4, 3, key=KEY)


def test_fields_in_equinox_order():
    wrapped = fx.nn.WeightNorm(_linear())
    assert _field_names(wrapped) == [
        "layer",
        "g",
        "weight_name",
        "axis",
        "_norm",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    assert wrapped.weight_name == "weight" and wrapped.axis == 0


@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_g_starts_at_the_norm_so_the_layer_is_unchanged(axis):
    linear = _linear()
    wrapped = fx.nn.WeightNorm(linear, axis=axis)
    assert np.allclose(wrapped.g, row_norms(linear.weight, axis), atol=1e-6)
    x = jax.random.normal(jax.random.key(1), (4,))
    assert jnp.allclose(wrapped(x), linear(x), atol=1e-6)


@pytest.mark.parametrize("axis", [0, None])
def test_output_uses_g_times_direction(axis):
    linear = _linear()
    wrapped = fx.nn.WeightNorm(linear, axis=axis)
    g = jax.random.uniform(jax.random.key(2), wrapped.g.shape, minval=0.5, maxval=2)
    wrapped = fx.tree_at(lambda w: w.g, wrapped, g)
    v = linear.weight
    norm = jnp.asarray(row_norms(v, axis), jnp.float32)
    expected_weight = g * v / norm
    x = jax.random.normal(jax.random.key(1), (4,))
    assert linear.bias is not None
    expected = expected_weight @ x + linear.bias
    assert jnp.allclose(wrapped(x), expected, atol=1e-5)


def test_direction_scale_does_not_matter():
    wrapped = fx.nn.WeightNorm(_linear())
    scaled = fx.tree_at(lambda w: w.layer.weight, wrapped, 5 * wrapped.layer.weight)
    x = jnp.ones(4)
    assert jnp.allclose(wrapped(x), scaled(x), atol=1e-5)


def test_gradient_matches_formula():
    wrapped = fx.nn.WeightNorm(_linear())
    x = jax.random.normal(jax.random.key(1), (4,))
    ct = jax.random.normal(jax.random.key(3), (3,))

    def reference(v, g, bias):
        norm = jnp.sqrt(jnp.sum(v * v, axis=1, keepdims=True))
        return jnp.sum(((g * v / norm) @ x + bias) * ct)

    grads = fx.filter_grad(lambda w: jnp.sum(w(x) * ct))(wrapped)
    v_grad, g_grad, b_grad = jax.grad(reference, argnums=(0, 1, 2))(
        wrapped.layer.weight, wrapped.g, wrapped.layer.bias
    )
    assert jnp.allclose(grads.layer.weight, v_grad, atol=1e-5)
    assert jnp.allclose(grads.g, g_grad, atol=1e-5)
    assert jnp.allclose(grads.layer.bias, b_grad, atol=1e-5)
    # The gradient of v is orthogonal to v, row by row: only its direction moves.
    assert jnp.allclose(
        jnp.sum(grads.layer.weight * wrapped.layer.weight, axis=1), 0, atol=1e-5
    )


def test_wraps_a_convolution_per_output_channel():
    conv = fx.nn.Conv2d(2, 3, 3, key=KEY)
    wrapped = fx.nn.WeightNorm(conv)
    assert wrapped.g.shape == (3, 1, 1, 1)
    assert np.allclose(wrapped.g, row_norms(conv.weight, 0), atol=1e-6)
    x = jax.random.normal(jax.random.key(1), (2, 5, 5))
    assert jnp.allclose(wrapped(x), conv(x), atol=1e-5)


def test_wraps_any_layer_and_weight_name():
    layer = Scale(jnp.array([[3.0, 4.0], [1.0, 0.0]]))
    wrapped = fx.nn.WeightNorm(layer, weight_name="kernel")
    assert np.allclose(wrapped.g, [[5.0], [1.0]])
    wrapped = fx.tree_at(lambda w: w.g, wrapped, jnp.array([[10.0], [2.0]]))
    assert jnp.allclose(wrapped(jnp.ones((2, 2))), jnp.array([[6.0, 8.0], [2.0, 0.0]]))


def test_equal_configurations_compare_equal_and_share_a_compilation():
    linear = _linear()
    assert fx.tree_equal(fx.nn.WeightNorm(linear), fx.nn.WeightNorm(linear))
    assert not fx.tree_equal(
        fx.nn.WeightNorm(linear, axis=0), fx.nn.WeightNorm(linear, axis=None)
    )
    traces = []

    @fx.filter_jit
    def apply(model, x):
        traces.append(None)
        return model(x)

    apply(fx.nn.WeightNorm(linear), jnp.ones(4))
    apply(fx.nn.WeightNorm(fx.nn.Linear(4, 3, key=jax.random.key(5))), jnp.ones(4))
    assert len(traces) == 1


def test_array_leaves_are_the_layer_then_g():
    linear = _linear()
    wrapped = fx.nn.WeightNorm(linear)
    leaves = jax.tree.leaves(wrapped)
    assert len(leaves) == 3
    assert leaves[0] is linear.weight and leaves[1] is linear.bias
    assert leaves[2] is wrapped.g


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_stays_in_its_dtype(dtype):
    linear = fx.nn.Linear(4, 3, dtype=dtype, key=KEY)
    wrapped = fx.nn.WeightNorm(linear)
    assert wrapped.g.dtype == dtype
    x = jnp.ones(4, dtype)
    out = wrapped(x)
    assert out.dtype == dtype
    assert jnp.allclose(
        out.astype(jnp.float32), linear(x).astype(jnp.float32), atol=2e-2
    )


def test_float64():
    with jax.enable_x64(True):
        linear = fx.nn.Linear(4, 3, key=KEY)
        wrapped = fx.nn.WeightNorm(linear)
        assert wrapped.g.dtype == jnp.float64
        x = jnp.ones(4, jnp.float64)
        assert jnp.allclose(wrapped(x), linear(x), atol=1e-12)


def test_bad_configuration_says_what_was_expected():
    linear = _linear()
    with pytest.raises(ValueError, match="Linear has no field 'kernel'"):
        fx.nn.WeightNorm(linear, weight_name="kernel")
    with pytest.raises(AttributeError, match="kernel"):  # as Equinox raises
        fx.nn.WeightNorm(linear, weight_name="kernel")
    with pytest.raises(ValueError, match="must be an array.*got int"):
        fx.nn.WeightNorm(linear, weight_name="in_features")
    with pytest.raises(ValueError, match=r"axis=2.*shape \(3, 4\).*\[-2, 2\)"):
        fx.nn.WeightNorm(linear, axis=2)


def test_a_frozen_weight_is_normalised_and_gets_no_gradient():
    layer = fx.nn.Linear(3, 2, key=KEY)
    frozen = fx.tree_at(lambda m: m.weight, layer, replace_fn=fx.NonDifferentiable)
    x = jnp.arange(3.0)
    np.testing.assert_allclose(
        fx.nn.WeightNorm(frozen)(x), fx.nn.WeightNorm(layer)(x), rtol=1e-6
    )
    grads = fx.filter_grad(lambda n: fx.nn.WeightNorm(n.layer)(x).sum())(
        fx.nn.WeightNorm(frozen)
    )
    assert grads.layer.weight is None
    assert grads.g.shape == (2, 1)
