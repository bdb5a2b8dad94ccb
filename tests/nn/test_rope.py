"""`RotaryPositionalEmbedding` against the rotation written with sines and cosines."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

Rope = fx.nn.RotaryPositionalEmbedding


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def _field_names(module):
    return [f.name for f in dataclasses.fields(module)]


def rotation_reference(x, theta=10_000.0):
    """Rotates channel pairs `(j, j + d)` of row `t` by `t * theta**(-2j/size)`,
    one entry at a time, in float64 NumPy."""
    x = np.asarray(x, np.float64)
    length, size = x.shape
    half = size // 2
    out = np.empty_like(x)
    for t in range(length):
        for j in range(half):
            angle = t * theta ** (-2 * j / size)
            cos, sin = math.cos(angle), math.sin(angle)
            out[t, j] = x[t, j] * cos - x[t, j + half] * sin
            out[t, j + half] = x[t, j + half] * cos + x[t, j] * sin
    return out


def _random(seed, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


def test_fields_and_defaults():
    rope = Rope(8)
    assert _field_names(rope) == [
        "embedding_size",
        "theta",
        "dtype",
    ]
    assert rope.theta == 10_000.0
    assert rope.dtype == jnp.float32
    assert jax.tree.leaves(rope) == []


@pytest.mark.parametrize("size, theta", [(2, 10_000.0), (8, 10_000.0), (6, 50.0)])
def test_matches_rotation_formula(size, theta):
    rope = Rope(size, theta=theta)
    x = _random(0, (7, size))
    assert np.allclose(rope(x), rotation_reference(x, theta), atol=1e-5)


def test_gradient_is_the_inverse_rotation():
    rope = Rope(4)
    x = _random(0, (5, 4))
    cotangent = _random(1, (5, 4))
    grad = jax.grad(lambda x: jnp.sum(rope(x) * cotangent))(x)
    # The Jacobian is a rotation R, so the gradient is R^T c: rotating c by
    # the opposite angles, i.e. the formula with sin negated.
    c = np.asarray(cotangent, np.float64)
    half = 2
    expected = np.empty_like(c)
    for t in range(5):
        for j in range(half):
            angle = t * 10_000.0 ** (-2 * j / 4)
            cos, sin = math.cos(angle), math.sin(angle)
            expected[t, j] = c[t, j] * cos + c[t, j + half] * sin
            expected[t, j + half] = c[t, j + half] * cos - c[t, j] * sin
    assert np.allclose(grad, expected, atol=1e-5)


def test_rotation_preserves_norms_and_encodes_relative_position():
    rope = Rope(8)
    q = jnp.tile(_random(0, (1, 8)), (6, 1))
    k = jnp.tile(_random(1, (1, 8)), (6, 1))
    rq, rk = rope(q), rope(k)
    assert jnp.allclose(jnp.linalg.norm(rq, axis=1), jnp.linalg.norm(q, axis=1))
    # <R_m q, R_n k> depends only on m - n.
    assert jnp.allclose(rq[3] @ rk[1], rq[4] @ rk[2], atol=1e-5)
    assert jnp.allclose(rq[5] @ rk[5], q[0] @ k[0], atol=1e-5)


def test_precompute_freqs_cis_matches_formula():
    cos, sin = Rope.precompute_freqs_cis(6, 4, 100.0, jnp.float32)
    assert cos.shape == sin.shape == (4, 3)
    angles = np.outer(np.arange(4), 100.0 ** (-np.arange(0, 6, 2) / 6))
    assert np.allclose(cos, np.cos(angles), atol=1e-6)
    assert np.allclose(sin, np.sin(angles), atol=1e-6)
    half_cos, _ = Rope.precompute_freqs_cis(6, 4, 100.0, jnp.bfloat16)
    assert half_cos.dtype == jnp.bfloat16


def test_rotate_half():
    x = jnp.arange(6.0).reshape(1, 6)
    assert jnp.array_equal(Rope.rotate_half(x), jnp.array([[-3.0, -4, -5, 0, 1, 2]]))


def test_cached_tables_serve_longer_and_shorter_sequences():
    rope = Rope(4)
    short, long = _random(0, (3, 4)), _random(1, (12, 4))
    first = rope(short)
    assert np.allclose(rope(long), rotation_reference(long), atol=1e-5)
    assert jnp.array_equal(rope(short), first)


def test_theta_is_part_of_the_cached_tables():
    x = _random(0, (5, 4))
    a = Rope(4, theta=10.0)(x)
    b = Rope(4, theta=1000.0)(x)
    assert np.allclose(b, rotation_reference(x, 1000.0), atol=1e-5)
    assert not jnp.allclose(a, b)


def test_under_jit_and_vmap_over_heads():
    rope = Rope(4)
    heads = _random(0, (6, 3, 4))  # (seq_length, num_heads, size)
    out = fx.filter_jit(jax.vmap(rope, in_axes=1, out_axes=1))(heads)
    for h in range(3):
        assert np.allclose(out[:, h], rotation_reference(heads[:, h]), atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_layer_keeps_its_dtype(dtype):
    rope = Rope(4, dtype=dtype)
    x = _random(0, (5, 4), dtype)
    out = rope(x)
    assert out.dtype == dtype
    assert np.allclose(out.astype(jnp.float32), rotation_reference(x), atol=5e-2)


def test_float64():
    with jax.enable_x64(True):
        rope = Rope(4)
        assert rope.dtype == jnp.float64
        x = jax.random.normal(jax.random.key(0), (5, 4), jnp.float64)
        out = rope(x)
        assert out.dtype == jnp.float64
        assert np.allclose(out, rotation_reference(x), atol=1e-12)


def test_mismatched_dtype_under_strict_promotion_explains_the_fix():
    rope = Rope(4)
    x = _random(0, (3, 4), jnp.float16)
    with pytest.raises(
        jax.dtypes.TypePromotionError, match="cast the input to float32"
    ):
        rope(x)
    with jax.numpy_dtype_promotion("standard"):
        out = rope(x)
    assert out.dtype == jnp.float16


@pytest.mark.parametrize("size, message", [(3, "must be even"), (-2, "non-negative")])
def test_bad_embedding_size_raises(size, message):
    with pytest.raises(ValueError, match=message):
        Rope(size)


@pytest.mark.parametrize("shape", [(4,), (3, 6), (2, 3, 4)])
def test_wrong_input_shape_raises(shape):
    with pytest.raises(ValueError, match=r"shape \(seq_length, 4\)"):
        Rope(4)(jnp.ones(shape))
