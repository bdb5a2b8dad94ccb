"""`filterax.nn.Linear` and `filterax.nn.Identity`."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def test_output_is_weight_times_input_plus_bias():
    linear = fx.nn.Linear(3, 4, key=jax.random.key(0))
    x = jnp.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(
        linear(x), linear.weight @ x + linear.bias, rtol=1e-6, atol=1e-6
    )


def test_gradients_match_the_formula():
    linear = fx.nn.Linear(3, 2, key=jax.random.key(1))
    x = jnp.array([0.5, -1.0, 2.0])
    cotangent = jnp.array([1.5, -0.5])

    @fx.filter_grad
    def grads(model):
        return jnp.vdot(cotangent, model(x))

    g = grads(linear)
    np.testing.assert_allclose(g.weight, jnp.outer(cotangent, x), rtol=1e-6)
    np.testing.assert_allclose(g.bias, cotangent, rtol=1e-6)
    dx = jax.grad(lambda x: jnp.vdot(cotangent, linear(x)))(x)
    np.testing.assert_allclose(dx, linear.weight.T @ cotangent, rtol=1e-6)


def test_initialisation_is_equinox_s():
    # Values that equinox.nn.Linear(3, 4, key=jax.random.key(0)) draws.
    linear = fx.nn.Linear(3, 4, key=jax.random.key(0))
    expected_first_row = np.array([0.3952703, -0.36675754, -0.3150276], np.float32)
    np.testing.assert_array_equal(linear.weight[0], expected_first_row)


def test_initialisation_is_uniform_within_one_over_sqrt_in_features():
    linear = fx.nn.Linear(64, 32, key=jax.random.key(2))
    limit = 1 / math.sqrt(64)
    for array in (linear.weight, linear.bias):
        assert float(jnp.max(jnp.abs(array))) <= limit
    # A uniform sample of 2048 values spreads over most of the interval.
    assert float(jnp.max(linear.weight)) > 0.9 * limit
    assert float(jnp.min(linear.weight)) < -0.9 * limit


def test_initialisation_uses_a_limit_of_one_without_inputs():
    linear = fx.nn.Linear(0, 64, key=jax.random.key(0))
    assert linear.weight.shape == (64, 0)
    assert float(jnp.max(jnp.abs(linear.bias))) > 0.5
    np.testing.assert_array_equal(linear(jnp.zeros(0)), linear.bias)


def test_same_key_same_parameters_and_different_keys_different_ones():
    a = fx.nn.Linear(3, 4, key=jax.random.key(7))
    b = fx.nn.Linear(3, 4, key=jax.random.key(7))
    c = fx.nn.Linear(3, 4, key=jax.random.key(8))
    assert fx.tree_equal(a, b)
    assert not bool(jnp.any(a.weight == c.weight))


def test_legacy_uint32_keys_are_accepted():
    typed = fx.nn.Linear(3, 4, key=jax.random.key(3))
    legacy = fx.nn.Linear(3, 4, key=jax.random.PRNGKey(3))
    assert fx.tree_equal(typed, legacy)


def test_without_bias():
    linear = fx.nn.Linear(3, 2, use_bias=False, key=jax.random.key(0))
    assert linear.bias is None
    assert linear.use_bias is False
    x = jnp.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(linear(x), linear.weight @ x, rtol=1e-6)


def test_scalar_input_and_output():
    linear = fx.nn.Linear("scalar", "scalar", key=jax.random.key(0))
    assert linear.weight.shape == (1, 1)
    y = linear(jnp.array(2.0))
    assert y.shape == ()
    np.testing.assert_allclose(y, 2.0 * linear.weight[0, 0] + linear.bias[0])
    assert linear(2.0).shape == ()
    assert fx.nn.Linear("scalar", 3, key=jax.random.key(0))(1.0).shape == (3,)
    assert fx.nn.Linear(3, "scalar", key=jax.random.key(0))(jnp.ones(3)).shape == ()


def test_zero_outputs():
    linear = fx.nn.Linear(4, 0, key=jax.random.key(0))
    assert linear(jnp.ones(4)).shape == (0,)


def test_fields_and_key_paths_are_equinox_s():
    assert [f.name for f in dataclasses.fields(fx.nn.Linear)] == [
        "weight",
        "bias",
        "in_features",
        "out_features",
        "use_bias",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    linear = fx.nn.Linear(2, 3, key=jax.random.key(0))
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(linear)
    ]
    assert paths == [".weight", ".bias"]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_low_precision_dtypes(dtype):
    linear = fx.nn.Linear(3, 2, dtype=dtype, key=jax.random.key(0))
    assert linear.weight.dtype == dtype and linear.bias.dtype == dtype
    x = jnp.array([1.0, -2.0, 0.5], dtype)
    y = linear(x)
    assert y.dtype == dtype
    reference = linear.weight.astype(jnp.float32) @ x.astype(jnp.float32)
    reference = reference + linear.bias.astype(jnp.float32)
    np.testing.assert_allclose(y.astype(jnp.float32), reference, rtol=2e-2, atol=2e-2)


def test_low_precision_parameters_are_drawn_in_that_dtype():
    # As Equinox: drawn directly in float16, not drawn in float32 and cast.
    half = fx.nn.Linear(3, 2, dtype=jnp.float16, key=jax.random.key(0))
    weight_key = jax.random.split(jax.random.key(0))[0]
    limit = 1 / math.sqrt(3)
    direct = jax.random.uniform(weight_key, (2, 3), jnp.float16, -limit, limit)
    np.testing.assert_array_equal(half.weight, direct)


def test_float64_is_the_default_under_x64():
    with jax.enable_x64(True):
        linear = fx.nn.Linear(3, 2, key=jax.random.key(0))
        assert linear.weight.dtype == jnp.float64
        assert linear(jnp.ones(3, jnp.float64)).dtype == jnp.float64
    assert fx.nn.Linear(3, 2, key=jax.random.key(0)).weight.dtype == jnp.float32


def test_complex_parameters():
    linear = fx.nn.Linear(2, 3, dtype=jnp.complex64, key=jax.random.key(0))
    assert linear.weight.dtype == jnp.complex64
    limit = 1 / math.sqrt(2)
    assert float(jnp.max(jnp.abs(linear.weight.real))) <= limit
    assert float(jnp.max(jnp.abs(linear.weight.imag))) <= limit
    # Real and imaginary parts are drawn independently.
    assert not bool(jnp.any(linear.weight.real == linear.weight.imag))
    x = jnp.array([1.0 + 2.0j, -0.5j], jnp.complex64)
    y = linear(x)
    assert y.dtype == jnp.complex64
    np.testing.assert_allclose(y, linear.weight @ x + linear.bias, rtol=1e-6)


def test_under_jit_and_vmap():
    linear = fx.nn.Linear(3, 2, key=jax.random.key(0))
    xs = jnp.arange(12.0).reshape(4, 3)
    ys = fx.filter_jit(fx.filter_vmap(lambda m, x: m(x), in_axes=(None, 0)))(linear, xs)
    np.testing.assert_allclose(ys, xs @ linear.weight.T + linear.bias[None], rtol=1e-6)


@pytest.mark.parametrize("shape", [(4,), (3, 1), (1, 3), ()])
def test_wrong_input_shape_is_a_clear_error(shape):
    linear = fx.nn.Linear(3, 2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"expects an input of shape \(3,\)"):
        linear(jnp.ones(shape))


def test_scalar_layer_rejects_a_vector():
    linear = fx.nn.Linear("scalar", 2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"shape \(\)"):
        linear(jnp.ones(1))


@pytest.mark.parametrize(
    "in_features, error",
    [("vector", ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)],
)
def test_bad_feature_sizes(in_features, error):
    with pytest.raises(error, match="in_features"):
        fx.nn.Linear(in_features, 2, key=jax.random.key(0))


def test_key_is_required():
    with pytest.raises(TypeError):
        fx.nn.Linear(3, 4)  # pyright: ignore[reportCallIssue]
    with pytest.raises(TypeError, match="key"):
        fx.nn.Linear(3, 4, key=None)  # pyright: ignore[reportArgumentType]


def test_integer_dtype_is_rejected():
    with pytest.raises(ValueError, match="floating or complex"):
        fx.nn.Linear(3, 4, dtype=jnp.int32, key=jax.random.key(0))


def test_identity_returns_its_input_itself():
    x = jnp.arange(3.0)
    assert fx.nn.Identity()(x) is x
    assert fx.nn.Identity()(x, key=jax.random.key(0)) is x


def test_identity_ignores_constructor_arguments_and_has_no_leaves():
    identity = fx.nn.Identity(1, 2, name="anything")
    assert identity == fx.nn.Identity()
    assert jax.tree_util.tree_leaves(identity) == []


def test_the_forward_pass_is_one_matrix_product():
    layer = fx.nn.Linear(3, 4, key=jax.random.key(0))
    plain = [e.primitive.name for e in jax.make_jaxpr(layer)(jnp.ones(3)).eqns]
    assert plain == ["dot_general", "add"]
    batched = jax.make_jaxpr(jax.vmap(layer))(jnp.ones((5, 3))).eqns
    names = [e.primitive.name for e in batched]
    # `weight @ x` as Equinox computes it: (out, batch), then one transpose.
    assert names[:2] == ["dot_general", "transpose"]
    assert names.count("dot_general") == 1 and names.count("transpose") == 1
    assert batched[-1].outvars[0].aval.shape == (5, 4)
