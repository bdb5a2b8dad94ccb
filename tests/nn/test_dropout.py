"""`filterax.nn.Dropout`, with PRNG keys and with `filterax.RngStream`."""

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


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_drop_rate_and_scaling(p):
    x = jnp.full((200_000,), 3.0)
    y = fx.nn.Dropout(p)(x, key=jax.random.key(0))
    dropped = y == 0
    # The fraction dropped is within 5 standard deviations of p.
    std = (p * (1 - p) / x.size) ** 0.5
    assert abs(float(jnp.mean(dropped)) - p) < 5 * std
    np.testing.assert_allclose(y[~dropped], 3.0 / (1 - p), rtol=1e-6)
    # So the mean is preserved.
    assert abs(float(jnp.mean(y)) - 3.0) < 0.05


def test_mask_is_a_bernoulli_draw_of_the_keep_probability():
    key = jax.random.key(5)
    x = jnp.arange(1.0, 33.0)
    y = fx.nn.Dropout(0.25)(x, key=key)
    keep = jax.random.bernoulli(key, 0.75, x.shape)
    np.testing.assert_array_equal(y, jnp.where(keep, x / 0.75, 0.0))


def test_gradient_is_the_mask_over_the_keep_probability():
    key = jax.random.key(1)
    dropout = fx.nn.Dropout(0.4)
    x = jnp.linspace(-1.0, 1.0, 50)
    grad = jax.grad(lambda x: jnp.sum(dropout(x, key=key)))(x)
    keep = jax.random.bernoulli(key, 0.6, x.shape)
    np.testing.assert_allclose(grad, jnp.where(keep, 1 / 0.6, 0.0), rtol=1e-6)


def test_no_gradient_flows_to_p():
    dropout = fx.nn.Dropout(jnp.array(0.5))  # pyright: ignore[reportArgumentType]
    grads = fx.filter_grad(lambda d: jnp.sum(d(jnp.ones(8), key=jax.random.key(0))))(
        dropout
    )
    assert float(grads.p) == 0.0


def test_inference_returns_the_input_itself():
    x = jnp.arange(4.0)
    assert fx.nn.Dropout(inference=True)(x) is x
    assert fx.nn.Dropout()(x, inference=True) is x
    assert fx.nn.Dropout()(x, key=jax.random.key(0), inference=True) is x
    assert fx.nn.Dropout(0.0)(x) is x


def test_call_argument_overrides_the_flag():
    x = jnp.ones(64)
    y = fx.nn.Dropout(0.5, inference=True)(x, key=jax.random.key(0), inference=False)
    assert bool(jnp.any(y == 0))


def test_flags_can_be_changed_with_tree_at_and_inference_mode():
    dropout = fx.nn.Dropout(0.5, inference=True)
    training = fx.tree_at(lambda d: d.inference, dropout, False)
    assert bool(jnp.any(training(jnp.ones(64), key=jax.random.key(0)) == 0))
    assert fx.nn.inference_mode(training).inference is True
    assert [f.name for f in dataclasses.fields(fx.nn.Dropout)] == ["p", "inference"]


def test_a_key_is_needed_in_training():
    with pytest.raises(RuntimeError, match="needs a key"):
        fx.nn.Dropout(0.5)(jnp.ones(3))


def test_p_must_be_a_probability():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        fx.nn.Dropout(1.5)


def test_deterministic_is_a_deprecated_alias():
    with pytest.warns(fx.FilteraxDeprecationWarning, match="inference"):
        dropout = fx.nn.Dropout(deterministic=True)
    assert dropout.inference is True and dropout.deterministic is True
    x = jnp.ones(3)
    with pytest.warns(fx.FilteraxDeprecationWarning, match="inference"):
        assert fx.nn.Dropout()(x, deterministic=True) is x


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_low_precision_inputs_keep_their_dtype(dtype):
    y = fx.nn.Dropout(0.3)(jnp.ones(16, dtype), key=jax.random.key(0))
    assert y.dtype == dtype


def test_float64_under_x64():
    with jax.enable_x64(True):
        y = fx.nn.Dropout(0.3)(jnp.ones(16, jnp.float64), key=jax.random.key(0))
        assert y.dtype == jnp.float64


def test_under_filter_jit_and_vmap_with_keys():
    dropout = fx.nn.Dropout(0.5)
    keys = jax.random.split(jax.random.key(0), 4)
    x = jnp.ones((4, 16))
    ys = fx.filter_jit(
        fx.filter_vmap(lambda d, x, k: d(x, key=k), in_axes=(None, 0, 0))
    )(dropout, x, keys)
    for y, row, key in zip(ys, x, keys):
        np.testing.assert_array_equal(y, dropout(row, key=key))


# --- RngStream ------------------------------------------------------------------------


def test_rng_stream_draws_one_key_per_call():
    dropout = fx.nn.Dropout(0.5)
    x = jnp.arange(1.0, 65.0)
    stream = fx.RngStream(jax.random.key(7))
    first, second = dropout(x, key=stream), dropout(x, key=stream)
    base = jax.random.key(7)
    np.testing.assert_array_equal(first, dropout(x, key=jax.random.fold_in(base, 0)))
    np.testing.assert_array_equal(second, dropout(x, key=jax.random.fold_in(base, 1)))
    assert int(stream.count[...]) == 2


def test_rng_stream_is_not_drawn_from_in_inference():
    stream = fx.RngStream(0)
    x = jnp.ones(3)
    assert fx.nn.Dropout(0.5, inference=True)(x, key=stream) is x
    assert fx.nn.Dropout(0.0)(x, key=stream) is x
    assert int(stream.count[...]) == 0


def test_rng_stream_inside_lax_scan_matches_eager_calls():
    dropout = fx.nn.Dropout(0.5)
    xs = jnp.arange(1.0, 41.0).reshape(5, 8)
    stream = fx.RngStream(3)

    def body(carry, x):
        return carry, dropout(x, key=stream)

    _, ys = jax.lax.scan(body, None, xs)
    assert int(stream.count[...]) == 5
    eager_stream = fx.RngStream(3)
    eager = jnp.stack([dropout(x, key=eager_stream) for x in xs])
    np.testing.assert_array_equal(ys, eager)


def test_rng_stream_under_filter_jit_matches_eager_calls():
    dropout = fx.nn.Dropout(0.5)
    x = jnp.arange(1.0, 33.0)

    @fx.filter_jit
    def apply(dropout, x, stream):
        return dropout(x, key=stream)

    stream = fx.RngStream(11)
    jitted = [apply(dropout, x, stream) for _ in range(3)]
    assert int(stream.count[...]) == 3
    eager_stream = fx.RngStream(11)
    for y in jitted:
        np.testing.assert_array_equal(y, dropout(x, key=eager_stream))
