"""The `nn` layers compute in Equinox's order of operations, so that a model
ported from Equinox gives bit-for-bit the same numbers: eagerly, under
`jax.jit`, and under `jax.vmap` (where a product written the other way round
runs a different kernel and differs by an ulp).

Each reference below is the layer's formula written out in that order
(`weight @ x + bias`, heads attended one by one, ...); the comparisons are
exact."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

_BATCH = 7


def _normal(seed: int, *shape: int) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _assert_bitwise_equal(got: Any, expected: Any) -> None:
    got_leaves, expected_leaves = jax.tree.leaves(got), jax.tree.leaves(expected)
    assert len(got_leaves) == len(expected_leaves)
    for g, e in zip(got_leaves, expected_leaves):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert np.array_equal(np.asarray(g), np.asarray(e)), np.max(
            np.abs(np.asarray(g) - np.asarray(e))
        )


def _assert_same_in_every_mode(
    layer: Callable[..., Any],
    reference: Callable[..., Any],
    one: tuple[jax.Array, ...],
    batch: tuple[jax.Array, ...],
) -> None:
    def layer_fn(*args: jax.Array) -> Any:  # a plain function, for `jax.jit`
        return layer(*args)

    _assert_bitwise_equal(layer_fn(*one), reference(*one))
    _assert_bitwise_equal(jax.jit(layer_fn)(*one), jax.jit(reference)(*one))
    _assert_bitwise_equal(jax.vmap(layer_fn)(*batch), jax.vmap(reference)(*batch))
    _assert_bitwise_equal(
        jax.jit(jax.vmap(layer_fn))(*batch), jax.jit(jax.vmap(reference))(*batch)
    )


def _affine(weight: jax.Array, bias: jax.Array | None, x: jax.Array) -> jax.Array:
    out = weight @ x
    return out if bias is None else out + bias


@pytest.mark.parametrize("use_bias", [True, False])
def test_linear_computes_weight_at_x_plus_bias(use_bias: bool):
    # 64 -> 32 with a batch of 7 is a size where an eager `vmap` of `x @ W.T`
    # and of `W @ x` round differently.
    layer = fx.nn.Linear(64, 32, use_bias=use_bias, key=jax.random.key(0))
    _assert_same_in_every_mode(
        layer,
        lambda x: _affine(layer.weight, layer.bias, x),
        (_normal(1, 64),),
        (_normal(2, _BATCH, 64),),
    )


def test_linear_under_vmap_is_a_product_with_the_weight_on_the_left():
    layer = fx.nn.Linear(3, 4, key=jax.random.key(0))
    eqns = jax.make_jaxpr(jax.vmap(layer))(jnp.ones((5, 3))).eqns
    [product] = [e for e in eqns if e.primitive.name == "dot_general"]
    assert product.invars[0].aval.shape == (4, 3)  # the weight
    assert product.outvars[0].aval.shape == (4, 5)  # (out, batch), then transposed


def test_mlp_chains_weight_at_x_plus_bias_and_activations():
    mlp = fx.nn.MLP(16, 5, 32, 2, key=jax.random.key(0))

    def reference(x: jax.Array) -> jax.Array:
        for layer in mlp.layers[:-1]:
            x = jax.nn.relu(_affine(layer.weight, layer.bias, x))
        last = mlp.layers[-1]
        return _affine(last.weight, last.bias, x)

    _assert_same_in_every_mode(
        mlp, reference, (_normal(1, 16),), (_normal(2, _BATCH, 16),)
    )


def test_multihead_attention_projects_tokens_then_attends_head_by_head():
    attention = fx.nn.MultiheadAttention(
        2, 8, key_size=6, value_size=4, use_output_bias=True, key=jax.random.key(0)
    )

    def project(linear: fx.nn.Linear, x: jax.Array) -> jax.Array:
        tokens = jax.vmap(lambda t: _affine(linear.weight, linear.bias, t))(x)
        return tokens.reshape(x.shape[0], 2, -1)

    def one_head(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        logits = jnp.einsum("sd,Sd->sS", q / math.sqrt(q.shape[-1]), k)
        return jnp.einsum("sS,Sd->sd", jax.nn.softmax(logits), v)

    def reference(query: jax.Array, key: jax.Array, value: jax.Array) -> jax.Array:
        heads = jax.vmap(one_head, in_axes=1, out_axes=1)(
            project(attention.query_proj, query),
            project(attention.key_proj, key),
            project(attention.value_proj, value),
        )
        out = attention.output_proj
        return jax.vmap(lambda t: _affine(out.weight, out.bias, t))(
            heads.reshape(query.shape[0], -1)
        )

    _assert_same_in_every_mode(
        lambda q, k, v: attention(q, k, v),
        reference,
        (_normal(1, 5, 8), _normal(2, 3, 6), _normal(3, 3, 4)),
        (_normal(4, _BATCH, 5, 8), _normal(5, _BATCH, 3, 6), _normal(6, _BATCH, 3, 4)),
    )


def test_gru_cell_follows_the_gate_order():
    cell = fx.nn.GRUCell(16, 8, key=jax.random.key(0))

    def reference(x: jax.Array, h: jax.Array) -> jax.Array:
        assert cell.bias is not None and cell.bias_n is not None
        i_r, i_z, i_n = jnp.split(cell.weight_ih @ x + cell.bias, 3)
        h_r, h_z, h_n = jnp.split(cell.weight_hh @ h, 3)
        reset = jax.nn.sigmoid(i_r + h_r)
        update = jax.nn.sigmoid(i_z + h_z)
        new = jnp.tanh(i_n + reset * (h_n + cell.bias_n))
        return new + update * (h - new)

    _assert_same_in_every_mode(
        cell,
        reference,
        (_normal(1, 16), _normal(2, 8)),
        (_normal(3, _BATCH, 16), _normal(4, _BATCH, 8)),
    )


def test_lstm_cell_follows_the_gate_order():
    cell = fx.nn.LSTMCell(16, 8, key=jax.random.key(0))

    def reference(x: jax.Array, h: jax.Array, c: jax.Array) -> tuple[Any, Any]:
        assert cell.bias is not None
        gates = cell.weight_ih @ x + cell.weight_hh @ h + cell.bias
        i, f, g, o = jnp.split(gates, 4)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c

    _assert_same_in_every_mode(
        lambda x, h, c: cell(x, (h, c)),
        reference,
        (_normal(1, 16), _normal(2, 8), _normal(3, 8)),
        (_normal(4, _BATCH, 16), _normal(5, _BATCH, 8), _normal(6, _BATCH, 8)),
    )


def test_conv_convolves_one_example_then_adds_the_bias():
    conv = fx.nn.Conv2d(3, 4, 3, stride=2, padding=1, key=jax.random.key(0))

    def reference(x: jax.Array) -> jax.Array:
        out = jax.lax.conv_general_dilated(
            x[None], conv.weight, (2, 2), ((1, 1), (1, 1))
        )[0]
        assert conv.bias is not None
        return out + conv.bias

    _assert_same_in_every_mode(
        conv, reference, (_normal(1, 3, 9, 9),), (_normal(2, _BATCH, 3, 9, 9),)
    )


def test_layer_norm_scales_then_shifts_the_normalised_input():
    norm = fx.nn.LayerNorm(32)
    norm = fx.tree_at(
        lambda n: (n.weight, n.bias), norm, (_normal(7, 32), _normal(8, 32))
    )

    def reference(x: jax.Array) -> jax.Array:
        mean = jnp.mean(x, keepdims=True)
        variance = jnp.maximum(0.0, jnp.var(x, keepdims=True))
        out = (x - mean) * jax.lax.rsqrt(variance + norm.eps)
        assert norm.weight is not None and norm.bias is not None
        return norm.weight * out + norm.bias

    _assert_same_in_every_mode(
        norm, reference, (_normal(1, 32),), (_normal(2, _BATCH, 32),)
    )


def test_rms_norm_scales_by_the_reciprocal_root_mean_square():
    norm = fx.nn.RMSNorm(32)
    norm = fx.tree_at(
        lambda n: (n.weight, n.bias), norm, (_normal(7, 32), _normal(8, 32))
    )

    def reference(x: jax.Array) -> jax.Array:
        out = jax.lax.rsqrt(jnp.mean(x**2) + norm.eps) * x
        assert norm.weight is not None and norm.bias is not None
        return norm.weight * out + norm.bias

    _assert_same_in_every_mode(
        norm, reference, (_normal(1, 32),), (_normal(2, _BATCH, 32),)
    )
