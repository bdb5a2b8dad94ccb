"""`filterax.nn.Sequential`, `Lambda` and `StatefulLayer`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


def _two_linears():
    k1, k2 = jax.random.split(jax.random.key(0))
    return fx.nn.Linear(3, 4, key=k1), fx.nn.Linear(4, 2, key=k2)


def test_applies_the_layers_in_order():
    first, second = _two_linears()
    model = fx.nn.Sequential([first, fx.nn.Lambda(jnp.tanh), second])
    x = jnp.array([0.1, -0.2, 0.3])
    np.testing.assert_allclose(model(x), second(jnp.tanh(first(x))), rtol=1e-6)


def test_gradients_through_the_layers():
    first, second = _two_linears()
    model = fx.nn.Sequential([first, fx.nn.Lambda(jnp.tanh), second])
    x = jnp.array([0.1, -0.2, 0.3])
    grads = fx.filter_grad(lambda m: jnp.sum(m(x)))(model)

    def by_hand(w1, b1, w2, b2):
        return jnp.sum(w2 @ jnp.tanh(w1 @ x + b1) + b2)

    expected = jax.grad(by_hand, argnums=(0, 1, 2, 3))(
        first.weight, first.bias, second.weight, second.bias
    )
    got = (grads[0].weight, grads[0].bias, grads[2].weight, grads[2].bias)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_indexing_slicing_length_and_iteration():
    first, second = _two_linears()
    model = fx.nn.Sequential([first, fx.nn.Identity(), second])
    assert len(model) == 3
    assert model[0] is first and model[-1] is second
    assert model[np.int64(2)] is second
    tail = model[1:]
    assert isinstance(tail, fx.nn.Sequential) and tail.layers == model.layers[1:]
    assert list(model) == list(model.layers)
    assert fx.nn.Sequential(list(model)) == model


def test_bad_index_type():
    with pytest.raises(TypeError, match="int .* or a slice"):
        fx.nn.Sequential([fx.nn.Identity()])["first"]  # pyright: ignore[reportCallIssue, reportArgumentType]


def test_layers_must_be_callable():
    with pytest.raises(TypeError, match="position 1"):
        fx.nn.Sequential([fx.nn.Identity(), jnp.ones(2)])  # pyright: ignore[reportArgumentType]


def test_key_is_split_between_the_layers():
    model = fx.nn.Sequential([fx.nn.Dropout(0.5), fx.nn.Dropout(0.5)])
    key = jax.random.key(1)
    x = jnp.ones(64)
    k1, k2 = jax.random.split(key, 2)
    expected = fx.nn.Dropout(0.5)(fx.nn.Dropout(0.5)(x, key=k1), key=k2)
    np.testing.assert_array_equal(model(x, key=key), expected)


def test_an_rng_stream_is_shared_by_the_layers():
    model = fx.nn.Sequential([fx.nn.Dropout(0.5), fx.nn.Identity(), fx.nn.Dropout(0.5)])
    x = jnp.ones(64)
    y = model(x, key=fx.RngStream(3))
    base = jax.random.key(3)
    k0, k1 = jax.random.fold_in(base, 0), jax.random.fold_in(base, 1)
    expected = fx.nn.Dropout(0.5)(fx.nn.Dropout(0.5)(x, key=k0), key=k1)
    np.testing.assert_array_equal(y, expected)


def test_state_is_threaded_through_stateful_layers_only():
    class Counter(fx.nn.StatefulLayer):
        index: fx.nn.StateIndex

        def __init__(self):
            self.index = fx.nn.StateIndex(jnp.array(0))

        def __call__(self, x, state, *, key=None):
            count = state.get(self.index)
            return x + count, state.set(self.index, count + 1)

    first, second = _two_linears()
    model, state = fx.nn.make_with_state(fx.nn.Sequential)([first, Counter(), second])
    assert model.is_stateful()
    x = jnp.array([0.1, -0.2, 0.3])
    y, state = model(x, state)
    np.testing.assert_allclose(y, second(first(x)), rtol=1e-6)
    y, state = model(x, state)
    np.testing.assert_allclose(y, second(first(x) + 1), rtol=1e-6)
    assert int(state.get(model[1].index)) == 2


def test_nested_sequentials_thread_the_state():
    bn = fx.nn.BatchNorm(2, "batch", mode="batch")
    inner = fx.nn.Sequential([fx.nn.Identity(), bn])
    model, state = fx.nn.make_with_state(fx.nn.Sequential)([inner, fx.nn.Identity()])
    assert (
        model.is_stateful() and not fx.nn.Sequential([fx.nn.Identity()]).is_stateful()
    )
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    run = jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    y, state = run(x, state)
    np.testing.assert_allclose(y, jnp.array([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-4)
    assert int(state.get(model[0][1].batch_counter)) == 1


def test_without_state_returns_only_the_output():
    model = fx.nn.Sequential([fx.nn.Identity()])
    x = jnp.ones(2)
    assert model(x) is x


def test_stateful_layer_without_call_cannot_be_instantiated():
    class Incomplete(fx.nn.StatefulLayer):
        pass

    with pytest.raises(TypeError, match="__call__"):
        Incomplete()  # pyright: ignore[reportAbstractUsage]


def test_lambda_applies_its_function_and_ignores_the_key():
    layer = fx.nn.Lambda(jax.nn.relu)
    np.testing.assert_array_equal(
        layer(jnp.array([-1.0, 2.0]), key=jax.random.key(0)), jnp.array([0.0, 2.0])
    )
    assert jax.tree_util.tree_leaves(layer) == [jax.nn.relu]


def test_lambda_of_a_module_carries_its_parameters():
    first, _ = _two_linears()
    layer = fx.nn.Lambda(first)
    grads = fx.filter_grad(lambda m: jnp.sum(m(jnp.ones(3))))(layer)
    np.testing.assert_allclose(grads.fn.weight, jnp.ones((4, 3)))


def test_lambda_needs_a_callable():
    with pytest.raises(TypeError, match="callable"):
        fx.nn.Lambda(3)  # pyright: ignore[reportArgumentType]


def test_sequential_under_filter_jit_and_vmap():
    first, second = _two_linears()
    model = fx.nn.Sequential([first, fx.nn.Lambda(jax.nn.relu), second])
    xs = jnp.arange(6.0).reshape(2, 3)
    ys = fx.filter_jit(fx.filter_vmap(lambda m, x: m(x), in_axes=(None, 0)))(model, xs)
    np.testing.assert_allclose(ys, jnp.stack([model(x) for x in xs]), rtol=1e-6)
