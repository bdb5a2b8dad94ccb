"""`RngStream`: the same keys eagerly, under `filter_jit`, across scan iterations;
a stream per example with `split`; never differentiated; saved with its counter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

SEED = jax.random.key(7)


def by_hand(count, key=SEED):
    """The key a stream made from `key` draws when its counter is `count`."""
    return jax.random.fold_in(key, count)


def assert_same_keys(actual, expected):
    assert fx.is_key_array(actual) and fx.is_key_array(expected)
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(
        jax.random.key_data(actual), jax.random.key_data(expected)
    )


def test_eager_draws_fold_in_the_counter_and_advance_it():
    stream = fx.RngStream(SEED)
    keys = [stream() for _ in range(3)]
    assert_same_keys(jnp.stack(keys), jnp.stack([by_hand(n) for n in range(3)]))
    assert stream.count.dtype == jnp.uint32
    assert int(stream.count[...]) == 3


def test_filter_jit_draws_the_same_keys_as_eager():
    eager = fx.RngStream(SEED)
    expected = [eager() for _ in range(4)]

    stream = fx.RngStream(SEED)
    draw_two = fx.filter_jit(lambda stream: (stream(), stream()))
    keys = [*draw_two(stream), *draw_two(stream)]
    assert_same_keys(jnp.stack(keys), jnp.stack(expected))
    assert int(stream.count[...]) == 4


def test_a_stream_returned_from_filter_jit_is_the_same_stream():
    stream = fx.RngStream(SEED)
    returned = fx.filter_jit(lambda stream: stream)(stream)
    assert returned.count is stream.count
    returned()
    assert int(stream.count[...]) == 1


def test_lax_scan_draws_one_new_key_per_iteration():
    stream = fx.RngStream(SEED)
    _, keys = jax.lax.scan(lambda carry, _: (carry, stream()), None, length=5)
    assert_same_keys(keys, jnp.stack([by_hand(n) for n in range(5)]))
    assert int(stream.count[...]) == 5


def test_filter_scan_draws_one_new_key_per_iteration():
    # The stream is the carry: filter_scan passes its Ref through by identity.
    stream = fx.RngStream(SEED)
    stream()
    out, keys = fx.filter_scan(lambda s, _: (s, s()), stream, length=5)
    assert_same_keys(keys, jnp.stack([by_hand(n) for n in range(1, 6)]))
    assert out.count is stream.count
    assert int(stream.count[...]) == 6


def test_split_under_filter_vmap_gives_each_example_its_own_stream():
    parent = fx.RngStream(SEED)
    streams = parent.split(4)
    assert int(parent.count[...]) == 1  # split draws one key from the parent
    assert streams.key.shape == streams.count.shape == (4,)

    first, second = fx.filter_vmap(lambda s: (s(), s()))(streams)

    children = jax.random.split(by_hand(0), 4)
    assert_same_keys(first, jax.vmap(by_hand, in_axes=(None, 0))(0, children))
    assert_same_keys(second, jax.vmap(by_hand, in_axes=(None, 0))(1, children))
    drawn = jax.random.key_data(jnp.concatenate([first, second]))
    assert len({tuple(row) for row in np.asarray(drawn).tolist()}) == 8
    np.testing.assert_array_equal(streams.count[...], [2, 2, 2, 2])


class Noisy(fx.Module):
    scale: jax.Array
    stream: fx.RngStream

    def __call__(self, x):
        return x + self.scale * jax.random.normal(self.stream(), x.shape)


def test_filter_grad_gives_no_gradient_for_a_stream():
    model = Noisy(jnp.array(2.0), fx.RngStream(SEED))
    x = jnp.arange(3.0)
    grads = fx.filter_grad(lambda m, x: jnp.sum(m(x) ** 2))(model, x)

    noise = jax.random.normal(by_hand(0), x.shape)
    expected = jax.grad(lambda s: jnp.sum((x + s * noise) ** 2))(model.scale)
    np.testing.assert_array_equal(grads.scale, expected)
    assert jax.tree.leaves(grads.stream) == []
    assert int(model.stream.count[...]) == 1


def test_a_stream_passed_to_filter_grad_first_gets_no_gradient():
    stream = fx.RngStream(SEED)
    with pytest.warns(fx.NoDifferentiableLeafWarning):
        grads = fx.filter_grad(lambda s, x: jnp.sum(jax.random.normal(s(), (2,)) * x))(
            stream, jnp.ones(2)
        )
    assert isinstance(grads, fx.RngStream)
    assert jax.tree.leaves(grads) == []


def test_a_stream_round_trips_through_a_checkpoint_with_its_counter(tmp_path):
    stream = fx.RngStream(SEED)
    for _ in range(3):
        stream()
    path = tmp_path / "stream.eqx"
    fx.tree_serialise_leaves(path, stream)

    like = fx.RngStream(jax.random.key(0))
    restored = fx.tree_deserialise_leaves(path, like)
    assert fx.is_ref(restored.count)
    assert restored.count is not like.count
    assert restored.count is not stream.count
    assert int(restored.count[...]) == 3
    assert_same_keys(restored(), by_hand(3))
    assert int(stream.count[...]) == 3  # the saved stream is left alone
