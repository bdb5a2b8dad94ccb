"""`filterax.nn.PReLU`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def _prelu(x, slope):
    return jnp.maximum(x, 0) + slope * jnp.minimum(x, 0)


def test_output_matches_the_formula():
    x = jnp.linspace(-3.0, 3.0, 13)
    np.testing.assert_allclose(fx.nn.PReLU(0.1)(x), _prelu(x, 0.1), rtol=1e-6)
    np.testing.assert_allclose(fx.nn.PReLU()(x), _prelu(x, 0.25), rtol=1e-6)


def test_one_slope_per_channel_broadcasts_over_the_last_axis():
    slopes = jnp.array([0.1, 0.2, 0.3])
    x = jnp.array([[-1.0, -2.0, -3.0], [1.0, -1.0, 2.0]])
    y = fx.nn.PReLU(slopes)(x)
    np.testing.assert_allclose(y, _prelu(x, slopes[None, :]), rtol=1e-6)


def test_gradients_match_the_formula():
    slopes = jnp.array([0.1, 0.2, 0.3])
    x = jnp.array([[-1.0, -2.0, 3.0], [1.0, -1.0, -2.0]])
    layer = fx.nn.PReLU(slopes)
    grads = fx.filter_grad(lambda layer: jnp.sum(layer(x)))(layer)
    np.testing.assert_allclose(grads.negative_slope, jnp.sum(jnp.minimum(x, 0), axis=0))
    dx = jax.grad(lambda x: jnp.sum(layer(x)))(x)
    np.testing.assert_allclose(dx, jnp.where(x >= 0, 1.0, slopes[None, :]), rtol=1e-6)


def test_a_python_slope_keeps_the_input_dtype():
    layer = fx.nn.PReLU(0.5)
    for dtype in (jnp.float16, jnp.bfloat16):
        y = layer(jnp.array([-2.0, 2.0], dtype))
        assert y.dtype == dtype
        np.testing.assert_array_equal(y.astype(jnp.float32), jnp.array([-1.0, 2.0]))


def test_an_integer_input_gives_a_floating_output():
    y = fx.nn.PReLU(0.1)(jnp.array([-10, 10]))
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(y, jnp.array([-1.0, 10.0]))


def test_float64_under_x64():
    with jax.enable_x64(True):
        y = fx.nn.PReLU()(jnp.array([-1.0, 1.0], jnp.float64))
        assert y.dtype == jnp.float64


def test_slope_is_a_learnt_array():
    layer = fx.nn.PReLU(0.25)
    assert fx.is_inexact_array(layer.negative_slope)
    assert layer.negative_slope.shape == ()
    assert jax.tree_util.tree_leaves(layer) == [layer.negative_slope]


def test_bad_slope():
    with pytest.raises(TypeError, match="init_alpha"):
        fx.nn.PReLU("steep")  # pyright: ignore[reportArgumentType]
