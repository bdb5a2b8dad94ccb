"""`filterax.nn.Stacked`: layers of one structure, stacked and scanned."""

from __future__ import annotations

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx
from filterax import nn

WIDTH = 4


class Block(fx.Module):
    """A small residual block: `x + linear(norm(x))`."""

    norm: nn.LayerNorm
    linear: nn.Linear

    def __init__(self, key: jax.Array):
        self.norm = nn.LayerNorm(WIDTH)
        self.linear = nn.Linear(WIDTH, WIDTH, key=key)

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        del key
        return x + jnp.tanh(self.linear(self.norm(x)))


class Scaled(fx.Module):
    """A layer taking an extra argument and keyword, passed unchanged."""

    linear: nn.Linear

    def __init__(self, key: jax.Array):
        self.linear = nn.Linear(WIDTH, WIDTH, key=key)

    def __call__(self, x: jax.Array, scale: jax.Array, *, shift: float) -> jax.Array:
        return jnp.tanh(self.linear(x)) * scale + shift


class Noisy(fx.Module):
    """Dropout twice per layer, so that a layer draws two keys."""

    linear: nn.Linear
    dropout: nn.Dropout

    def __init__(self, key: jax.Array):
        self.linear = nn.Linear(WIDTH, WIDTH, key=key)
        self.dropout = nn.Dropout(0.5)

    def __call__(self, x: jax.Array, *, key: fx.RngStream | None = None) -> jax.Array:
        return self.dropout(self.linear(self.dropout(x, key=key)), key=key)


def _x() -> jax.Array:
    return jnp.linspace(-1.0, 1.0, WIDTH)


def _unrolled(layers, x, **kwargs):
    for layer in layers:
        x = layer(x, **kwargs)
    return x


def _count_equations(jaxpr) -> int:
    total = 0
    for equation in jaxpr.eqns:
        total += 1
        for sub in jax.extend.core.jaxprs_in_params(equation.params):
            total += _count_equations(sub)
    return total


# --- construction, indexing, conversion ----------------------------------------


def test_layer_i_is_make_of_the_ith_key():
    key = jax.random.key(0)
    stacked = nn.Stacked(Block, 3, key=key)
    keys = jax.random.split(key, 3)
    assert len(stacked) == 3
    assert stacked.layers.linear.weight.shape == (3, WIDTH, WIDTH)
    for i in range(3):
        expected = Block(keys[i])
        np.testing.assert_allclose(
            stacked[i].linear.weight, expected.linear.weight, rtol=1e-6
        )
        assert fx.tree_equal(stacked[i].norm, expected.norm)


def test_negative_index_slice_and_out_of_range():
    stacked = nn.Stacked(Block, 4, key=jax.random.key(0))
    assert fx.tree_equal(stacked[-1], stacked[3])
    part = stacked[1:4:2]
    assert isinstance(part, nn.Stacked) and len(part) == 2
    assert fx.tree_equal(part.unstack(), [stacked[1], stacked[3]])
    with pytest.raises(IndexError, match="index 4 is out of range for a stack of 4"):
        stacked[4]
    with pytest.raises(TypeError, match="indexed with an int"):
        stacked["a"]  # type: ignore[index]


def test_unstack_and_from_layers_are_inverse():
    stacked = nn.Stacked(Block, 3, key=jax.random.key(0), remat=True, unroll=2)
    layers = stacked.unstack()
    assert [type(layer) for layer in layers] == [Block] * 3
    again = nn.Stacked.from_layers(layers, remat=True, unroll=2)
    assert fx.tree_equal(again, stacked)


def test_num_must_be_a_positive_int():
    with pytest.raises(ValueError, match="at least 1"):
        nn.Stacked(Block, 0, key=jax.random.key(0))
    with pytest.raises(TypeError, match="`num` must be an int"):
        nn.Stacked(Block, 2.0, key=jax.random.key(0))  # type: ignore[arg-type]


def test_make_that_reads_its_key_but_keeps_one_structure_works():
    def make(key):
        if jax.random.uniform(key) > 2.0:  # never; but needs the key's value
            raise AssertionError
        return Block(key)

    stacked = nn.Stacked(make, 3, key=jax.random.key(0))
    reference = nn.Stacked(Block, 3, key=jax.random.key(0))
    np.testing.assert_allclose(
        stacked.layers.linear.weight, reference.layers.linear.weight, rtol=1e-6
    )


# --- application ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remat", "unroll"),
    [(False, 1), (True, 2), (jax.checkpoint_policies.nothing_saveable, 1)],
)
def test_outputs_and_gradients_equal_the_unrolled_layers(remat, unroll):
    stacked = nn.Stacked(Block, 3, key=jax.random.key(0), remat=remat, unroll=unroll)
    layers = stacked.unstack()
    x = _x()
    np.testing.assert_allclose(stacked(x), _unrolled(layers, x), rtol=1e-5, atol=1e-6)

    grads = fx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(stacked)
    expected = fx.filter_grad(lambda ls: jnp.sum(_unrolled(ls, x) ** 2))(layers)
    stacked_expected = nn.Stacked.from_layers(expected)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(stacked_expected)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_extra_arguments_reach_every_layer_unchanged():
    stacked = nn.Stacked(Scaled, 3, key=jax.random.key(1))
    x, scale = _x(), jnp.asarray(0.5)
    expected = x
    for layer in stacked.unstack():
        expected = layer(expected, scale, shift=0.25)
    np.testing.assert_allclose(stacked(x, scale, shift=0.25), expected, rtol=1e-6)


def test_trace_size_does_not_grow_with_depth():
    x = _x()

    def equations(depth: int, stacked: bool) -> int:
        model = nn.Stacked(Block, depth, key=jax.random.key(0))
        if not stacked:
            model = model.unstack()
            loss = lambda m: jnp.sum(_unrolled(m, x))  # noqa: E731
        else:
            loss = lambda m: jnp.sum(m(x))  # noqa: E731
        grad = fx.filter_grad(loss)
        return _count_equations(fx.filter_make_jaxpr(grad)(model)[0].jaxpr)

    assert equations(2, stacked=True) == equations(6, stacked=True)
    assert equations(6, stacked=False) > 2 * equations(2, stacked=False)


def test_under_filter_jit_and_filter_vmap():
    stacked = nn.Stacked(Block, 3, key=jax.random.key(0))
    layers = stacked.unstack()
    xs = jnp.stack([_x(), -_x()])
    jitted = fx.filter_jit(lambda m, x: m(x))(stacked, xs[0])
    np.testing.assert_allclose(jitted, _unrolled(layers, xs[0]), rtol=1e-5)
    mapped = fx.filter_vmap(stacked)(xs)
    expected = jnp.stack([_unrolled(layers, x) for x in xs])
    np.testing.assert_allclose(mapped, expected, rtol=1e-5, atol=1e-6)
    # An ensemble: two stacks mapped over by filter_vmap.
    ensemble = fx.filter_vmap(
        lambda key: nn.Stacked(Block, 3, key=key), out_axes=fx.if_array(0)
    )(jax.random.split(jax.random.key(2), 2))
    out = fx.filter_vmap(lambda m, x: m(x))(ensemble, xs)
    second = jax.tree.map(lambda a: a[1] if fx.is_array(a) else a, ensemble)
    np.testing.assert_allclose(out[1], second(xs[1]), rtol=1e-5, atol=1e-6)


# --- state and keys ---------------------------------------------------------------


def _batch_norm(key: jax.Array) -> nn.BatchNorm:
    del key
    return nn.BatchNorm(WIDTH, "batch", mode="batch")


@pytest.mark.parametrize("by_keyword", [False, True])
def test_each_layer_reads_and_writes_its_own_state(by_keyword):
    stacked, state = nn.make_with_state(nn.Stacked)(
        _batch_norm, 3, key=jax.random.key(0)
    )
    counter, statistics = stacked.layers.batch_counter, stacked.layers.batch_state_index
    assert counter is not None and statistics is not None
    assert state.get(counter).shape == (3,)
    xs = jnp.stack([_x(), 2 * _x() + 1, -_x()])

    if by_keyword:
        call = lambda x, s: stacked(x, state=s)  # noqa: E731
    else:
        call = stacked
    run = jax.vmap(call, axis_name="batch", in_axes=(0, None), out_axes=(0, None))
    ys, new_state = run(xs, jax.tree.map(lambda v: v, state))

    # By hand: layer i with the i-th slice of every state entry.
    expected_ys = xs
    for i, layer in enumerate(stacked.unstack()):
        layer_state = jax.tree.map(lambda v, i=i: v[i], state)
        run_one = jax.vmap(
            layer, axis_name="batch", in_axes=(0, None), out_axes=(0, None)
        )
        expected_ys, layer_state = run_one(expected_ys, layer_state)
        mean, _ = layer_state.get(statistics)
        got_mean, _ = jax.tree.map(lambda v, i=i: v[i], new_state).get(statistics)
        np.testing.assert_allclose(got_mean, mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ys, expected_ys, rtol=1e-5, atol=1e-6)
    assert new_state.get(counter).tolist() == [1, 1, 1]


def test_a_prng_key_is_split_one_key_per_layer_as_sequential_does():
    stacked = nn.Stacked(Noisy, 3, key=jax.random.key(0))
    key = jax.random.key(7)
    expected = nn.Sequential(stacked.unstack())(_x(), key=key)
    np.testing.assert_allclose(stacked(_x(), key=key), expected, rtol=1e-6)


def test_an_rng_stream_is_shared_and_advances_as_in_the_unrolled_loop():
    stacked = nn.Stacked(Noisy, 3, key=jax.random.key(0))
    stream, reference = fx.RngStream(3), fx.RngStream(3)
    expected = _unrolled(stacked.unstack(), _x(), key=reference)
    got = fx.filter_jit(lambda m, x, s: m(x, key=s))(stacked, _x(), stream)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert int(stream.count[...]) == int(reference.count[...]) == 6


def test_remat_refuses_an_rng_stream():
    stacked = nn.Stacked(Noisy, 2, key=jax.random.key(0), remat=True)
    with pytest.raises(ValueError, match="cannot draw from a stream"):
        stacked(_x(), key=fx.RngStream(0))


# --- errors -----------------------------------------------------------------------


def test_make_with_key_dependent_structure_names_layer_and_path():
    sizes = iter([2, 3, 3])

    def make(key):
        jax.random.uniform(key).item()  # reads the key's value
        return nn.Linear(next(sizes), WIDTH, key=key)

    with pytest.raises(
        ValueError, match=r"layer 1 differs from layer 0 at layers\[1\]"
    ):
        nn.Stacked(make, 3, key=jax.random.key(0))


def test_output_unlike_input_names_the_path():
    stacked = nn.Stacked(lambda k: nn.Linear(WIDTH, 2, key=k), 2, key=jax.random.key(0))
    with pytest.raises(
        TypeError, match=r"layer 0 .* differs at x: f32\[4\] vs f32\[2\]"
    ):
        stacked(_x())
    pair = nn.Stacked(
        lambda k: nn.Lambda(lambda xy: (xy[0], xy[1].astype(jnp.int32))),
        2,
        key=jax.random.key(0),
    )
    with pytest.raises(TypeError, match=r"x\[1\]: f32\[4\] vs i32\[4\]"):
        pair((_x(), _x()))


class ForgetsState(fx.Module):
    def __call__(self, x: jax.Array, state: nn.State) -> jax.Array:
        return x


def test_stateful_layer_must_return_a_state():
    _, state = nn.make_with_state(nn.Stacked)(_batch_norm, 2, key=jax.random.key(0))
    bad = nn.Stacked.from_layers([ForgetsState(), ForgetsState()])
    with pytest.raises(TypeError, match="must return `\\(x, state\\)`"):
        bad(_x(), state)


def test_from_layers_mismatch_names_layer_and_path():
    keys = jax.random.split(jax.random.key(0), 3)
    layers = [Block(keys[0]), Block(keys[1]), Block(keys[2])]
    wrong = fx.tree_at(lambda b: b.linear.bias, layers[2], jnp.zeros(WIDTH + 1))
    with pytest.raises(
        ValueError, match=r"layer 2 differs from layer 0 at layers\[2\]\.linear\.bias"
    ):
        nn.Stacked.from_layers([layers[0], layers[1], wrong])
    other_dtype = fx.tree_at(
        lambda b: b.linear.weight,
        layers[1],
        layers[1].linear.weight.astype(jnp.float16),
    )
    with pytest.raises(
        ValueError, match=r"layers\[1\]\.linear\.weight: f32\[4,4\] vs f16"
    ):
        nn.Stacked.from_layers([layers[0], other_dtype])
    with pytest.raises(ValueError, match="no layers"):
        nn.Stacked.from_layers([])


def test_from_layers_refuses_refs():
    class WithStream(fx.Module):
        stream: fx.RngStream

        def __call__(self, x):
            return x

    with pytest.raises(ValueError, match=r"layers\[0\]\.stream\.count is a jax\.Ref"):
        nn.Stacked.from_layers(
            [WithStream(fx.RngStream(0)), WithStream(fx.RngStream(1))]
        )


# --- printing and serialisation -------------------------------------------------------


def test_pformat_shows_one_layer_and_the_count():
    stacked = nn.Stacked(lambda k: nn.Linear(2, 2, key=k), 48, key=jax.random.key(0))
    text = fx.tree_pformat(stacked, width=200)
    assert text == (
        "Stacked(48 x Linear(weight=f32[2,2], bias=f32[2], in_features=2, "
        "out_features=2, use_bias=True))"
    )
    assert repr(stacked).count("Linear") == 1
    remat = nn.Stacked(Block, 2, key=jax.random.key(0), remat=True, unroll=2)
    assert fx.tree_pformat(remat, width=400).endswith(", remat=True, unroll=2)")


def test_a_checkpoint_of_the_unrolled_layers_loads_into_the_stack_and_back(tmp_path):
    stacked = nn.Stacked(Block, 3, key=jax.random.key(0))
    other = nn.Stacked(Block, 3, key=jax.random.key(1))

    unrolled_file = tmp_path / "unrolled.eqx"
    fx.tree_serialise_leaves(unrolled_file, stacked.unstack())
    loaded = nn.Stacked.from_layers(
        fx.tree_deserialise_leaves(unrolled_file, other.unstack())
    )
    assert fx.tree_equal(loaded, stacked)

    stacked_file = tmp_path / "stacked.eqx"
    fx.tree_serialise_leaves(stacked_file, nn.Stacked.from_layers(other.unstack()))
    back = fx.tree_deserialise_leaves(stacked_file, stacked).unstack()
    assert fx.tree_equal(back, other.unstack())


def test_stacked_arrays_carry_the_stack_logical_axis():
    stacked = nn.Stacked(lambda k: nn.Linear(3, 4, key=k), 2, key=jax.random.key(0))
    axes = fx.logical_axes(stacked)
    assert axes.layers.weight == ("stack", "out", "in")
    assert axes.layers.bias == ("stack", "out")
