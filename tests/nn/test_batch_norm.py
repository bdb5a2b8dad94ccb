"""`filterax.nn.BatchNorm`, against the mean and variance formulas."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

EPS = 1e-5


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def _run(bn, state, x, **kwargs):
    """One step on a batch `x` of shape (batch, channels, *spatial)."""
    call = lambda x, state: bn(x, state, **kwargs)  # noqa: E731
    return jax.vmap(call, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
        x, state
    )


def _statistics(x):
    """Per channel, over the batch and every spatial position."""
    axes = (0, *range(2, x.ndim))
    return jnp.mean(x, axis=axes), jnp.var(x, axis=axes)


def _normalise(x, mean, var, weight=None, bias=None):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    out = (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + EPS)
    if weight is not None and bias is not None:
        out = out * weight.reshape(shape) + bias.reshape(shape)
    return out


def _batches():
    key = jax.random.key(0)
    return [
        jax.random.normal(jax.random.fold_in(key, i), (8, 3, 4)) * (i + 1) + 2 * i
        for i in range(3)
    ]


def test_ema_mode_follows_the_moving_average():
    m = 0.9
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(
        3, "batch", momentum=m, mode="ema"
    )
    running = None
    for x in _batches():
        y, state = _run(bn, state, x)
        mean, var = _statistics(x)
        if running is None:  # the first batch starts the average
            running = (mean, var)
        else:
            running = (m * running[0] + (1 - m) * mean, m * running[1] + (1 - m) * var)
        np.testing.assert_allclose(y, _normalise(x, *running), rtol=1e-4, atol=1e-5)
        stored_mean, stored_var = state.get(bn.ema_state_index)
        np.testing.assert_allclose(stored_mean, running[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stored_var, running[1], rtol=1e-5)
    assert not bool(state.get(bn.ema_first_time_index))


def test_batch_mode_normalises_with_the_batch_and_averages_from_zero_and_one():
    m = 0.9
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(
        3, "batch", momentum=m, mode="batch"
    )
    running = (jnp.zeros(3), jnp.ones(3))
    batches = _batches()
    for x in batches:
        y, state = _run(bn, state, x)
        mean, var = _statistics(x)
        np.testing.assert_allclose(y, _normalise(x, mean, var), rtol=1e-4, atol=1e-5)
        running = (m * running[0] + (1 - m) * mean, m * running[1] + (1 - m) * var)
        stored_mean, stored_var = state.get(bn.batch_state_index)
        np.testing.assert_allclose(stored_mean, running[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stored_var, running[1], rtol=1e-5)
    assert int(state.get(bn.batch_counter)) == len(batches)
    # Inference removes the bias of the (0, 1) start: 1 - m**steps.
    total = 1 - m ** len(batches)
    x = batches[0]
    before = jax.tree_util.tree_leaves(state)
    y, after = _run(fx.nn.inference_mode(bn), state, x)
    expected = _normalise(x, running[0] / total, running[1] / total)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(after), before):
        np.testing.assert_array_equal(a, b)


def test_batch_mode_inference_before_training_uses_zero_and_one():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(
        3, "batch", mode="batch", inference=True
    )
    x = _batches()[1]
    y, _ = _run(bn, state, x)
    np.testing.assert_allclose(y, x / jnp.sqrt(1 + EPS), rtol=1e-6)


def test_ema_inference_uses_the_running_statistics_and_leaves_the_state_alone():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="ema")
    first, second, _ = _batches()
    _, state = _run(bn, state, first)
    running = state.get(bn.ema_state_index)
    y, state_after = _run(bn, state, second, inference=True)
    np.testing.assert_allclose(y, _normalise(second, *running), rtol=1e-4, atol=1e-5)
    for a, b in zip(state_after.get(bn.ema_state_index), running):
        np.testing.assert_array_equal(a, b)


def test_channelwise_affine_scales_and_shifts():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
    np.testing.assert_array_equal(bn.weight, jnp.ones(3))
    np.testing.assert_array_equal(bn.bias, jnp.zeros(3))
    weight, bias = jnp.array([1.0, 2.0, -1.0]), jnp.array([0.5, 0.0, 3.0])
    bn = fx.tree_at(lambda b: (b.weight, b.bias), bn, (weight, bias))
    x = _batches()[0]
    y, _ = _run(bn, state, x)
    mean, var = _statistics(x)
    np.testing.assert_allclose(
        y, _normalise(x, mean, var, weight, bias), rtol=1e-4, atol=1e-5
    )


def test_without_affine_there_are_no_parameters():
    bn = fx.nn.BatchNorm(3, "batch", channelwise_affine=False, mode="batch")
    assert bn.weight is None and bn.bias is None


def test_gradients_match_the_formula():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
    weight, bias = jnp.array([1.0, 2.0, -1.0]), jnp.array([0.5, 0.0, 3.0])
    bn = fx.tree_at(lambda b: (b.weight, b.bias), bn, (weight, bias))
    x = _batches()[1]
    r = jax.random.normal(jax.random.key(9), x.shape)

    def loss(bn, x):
        y, _ = _run(bn, state, x)
        return jnp.sum(y * r)

    def loss_by_hand(weight, bias, x):
        return jnp.sum(_normalise(x, *_statistics(x), weight, bias) * r)

    grads = fx.filter_grad(loss)(bn, x)
    dw, db, dx = jax.grad(loss_by_hand, argnums=(0, 1, 2))(weight, bias, x)
    np.testing.assert_allclose(grads.weight, dw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads.bias, db, rtol=1e-5)
    np.testing.assert_allclose(
        jax.grad(loss, argnums=1)(bn, x), dx, rtol=1e-3, atol=1e-4
    )


def test_gradients_are_bit_for_bit_those_of_equinox_s_operations():
    # Equinox computes `x - mean` twice for the variance. The gradient of a
    # shift, zero in exact arithmetic, is rounding noise that Adam turns into
    # full steps, so ported training runs match only if the noise does.
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
    x = _batches()[2]

    def stats(y):
        mean = jax.lax.pmean(jnp.mean(y), "batch")
        var = jax.lax.pmean(jnp.mean((y - mean) * jnp.conj(y - mean)), "batch")
        return mean, jnp.maximum(0.0, var)

    def by_hand(x):
        def one(x):
            mean, var = jax.vmap(stats)(x)
            out = (x - mean[:, None]) / jnp.sqrt(var[:, None] + EPS)
            return out * bn.weight[:, None] + bn.bias[:, None]

        return jnp.sin(jax.vmap(one, axis_name="batch")(x)).sum()

    def through_layer(x):
        return jnp.sin(_run(bn, state, x)[0]).sum()

    np.testing.assert_array_equal(jax.grad(through_layer)(x), jax.grad(by_hand)(x))


def test_several_axis_names_normalise_over_all_of_them():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(
        3, ("outer", "inner"), mode="batch"
    )
    x = jax.random.normal(jax.random.key(1), (4, 5, 3)) * 2 + 1
    inner = jax.vmap(bn, axis_name="inner", in_axes=(0, None), out_axes=(0, None))
    outer = jax.vmap(inner, axis_name="outer", in_axes=(0, None), out_axes=(0, None))
    y, state = outer(x, state)
    flat = x.reshape(20, 3)
    expected = _normalise(flat, *_statistics(flat)).reshape(4, 5, 3)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_low_precision(dtype):
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(
        3, "batch", mode="ema", dtype=dtype
    )
    x = _batches()[0].astype(dtype)
    y, state = _run(bn, state, x)
    assert y.dtype == dtype
    assert {a.dtype for a in state.get(bn.ema_state_index)} == {jnp.dtype(dtype)}
    reference = _normalise(x.astype(jnp.float32), *_statistics(x.astype(jnp.float32)))
    np.testing.assert_allclose(y.astype(jnp.float32), reference, rtol=0.05, atol=0.05)


def test_float64_under_x64():
    with jax.enable_x64(True):
        bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
        assert bn.weight.dtype == jnp.float64
        assert state.get(bn.batch_counter).dtype == jnp.int64
        y, _ = _run(bn, state, _batches()[0].astype(jnp.float64))
        assert y.dtype == jnp.float64


def test_outside_a_named_map_is_a_name_error():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
    with pytest.raises(NameError, match="axis_name='batch'"):
        bn(jnp.ones(3), state)
    with pytest.raises(NameError):
        jax.vmap(bn, in_axes=(0, None), out_axes=(0, None))(jnp.ones((2, 3)), state)


def test_wrong_number_of_channels():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
    with pytest.raises(ValueError, match=r"shape \(3, \.\.\.\)"):
        _run(bn, state, jnp.ones((2, 4)))


def test_mode():
    with pytest.raises(ValueError, match="'ema' or 'batch'"):
        fx.nn.BatchNorm(3, "batch", mode="running")  # pyright: ignore[reportArgumentType]
    with pytest.warns(UserWarning, match="mode"):
        bn = fx.nn.BatchNorm(3, "batch")
    assert bn.mode == "ema"
    with pytest.warns(UserWarning, match="mode"):  # Equinox's default, spelt out
        assert fx.nn.BatchNorm(3, "batch", mode="legacy").mode == "ema"


def test_mode_none_means_legacy_too():
    # The default itself is checked against Equinox's signature in
    # test_equinox_signatures.py.
    with pytest.warns(fx.FilteraxWarning, match="mode"):
        assert fx.nn.BatchNorm(3, "batch", mode=None).mode == "ema"


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_statistics_are_float32_for_half_precision_inputs(dtype):
    # Values near 300: the squares of the deviations (about 1e4 to 1e5) pass
    # float16's largest value when summed, and bfloat16 cannot hold the
    # deviations themselves; the statistics are float32, so neither matters.
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(
        3, "batch", mode="batch", dtype=jnp.float32
    )
    x32 = 300.0 + 100.0 * jnp.asarray(_batches()[0])
    y, state = _run(bn, state, x32.astype(dtype))
    assert y.dtype == dtype
    assert {a.dtype for a in state.get(bn.batch_state_index)} == {jnp.dtype("float32")}
    exact = x32.astype(dtype).astype(jnp.float32)
    reference = _normalise(exact, *_statistics(exact))
    np.testing.assert_allclose(y.astype(jnp.float32), reference, rtol=0.02, atol=0.02)


def test_fields_and_state_are_equinox_s():
    assert [f.name for f in dataclasses.fields(fx.nn.BatchNorm)] == [
        "weight",
        "bias",
        "ema_first_time_index",
        "ema_state_index",
        "batch_counter",
        "batch_state_index",
        "axis_name",
        "inference",
        "input_size",
        "eps",
        "channelwise_affine",
        "momentum",
        "mode",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    ema = fx.nn.BatchNorm(3, "batch", mode="ema")
    assert ema.batch_counter is None and ema.batch_state_index is None
    batch = fx.nn.BatchNorm(3, "batch", mode="batch")
    assert batch.ema_first_time_index is None and batch.ema_state_index is None
    _, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="ema")
    assert repr(state) == (
        "State(BatchNorm.ema_first_time_index=bool[], "
        "BatchNorm.ema_state_index=(f32[3], f32[3]))"
    )
