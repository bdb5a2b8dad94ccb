"""`filterax.nn.MLP`."""

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


def _by_hand(params, x, activation=jax.nn.relu, final=lambda y: y):
    """The MLP written out: `params` is a list of (weight, bias) pairs."""
    *hidden, (w_last, b_last) = params
    for w, b in hidden:
        x = activation(w @ x + b)
    return final(w_last @ x + b_last)


def _params(mlp):
    return [(layer.weight, layer.bias) for layer in mlp.layers]


def test_output_is_the_composed_formula():
    mlp = fx.nn.MLP(3, 2, width_size=5, depth=2, key=jax.random.key(0))
    x = jnp.array([0.3, -1.2, 0.8])
    np.testing.assert_allclose(mlp(x), _by_hand(_params(mlp), x), rtol=1e-6)


def test_gradients_match_the_composed_formula():
    mlp = fx.nn.MLP(3, 2, 5, 2, activation=jnp.tanh, key=jax.random.key(1))
    x = jnp.array([0.3, -1.2, 0.8])

    def loss(model):
        return jnp.sum(model(x) ** 2)

    def loss_by_hand(params):
        return jnp.sum(_by_hand(params, x, jnp.tanh) ** 2)

    grads = fx.filter_grad(loss)(mlp)
    expected = jax.grad(loss_by_hand)(_params(mlp))
    for layer, (dw, db) in zip(grads.layers, expected):
        np.testing.assert_allclose(layer.weight, dw, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(layer.bias, db, rtol=1e-5, atol=1e-7)


def test_layer_sizes():
    mlp = fx.nn.MLP(3, 2, 5, depth=3, key=jax.random.key(0))
    assert [layer.weight.shape for layer in mlp.layers] == [
        (5, 3),
        (5, 5),
        (5, 5),
        (2, 5),
    ]
    shallow = fx.nn.MLP(3, 2, 5, depth=0, key=jax.random.key(0))
    assert [layer.weight.shape for layer in shallow.layers] == [(2, 3)]


def test_layers_are_drawn_from_split_keys():
    key = jax.random.key(4)
    mlp = fx.nn.MLP(3, 2, 5, depth=2, key=key)
    keys = jax.random.split(key, 3)
    assert fx.tree_equal(mlp.layers[0], fx.nn.Linear(3, 5, key=keys[0]))
    assert fx.tree_equal(mlp.layers[1], fx.nn.Linear(5, 5, key=keys[1]))
    assert fx.tree_equal(mlp.layers[2], fx.nn.Linear(5, 2, key=keys[2]))


def test_final_activation():
    mlp = fx.nn.MLP(3, 2, 4, 1, final_activation=jax.nn.sigmoid, key=jax.random.key(0))
    x = jnp.array([1.0, 0.0, -1.0])
    expected = _by_hand(_params(mlp), x, final=jax.nn.sigmoid)
    np.testing.assert_allclose(mlp(x), expected, rtol=1e-6)


def test_final_activation_applies_at_depth_zero():
    # Equinox 0.13.8 skips it at depth 0; the documented behaviour is applied here.
    mlp = fx.nn.MLP(3, 2, 4, 0, final_activation=jax.nn.sigmoid, key=jax.random.key(0))
    x = jnp.array([1.0, 0.0, -1.0])
    layer = mlp.layers[0]
    np.testing.assert_allclose(mlp(x), jax.nn.sigmoid(layer(x)), rtol=1e-6)


def test_use_bias_and_use_final_bias():
    mlp = fx.nn.MLP(
        2, 3, 4, 2, use_bias=False, use_final_bias=True, key=jax.random.key(0)
    )
    assert [layer.bias is None for layer in mlp.layers] == [True, True, False]
    mlp = fx.nn.MLP(
        2, 3, 4, 2, use_bias=True, use_final_bias=False, key=jax.random.key(0)
    )
    assert [layer.bias is None for layer in mlp.layers] == [False, False, True]
    shallow = fx.nn.MLP(
        2, 3, 4, 0, use_bias=True, use_final_bias=False, key=jax.random.key(0)
    )
    assert shallow.layers[0].bias is None


def test_scalar_sizes():
    mlp = fx.nn.MLP("scalar", "scalar", 4, 2, key=jax.random.key(0))
    assert mlp(jnp.array(0.5)).shape == ()
    assert mlp(0.5).shape == ()


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_scan_gives_the_same_parameters_outputs_and_gradients(depth):
    key = jax.random.key(3)
    plain = fx.nn.MLP(3, 2, 5, depth, activation=jnp.tanh, key=key)
    scanned = fx.nn.MLP(3, 2, 5, depth, activation=jnp.tanh, scan=True, key=key)
    first, middle, last = scanned.layers
    assert middle.weight.shape == (depth - 1, 5, 5)
    assert fx.tree_equal(first, plain.layers[0])
    assert fx.tree_equal(last, plain.layers[-1])
    for i, layer in enumerate(plain.layers[1:-1]):
        np.testing.assert_array_equal(middle.weight[i], layer.weight)
    x = jnp.array([0.5, -0.5, 2.0])
    np.testing.assert_allclose(scanned(x), plain(x), rtol=1e-6)

    def loss(model):
        return jnp.sum(model(x))

    g_plain = fx.filter_grad(loss)(plain)
    g_scanned = fx.filter_grad(loss)(scanned)
    np.testing.assert_allclose(
        g_scanned.layers[0].weight, g_plain.layers[0].weight, rtol=1e-5
    )
    for i, layer in enumerate(g_plain.layers[1:-1]):
        np.testing.assert_allclose(
            g_scanned.layers[1].weight[i], layer.weight, rtol=1e-5
        )


def test_scan_at_depth_zero_has_one_layer():
    mlp = fx.nn.MLP(3, 2, 5, 0, scan=True, key=jax.random.key(0))
    assert len(mlp.layers) == 1
    assert mlp(jnp.ones(3)).shape == (2,)


def test_learnt_activations_get_one_copy_per_neuron():
    mlp = fx.nn.MLP(
        2,
        3,
        4,
        2,
        activation=fx.nn.PReLU(0.1),
        final_activation=fx.nn.PReLU(0.2),
        key=jax.random.key(0),
    )
    assert mlp.activation.negative_slope.shape == (2, 4)
    assert mlp.final_activation.negative_slope.shape == (3,)
    # Give each neuron of the first hidden layer its own slope, then check
    # against the formula with per-neuron slopes.
    slopes = jnp.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]])
    mlp = fx.tree_at(lambda m: m.activation.negative_slope, mlp, slopes)
    x = jnp.array([1.0, -2.0])

    def prelu(slope):
        return lambda y: jnp.where(y >= 0, y, slope * y)

    (w0, b0), (w1, b1), (w2, b2) = _params(mlp)
    h = prelu(slopes[0])(w0 @ x + b0)
    h = prelu(slopes[1])(w1 @ h + b1)
    expected = prelu(0.2)(w2 @ h + b2)
    np.testing.assert_allclose(mlp(x), expected, rtol=1e-6)
    grads = fx.filter_grad(lambda m: jnp.sum(m(x)))(mlp)
    assert grads.activation.negative_slope.shape == (2, 4)


def test_scalar_output_keeps_the_final_activation_as_given():
    final = fx.nn.PReLU(0.3)
    mlp = fx.nn.MLP(2, "scalar", 4, 1, final_activation=final, key=jax.random.key(0))
    assert mlp.final_activation is final


def test_fields_are_equinox_s():
    assert [f.name for f in dataclasses.fields(fx.nn.MLP)] == [
        "layers",
        "activation",
        "final_activation",
        "use_bias",
        "use_final_bias",
        "in_size",
        "out_size",
        "width_size",
        "depth",
        "scan",
    ]
    mlp = fx.nn.MLP(2, 3, 4, 1, key=jax.random.key(0))
    assert mlp.activation is jax.nn.relu


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_dtype_reaches_every_layer(dtype):
    mlp = fx.nn.MLP(2, 3, 4, 2, dtype=dtype, key=jax.random.key(0))
    arrays = [leaf for leaf in jax.tree_util.tree_leaves(mlp) if fx.is_array(leaf)]
    assert {leaf.dtype for leaf in arrays} == {jnp.dtype(dtype)}
    assert mlp(jnp.ones(2, dtype)).dtype == dtype


def test_float64_under_x64():
    with jax.enable_x64(True):
        mlp = fx.nn.MLP(2, 3, 4, 2, key=jax.random.key(0))
        assert mlp.layers[0].weight.dtype == jnp.float64


@pytest.mark.parametrize("depth, error", [(-1, ValueError), (1.5, TypeError)])
def test_bad_depth(depth, error):
    with pytest.raises(error, match="depth"):
        fx.nn.MLP(2, 3, 4, depth, key=jax.random.key(0))


def test_wrong_input_shape_is_a_clear_error():
    mlp = fx.nn.MLP(2, 3, 4, 1, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        mlp(jnp.ones(3))


def test_serialisation_round_trip(tmp_path):
    mlp = fx.nn.MLP(2, 3, 4, 2, scan=True, key=jax.random.key(0))
    fx.tree_serialise_leaves(tmp_path / "mlp.eqx", mlp)
    like = fx.nn.MLP(2, 3, 4, 2, scan=True, key=jax.random.key(1))
    loaded = fx.tree_deserialise_leaves(tmp_path / "mlp.eqx", like)
    assert fx.tree_equal(loaded, mlp)
