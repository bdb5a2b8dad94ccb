"""`LayerNorm`, `RMSNorm` and `GroupNorm` against their mean/variance formulas."""

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


def _random(seed, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


def _with_affine(layer, seed=1):
    """The layer with random (not all-ones / all-zeros) weight and bias."""
    weight = _random(seed, layer.weight.shape)
    bias = _random(seed + 1, layer.bias.shape)
    return fx.tree_at(lambda m: (m.weight, m.bias), layer, (weight, bias))


def _field_names(layer):
    return [f.name for f in dataclasses.fields(layer)]


# ---------------------------------------------------------------- reference formulas


def layer_norm_reference(x, weight, bias, eps=1e-5):
    mean = jnp.sum(x) / x.size
    variance = jnp.sum((x - mean) ** 2) / x.size
    return (x - mean) / jnp.sqrt(variance + eps) * weight + bias


def rms_norm_reference(x, weight, bias, eps=1e-5):
    return x / jnp.sqrt(jnp.sum(x**2) / x.size + eps) * weight + bias


def group_norm_reference(x, groups, weight, bias, eps=1e-5):
    per_group = x.shape[0] // groups
    pieces = []
    for g in range(groups):
        piece = x[g * per_group : (g + 1) * per_group]
        mean = jnp.sum(piece) / piece.size
        variance = jnp.sum((piece - mean) ** 2) / piece.size
        pieces.append((piece - mean) / jnp.sqrt(variance + eps))
    out = jnp.concatenate(pieces)
    for c in range(x.shape[0]):
        out = out.at[c].set(out[c] * weight[c] + bias[c])
    return out


# --------------------------------------------------------------------- LayerNorm


def test_layer_norm_fields_and_initialisation():
    norm = fx.nn.LayerNorm((3, 4))
    assert _field_names(norm) == [
        "shape",
        "eps",
        "use_weight",
        "use_bias",
        "weight",
        "bias",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    assert norm.shape == (3, 4)
    assert jnp.array_equal(_present(norm.weight), jnp.ones((3, 4)))
    assert jnp.array_equal(_present(norm.bias), jnp.zeros((3, 4)))
    assert _present(norm.weight).dtype == jnp.float32
    assert fx.nn.LayerNorm(5).shape == (5,)


def test_norm_shapes_from_numpy_are_stored_as_python_ints():
    # A shape taken from `x.shape` of a NumPy array, or a NumPy array itself.
    for shape in (np.array([2, 3]), (np.int64(2), np.int64(3))):
        for layer in (fx.nn.LayerNorm(shape), fx.nn.RMSNorm(shape)):
            assert layer.shape == (2, 3)
            assert all(type(size) is int for size in layer.shape)
    assert fx.nn.LayerNorm(np.int64(4)).shape == (4,)
    with pytest.raises(TypeError):
        fx.nn.LayerNorm(2.5)  # type: ignore[arg-type]


def test_layer_norm_matches_formula():
    norm = _with_affine(fx.nn.LayerNorm((3, 4)))
    x = _random(0, (3, 4)) * 3 + 2
    expected = layer_norm_reference(x, norm.weight, norm.bias)
    assert jnp.allclose(norm(x), expected, atol=1e-5)


def test_layer_norm_gradient_matches_formula():
    norm = _with_affine(fx.nn.LayerNorm(6, eps=1e-3))
    x = _random(0, (6,))
    cotangent = _random(7, (6,))

    def loss(weight, bias, x):
        layer = fx.tree_at(lambda m: (m.weight, m.bias), norm, (weight, bias))
        return jnp.sum(layer(x) * cotangent)

    def reference_loss(weight, bias, x):
        return jnp.sum(layer_norm_reference(x, weight, bias, eps=1e-3) * cotangent)

    args = (norm.weight, norm.bias, x)
    got = jax.grad(loss, argnums=(0, 1, 2))(*args)
    expected = jax.grad(reference_loss, argnums=(0, 1, 2))(*args)
    for g, e in zip(got, expected):
        assert jnp.allclose(g, e, atol=1e-5)


def test_layer_norm_without_weight_or_bias():
    norm = fx.nn.LayerNorm(5, use_weight=False, use_bias=False)
    assert norm.weight is None and norm.bias is None
    assert jax.tree.leaves(norm) == []
    x = _random(0, (5,))
    assert jnp.allclose(norm(x), layer_norm_reference(x, 1.0, 0.0), atol=1e-5)
    only_bias = fx.nn.LayerNorm(5, use_weight=False)
    assert only_bias.weight is None and only_bias.bias is not None


def test_layer_norm_elementwise_affine_is_deprecated_and_sets_both_flags():
    with pytest.warns(fx.FilteraxDeprecationWarning, match="use_weight"):
        norm = fx.nn.LayerNorm(4, elementwise_affine=False)
    assert norm.use_weight is False and norm.use_bias is False
    assert norm.weight is None and norm.bias is None


def test_layer_norm_passes_state_through():
    norm = fx.nn.LayerNorm(3)
    state = object()
    out, returned = norm(jnp.ones(3), state)
    assert returned is state
    assert out.shape == (3,)


def test_layer_norm_wrong_shape_names_expected_shape():
    norm = fx.nn.LayerNorm(4)
    with pytest.raises(ValueError, match=r"shape \(4,\).*got shape \(2, 4\).*vmap"):
        norm(jnp.ones((2, 4)))


def test_layer_norm_over_trailing_axis_by_vmap():
    norm = _with_affine(fx.nn.LayerNorm(4))
    x = _random(0, (3, 4))
    out = jax.vmap(norm)(x)
    for row, expected in zip(out, x):
        assert jnp.allclose(
            row, layer_norm_reference(expected, norm.weight, norm.bias), atol=1e-5
        )


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_layer_norm_half_precision_computes_in_float32(dtype):
    norm = fx.nn.LayerNorm(64, dtype=dtype)
    assert _present(norm.weight).dtype == dtype
    # A large offset and small spread: a float16 mean/variance would lose it.
    x = (1000 + _random(0, (64,))).astype(dtype)
    out = norm(x)
    assert out.dtype == dtype
    expected = layer_norm_reference(x.astype(jnp.float32), 1.0, 0.0).astype(dtype)
    assert jnp.array_equal(out, expected)


def test_layer_norm_float64():
    with jax.enable_x64(True):
        norm = fx.nn.LayerNorm(8)
        assert _present(norm.weight).dtype == jnp.float64
        x = jax.random.normal(jax.random.key(0), (8,), jnp.float64)
        out = norm(x)
        assert out.dtype == jnp.float64
        assert jnp.allclose(out, layer_norm_reference(x, 1.0, 0.0), atol=1e-12)


def test_layer_norm_under_filter_jit():
    norm = _with_affine(fx.nn.LayerNorm(5))
    x = _random(0, (5,))
    assert jnp.allclose(fx.filter_jit(norm)(x), norm(x), atol=1e-6)


# ----------------------------------------------------------------------- RMSNorm


def test_rms_norm_fields_and_initialisation():
    norm = fx.nn.RMSNorm(4)
    assert _field_names(norm) == [
        "shape",
        "eps",
        "use_weight",
        "use_bias",
        "weight",
        "bias",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    assert jnp.array_equal(_present(norm.weight), jnp.ones(4))
    assert jnp.array_equal(_present(norm.bias), jnp.zeros(4))


def test_rms_norm_matches_formula_and_does_not_centre():
    norm = _with_affine(fx.nn.RMSNorm((2, 3)))
    x = _random(0, (2, 3)) + 5
    assert jnp.allclose(
        norm(x), rms_norm_reference(x, _present(norm.weight), _present(norm.bias))
    )
    plain = fx.nn.RMSNorm(2, use_weight=False, use_bias=False)
    assert jnp.allclose(plain(jnp.array([3.0, 4.0])), jnp.array([3.0, 4.0]) / 12.5**0.5)


def test_rms_norm_gradient_matches_formula():
    norm = _with_affine(fx.nn.RMSNorm(5))
    x = _random(0, (5,))
    cotangent = _random(3, (5,))

    def loss(weight, bias, x):
        layer = fx.tree_at(lambda m: (m.weight, m.bias), norm, (weight, bias))
        return jnp.sum(layer(x) * cotangent)

    def reference_loss(weight, bias, x):
        return jnp.sum(rms_norm_reference(x, weight, bias) * cotangent)

    args = (norm.weight, norm.bias, x)
    got = jax.grad(loss, argnums=(0, 1, 2))(*args)
    expected = jax.grad(reference_loss, argnums=(0, 1, 2))(*args)
    for g, e in zip(got, expected):
        assert jnp.allclose(g, e, atol=1e-5)


def test_rms_norm_wrong_shape_raises():
    with pytest.raises(ValueError, match=r"RMSNorm.*shape \(3,\).*got shape \(4,\)"):
        fx.nn.RMSNorm(3)(jnp.ones(4))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_rms_norm_half_precision(dtype):
    norm = fx.nn.RMSNorm(16, dtype=dtype)
    x = (300 * _random(0, (16,))).astype(dtype)
    out = norm(x)
    assert out.dtype == dtype
    expected = rms_norm_reference(x.astype(jnp.float32), 1.0, 0.0).astype(dtype)
    assert jnp.array_equal(out, expected)


def test_rms_norm_passes_state_through():
    state = {"anything": 1}
    _, returned = fx.nn.RMSNorm(2)(jnp.ones(2), state)
    assert returned is state


# --------------------------------------------------------------------- GroupNorm


def test_group_norm_fields_and_initialisation():
    norm = fx.nn.GroupNorm(2, 6)
    assert _field_names(norm) == [
        "groups",
        "channels",
        "eps",
        "channelwise_affine",
        "weight",
        "bias",
        "axes",  # filterax: static per-instance logical axes, no leaf
    ]
    assert jnp.array_equal(_present(norm.weight), jnp.ones(6))
    assert jnp.array_equal(_present(norm.bias), jnp.zeros(6))


@pytest.mark.parametrize("spatial", [(), (5,), (3, 4)])
def test_group_norm_matches_formula(spatial):
    norm = _with_affine(fx.nn.GroupNorm(3, 6))
    x = _random(0, (6, *spatial)) * 2 + 1
    expected = group_norm_reference(x, 3, norm.weight, norm.bias)
    assert jnp.allclose(norm(x), expected, atol=1e-5)


def test_group_norm_gradient_matches_formula():
    norm = _with_affine(fx.nn.GroupNorm(2, 4))
    x = _random(0, (4, 3))
    cotangent = _random(5, (4, 3))

    def loss(weight, bias, x):
        layer = fx.tree_at(lambda m: (m.weight, m.bias), norm, (weight, bias))
        return jnp.sum(layer(x) * cotangent)

    def reference_loss(weight, bias, x):
        return jnp.sum(group_norm_reference(x, 2, weight, bias) * cotangent)

    args = (norm.weight, norm.bias, x)
    got = jax.grad(loss, argnums=(0, 1, 2))(*args)
    expected = jax.grad(reference_loss, argnums=(0, 1, 2))(*args)
    for g, e in zip(got, expected):
        assert jnp.allclose(g, e, atol=1e-5)


def test_group_norm_without_affine_needs_no_channels():
    norm = fx.nn.GroupNorm(2, channelwise_affine=False)
    assert norm.weight is None and norm.bias is None and norm.channels is None
    x = _random(0, (4, 3))
    assert jnp.allclose(norm(x), group_norm_reference(x, 2, jnp.ones(4), jnp.zeros(4)))


def test_group_norm_one_group_is_layer_norm_over_everything():
    x = _random(0, (4, 5))
    group = fx.nn.GroupNorm(1, 4, channelwise_affine=False)
    layer = fx.nn.LayerNorm((4, 5), use_weight=False, use_bias=False)
    assert jnp.allclose(group(x), layer(x), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(groups=3, channels=4), "groups=3 must divide channels=4"),
        (dict(groups=2, channels=None), "needs the number of channels"),
        (dict(groups=0, channels=4), "at least one group"),
    ],
)
def test_group_norm_bad_configuration_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fx.nn.GroupNorm(**kwargs)


def test_group_norm_bad_input_raises():
    norm = fx.nn.GroupNorm(2, 4)
    with pytest.raises(ValueError, match=r"channels=4.*\(4, \.\.\.\).*\(6, 3\)"):
        norm(jnp.ones((6, 3)))
    with pytest.raises(ValueError, match=r"divisible by 2.*\(3,\)"):
        fx.nn.GroupNorm(2, channelwise_affine=False)(jnp.ones(3))
    with pytest.raises(ValueError, match="scalar"):
        norm(jnp.ones(()))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_group_norm_half_precision(dtype):
    norm = fx.nn.GroupNorm(2, 4, dtype=dtype)
    assert _present(norm.weight).dtype == dtype
    x = (500 + _random(0, (4, 8))).astype(dtype)
    out = norm(x)
    assert out.dtype == dtype
    expected = group_norm_reference(
        x.astype(jnp.float32), 2, jnp.ones(4), jnp.zeros(4)
    ).astype(dtype)
    assert jnp.allclose(
        out.astype(jnp.float32), expected.astype(jnp.float32), atol=1e-2
    )


def test_group_norm_float64():
    with jax.enable_x64(True):
        norm = fx.nn.GroupNorm(2, 4)
        assert _present(norm.weight).dtype == jnp.float64
        x = jax.random.normal(jax.random.key(0), (4, 3), jnp.float64)
        out = norm(x)
        assert out.dtype == jnp.float64
        expected = group_norm_reference(x, 2, norm.weight, norm.bias)
        assert jnp.allclose(out, expected, atol=1e-12)


def test_group_norm_passes_state_through():
    state = ["state"]
    _, returned = fx.nn.GroupNorm(1, 2)(jnp.ones(2), state)
    assert returned is state


def test_norms_are_not_retraced_for_new_values():
    traces = []

    @fx.filter_jit
    def apply(layer, x):
        traces.append(None)
        return layer(x)

    for seed in range(3):
        layer = _with_affine(fx.nn.GroupNorm(2, 4), seed=seed)
        apply(layer, np.full((4,), float(seed)))
    assert len(traces) == 1
