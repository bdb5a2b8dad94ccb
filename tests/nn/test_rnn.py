"""`GRUCell` and `LSTMCell` against their gate equations."""

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


def _present(x):
    """`x`, which the test expects to be there (narrows `Array | None`)."""
    assert x is not None
    return x


def _field_names(module):
    return [f.name for f in dataclasses.fields(module)]


KEY = jax.random.key(0)


def _random(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape)


def _sigmoid(x):
    return 1 / (1 + jnp.exp(-x))


def gru_reference(cell, x, h):
    """The GRU equations, one gate at a time, from slices of the weights."""
    n = cell.hidden_size
    wi, wh = cell.weight_ih, cell.weight_hh
    b = cell.bias if cell.use_bias else jnp.zeros(3 * n)
    b_n = cell.bias_n if cell.use_bias else jnp.zeros(n)
    r = _sigmoid(wi[:n] @ x + b[:n] + wh[:n] @ h)
    z = _sigmoid(wi[n : 2 * n] @ x + b[n : 2 * n] + wh[n : 2 * n] @ h)
    candidate = jnp.tanh(wi[2 * n :] @ x + b[2 * n :] + r * (wh[2 * n :] @ h + b_n))
    return (1 - z) * candidate + z * h


def lstm_reference(cell, x, h, c):
    n = cell.hidden_size
    b = cell.bias if cell.use_bias else jnp.zeros(4 * n)

    def gate(k):
        rows = slice(k * n, (k + 1) * n)
        return cell.weight_ih[rows] @ x + cell.weight_hh[rows] @ h + b[rows]

    i, f, g, o = (
        _sigmoid(gate(0)),
        _sigmoid(gate(1)),
        jnp.tanh(gate(2)),
        _sigmoid(gate(3)),
    )
    c_next = f * c + i * g
    return o * jnp.tanh(c_next), c_next


# --------------------------------------------------------------------------- GRU


def test_gru_fields_and_shapes():
    cell = fx.nn.GRUCell(3, 5, key=KEY)
    assert _field_names(cell) == [
        "weight_ih",
        "weight_hh",
        "bias",
        "bias_n",
        "input_size",
        "hidden_size",
        "use_bias",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    assert cell.weight_ih.shape == (15, 3)
    assert cell.weight_hh.shape == (15, 5)
    assert _present(cell.bias).shape == (15,)
    assert _present(cell.bias_n).shape == (5,)


def test_gru_initialisation_is_uniform_in_the_equinox_range_and_values():
    cell = fx.nn.GRUCell(2, 3, key=KEY)
    limit = 1 / np.sqrt(3)
    for leaf in jax.tree.leaves(cell):
        assert jnp.all(jnp.abs(leaf) <= limit)
    # Recorded from equinox.nn.GRUCell(2, 3, key=jax.random.key(0)).
    assert np.allclose(
        cell.weight_ih[:2], [[0.3952703, -0.36675754], [-0.3150276, -0.43794832]]
    )
    assert np.allclose(_present(cell.bias_n), [-0.2690574, 0.27014235, 0.5239143])


@pytest.mark.parametrize("use_bias", [True, False])
def test_gru_matches_gate_equations(use_bias):
    cell = fx.nn.GRUCell(3, 4, use_bias=use_bias, key=KEY)
    x, h = _random(1, (3,)), _random(2, (4,))
    assert jnp.allclose(cell(x, h), gru_reference(cell, x, h), atol=1e-6)
    if not use_bias:
        assert cell.bias is None and cell.bias_n is None


def test_gru_gradient_matches_gate_equations():
    cell = fx.nn.GRUCell(3, 4, key=KEY)
    x, h = _random(1, (3,)), _random(2, (4,))
    cotangent = _random(3, (4,))
    got = fx.filter_grad(lambda args: jnp.sum(args[0](args[1], args[2]) * cotangent))(
        (cell, x, h)
    )
    expected = fx.filter_grad(lambda args: jnp.sum(gru_reference(*args) * cotangent))(
        (cell, x, h)
    )
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert jnp.allclose(g, e, atol=1e-5)


def test_gru_over_a_sequence_with_scan():
    cell = fx.nn.GRUCell(2, 3, key=KEY)
    xs = _random(1, (6, 2))
    final, _ = jax.lax.scan(lambda h, x: (cell(x, h), None), jnp.zeros(3), xs)
    h = jnp.zeros(3)
    for x in xs:
        h = gru_reference(cell, x, h)
    assert jnp.allclose(final, h, atol=1e-5)


# -------------------------------------------------------------------------- LSTM


def test_lstm_fields_and_shapes():
    cell = fx.nn.LSTMCell(3, 5, key=KEY)
    assert _field_names(cell) == [
        "weight_ih",
        "weight_hh",
        "bias",
        "input_size",
        "hidden_size",
        "use_bias",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    assert cell.weight_ih.shape == (20, 3)
    assert cell.weight_hh.shape == (20, 5)
    assert _present(cell.bias).shape == (20,)
    # Recorded from equinox.nn.LSTMCell(2, 3, key=jax.random.key(0)).
    recorded = fx.nn.LSTMCell(2, 3, key=KEY)
    assert np.allclose(
        _present(recorded.bias)[:3], [0.46470863, 0.47607476, -0.18354237]
    )


@pytest.mark.parametrize("use_bias", [True, False])
def test_lstm_matches_gate_equations(use_bias):
    cell = fx.nn.LSTMCell(3, 4, use_bias=use_bias, key=KEY)
    x, h, c = _random(1, (3,)), _random(2, (4,)), _random(3, (4,))
    got_h, got_c = cell(x, (h, c))
    expected_h, expected_c = lstm_reference(cell, x, h, c)
    assert jnp.allclose(got_h, expected_h, atol=1e-6)
    assert jnp.allclose(got_c, expected_c, atol=1e-6)


def test_lstm_gradient_matches_gate_equations():
    cell = fx.nn.LSTMCell(2, 3, key=KEY)
    x, h, c = _random(1, (2,)), _random(2, (3,)), _random(3, (3,))
    ct_h, ct_c = _random(4, (3,)), _random(5, (3,))

    def loss(args):
        cell, x, h, c = args
        new_h, new_c = cell(x, (h, c))
        return jnp.sum(new_h * ct_h) + jnp.sum(new_c * ct_c)

    def reference_loss(args):
        new_h, new_c = lstm_reference(*args)
        return jnp.sum(new_h * ct_h) + jnp.sum(new_c * ct_c)

    got = fx.filter_grad(loss)((cell, x, h, c))
    expected = fx.filter_grad(reference_loss)((cell, x, h, c))
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert jnp.allclose(g, e, atol=1e-5)


# ------------------------------------------------------------------ shared checks


@pytest.mark.parametrize("cls", [fx.nn.GRUCell, fx.nn.LSTMCell])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.complex64])
def test_parameter_dtype(cls, dtype):
    cell = cls(2, 3, dtype=dtype, key=KEY)
    for leaf in jax.tree.leaves(cell):
        assert leaf.dtype == dtype


@pytest.mark.parametrize("cls", [fx.nn.GRUCell, fx.nn.LSTMCell])
def test_complex_parameters_have_both_parts_drawn(cls):
    cell = cls(2, 3, dtype=jnp.complex64, key=KEY)
    assert jnp.any(cell.weight_ih.real != 0) and jnp.any(cell.weight_ih.imag != 0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_steps_stay_in_their_dtype(dtype):
    gru = fx.nn.GRUCell(2, 3, dtype=dtype, key=KEY)
    assert gru(jnp.ones(2, dtype), jnp.zeros(3, dtype)).dtype == dtype
    lstm = fx.nn.LSTMCell(2, 3, dtype=dtype, key=KEY)
    h, c = lstm(jnp.ones(2, dtype), (jnp.zeros(3, dtype), jnp.zeros(3, dtype)))
    assert h.dtype == c.dtype == dtype


def test_float64_by_default_under_x64():
    with jax.enable_x64(True):
        cell = fx.nn.GRUCell(2, 3, key=KEY)
        assert cell.weight_ih.dtype == jnp.float64
        x = jnp.ones(2, jnp.float64)
        h = jnp.zeros(3, jnp.float64)
        assert jnp.allclose(cell(x, h), gru_reference(cell, x, h), atol=1e-12)


@pytest.mark.parametrize("cls", [fx.nn.GRUCell, fx.nn.LSTMCell])
def test_same_key_same_parameters_other_key_other_parameters(cls):
    a, b = cls(2, 3, key=KEY), cls(2, 3, key=KEY)
    c = cls(2, 3, key=jax.random.key(1))
    assert fx.tree_equal(a, b)
    assert not jnp.array_equal(a.weight_ih, c.weight_ih)


def test_wrong_shapes_raise_naming_the_expected_shape():
    gru = fx.nn.GRUCell(2, 3, key=KEY)
    with pytest.raises(ValueError, match=r"`input` of shape \(2,\); got shape \(4,\)"):
        gru(jnp.ones(4), jnp.zeros(3))
    with pytest.raises(
        ValueError, match=r"`hidden` of shape \(3,\); got shape \(1, 3\)"
    ):
        gru(jnp.ones(2), jnp.zeros((1, 3)))
    lstm = fx.nn.LSTMCell(2, 3, key=KEY)
    with pytest.raises(ValueError, match=r"pair `\(h, c\)`"):
        lstm(jnp.ones(2), jnp.zeros(3))  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"`c` of shape \(3,\); got shape \(2,\)"):
        lstm(jnp.ones(2), (jnp.zeros(3), jnp.zeros(2)))


@pytest.mark.parametrize("cls", [fx.nn.GRUCell, fx.nn.LSTMCell])
def test_bad_configuration_raises(cls):
    with pytest.raises(ValueError, match="positive int hidden_size; got 0"):
        cls(2, 0, key=KEY)
    with pytest.raises(ValueError, match="non-negative int input_size"):
        cls(-1, 3, key=KEY)
    with pytest.raises(TypeError, match="key"):
        cls(2, 3, key=None)
