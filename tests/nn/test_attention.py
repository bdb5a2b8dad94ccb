"""Attention against the textbook formula `softmax(Q K^T / sqrt(d)) V`, head by
head."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx
from filterax.nn._attention import dot_product_attention, dot_product_attention_weights

KEY = jax.random.key(0)


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def _field_names(module):
    return [f.name for f in dataclasses.fields(module)]


def _random(seed, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


def softmax_reference(logits):
    exp = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    return exp / jnp.sum(exp, axis=-1, keepdims=True)


def attention_reference(q, k, v, mask=None):
    logits = q @ k.T / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    return softmax_reference(logits) @ v


def multihead_reference(layer, query, key_, value, mask=None, process_heads=None):
    """Every head written out: project with that head's rows of each weight,
    attend, concatenate, project out."""

    def project(linear, x):
        out = x @ linear.weight.T
        return out if linear.bias is None else out + linear.bias[None, :]

    n, dk, dv = layer.num_heads, layer.qk_size, layer.vo_size
    q = project(layer.query_proj, query).reshape(query.shape[0], n, dk)
    k = project(layer.key_proj, key_).reshape(key_.shape[0], n, dk)
    v = project(layer.value_proj, value).reshape(value.shape[0], n, dv)
    if process_heads is not None:
        q, k, v = process_heads(q, k, v)
    heads = []
    for h in range(n):
        head_mask = None if mask is None else (mask[h] if mask.ndim == 3 else mask)
        heads.append(attention_reference(q[:, h], k[:, h], v[:, h], head_mask))
    return project(layer.output_proj, jnp.concatenate(heads, axis=1))


def _layer(**kwargs):
    defaults = dict(num_heads=2, query_size=6, key_size=5, value_size=4)
    return fx.nn.MultiheadAttention(**{**defaults, **kwargs}, key=KEY)


def _inputs(q_seq=3, kv_seq=4, sizes=(6, 5, 4)):
    return (
        _random(1, (q_seq, sizes[0])),
        _random(2, (kv_seq, sizes[1])),
        _random(3, (kv_seq, sizes[2])),
    )


# -------------------------------------------------------------------- functions


def test_weights_match_softmax_formula():
    q, k = _random(0, (3, 4)), _random(1, (5, 4))
    weights = dot_product_attention_weights(q, k)
    assert jnp.allclose(weights, softmax_reference(q @ k.T / 2.0), atol=1e-6)
    assert jnp.allclose(jnp.sum(weights, axis=1), 1.0)


def test_masked_weights_are_zero_and_rows_still_sum_to_one():
    q, k = _random(0, (3, 4)), _random(1, (5, 4))
    mask = jnp.array(
        [[True, False, True, False, True], [False] * 4 + [True], [True] * 5]
    )
    weights = dot_product_attention_weights(q, k, mask)
    assert jnp.all(jnp.where(mask, True, weights == 0))
    assert jnp.allclose(jnp.sum(weights, axis=1), 1.0)
    expected = softmax_reference(jnp.where(mask, q @ k.T / 2.0, -jnp.inf))
    assert jnp.allclose(weights, expected, atol=1e-6)


def test_attention_matches_formula_and_its_gradient():
    q, k, v = _random(0, (3, 4)), _random(1, (5, 4)), _random(2, (5, 2))
    mask = _random(3, (3, 5)) > -0.5
    assert jnp.allclose(
        dot_product_attention(q, k, v, mask),
        attention_reference(q, k, v, mask),
        atol=1e-6,
    )
    ct = _random(4, (3, 2))
    got = jax.grad(
        lambda q, k, v: jnp.sum(dot_product_attention(q, k, v, mask) * ct),
        argnums=(0, 1, 2),
    )(q, k, v)
    expected = jax.grad(
        lambda q, k, v: jnp.sum(attention_reference(q, k, v, mask) * ct),
        argnums=(0, 1, 2),
    )(q, k, v)
    for g, e in zip(got, expected):
        assert jnp.allclose(g, e, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_weights_keep_their_dtype_and_softmax_in_float32(dtype):
    q = jnp.array([[1.0]], dtype)
    k = jnp.array([[9.0], [1.0]], dtype)
    weights = dot_product_attention_weights(q, k)
    assert weights.dtype == dtype
    expected = softmax_reference(jnp.array([[9.0, 1.0]])).astype(dtype)
    assert jnp.array_equal(weights, expected)


def test_float64_functions():
    with jax.enable_x64(True):
        q = jax.random.normal(jax.random.key(0), (2, 3), jnp.float64)
        k = jax.random.normal(jax.random.key(1), (4, 3), jnp.float64)
        v = jax.random.normal(jax.random.key(2), (4, 2), jnp.float64)
        out = dot_product_attention(q, k, v)
        assert out.dtype == jnp.float64
        assert jnp.allclose(out, attention_reference(q, k, v), atol=1e-12)


def test_function_shape_errors_say_what_was_expected():
    q, k = jnp.ones((2, 3)), jnp.ones((4, 3))
    with pytest.raises(
        ValueError, match=r"`mask` of shape \(q_seq, kv_seq\) = \(2, 4\)"
    ):
        dot_product_attention_weights(q, k, jnp.ones((4, 2), bool))
    with pytest.raises(ValueError, match="same number of channels"):
        dot_product_attention_weights(q, jnp.ones((4, 2)))
    with pytest.raises(ValueError, match=r"`query` of shape \(q_seq, qk_size\)"):
        dot_product_attention_weights(jnp.ones(3), k)
    with pytest.raises(ValueError, match="same length"):
        dot_product_attention(q, k, jnp.ones((3, 5)))


# ----------------------------------------------------------- MultiheadAttention


def test_fields_in_equinox_order_and_projection_shapes():
    layer = _layer(output_size=7, qk_size=3, vo_size=5)
    assert _field_names(layer) == [
        "query_proj",
        "key_proj",
        "value_proj",
        "output_proj",
        "dropout",
        "num_heads",
        "query_size",
        "key_size",
        "value_size",
        "output_size",
        "qk_size",
        "vo_size",
        "use_query_bias",
        "use_key_bias",
        "use_value_bias",
        "use_output_bias",
    ]
    assert isinstance(layer.query_proj, fx.nn.Linear)
    assert isinstance(layer.dropout, fx.nn.Dropout)
    assert layer.query_proj.weight.shape == (6, 6)
    assert layer.key_proj.weight.shape == (6, 5)
    assert layer.value_proj.weight.shape == (10, 4)
    assert layer.output_proj.weight.shape == (7, 10)
    assert layer.query_proj.bias is None


def test_defaults_follow_query_size():
    layer = fx.nn.MultiheadAttention(4, 8, key=KEY)
    assert (layer.key_size, layer.value_size, layer.output_size) == (8, 8, 8)
    assert (layer.qk_size, layer.vo_size) == (2, 2)


def test_initialisation_matches_equinox_values():
    layer = fx.nn.MultiheadAttention(2, 4, key=KEY)
    # Recorded from equinox.nn.MultiheadAttention(2, 4, key=jax.random.key(0)).
    assert np.allclose(
        layer.query_proj.weight[0], [-0.21728003, 0.28809726, -0.10241652, 0.4236232]
    )
    assert np.allclose(
        layer.output_proj.weight[0], [0.45369828, 0.2472626, -0.08082068, 0.30035555]
    )


@pytest.mark.parametrize("use_bias", [False, True])
def test_matches_per_head_formula(use_bias):
    layer = _layer(
        use_query_bias=use_bias,
        use_key_bias=use_bias,
        use_value_bias=use_bias,
        use_output_bias=use_bias,
        qk_size=3,
        vo_size=2,
        output_size=5,
    )
    q, k, v = _inputs()
    out = layer(q, k, v)
    assert out.shape == (3, 5)
    assert jnp.allclose(out, multihead_reference(layer, q, k, v), atol=1e-5)


def test_shared_mask_matches_formula():
    layer = _layer()
    q, k, v = _inputs()
    mask = jnp.array(
        [[True, False, False, True], [True, True, False, False], [False, True] * 2]
    )
    expected = multihead_reference(layer, q, k, v, mask)
    assert jnp.allclose(layer(q, k, v, mask), expected, atol=1e-5)


def test_per_head_mask_matches_formula():
    layer = _layer()
    q, k, v = _inputs()
    mask = jnp.stack(
        [jnp.tril(jnp.ones((3, 4), bool)), jnp.triu(jnp.ones((3, 4), bool))]
    )
    out = layer(q, k, v, mask)
    assert jnp.allclose(out, multihead_reference(layer, q, k, v, mask), atol=1e-5)
    # Differs from applying either head's mask to both heads.
    assert not jnp.allclose(out, layer(q, k, v, mask[0]), atol=1e-3)


def test_process_heads_sees_the_projected_heads():
    layer = _layer(qk_size=4, vo_size=2)
    q, k, v = _inputs()
    rope = fx.nn.RotaryPositionalEmbedding(4)
    seen = []

    def process_heads(q_heads, k_heads, v_heads):
        seen.append((q_heads.shape, k_heads.shape, v_heads.shape))
        rotate = jax.vmap(rope, in_axes=1, out_axes=1)
        return rotate(q_heads), rotate(k_heads), 2 * v_heads

    out = layer(q, k, v, process_heads=process_heads)
    assert seen == [((3, 2, 4), (4, 2, 4), (4, 2, 2))]
    expected = multihead_reference(layer, q, k, v, process_heads=process_heads)
    assert jnp.allclose(out, expected, atol=1e-5)


def test_process_heads_must_keep_shapes():
    layer = _layer()
    q, k, v = _inputs()
    with pytest.raises(ValueError, match="process_heads must return .* shapes"):
        layer(q, k, v, process_heads=lambda a, b, c: (a[:1], b, c))


def test_gradient_matches_formula():
    layer = _layer(use_query_bias=True, use_output_bias=True)
    q, k, v = _inputs()
    mask = jnp.tril(jnp.ones((3, 4), bool))
    ct = _random(9, (3, 6))

    def loss(args):
        layer, q, k, v = args
        return jnp.sum(layer(q, k, v, mask) * ct)

    def reference_loss(args):
        layer, q, k, v = args
        return jnp.sum(multihead_reference(layer, q, k, v, mask) * ct)

    got = fx.filter_grad(loss)((layer, q, k, v))
    expected = fx.filter_grad(reference_loss)((layer, q, k, v))
    got_leaves, expected_leaves = jax.tree.leaves(got), jax.tree.leaves(expected)
    assert len(got_leaves) == len(expected_leaves) == 9
    for g, e in zip(got_leaves, expected_leaves):
        assert jnp.allclose(g, e, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_parameters_and_outputs(dtype):
    layer = _layer(dtype=dtype)
    for leaf in jax.tree.leaves(fx.filter(layer, fx.is_inexact_array)):
        assert leaf.dtype == dtype
    q, k, v = (x.astype(dtype) for x in _inputs())
    out = layer(q, k, v)
    assert out.dtype == dtype
    reference = multihead_reference(
        jax.tree.map(
            lambda x: x.astype(jnp.float32), fx.filter(layer, fx.is_inexact_array)
        ),
        *(x.astype(jnp.float32) for x in (q, k, v)),
    )
    assert jnp.allclose(out.astype(jnp.float32), reference, atol=0.1)


def test_float64_parameters_under_x64():
    with jax.enable_x64(True):
        layer = fx.nn.MultiheadAttention(2, 4, key=KEY)
        assert layer.query_proj.weight.dtype == jnp.float64
        x = jax.random.normal(jax.random.key(1), (3, 4), jnp.float64)
        out = layer(x, x, x)
        assert out.dtype == jnp.float64
        assert jnp.allclose(out, multihead_reference(layer, x, x, x), atol=1e-12)


# ------------------------------------------------------------------------ dropout


def test_dropout_needs_randomness_unless_in_inference():
    layer = _layer(dropout_p=0.5)
    q, k, v = _inputs()
    a = layer(q, k, v, key=jax.random.key(1))
    b = layer(q, k, v, key=jax.random.key(2))
    assert not jnp.allclose(a, b)
    clean = multihead_reference(layer, q, k, v)
    assert jnp.allclose(layer(q, k, v, inference=True), clean, atol=1e-5)
    in_inference = fx.tree_at(lambda m: m.dropout.inference, layer, True)
    assert jnp.allclose(in_inference(q, k, v, key=jax.random.key(1)), clean, atol=1e-5)


def test_deterministic_is_deprecated_and_means_inference():
    layer = _layer(dropout_p=0.5)
    q, k, v = _inputs()
    with pytest.warns(fx.FilteraxDeprecationWarning, match="inference"):
        out = layer(q, k, v, deterministic=True)
    assert jnp.array_equal(out, layer(q, k, v, inference=True))


def test_rng_stream_draws_one_key_split_across_heads():
    layer = _layer(dropout_p=0.5)
    q, k, v = _inputs()
    stream = fx.RngStream(jax.random.key(7))
    out = layer(q, k, v, key=stream)
    assert int(stream.count[...]) == 1
    drawn = jax.random.fold_in(jax.random.key(7), 0)
    assert jnp.array_equal(out, layer(q, k, v, key=drawn))
    second = layer(q, k, v, key=stream)
    assert int(stream.count[...]) == 2
    assert not jnp.allclose(out, second)


def test_rng_stream_is_not_drawn_from_when_dropout_is_off():
    q, k, v = _inputs()
    stream = fx.RngStream(0)
    _layer(dropout_p=0.5)(q, k, v, key=stream, inference=True)
    _layer(dropout_p=0.0)(q, k, v, key=stream)
    assert int(stream.count[...]) == 0


def test_rng_stream_under_filter_jit_gives_the_eager_keys():
    layer = _layer(dropout_p=0.5)
    q, k, v = _inputs()
    eager_stream, jit_stream = fx.RngStream(3), fx.RngStream(3)
    eager = [layer(q, k, v, key=eager_stream) for _ in range(2)]
    apply = fx.filter_jit(lambda layer, stream: layer(q, k, v, key=stream))
    jitted = [apply(layer, jit_stream) for _ in range(2)]
    for e, j in zip(eager, jitted):
        assert jnp.allclose(e, j, atol=1e-6)
    assert int(jit_stream.count[...]) == 2


# ------------------------------------------------------------------------- errors


def test_input_errors_say_what_was_expected():
    layer = _layer()
    q, k, v = _inputs()
    with pytest.raises(
        ValueError, match=r"`query` of shape \(seq_length, 6\).*\(3, 5\)"
    ):
        layer(q[:, :5], k, v)
    with pytest.raises(ValueError, match=r"`key_` of shape \(seq_length, 5\)"):
        layer(q, k[None], v)
    with pytest.raises(ValueError, match="same length"):
        layer(q, k, v[:2])
    with pytest.raises(ValueError, match=r"`mask` of shape \(3, 4\) or \(2, 3, 4\)"):
        layer(q, k, v, jnp.ones((3, 3), bool))


def test_bad_num_heads_raises():
    with pytest.raises(ValueError, match="positive int num_heads; got 0"):
        fx.nn.MultiheadAttention(0, 4, key=KEY)
    with pytest.raises(ValueError, match="positive int num_heads; got True"):
        fx.nn.MultiheadAttention(True, 4, key=KEY)


def test_num_heads_may_be_a_numpy_integer():
    config = np.array([2, 4])  # hyperparameters read from a file
    layer = fx.nn.MultiheadAttention(config[0], 4, key=KEY)
    assert type(layer.num_heads) is int and layer.num_heads == 2
    x = jnp.ones((3, 4))
    assert layer(x, x, x).shape == (3, 4)
