"""Pooling layers: checked against `lax.reduce_window` written out directly and
against loops over the windows, values and gradients."""

import dataclasses
import itertools
import math
from typing import Any

import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import filterax as fx

KEY = jr.key(0)


@pytest.fixture(autouse=True)
def strictest_numpy_semantics():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def _field_names(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _distinct(seed, shape):
    """Distinct values, so that every window has a single maximum."""
    values = jr.permutation(jr.fold_in(KEY, seed), math.prod(shape))
    return (values.astype(jnp.float32) / 7.0).reshape(shape)


def _input_gradient(pool, x, cotangent):
    """The gradient of `sum(pool(x) * cotangent)` with respect to `x`."""

    # Compiled as one program: far cheaper than dispatching each step alone.
    @jax.jit
    def gradient(x, cotangent):
        _, pullback = jax.vjp(pool, x)
        return pullback(cotangent)[0]

    return gradient(x, jnp.asarray(cotangent))


def _pads(padding, n):
    if isinstance(padding, int):
        return [(padding, padding)] * n
    return [tuple(p) if isinstance(p, tuple) else (p, p) for p in padding]


def _loop_pool(x, kernel, stride, pads, use_ceil, reduce, fill):
    """Pools by visiting each window in turn, in NumPy."""
    x = np.asarray(x, np.float64)
    out_shape = []
    for size, k, s, (before, after) in zip(x.shape[1:], kernel, stride, pads):
        span = size + before + after - k
        out_shape.append((-(-span // s) if use_ceil else span // s) + 1)
    # Room for the extra windows of `use_ceil`, which reach into more padding.
    widths = [(b, a + s + k) for (b, a), s, k in zip(pads, stride, kernel)]
    padded = np.pad(x, [(0, 0), *widths], constant_values=fill)
    out = np.empty((x.shape[0], *out_shape))
    for pos in itertools.product(*map(range, out_shape)):
        window = tuple(slice(p * s, p * s + k) for p, s, k in zip(pos, stride, kernel))
        out[(slice(None), *pos)] = reduce(
            padded[(slice(None), *window)].reshape(x.shape[0], -1), axis=1
        )
    return out


def _loop_average(x, kernel, stride, pads, use_ceil=False):
    total = _loop_pool(x, kernel, stride, pads, use_ceil, np.sum, 0.0)
    return total / math.prod(kernel)


def _loop_max(x, kernel, stride, pads, use_ceil=False):
    return _loop_pool(x, kernel, stride, pads, use_ceil, np.max, -np.inf)


POOL_CASES = [
    # n, kernel, stride, padding
    (1, 2, 3, 0),
    (1, 3, 1, 1),
    (1, 3, 2, [(0, 2)]),
    (2, 2, (3, 2), 0),
    (2, (3, 2), 2, (1, 0)),
    (2, 3, 1, [(1, 2), (0, 1)]),
    (3, 2, (2, 1, 2), (1, 0, 1)),
    (3, (1, 3, 2), 2, 0),
]

AVG = {1: fx.nn.AvgPool1d, 2: fx.nn.AvgPool2d, 3: fx.nn.AvgPool3d}
MAX = {1: fx.nn.MaxPool1d, 2: fx.nn.MaxPool2d, 3: fx.nn.MaxPool3d}


@pytest.mark.parametrize("n, kernel, stride, padding", POOL_CASES)
def test_pools_match_reduce_window(n, kernel, stride, padding):
    x = _distinct(1, (2, 7, 6, 5)[: n + 1])
    kernel_t = (kernel,) * n if isinstance(kernel, int) else kernel
    stride_t = (stride,) * n if isinstance(stride, int) else stride
    pads = [(0, 0), *_pads(padding, n)]

    def window_reduce(init, op):
        return lax.reduce_window(x, init, op, (1, *kernel_t), (1, *stride_t), pads)

    np.testing.assert_array_equal(
        MAX[n](kernel, stride, padding)(x), window_reduce(-jnp.inf, lax.max)
    )
    np.testing.assert_allclose(
        AVG[n](kernel, stride, padding)(x),
        window_reduce(0.0, lax.add) / math.prod(kernel_t),
        rtol=1e-6,
    )


@pytest.mark.parametrize("n, kernel, stride, padding", POOL_CASES)
@pytest.mark.parametrize("use_ceil", [False, True])
def test_pools_match_a_loop_over_the_windows(n, kernel, stride, padding, use_ceil):
    x = _distinct(2, (2, 7, 6, 5)[: n + 1])
    kernel_t = (kernel,) * n if isinstance(kernel, int) else kernel
    stride_t = (stride,) * n if isinstance(stride, int) else stride
    pads = _pads(padding, n)
    try:
        max_out = MAX[n](kernel, stride, padding, use_ceil)(x)
    except ValueError as error:
        # `use_ceil` may need padding wider than the kernel, which is refused.
        assert use_ceil and "may not exceed the kernel size" in str(error)
        return
    avg_out = AVG[n](kernel, stride, padding, use_ceil)(x)
    expected_max = _loop_max(x, kernel_t, stride_t, pads, use_ceil)
    expected_avg = _loop_average(x, kernel_t, stride_t, pads, use_ceil)
    np.testing.assert_array_equal(max_out, expected_max.astype(np.float32))
    np.testing.assert_allclose(avg_out, expected_avg, rtol=1e-6, atol=1e-6)


def test_use_ceil_rounds_the_output_size_up():
    x = jnp.arange(14.0).reshape(1, 14)
    assert fx.nn.MaxPool1d(3, 3)(x).shape == (1, 4)
    out = fx.nn.MaxPool1d(3, 3, use_ceil=True)(x)
    np.testing.assert_array_equal(out, [[2.0, 5.0, 8.0, 11.0, 13.0]])
    # An exact fit adds nothing.
    assert fx.nn.MaxPool1d(2, 4, use_ceil=True)(x).shape == (1, 4)


def test_average_counts_padding_as_zeros():
    out = fx.nn.AvgPool1d(2, 2, padding=1)(jnp.array([[4.0, 6.0, 8.0]]))
    np.testing.assert_array_equal(out, [[2.0, 7.0]])


def _loop_max_gradient(x, kernel, stride, pads, cotangent):
    """Each window passes its cotangent to its maximum element."""
    x = np.asarray(x)
    padded = np.pad(x, [(0, 0), *pads], constant_values=-np.inf)
    grad = np.zeros_like(padded)
    for c, pos in itertools.product(
        range(x.shape[0]), itertools.product(*map(range, cotangent.shape[1:]))
    ):
        starts = [p * s for p, s in zip(pos, stride)]
        window = padded[(c, *(slice(b, b + k) for b, k in zip(starts, kernel)))]
        offset = np.unravel_index(np.argmax(window), window.shape)
        grad[(c, *(b + o for b, o in zip(starts, offset)))] += cotangent[(c, *pos)]
    inner = tuple(slice(b, b + size) for (b, _), size in zip(pads, x.shape[1:]))
    return grad[(slice(None), *inner)]


def _loop_average_gradient(x, kernel, stride, pads, cotangent):
    """Each window spreads its cotangent evenly over its elements."""
    padded = np.zeros(
        [x.shape[0]] + [n + b + a for n, (b, a) in zip(x.shape[1:], pads)]
    )
    for pos in itertools.product(*map(range, cotangent.shape[1:])):
        window = tuple(slice(p * s, p * s + k) for p, s, k in zip(pos, stride, kernel))
        share = np.asarray(cotangent)[(slice(None), *pos)] / math.prod(kernel)
        padded[(slice(None), *window)] += share.reshape(-1, *([1] * len(kernel)))
    inner = tuple(slice(b, b + size) for (b, _), size in zip(pads, x.shape[1:]))
    return padded[(slice(None), *inner)]


@pytest.mark.parametrize("n, kernel, stride, padding", POOL_CASES)
def test_pool_gradients_match_loops(n, kernel, stride, padding):
    x = _distinct(3, (2, 7, 6, 5)[: n + 1])
    kernel_t = (kernel,) * n if isinstance(kernel, int) else kernel
    stride_t = (stride,) * n if isinstance(stride, int) else stride
    pads = _pads(padding, n)
    for pools, loop_gradient in (
        (MAX, _loop_max_gradient),
        (AVG, _loop_average_gradient),
    ):
        pool = pools[n](kernel, stride, padding)
        cotangent = jr.normal(jr.fold_in(KEY, 4), pool(x).shape)
        grad = _input_gradient(pool, x, cotangent)
        expected = loop_gradient(x, kernel_t, stride_t, pads, cotangent)
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


def test_pool_with_a_custom_operation():
    pool = fx.nn.Pool(1.0, lax.mul, 1, kernel_size=2, stride=1)
    out = pool(jnp.array([[1.0, 2.0, 3.0, 4.0]]))
    np.testing.assert_array_equal(out, [[2.0, 6.0, 12.0]])


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_pools_keep_floating_dtypes(dtype):
    x = _distinct(5, (2, 6, 6)).astype(dtype)
    for pool in (fx.nn.MaxPool2d(2, 2), fx.nn.AvgPool2d(2, 2)):
        out = pool(x)
        assert out.dtype == dtype
        expected = pool(x.astype(jnp.float32))
        np.testing.assert_allclose(out.astype(jnp.float32), expected, rtol=1e-2)


def test_pools_on_integers_and_float64():
    x = jnp.arange(6, dtype=jnp.int32).reshape(1, 6)
    max_out = fx.nn.MaxPool1d(2, 2)(x)
    assert max_out.dtype == jnp.int32
    np.testing.assert_array_equal(max_out, [[1, 3, 5]])
    avg_out = fx.nn.AvgPool1d(2, 2)(x)
    assert avg_out.dtype == jnp.float32
    np.testing.assert_array_equal(avg_out, [[0.5, 2.5, 4.5]])
    with jax.enable_x64(True):
        assert fx.nn.AvgPool1d(2)(jnp.ones((1, 4), jnp.float64)).dtype == jnp.float64


def test_pool_fields_are_equinox_fields_in_equinox_order():
    assert _field_names(fx.nn.MaxPool2d) == [
        "init",
        "operation",
        "num_spatial_dims",
        "kernel_size",
        "stride",
        "padding",
        "use_ceil",
    ]
    assert jax.tree.leaves(fx.nn.MaxPool2d(2)) == [-jnp.inf, lax.max]
    assert jax.tree.leaves(fx.nn.AvgPool3d(2)) == [0, lax.add]
    assert _field_names(fx.nn.AdaptiveAvgPool2d) == [
        "target_shape",
        "operation",
    ]
    pool = fx.nn.MaxPool2d([3, 2], stride=[1, 2], padding=[(1, 0), 1])
    assert (pool.kernel_size, pool.stride) == ((3, 2), (1, 2))
    assert pool.padding == ((1, 0), (1, 1))
    assert fx.nn.AdaptiveMaxPool2d([2, 3]).target_shape == (2, 3)


def test_pools_work_under_filter_jit_and_vmap():
    pool = fx.nn.MaxPool2d(2, 2)
    batch = _distinct(6, (3, 2, 4, 4))
    out = fx.filter_jit(lambda p, x: jax.vmap(p)(x))(pool, batch)
    np.testing.assert_array_equal(out[1], pool(batch[1]))
    adaptive = fx.nn.AdaptiveAvgPool2d(2)
    out = fx.filter_jit(lambda p, x: jax.vmap(p)(x))(adaptive, batch)
    np.testing.assert_allclose(out[2], adaptive(batch[2]), rtol=1e-6)


# --- adaptive pooling --------------------------------------------------------


def _windows(size, target):
    """The `(start, stop)` of each adaptive window: the first `size % target`
    windows are one element longer than the rest."""
    base, extra = divmod(size, target)
    lengths = [base + 1] * extra + [base] * (target - extra)
    stops = np.cumsum(lengths)
    return list(zip(stops - lengths, stops))


def _loop_adaptive(x, target_shape, reduce):
    x = np.asarray(x)
    per_axis = [_windows(n, t) for n, t in zip(x.shape[1:], target_shape)]
    out = np.empty((x.shape[0], *target_shape), x.dtype)
    for pos in itertools.product(*map(range, target_shape)):
        window = tuple(slice(*per_axis[a][p]) for a, p in enumerate(pos))
        block = x[(slice(None), *window)].reshape(x.shape[0], -1)
        out[(slice(None), *pos)] = reduce(block, axis=1)
    return out


ADAPTIVE_AVG = {
    1: fx.nn.AdaptiveAvgPool1d,
    2: fx.nn.AdaptiveAvgPool2d,
    3: fx.nn.AdaptiveAvgPool3d,
}
ADAPTIVE_MAX = {
    1: fx.nn.AdaptiveMaxPool1d,
    2: fx.nn.AdaptiveMaxPool2d,
    3: fx.nn.AdaptiveMaxPool3d,
}
ADAPTIVE_CASES = [
    (1, (14,), 4),
    (1, (9,), 9),
    (1, (10,), 1),
    (2, (7, 6), (3, 4)),
    (2, (5, 8), 2),
    (3, (5, 4, 6), (2, 1, 4)),
    (3, (3, 3, 3), 3),
]


@pytest.mark.parametrize("n, spatial, target", ADAPTIVE_CASES)
def test_adaptive_pools_match_a_loop_over_the_windows(n, spatial, target):
    x = _distinct(7, (3, *spatial))
    target_shape = (target,) * n if isinstance(target, int) else target
    max_out = ADAPTIVE_MAX[n](target)(x)
    avg_out = ADAPTIVE_AVG[n](target)(x)
    assert max_out.shape == avg_out.shape == (3, *target_shape)
    np.testing.assert_array_equal(max_out, _loop_adaptive(x, target_shape, np.max))
    np.testing.assert_allclose(
        avg_out, _loop_adaptive(x, target_shape, np.mean), rtol=1e-6
    )


@pytest.mark.parametrize("n, spatial, target", ADAPTIVE_CASES)
def test_adaptive_pool_gradients_match_loops(n, spatial, target):
    x = _distinct(8, (2, *spatial))
    target_shape = (target,) * n if isinstance(target, int) else target
    cotangent = np.asarray(jr.normal(jr.fold_in(KEY, 9), (2, *target_shape)))
    per_axis = [_windows(s, t) for s, t in zip(spatial, target_shape)]
    expected_max = np.zeros(x.shape, np.float32)
    expected_avg = np.zeros(x.shape, np.float32)
    for c, pos in itertools.product(
        range(2), itertools.product(*map(range, target_shape))
    ):
        window = tuple(slice(*per_axis[a][p]) for a, p in enumerate(pos))
        block = np.asarray(x)[(c, *window)]
        expected_avg[(c, *window)] += cotangent[(c, *pos)] / block.size
        offset = np.unravel_index(np.argmax(block), block.shape)
        corner = tuple(s.start + o for s, o in zip(window, offset))
        expected_max[(c, *corner)] += cotangent[(c, *pos)]
    for pool, expected in (
        (ADAPTIVE_MAX[n](target), expected_max),
        (ADAPTIVE_AVG[n](target), expected_avg),
    ):
        grad = _input_gradient(pool, x, cotangent)
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


def test_adaptive_pool_with_a_custom_operation_reduces_one_axis_at_a_time():
    pool = fx.nn.AdaptivePool((2, 1), 2, jnp.median)
    x = _distinct(10, (2, 5, 3))
    # A median is not separable: the first axis is reduced, then the second.
    first_axis = _loop_adaptive(x, (2, 3), np.median)
    expected = _loop_adaptive(first_axis, (2, 1), np.median)
    np.testing.assert_allclose(pool(x), expected, rtol=1e-6)


def test_adaptive_pool_to_the_input_shape_is_the_identity():
    x = _distinct(11, (2, 3, 4))
    np.testing.assert_array_equal(fx.nn.AdaptiveAvgPool2d((3, 4))(x), x)
    np.testing.assert_array_equal(fx.nn.AdaptiveMaxPool2d((3, 4))(x), x)


def test_adaptive_average_keeps_low_precision_dtypes():
    for dtype in (jnp.float16, jnp.bfloat16):
        out = fx.nn.AdaptiveAvgPool1d(2)(jnp.ones((1, 5), dtype))
        assert out.dtype == dtype
        np.testing.assert_array_equal(out.astype(jnp.float32), [[1.0, 1.0]])


# --- errors ------------------------------------------------------------------


def test_wrong_input_rank_says_what_shape_was_expected():
    with pytest.raises(
        ValueError, match=r"MaxPool2d .* 2 spatial .* got shape \(4, 4\)"
    ):
        fx.nn.MaxPool2d(2)(jnp.ones((4, 4)))
    with pytest.raises(ValueError, match=r"1 spatial dimension.*got shape \(1, 2, 8\)"):
        fx.nn.AdaptiveAvgPool1d(2)(jnp.ones((1, 2, 8)))


def test_padding_wider_than_the_kernel_is_an_error():
    with pytest.raises(ValueError, match=r"padding \(3, 3\) .* kernel size 2"):
        fx.nn.AvgPool1d(2, padding=3)
    # `use_ceil` adds a stride of padding at the end where windows do not fit.
    pool = fx.nn.MaxPool1d(2, stride=3, use_ceil=True)
    with pytest.raises(ValueError, match=r"padding \(0, 3\) .* `use_ceil`"):
        pool(jnp.ones((1, 6)))
    with pytest.raises(RuntimeError):  # Equinox's type too
        pool(jnp.ones((1, 6)))


def test_malformed_pool_arguments_are_errors():
    with pytest.raises(
        ValueError, match="`padding` must be an int, or a sequence of 2"
    ):
        fx.nn.MaxPool2d(2, padding=(1, 1, 1))
    with pytest.raises(
        ValueError, match="`kernel_size` must be an int or a sequence of 3"
    ):
        fx.nn.AvgPool3d((2, 2))
    with pytest.raises(ValueError, match="`stride` must be at least 1"):
        fx.nn.AvgPool1d(2, stride=0)
    with pytest.raises(
        ValueError, match="`target_shape` must be an int or a sequence of 2"
    ):
        fx.nn.AdaptiveMaxPool2d((1, 2, 3))
    with pytest.raises(ValueError, match="`target_shape` must be at least 1"):
        fx.nn.AdaptiveMaxPool1d(0)


def test_adaptive_target_larger_than_the_input_is_an_error():
    with pytest.raises(ValueError, match=r"spatial dimension 1 of size 3 to size 4"):
        fx.nn.AdaptiveAvgPool2d(4)(jnp.ones((1, 5, 3)))


def test_max_pool_gradients_are_bit_for_bit_those_of_channels_last_pooling():
    # Equinox pools channels last; XLA rounds the backward pass of another
    # layout differently, which showed in a ported CNN's conv-bias gradients.
    conv_key, data_key = jr.split(jr.key(0))
    conv = fx.nn.Conv2d(1, 4, 3, padding=1, key=conv_key)
    x = jr.normal(data_key, (96, 1, 16, 16))

    def channels_last(z):
        z = jnp.moveaxis(z, 0, -1)[None]
        z = lax.reduce_window(z, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jnp.moveaxis(z[0], -1, 0)

    def loss(conv, pool):
        return jnp.sum(jnp.sin(jax.vmap(lambda a: pool(jax.nn.relu(conv(a))))(x)))

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    ours = grad(conv, fx.nn.MaxPool2d(2, 2))
    np.testing.assert_array_equal(ours.bias, grad(conv, channels_last).bias)
    np.testing.assert_array_equal(ours.weight, grad(conv, channels_last).weight)
