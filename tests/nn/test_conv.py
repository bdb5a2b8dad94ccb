"""`Conv*` and `ConvTranspose*`: checked against `lax.conv_general_dilated` written
out directly and against loops over the definitions; transposed convolutions
checked as the adjoints of the matching convolutions."""

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


def _normal(seed, shape, dtype=jnp.float32):
    return jr.normal(jr.fold_in(KEY, seed), shape, dtype)


# --- reference implementations, written independently of the layers ---------


def _same_pads(size, kernel, stride, dilation, lower):
    """The padding that makes a convolution's output `ceil(size / stride)` long."""
    out = -(-size // stride)
    total = max((out - 1) * stride + dilation * (kernel - 1) + 1 - size, 0)
    small = total // 2
    return (total - small, small) if lower else (small, total - small)


def _pads(padding, spatial, kernel, stride, dilation):
    """`(before, after)` per spatial dimension for every accepted padding form."""
    n = len(spatial)
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            return [(0, 0)] * n
        lower = padding.upper() == "SAME_LOWER"
        return [
            _same_pads(size, k, s, d, lower)
            for size, k, s, d in zip(spatial, kernel, stride, dilation)
        ]
    if isinstance(padding, int):
        return [(padding, padding)] * n
    return [tuple(p) if isinstance(p, (tuple, list)) else (p, p) for p in padding]


def _source_index(i, size, mode):
    """Which input element sits at (unpadded) position `i` under `mode`."""
    if mode == "REFLECT":
        period = 2 * (size - 1)
        i %= period
        return i if i < size else period - i
    if mode == "REPLICATE":
        return min(max(i, 0), size - 1)
    assert mode == "CIRCULAR"
    return i % size


def _mode_pad(x, pads, mode):
    """Pads the spatial axes of `x` by gathering, differentiably."""
    for axis, (before, after) in enumerate(pads, start=1):
        size = x.shape[axis]
        index = [_source_index(i, size, mode) for i in range(-before, size + after)]
        x = jnp.take(x, jnp.asarray(index), axis=axis)
    return x


def _reference_conv(x, weight, bias, stride, pads, dilation, groups, mode):
    if mode != "ZEROS":
        x = _mode_pad(x, pads, mode)
        pads = [(0, 0)] * len(pads)
    out = lax.conv_general_dilated(
        x[None],
        weight,
        window_strides=stride,
        padding=pads,
        rhs_dilation=dilation,
        feature_group_count=groups,
    )[0]
    return out if bias is None else out + bias


def _loop_conv(x, weight, stride, pads, dilation, groups):
    """Cross-correlation by its definition, in NumPy."""
    x = np.pad(np.asarray(x), [(0, 0), *pads])
    weight = np.asarray(weight)
    out_channels, in_per_group, *kernel = weight.shape
    out_per_group = out_channels // groups
    out_shape = [
        (size - d * (k - 1) - 1) // s + 1
        for size, k, s, d in zip(x.shape[1:], kernel, stride, dilation)
    ]
    out = np.zeros((out_channels, *out_shape), np.result_type(x, weight))
    for o, pos, c, tap in itertools.product(
        range(out_channels),
        itertools.product(*map(range, out_shape)),
        range(in_per_group),
        itertools.product(*map(range, kernel)),
    ):
        source = tuple(p * s + t * d for p, s, t, d in zip(pos, stride, tap, dilation))
        channel = (o // out_per_group) * in_per_group + c
        out[(o, *pos)] += weight[(o, c, *tap)] * x[(channel, *source)]
    return out


def _loop_conv_transpose(
    x, weight, stride, before, dilation, groups, out_spatial, wrap
):
    """Transposed convolution by its definition (a scatter), in NumPy: input
    element `i` reaches output `i * stride + tap * dilation - before` through
    the flipped kernel tap `tap`."""
    x = np.asarray(x)
    weight = np.asarray(weight)
    out_channels, in_per_group, *kernel = weight.shape
    out_per_group = out_channels // groups
    out = np.zeros((out_channels, *out_spatial), np.result_type(x, weight))
    for o, pos, c, tap in itertools.product(
        range(out_channels),
        itertools.product(*map(range, x.shape[1:])),
        range(in_per_group),
        itertools.product(*map(range, kernel)),
    ):
        target = [
            p * s + t * d - b
            for p, s, t, d, b in zip(pos, stride, tap, dilation, before)
        ]
        if wrap:
            target = [j % n for j, n in zip(target, out_spatial)]
        elif not all(0 <= j < n for j, n in zip(target, out_spatial)):
            continue
        flipped = tuple(k - 1 - t for k, t in zip(kernel, tap))
        channel = (o // out_per_group) * in_per_group + c
        out[(o, *target)] += weight[(o, c, *flipped)] * x[(channel, *pos)]
    return out


def _transposed_weight(weight, groups):
    """The `ConvTranspose` weight whose layer is the adjoint of a `Conv` with
    `weight`: channel axes swapped within each group, kernel flipped."""
    out_channels, in_per_group, *kernel = weight.shape
    grouped = weight.reshape(groups, out_channels // groups, in_per_group, *kernel)
    swapped = jnp.swapaxes(grouped, 1, 2).reshape(
        groups * in_per_group, out_channels // groups, *kernel
    )
    return jnp.flip(swapped, axis=tuple(range(2, weight.ndim)))


def _conv_input_size(m, k, s, d, padding, a):
    """The `Conv` input size whose output size is `m`, picked by `a`."""
    if isinstance(padding, str) and padding != "VALID":
        return m * s - a
    before, after = (0, 0) if padding == "VALID" else padding
    return (m - 1) * s + d * (k - 1) + 1 - before - after + a


# --- convolution -------------------------------------------------------------

PADDINGS = [
    0,
    2,
    "VALID",
    "SAME",
    "same_lower",
    "per-dimension",
    "pairs",
]


def _padding_argument(padding, n):
    if padding == "per-dimension":
        return [1, 0, 2][:n]
    if padding == "pairs":
        return [(0, 2), (1, 0), (2, 1)][:n]
    return padding


MODES = ["ZEROS", "REFLECT", "REPLICATE", "CIRCULAR"]
# Every padding form with every mode in two dimensions; a sample in one and three.
LAX_CASES = [
    *itertools.product([2], PADDINGS, MODES),
    *itertools.product([1, 3], ["same_lower", "pairs"], MODES),
]


@pytest.mark.parametrize("n, padding, mode", LAX_CASES)
def test_conv_matches_lax_for_every_padding_form_and_mode(n, padding, mode):
    padding = _padding_argument(padding, n)
    stride, dilation = (2, 1, 3)[:n], (1, 2, 1)[:n]
    conv = fx.nn.Conv(
        n, 4, 6, 3, stride, padding, dilation, groups=2, padding_mode=mode, key=KEY
    )
    x = _normal(1, (4, 7, 8, 6)[: n + 1])
    pads = _pads(padding, x.shape[1:], (3,) * n, stride, dilation)
    expected = _reference_conv(
        x, conv.weight, conv.bias, stride, pads, dilation, 2, mode.upper()
    )
    np.testing.assert_allclose(conv(x), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "mode, padding",
    [
        ("ZEROS", 1),
        ("ZEROS", "SAME_LOWER"),
        ("REFLECT", "SAME"),
        ("REFLECT", ((2, 0), (1, 2))),
        ("REPLICATE", "SAME_LOWER"),
        ("REPLICATE", 1),
        ("CIRCULAR", "SAME"),
        ("CIRCULAR", ((2, 0), (1, 2))),
    ],
)
def test_conv_gradients_match_lax(mode, padding):
    conv = fx.nn.Conv2d(
        2, 4, (3, 2), (2, 1), padding, (1, 2), groups=2, padding_mode=mode, key=KEY
    )
    x = _normal(1, (2, 6, 7))
    out_shape = conv(x).shape
    cotangent = _normal(2, out_shape)
    pads = _pads(padding, x.shape[1:], (3, 2), (2, 1), (1, 2))

    def layer_loss(weight, bias, x):
        layer = fx.tree_at(lambda c: (c.weight, c.bias), conv, (weight, bias))
        return jnp.sum(layer(x) * cotangent)

    def reference_loss(weight, bias, x):
        out = _reference_conv(x, weight, bias, (2, 1), pads, (1, 2), 2, mode)
        return jnp.sum(out * cotangent)

    args = (conv.weight, conv.bias, x)
    grads = jax.jit(jax.grad(layer_loss, argnums=(0, 1, 2)))(*args)
    expected = jax.jit(jax.grad(reference_loss, argnums=(0, 1, 2)))(*args)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv_filter_grad_gives_weight_and_bias_gradients():
    conv = fx.nn.Conv1d(3, 2, 3, padding="SAME", key=KEY)
    x = _normal(1, (3, 5))
    grads = fx.filter_grad(lambda c, x: jnp.sum(c(x) ** 2))(conv, x)
    out = conv(x)
    # d/db sum(out^2) = 2 * sum over positions of out.
    np.testing.assert_allclose(grads.bias, 2 * out.sum(axis=1, keepdims=True), 1e-5)
    assert grads.weight.shape == conv.weight.shape
    assert grads.kernel_size == conv.kernel_size


@pytest.mark.parametrize("cls", [fx.nn.Conv1d, fx.nn.ConvTranspose1d])
def test_a_frozen_weight_is_used_and_gets_no_gradient(cls):
    conv = cls(3, 2, 3, key=KEY)
    frozen = fx.tree_at(lambda c: c.weight, conv, replace_fn=fx.NonDifferentiable)
    x = _normal(1, (3, 5))
    np.testing.assert_allclose(frozen(x), conv(x), rtol=1e-6)

    def loss(c: Any, x: jax.Array) -> jax.Array:
        return jnp.sum(c(x) ** 2)

    grads = fx.filter_grad(loss)(frozen, x)
    assert grads.weight is None
    np.testing.assert_allclose(grads.bias, fx.filter_grad(loss)(conv, x).bias, 1e-5)
    # Differentiating everything, frozen values included, still gives none.
    everything = jax.grad(loss)(frozen, x)
    np.testing.assert_allclose(everything.weight.value, 0.0)


@pytest.mark.parametrize(
    "n, stride, padding, dilation, groups",
    [
        (1, (1,), [(1, 2)], (1,), 1),
        (1, (2,), [(0, 1)], (2,), 2),
        (2, (2, 1), [(1, 1), (0, 2)], (1, 2), 1),
        (2, (1, 3), [(2, 0), (1, 1)], (1, 1), 3),
        (3, (1, 2, 1), [(1, 0), (0, 0), (1, 1)], (2, 1, 1), 1),
    ],
)
def test_conv_matches_a_loop_over_the_definition(n, stride, padding, dilation, groups):
    channels = 3 * groups // math.gcd(3, groups)
    conv = fx.nn.Conv(
        n, channels, groups * 2, 2, stride, padding, dilation, groups, key=KEY
    )
    x = _normal(1, (channels, 5, 4, 4)[: n + 1])
    expected = _loop_conv(x, conv.weight, stride, padding, dilation, groups)
    expected = expected + np.asarray(conv.bias)
    np.testing.assert_allclose(conv(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["REFLECT", "REPLICATE", "CIRCULAR"])
def test_padding_modes_fill_as_documented(mode):
    # A 1-tap identity kernel turns the layer into its own padding.
    conv = fx.nn.Conv1d(1, 1, 1, padding=2, padding_mode=mode, use_bias=False, key=KEY)
    conv = fx.tree_at(lambda c: c.weight, conv, jnp.ones((1, 1, 1)))
    expected = {
        "REFLECT": [3, 2, 1, 2, 3, 4, 3, 2],
        "REPLICATE": [1, 1, 1, 2, 3, 4, 4, 4],
        "CIRCULAR": [3, 4, 1, 2, 3, 4, 1, 2],
    }[mode]
    out = conv(jnp.array([[1.0, 2.0, 3.0, 4.0]]))
    np.testing.assert_array_equal(out[0], np.array(expected, np.float32))


def test_circular_same_conv_commutes_with_rolls():
    conv = fx.nn.Conv2d(2, 3, 3, padding="SAME", padding_mode="circular", key=KEY)
    x = _normal(1, (2, 6, 5))
    rolled = conv(jnp.roll(x, (2, -1), axis=(1, 2)))
    np.testing.assert_allclose(rolled, jnp.roll(conv(x), (2, -1), axis=(1, 2)), 1e-5)


def test_same_padding_keeps_spatial_size_over_stride():
    for padding in ("SAME", "SAME_LOWER"):
        conv = fx.nn.Conv3d(1, 1, (4, 3, 2), (1, 2, 3), padding, key=KEY)
        assert conv(jnp.ones((1, 5, 7, 8))).shape == (1, 5, 4, 3)


def test_same_lower_puts_the_odd_padding_element_first():
    # Kernel 2 needs one element of padding; an impulse kernel shows where.
    x = jnp.array([[1.0, 2.0, 3.0]])
    for padding, expected in (("SAME", [2.0, 3.0, 0.0]), ("SAME_LOWER", [1, 2, 3])):
        conv = fx.nn.Conv1d(1, 1, 2, padding=padding, use_bias=False, key=KEY)
        conv = fx.tree_at(lambda c: c.weight, conv, jnp.array([[[0.0, 1.0]]]))
        np.testing.assert_array_equal(conv(x)[0], np.array(expected, np.float32))


def test_groups_run_independent_convolutions_side_by_side():
    grouped = fx.nn.Conv1d(4, 6, 3, groups=2, key=KEY)
    assert grouped.bias is not None
    x = _normal(1, (4, 9))
    halves = []
    for g in range(2):
        part = fx.nn.Conv1d(2, 3, 3, key=KEY)
        part = fx.tree_at(
            lambda c: (c.weight, c.bias),
            part,
            (grouped.weight[3 * g : 3 * g + 3], grouped.bias[3 * g : 3 * g + 3]),
        )
        halves.append(part(x[2 * g : 2 * g + 2]))
    np.testing.assert_allclose(grouped(x), jnp.concatenate(halves), rtol=1e-6)


def test_conv_without_bias_has_only_a_weight_leaf():
    conv = fx.nn.Conv2d(2, 3, 3, use_bias=False, key=KEY)
    assert conv.bias is None
    assert len(jax.tree.leaves(conv)) == 1
    x = _normal(1, (2, 5, 5))
    expected = _reference_conv(
        x, conv.weight, None, (1, 1), [(0, 0)] * 2, (1, 1), 1, "ZEROS"
    )
    np.testing.assert_allclose(conv(x), expected, rtol=1e-6)


# --- transposed convolution --------------------------------------------------

ADJOINT_CASES = [
    # n, kernel, stride, padding, output_padding, dilation, groups, mode
    (1, 3, 1, 0, 0, 1, 1, "ZEROS"),
    (1, 3, 2, 1, 1, 2, 1, "ZEROS"),
    (1, 4, 3, ((2, 0),), 2, 1, 2, "ZEROS"),
    (1, 1, 2, 1, 0, 1, 1, "ZEROS"),  # padding wider than the kernel
    (1, 3, 2, "SAME", 1, 2, 1, "ZEROS"),
    (1, 2, 3, "SAME", 2, 1, 1, "ZEROS"),  # kernel narrower than the stride
    (1, 4, 2, "SAME_LOWER", 0, 1, 2, "ZEROS"),
    (1, 3, 2, "VALID", 1, 1, 1, "ZEROS"),
    (1, 3, 2, "SAME", 0, 2, 1, "CIRCULAR"),
    (1, 4, 1, "SAME_LOWER", 0, 1, 1, "CIRCULAR"),
    (2, (3, 2), (2, 1), ((1, 0), (0, 1)), (1, 0), (1, 2), 1, "ZEROS"),
    (2, 3, (1, 2), "SAME", (0, 1), 1, 3, "ZEROS"),
    (2, 3, 2, "SAME_LOWER", 0, (2, 1), 1, "CIRCULAR"),
    (3, 2, (1, 2, 1), 1, (0, 1, 0), 1, 1, "ZEROS"),
    (3, (1, 2, 3), 2, "SAME", 1, 1, 1, "ZEROS"),
]


def _adjoint_pair(case):
    n, kernel, stride, padding, output_padding, dilation, groups, mode = case
    conv = fx.nn.Conv(
        n,
        2 * groups,
        3 * groups,
        kernel,
        stride,
        padding,
        dilation,
        groups,
        use_bias=False,
        padding_mode=mode,
        key=KEY,
    )
    transpose = fx.nn.ConvTranspose(
        n,
        3 * groups,
        2 * groups,
        kernel,
        stride,
        padding,
        output_padding,
        dilation,
        groups,
        use_bias=False,
        padding_mode=mode,
        key=jr.key(1),
    )
    transpose = fx.tree_at(
        lambda t: t.weight, transpose, _transposed_weight(conv.weight, groups)
    )
    m = {1: (4,), 2: (3, 3), 3: (2, 3, 2)}[n]
    pads = conv.padding if isinstance(conv.padding, tuple) else (conv.padding,) * n
    in_spatial = tuple(
        _conv_input_size(mi, k, s, d, p, a)
        for mi, k, s, d, p, a in zip(
            m,
            conv.kernel_size,
            conv.stride,
            conv.dilation,
            pads,
            transpose.output_padding,
        )
    )
    return conv, transpose, (2 * groups, *in_spatial), (3 * groups, *m)


@pytest.mark.parametrize("case", ADJOINT_CASES)
def test_conv_transpose_jacobian_is_the_transpose_of_the_conv_jacobian(case):
    conv, transpose, in_shape, out_shape = _adjoint_pair(case)
    x, y = _normal(1, in_shape), _normal(2, out_shape)
    assert conv(x).shape == out_shape
    assert transpose(y).shape == in_shape
    # Both are linear maps: equal on a random vector, they are equal (a
    # nonzero difference vanishes only on a set of measure zero). JAX's own
    # transpose of the convolution is the reference.
    (adjoint,) = jax.jit(jax.linear_transpose(conv, x))(y)
    np.testing.assert_allclose(transpose(y), adjoint, atol=1e-5)


@pytest.mark.parametrize("case", ADJOINT_CASES)
def test_conv_transpose_matches_the_scatter_definition(case):
    n, kernel, stride, padding, output_padding, dilation, groups, mode = case
    _, transpose, in_shape, out_shape = _adjoint_pair(case)
    transpose = fx.nn.ConvTranspose(
        n,
        3 * groups,
        2 * groups,
        kernel,
        stride,
        padding,
        output_padding,
        dilation,
        groups,
        padding_mode=mode,
        key=jr.key(3),
    )
    y = _normal(2, out_shape)
    # Where the matching convolution's padding starts, per dimension.
    if isinstance(transpose.padding, str):
        before = [
            0
            if transpose.padding == "VALID"
            else _same_pads(size, k, s, d, transpose.padding == "SAME_LOWER")[0]
            for size, k, s, d in zip(
                in_shape[1:],
                transpose.kernel_size,
                transpose.stride,
                transpose.dilation,
            )
        ]
    else:
        before = [b for b, _ in transpose.padding]
    expected = _loop_conv_transpose(
        y,
        transpose.weight,
        transpose.stride,
        before,
        transpose.dilation,
        groups,
        in_shape[1:],
        wrap=mode == "CIRCULAR",
    )
    expected = expected + np.asarray(transpose.bias)
    np.testing.assert_allclose(transpose(y), expected, rtol=1e-5, atol=1e-5)


def test_conv_transpose_gradients_are_those_of_a_linear_map():
    transpose = fx.nn.ConvTranspose2d(
        4, 2, 3, stride=2, output_padding=1, padding=1, groups=2, key=KEY
    )
    assert transpose.bias is not None
    unbiased = fx.tree_at(lambda t: t.bias, transpose, jnp.zeros_like(transpose.bias))
    y = _normal(1, (4, 3, 4))
    cotangent = _normal(2, transpose(y).shape)

    def loss(y, weight, bias):
        layer = fx.tree_at(lambda t: (t.weight, t.bias), transpose, (weight, bias))
        return jnp.sum(layer(y) * cotangent)

    grad_y, grad_weight, grad_bias = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(
        y, transpose.weight, transpose.bias
    )
    # Linear in the input and in the weight, affine in the bias: each gradient,
    # paired with a direction, is the loss's change along that direction.
    direction = _normal(3, y.shape)
    np.testing.assert_allclose(
        jnp.sum(grad_y * direction),
        jnp.sum(unbiased(direction) * cotangent),
        rtol=1e-4,
    )
    np.testing.assert_allclose(
        jnp.sum(grad_weight * transpose.weight),
        jnp.sum(unbiased(y) * cotangent),
        rtol=1e-4,
    )
    np.testing.assert_allclose(
        grad_bias, cotangent.sum(axis=(1, 2), keepdims=True), rtol=1e-5
    )


def test_conv_transpose_undoes_the_shape_of_a_strided_conv():
    conv = fx.nn.Conv2d(3, 8, 3, stride=2, padding=1, key=KEY)
    transpose = fx.nn.ConvTranspose2d(8, 3, 3, 2, output_padding=1, padding=1, key=KEY)
    x = _normal(1, (3, 10, 10))
    assert transpose(conv(x)).shape == x.shape


def test_conv_transpose_1d_takes_output_padding_before_padding():
    transpose = fx.nn.ConvTranspose1d(1, 1, 3, 2, 1, 0, key=KEY)
    assert transpose.output_padding == (1,)
    assert transpose.padding == ((0, 0),)


# --- initialisation, fields, dtypes ------------------------------------------


@pytest.mark.parametrize("cls", [fx.nn.Conv2d, fx.nn.ConvTranspose2d])
def test_parameters_are_uniform_with_the_fan_in_limit(cls):
    layer = cls(6, 9, (3, 2), groups=3, key=KEY)
    weight_key, bias_key = jr.split(KEY)
    limit = 1 / math.sqrt(2 * 3 * 2)
    expected_weight = jr.uniform(weight_key, (9, 2, 3, 2), minval=-limit, maxval=limit)
    expected_bias = jr.uniform(bias_key, (9, 1, 1), minval=-limit, maxval=limit)
    np.testing.assert_array_equal(layer.weight, expected_weight)
    np.testing.assert_array_equal(layer.bias, expected_bias)


def test_complex_parameters_draw_real_and_imaginary_parts_separately():
    conv = fx.nn.Conv1d(2, 3, 4, dtype=jnp.complex64, key=KEY)
    weight_key, _ = jr.split(KEY)
    real_key, imag_key = jr.split(weight_key)
    limit = 1 / math.sqrt(8)
    real = jr.uniform(real_key, (3, 2, 4), minval=-limit, maxval=limit)
    imag = jr.uniform(imag_key, (3, 2, 4), minval=-limit, maxval=limit)
    assert conv.weight.dtype == jnp.complex64
    np.testing.assert_array_equal(conv.weight.real, real)
    np.testing.assert_array_equal(conv.weight.imag, imag)


def test_complex_convolution_is_four_real_convolutions():
    conv = fx.nn.Conv2d(2, 3, 3, padding=1, dtype=jnp.complex64, key=KEY)
    x = lax.complex(_normal(1, (2, 5, 6)), _normal(2, (2, 5, 6)))
    w, b = conv.weight, conv.bias
    assert b is not None

    def real_conv(x, w):
        return _reference_conv(x, w, None, (1, 1), [(1, 1)] * 2, (1, 1), 1, "ZEROS")

    real = real_conv(x.real, w.real) - real_conv(x.imag, w.imag) + b.real
    imag = real_conv(x.real, w.imag) + real_conv(x.imag, w.real) + b.imag
    out = conv(x)
    assert out.dtype == jnp.complex64
    np.testing.assert_allclose(out.real, real, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.imag, imag, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("cls", [fx.nn.Conv1d, fx.nn.ConvTranspose1d])
def test_low_precision_layers_keep_their_dtype(dtype, cls):
    layer = cls(2, 3, 3, stride=2, padding=1, dtype=dtype, key=KEY)
    assert layer.weight.dtype == layer.bias.dtype == dtype
    x = _normal(1, (2, 8))
    out = layer(x.astype(dtype))
    assert out.dtype == dtype
    as_float32 = jax.tree.map(lambda a: a.astype(jnp.float32), layer)
    np.testing.assert_allclose(
        out.astype(jnp.float32),
        as_float32(x.astype(dtype).astype(jnp.float32)),
        rtol=5e-2,
        atol=5e-2,
    )


def test_float64_and_complex128_under_x64():
    with jax.enable_x64(True):
        assert fx.nn.Conv1d(1, 1, 1, key=KEY).weight.dtype == jnp.float64
        conv = fx.nn.ConvTranspose1d(1, 1, 2, dtype=jnp.complex128, key=KEY)
        assert conv.weight.dtype == jnp.complex128
        assert conv(jnp.ones((1, 3), jnp.complex128)).dtype == jnp.complex128
    assert fx.nn.Conv1d(1, 1, 1, key=KEY).weight.dtype == jnp.float32


def test_fields_are_equinox_fields_in_equinox_order():
    conv_fields = [
        "num_spatial_dims",
        "weight",
        "bias",
        "in_channels",
        "out_channels",
        "kernel_size",
        "stride",
        "padding",
        "dilation",
        "groups",
        "use_bias",
        "padding_mode",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    transpose_fields = [*conv_fields]
    transpose_fields.insert(conv_fields.index("dilation"), "output_padding")
    assert _field_names(fx.nn.Conv3d) == conv_fields
    assert _field_names(fx.nn.ConvTranspose) == transpose_fields
    conv = fx.nn.Conv2d(2, 3, 3, key=KEY)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(conv)]
    assert paths == [".weight", ".bias"]


def test_arguments_are_normalised_to_hashable_tuples():
    conv = fx.nn.Conv2d(
        2,
        2,
        [3, np.int64(2)],  # pyright: ignore[reportArgumentType]
        stride=[1, 2],
        padding=[[1, 0], 2],
        dilation=2,
        padding_mode="reflect",
        key=KEY,
    )
    assert conv.kernel_size == (3, 2)
    assert conv.stride == (1, 2)
    assert conv.padding == ((1, 0), (2, 2))
    assert conv.dilation == (2, 2)
    assert conv.padding_mode == "REFLECT"
    assert fx.nn.Conv1d(1, 1, 1, padding="same", key=KEY).padding == "SAME"
    hash(jax.tree.structure(conv))


def test_conv_works_under_filter_jit_and_vmap():
    conv = fx.nn.Conv2d(3, 4, 3, padding="SAME", key=KEY)
    batch = _normal(1, (5, 3, 6, 6))
    out = fx.filter_jit(lambda c, x: jax.vmap(c)(x))(conv, batch)
    assert out.shape == (5, 4, 6, 6)
    np.testing.assert_allclose(out[2], conv(batch[2]), rtol=1e-5, atol=1e-6)


# --- errors ------------------------------------------------------------------


@pytest.mark.parametrize("cls", [fx.nn.Conv2d, fx.nn.ConvTranspose2d])
def test_wrong_input_rank_says_what_shape_was_expected(cls):
    layer = cls(3, 4, 3, key=KEY)
    with pytest.raises(ValueError, match=r"\(channels=3, \*spatial\) with 2 spatial"):
        layer(jnp.ones((3, 8)))
    with pytest.raises(ValueError, match=r"got shape \(1, 3, 8, 8\)"):
        layer(jnp.ones((1, 3, 8, 8)))


def test_wrong_channel_count_is_an_error():
    with pytest.raises(ValueError, match=r"channels=3.*got shape \(4, 8\)"):
        fx.nn.Conv1d(3, 4, 3, key=KEY)(jnp.ones((4, 8)))


@pytest.mark.parametrize("cls", [fx.nn.Conv1d, fx.nn.ConvTranspose1d])
def test_bad_padding_is_an_error(cls):
    with pytest.raises(ValueError, match="'SAME', 'SAME_LOWER' or 'VALID'.*'FULL'"):
        cls(1, 1, 3, padding="FULL", key=KEY)
    with pytest.raises(ValueError, match=r"sequence of 1 entries.*\(1, 2, 3\)"):
        cls(1, 1, 3, padding=(1, 2, 3), key=KEY)
    with pytest.raises(ValueError, match="`padding_mode` must be 'ZEROS'.*'mirror'"):
        cls(1, 1, 3, padding_mode="mirror", key=KEY)


@pytest.mark.parametrize("cls", [fx.nn.Conv2d, fx.nn.ConvTranspose2d])
def test_channels_not_divisible_by_groups_is_an_error(cls):
    with pytest.raises(ValueError, match=r"`in_channels` \(=5\) must be divisible by"):
        cls(5, 4, 3, groups=2, key=KEY)
    with pytest.raises(ValueError, match=r"`out_channels` \(=3\) .* `groups` \(=2\)"):
        cls(4, 3, 3, groups=2, key=KEY)
    with pytest.raises(ValueError, match="`groups` must be a positive int"):
        cls(4, 4, 3, groups=0, key=KEY)


def test_malformed_sizes_are_errors():
    with pytest.raises(
        ValueError, match=r"`kernel_size` must be an int or a sequence of 2"
    ):
        fx.nn.Conv2d(1, 1, (3, 3, 3), key=KEY)
    with pytest.raises(ValueError, match="`stride` must be at least 1, got 0"):
        fx.nn.Conv1d(1, 1, 3, stride=0, key=KEY)
    with pytest.raises(ValueError, match="floating or complex dtype, got int32"):
        fx.nn.Conv1d(1, 1, 3, dtype=jnp.int32, key=KEY)


def test_conv_transpose_negative_output_padding_crops_the_end():
    # Equinox accepts it too; Keras-style code uses it to trim the output.
    full = fx.nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1, key=KEY)
    cropped = fx.nn.ConvTranspose1d(
        2, 3, 3, stride=2, padding=1, output_padding=-1, key=KEY
    )
    x = _normal(1, (2, 5))
    np.testing.assert_allclose(cropped(x), full(x)[:, :-1], rtol=1e-6)


def test_conv_transpose_specific_errors():
    with pytest.raises(
        ValueError, match="`output_padding` must be smaller than `stride`"
    ):
        fx.nn.ConvTranspose1d(1, 1, 3, stride=2, output_padding=2, key=KEY)
    with pytest.raises(NotImplementedError, match="'ZEROS' or 'CIRCULAR'"):
        fx.nn.ConvTranspose1d(1, 1, 3, padding_mode="REFLECT", key=KEY)
    with pytest.raises(NotImplementedError, match="only with padding 'SAME'"):
        fx.nn.ConvTranspose1d(1, 1, 3, padding=1, padding_mode="CIRCULAR", key=KEY)
    with pytest.raises(NotImplementedError, match="zero `output_padding`"):
        fx.nn.ConvTranspose1d(
            1,
            1,
            3,
            2,
            output_padding=1,
            padding="SAME",
            padding_mode="CIRCULAR",
            key=KEY,
        )
