"""`filterax.nn.Shared`: tying nodes together."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


class TiedModel(fx.Module):
    """An embedding and an output layer sharing one weight."""

    shared: fx.nn.Shared

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        embedding = fx.nn.Embedding(5, 5, key=k1)
        head = fx.nn.Linear(5, 5, use_bias=False, key=k2)
        self.shared = fx.nn.Shared(
            (embedding, head), lambda pair: pair[1].weight, lambda pair: pair[0].weight
        )

    def __call__(self, token):
        embedding, head = self.shared()
        return head(embedding(token))


def test_the_tied_node_is_the_source():
    model = TiedModel(jax.random.key(0))
    embedding, head = model.shared()
    assert head.weight is embedding.weight


def test_the_tied_node_is_stored_once():
    model = TiedModel(jax.random.key(0))
    leaves = jax.tree_util.tree_leaves(model)
    assert len([x for x in leaves if fx.is_array(x)]) == 1
    # The head's weight is a placeholder.
    assert repr(model.shared.pytree[1].weight) == "SharedNode"


def test_output_and_gradient_match_one_weight_used_twice():
    model = TiedModel(jax.random.key(0))
    weight = model.shared.pytree[0].weight
    token = jnp.array(3)

    def by_hand(w):
        return jnp.sum(jnp.tanh(w @ w[3]))

    np.testing.assert_allclose(model(token), weight @ weight[3], rtol=1e-6)
    grads = fx.filter_grad(lambda m: jnp.sum(jnp.tanh(m(token))))(model)
    np.testing.assert_allclose(
        grads.shared.pytree[0].weight, jax.grad(by_hand)(weight), rtol=1e-5, atol=1e-7
    )


def test_nodes_stay_tied_after_an_update():
    model = TiedModel(jax.random.key(0))
    grads = fx.filter_grad(lambda m: jnp.sum(m(jnp.array(1))))(model)
    model = fx.apply_updates(model, jax.tree_util.tree_map(lambda g: -0.1 * g, grads))
    embedding, head = model.shared()
    assert head.weight is embedding.weight


def test_several_nodes_with_computed_values():
    k1, k2 = jax.random.split(jax.random.key(1))
    source = fx.nn.Linear(3, 3, key=k1)
    target = fx.nn.Sequential([fx.nn.Linear(3, 3, key=k2), fx.nn.Linear(3, 3, key=k2)])
    shared = fx.nn.Shared(
        (source, target),
        lambda p: (p[1][0], p[1][1].weight),
        lambda p: (p[0], p[0].weight.T),
    )
    source_out, target_out = shared()
    assert fx.tree_equal(target_out[0], source)
    np.testing.assert_array_equal(target_out[1].weight, source.weight.T)
    # The second layer keeps its own bias.
    np.testing.assert_array_equal(target_out[1].bias, target[1].bias)


def test_mismatched_nodes_are_an_error():
    with pytest.raises(ValueError, match="Every node being shared together") as info:
        fx.nn.Shared(
            (jnp.ones((3, 4)), jnp.ones((4, 3))), lambda p: p[0], lambda p: p[1]
        )
    assert "f32[4,3]" in str(info.value) and "f32[3,4]" in str(info.value)
    with pytest.raises(ValueError, match="Every node being shared together"):
        fx.nn.Shared(
            (jnp.ones(2), jnp.ones(2, jnp.int32)), lambda p: p[0], lambda p: p[1]
        )


def test_where_and_get_must_be_callable():
    with pytest.raises(TypeError, match="callables"):
        fx.nn.Shared((1.0, 2.0), 0, lambda p: p[1])  # pyright: ignore[reportArgumentType]


def test_filter_jit_does_not_recompile_for_a_rebuilt_model():
    traces = []

    @fx.filter_jit
    def apply(model, token):
        traces.append(None)
        return model(token)

    first = TiedModel(jax.random.key(0))
    apply(first, jnp.array(0))
    # Different weights, same structure: the compiled function is reused.
    rebuilt = jax.tree_util.tree_map(lambda x: x + 1 if fx.is_array(x) else x, first)
    np.testing.assert_allclose(
        apply(rebuilt, jnp.array(0)), rebuilt(jnp.array(0)), rtol=1e-6
    )
    assert len(traces) == 1


def test_serialisation_round_trip():
    model = TiedModel(jax.random.key(0))
    buffer = io.BytesIO()
    fx.tree_serialise_leaves(buffer, model)
    buffer.seek(0)
    loaded = fx.tree_deserialise_leaves(buffer, TiedModel(jax.random.key(1)))
    np.testing.assert_array_equal(loaded(jnp.array(2)), model(jnp.array(2)))
    embedding, head = loaded.shared()
    assert head.weight is embedding.weight


def test_a_projection_of_attention_is_shared_with_a_linear_built_alone():
    # The projections' default logical axes are declared on the attention's
    # fields, so each projection is an ordinary Linear, equal in structure to
    # one built on its own.
    k1, k2 = jax.random.split(jax.random.key(0))
    attention = fx.nn.MultiheadAttention(3, 12, key=k1)
    projection = fx.nn.Linear(12, 12, use_bias=False, key=k2)
    shared = fx.nn.Shared(
        (attention, projection), lambda pair: pair[1], lambda pair: pair[0].key_proj
    )
    attention, projection = shared()
    assert projection.weight is attention.key_proj.weight
    assert fx.logical_axes(attention).key_proj.weight == ("heads", "embed")
    assert fx.logical_axes(projection).weight == ("out", "in")
