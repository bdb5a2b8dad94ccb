"""Functional state: `StateIndex`, `State`, `make_with_state`,
`delete_init_state`, and `inference_mode`."""

from __future__ import annotations

import io
import os
import pathlib
import subprocess
import sys
import textwrap
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"):
        yield


class Counter(fx.Module):
    index: fx.nn.StateIndex

    def __init__(self, start: int = 0):
        self.index = fx.nn.StateIndex(jnp.array(start, jnp.int32))

    def __call__(self, x, state):
        count = state.get(self.index)
        return x + count, state.set(self.index, count + 1)


class Pair(fx.Module):
    counter: Counter
    scale: fx.nn.StateIndex

    def __init__(self):
        self.counter = Counter()
        self.scale = fx.nn.StateIndex((jnp.ones(2), jnp.zeros((), jnp.int32)))


def _leaves_equal(a, b):
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(leaves_a, leaves_b):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


# --- StateIndex -------------------------------------------------------------------


def test_state_index_holds_its_initial_value_and_a_unique_marker():
    a, b = fx.nn.StateIndex(jnp.zeros(2)), fx.nn.StateIndex(jnp.zeros(2))
    np.testing.assert_array_equal(a.init, jnp.zeros(2))
    assert a.marker is not b.marker
    assert jax.tree_util.tree_leaves(a) == [a.init]


def test_state_index_takes_the_value_not_a_function():
    with pytest.raises(ValueError, match="not a function"):
        fx.nn.StateIndex(lambda: jnp.zeros(2))


# --- State: get, set, substate, update ----------------------------------------------


def test_state_holds_the_initial_values():
    pair = Pair()
    state = fx.nn.State(pair)
    assert int(state.get(pair.counter.index)) == 0
    ones, zero = state.get(pair.scale)
    np.testing.assert_array_equal(ones, jnp.ones(2))
    assert zero.dtype == jnp.int32


def test_python_initial_values_become_arrays():
    index = fx.nn.StateIndex(1.5)
    value = fx.nn.State(index).get(index)
    assert isinstance(value, jax.Array) and value.dtype == jnp.float32


def test_set_returns_a_new_state_and_supersedes_the_old_one():
    counter = Counter()
    state = fx.nn.State(counter)
    new_state = state.set(counter.index, jnp.array(5))
    assert int(new_state.get(counter.index)) == 5
    with pytest.raises(ValueError, match="superseded"):
        state.get(counter.index)
    with pytest.raises(ValueError, match="superseded"):
        jax.tree_util.tree_leaves(state)
    assert repr(state) == "State(<superseded>)"


def test_a_copy_made_before_set_stays_usable():
    counter = Counter()
    state = fx.nn.State(counter)
    copy = jax.tree_util.tree_map(lambda v: v, state)
    state.set(counter.index, jnp.array(5))
    assert int(copy.get(counter.index)) == 0


def test_set_accepts_python_numbers_of_the_same_dtype():
    counter = Counter()
    state = fx.nn.State(counter).set(counter.index, 7)
    assert int(state.get(counter.index)) == 7


@pytest.mark.parametrize(
    "value, shown",
    [
        ((jnp.ones(3), jnp.zeros((), jnp.int32)), "f32[3]"),
        ((jnp.ones(2, jnp.float16), jnp.zeros((), jnp.int32)), "f16[2]"),
        ((jnp.ones(2),), "(f32[2],)"),
        ([jnp.ones(2), jnp.zeros((), jnp.int32)], "[f32[2], i32[]]"),
    ],
)
def test_set_refuses_another_structure_shape_or_dtype(value, shown):
    pair = Pair()
    state = fx.nn.State(pair)
    with pytest.raises(ValueError, match="another structure, shape or dtype") as info:
        state.set(pair.scale, value)
    assert shown in str(info.value)
    assert "(f32[2], i32[])" in str(info.value)
    # A refused `set` leaves the state usable.
    assert int(state.get(pair.counter.index)) == 0


def test_get_and_set_need_an_index_of_this_state():
    state = fx.nn.State(Counter())
    with pytest.raises(TypeError, match="StateIndex"):
        state.get("counter")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="StateIndex"):  # Equinox's type
        state.set("counter", 1)  # pyright: ignore[reportArgumentType]
    assert weakref.ref(state)() is state  # as Equinox's State
    with pytest.raises(ValueError, match="not part of this State") as info:
        state.get(Counter().index)
    # A KeyError too, as Equinox raises, showing the message unquoted.
    assert isinstance(info.value, KeyError)
    assert str(info.value).startswith("State.get: this StateIndex")
    with pytest.raises(KeyError, match="not part of this State"):
        state.set(Counter().index, jnp.array(0))


def test_substate_and_update():
    pair = Pair()
    state = fx.nn.State(pair)
    sub = state.substate(pair.counter)
    assert len(jax.tree_util.tree_leaves(sub)) == 1
    sub = sub.set(pair.counter.index, jnp.array(9))
    # `substate` leaves the state usable; `update` supersedes it.
    assert int(state.get(pair.counter.index)) == 0
    merged = state.update(sub)
    assert int(merged.get(pair.counter.index)) == 9
    np.testing.assert_array_equal(merged.get(pair.scale)[0], jnp.ones(2))
    with pytest.raises(ValueError, match="superseded"):
        state.get(pair.scale)


def test_update_needs_a_substate_of_this_state():
    pair = Pair()
    state = fx.nn.State(pair)
    with pytest.raises(ValueError, match="index this state has not"):
        state.update(fx.nn.State(Counter()))
    with pytest.raises(TypeError, match="takes a State"):
        state.update({})  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="takes a State"):  # Equinox's type
        state.update("x")  # pyright: ignore[reportArgumentType]


def test_substate_of_a_foreign_index_is_an_error():
    with pytest.raises(ValueError, match="not part of this State"):
        fx.nn.State(Counter()).substate(Counter())


# --- make_with_state and delete_init_state ------------------------------------------


def test_make_with_state_names_the_indices_after_their_paths():
    pair, state = fx.nn.make_with_state(Pair)()
    assert pair.counter.index.marker == "Pair.counter.index"
    assert pair.scale.marker == "Pair.scale"
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)
    ]
    assert paths == ["['Pair.counter.index']", "['Pair.scale'][0]", "['Pair.scale'][1]"]
    assert repr(state) == "State(Pair.counter.index=i32[], Pair.scale=(f32[2], i32[]))"


def test_make_with_state_moves_the_initial_values_into_the_state():
    pair, state = fx.nn.make_with_state(Pair)()
    assert jax.tree_util.tree_leaves(pair) == []
    assert int(state.get(pair.counter.index)) == 0
    with pytest.raises(ValueError, match="make_with_state"):
        fx.nn.State(pair)


def test_make_with_state_passes_the_arguments_through():
    counter, state = fx.nn.make_with_state(Counter)(start=4)
    y, state = counter(jnp.array(1), state)
    assert int(y) == 5 and int(state.get(counter.index)) == 5


def test_two_calls_make_interchangeable_models_and_states():
    model1, state1 = fx.nn.make_with_state(Pair)()
    model2, state2 = fx.nn.make_with_state(Pair)()
    assert jax.tree_util.tree_structure(model1) == jax.tree_util.tree_structure(model2)
    assert jax.tree_util.tree_structure(state1) == jax.tree_util.tree_structure(state2)
    _, state2 = model1.counter(jnp.array(0), state2)
    assert int(state2.get(model2.counter.index)) == 1


def test_delete_init_state_drops_only_the_initial_values():
    model = [fx.nn.StateIndex(jnp.zeros(3)), jnp.ones(2), Pair()]
    deleted = fx.nn.delete_init_state(model)
    leaves = jax.tree_util.tree_leaves(deleted)
    assert len(leaves) == 1 and leaves[0] is model[1]
    assert deleted[0].marker is model[0].marker
    assert len(jax.tree_util.tree_leaves(model)) == 5  # the original is unchanged
    with pytest.raises(ValueError):
        fx.nn.State(deleted)


def test_unnamed_indices_have_positional_key_paths():
    state = fx.nn.State(Pair())
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)
    ]
    assert paths == ["[0]", "[1][0]", "[1][1]"]
    assert repr(state).startswith("State(<unnamed index #0>=i32[], ")


# --- Under transforms -------------------------------------------------------------
#
# `RunningMean` keeps its state in a `State`; `running_mean_by_hand` is the same
# computation with the array threaded by hand. Under the same transform the two
# must agree bit for bit.


class RunningMean(fx.nn.StatefulLayer):
    index: fx.nn.StateIndex

    def __init__(self, size: int):
        self.index = fx.nn.StateIndex(jnp.zeros(size))

    def __call__(self, x, state, *, key=None):
        mean = 0.9 * state.get(self.index) + 0.1 * x
        return x - mean, state.set(self.index, mean)


def running_mean_by_hand(mean, x):
    mean = 0.9 * mean + 0.1 * x
    return x - mean, mean


def _inputs(n, size=3):
    return jax.random.normal(jax.random.key(0), (n, size)) * 10


def test_filter_jit_matches_threading_by_hand():
    layer, state = fx.nn.make_with_state(RunningMean)(3)
    traces = []

    @fx.filter_jit
    def step(layer, x, state):
        traces.append(None)
        return layer(x, state)

    by_hand = jax.jit(running_mean_by_hand)
    mean = jnp.zeros(3)
    for x in _inputs(4):
        y, state = step(layer, x, state)
        y_by_hand, mean = by_hand(mean, x)
        np.testing.assert_array_equal(y, y_by_hand)
        np.testing.assert_array_equal(state.get(layer.index), mean)
    assert len(traces) == 1
    # A state from another make_with_state call reuses the compiled step.
    _, other = fx.nn.make_with_state(RunningMean)(3)
    step(layer, _inputs(1)[0], other)
    assert len(traces) == 1


def test_filter_vmap_matches_threading_by_hand():
    layers, states = fx.filter_vmap(fx.nn.make_with_state(RunningMean), axis_size=5)(3)
    assert states.get(layers.index).shape == (5, 3)
    step = fx.filter_vmap(lambda layer, x, state: layer(x, state))
    by_hand = jax.vmap(running_mean_by_hand)
    means = jnp.zeros((5, 3))
    for i in range(3):
        xs = _inputs(5) + i
        ys, states = step(layers, xs, states)
        ys_by_hand, means = by_hand(means, xs)
        np.testing.assert_array_equal(ys, ys_by_hand)
        np.testing.assert_array_equal(states.get(layers.index), means)


def test_lax_scan_carry_matches_threading_by_hand():
    layer, state = fx.nn.make_with_state(RunningMean)(3)
    xs = _inputs(6)

    def body(state, x):
        y, state = layer(x, state)
        return state, y

    def body_by_hand(mean, x):
        y, mean = running_mean_by_hand(mean, x)
        return mean, y

    state, ys = jax.lax.scan(body, state, xs)
    mean, ys_by_hand = jax.lax.scan(body_by_hand, jnp.zeros(3), xs)
    np.testing.assert_array_equal(ys, ys_by_hand)
    np.testing.assert_array_equal(state.get(layer.index), mean)


def test_serialisation_round_trip_matches_threading_by_hand():
    layer, state = fx.nn.make_with_state(RunningMean)(3)
    mean = jnp.zeros(3)
    xs = _inputs(4)
    for x in xs[:2]:
        _, state = layer(x, state)
        _, mean = running_mean_by_hand(mean, x)
    buffer = io.BytesIO()
    fx.tree_serialise_leaves(buffer, (layer, state))
    buffer.seek(0)
    layer, state = fx.tree_deserialise_leaves(
        buffer, fx.nn.make_with_state(RunningMean)(3)
    )
    for x in xs[2:]:
        y, state = layer(x, state)
        y_by_hand, mean = running_mean_by_hand(mean, x)
        np.testing.assert_array_equal(y, y_by_hand)
    np.testing.assert_array_equal(state.get(layer.index), mean)


def _batch_norm_step(model, state, x):
    return jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
        x, state
    )


def _batches(n):
    return [
        jax.random.normal(jax.random.key(i), (8, 3)) * (i + 1) + i for i in range(n)
    ]


@pytest.mark.parametrize("mode", ["ema", "batch"])
def test_batch_norm_under_filter_jit_matches_eager(mode):
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode=mode)
    step = fx.filter_jit(_batch_norm_step)
    eager_state = jax.tree_util.tree_map(lambda v: v, state)
    for x in _batches(3):
        y_jit, state = step(bn, state, x)
        y_eager, eager_state = _batch_norm_step(bn, eager_state, x)
        np.testing.assert_allclose(y_jit, y_eager, rtol=1e-6, atol=1e-6)
        for a, b in zip(
            jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(eager_state)
        ):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_state_made_inside_filter_jit():
    @fx.filter_jit
    def make():
        return fx.nn.make_with_state(Pair)()[1]

    state = make()
    pair, reference = fx.nn.make_with_state(Pair)()
    _leaves_equal(state, reference)
    assert int(state.get(pair.counter.index)) == 0


def test_batch_norms_built_under_filter_vmap():
    make = fx.filter_vmap(fx.nn.make_with_state(fx.nn.BatchNorm), axis_size=3)
    ensemble, states = make(2, "batch", mode="batch")
    assert ensemble.weight.shape == (3, 2)
    assert states.get(ensemble.batch_counter).shape == (3,)
    mean, var = states.get(ensemble.batch_state_index)
    assert mean.shape == var.shape == (3, 2)
    scales = jnp.arange(1.0, 4.0)[:, None, None]
    xs = jax.random.normal(jax.random.key(0), (3, 5, 2)) * scales

    ys, states = fx.filter_vmap(_batch_norm_step)(ensemble, states, xs)
    mean, var = states.get(ensemble.batch_state_index)
    for member in range(3):
        model, state = fx.nn.make_with_state(fx.nn.BatchNorm)(2, "batch", mode="batch")
        y, state = _batch_norm_step(model, state, xs[member])
        np.testing.assert_allclose(ys[member], y, rtol=1e-6, atol=1e-6)
        expected_mean, expected_var = state.get(model.batch_state_index)
        np.testing.assert_allclose(mean[member], expected_mean, rtol=1e-6)
        np.testing.assert_allclose(var[member], expected_var, rtol=1e-6)
    assert states.get(ensemble.batch_counter).tolist() == [1, 1, 1]


def test_mapping_part_of_a_model_with_substate_and_update():
    class Model(fx.Module):
        single: Counter
        several: Counter

        def __init__(self):
            self.single = Counter()
            self.several = fx.filter_vmap(Counter, axis_size=2)()

        def __call__(self, x, state):
            x, state = self.single(x, state)
            sub = state.substate(self.several)
            x, sub = fx.filter_vmap(lambda c, x, s: c(x, s))(self.several, x, sub)
            return x, state.update(sub)

    model, state = fx.nn.make_with_state(Model)()
    x = jnp.array([10, 20], jnp.int32)
    for step in range(3):
        y, state = model(x, state)
        np.testing.assert_array_equal(y, x + 2 * step)
    assert int(state.get(model.single.index)) == 3
    np.testing.assert_array_equal(state.get(model.several.index), jnp.array([3, 3]))


# --- Serialisation --------------------------------------------------------------------


def _trained():
    bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="ema")
    for x in _batches(2):
        _, state = _batch_norm_step(bn, state, x)
    return bn, state


def test_serialisation_round_trip():
    bn, state = _trained()
    buffer = io.BytesIO()
    fx.tree_serialise_leaves(buffer, (bn, state))
    buffer.seek(0)
    like = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="ema")
    loaded_bn, loaded_state = fx.tree_deserialise_leaves(buffer, like)
    _leaves_equal(loaded_state, state)
    assert fx.tree_equal(loaded_bn, bn)
    # The loaded state goes on exactly as the original does.
    x = _batches(3)[2]
    y1, s1 = _batch_norm_step(bn, state, x)
    y2, s2 = _batch_norm_step(loaded_bn, loaded_state, x)
    np.testing.assert_array_equal(y1, y2)
    _leaves_equal(s1, s2)


def test_serialisation_of_a_state_with_unnamed_indices(tmp_path):
    class Model(fx.Module):
        first: fx.nn.BatchNorm
        second: fx.nn.BatchNorm

    def make():
        return Model(
            fx.nn.BatchNorm(3, "a", mode="ema"), fx.nn.BatchNorm(4, "b", mode="batch")
        )

    model = make()
    state = fx.nn.State(model)
    state = state.set(model.second.batch_counter, jnp.array(6))
    fx.tree_serialise_leaves(tmp_path / "state.eqx", state)
    other = make()
    loaded = fx.tree_deserialise_leaves(tmp_path / "state.eqx", fx.nn.State(other))
    assert int(loaded.get(other.second.batch_counter)) == 6


def test_key_paths_are_the_same_in_another_process(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        import jax
        import jax.numpy as jnp
        import filterax as fx

        bn, state = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
        state = state.set(bn.batch_counter, jnp.array(11))
        fx.tree_serialise_leaves(sys.argv[1], state)
        """
    )
    path = tmp_path / "state.eqx"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run(
        [sys.executable, "-c", script, str(path)], check=True, env=env, cwd=REPO_ROOT
    )
    bn, like = fx.nn.make_with_state(fx.nn.BatchNorm)(3, "batch", mode="batch")
    loaded = fx.tree_deserialise_leaves(path, like)
    assert int(loaded.get(bn.batch_counter)) == 11


# --- inference_mode ----------------------------------------------------------------------


def test_inference_mode_sets_every_flag_however_nested():
    bn = fx.nn.BatchNorm(2, "batch", mode="batch")
    model = fx.nn.Sequential(
        [
            fx.nn.Dropout(0.1),
            fx.nn.Sequential([fx.nn.Dropout(0.2), bn]),
            fx.nn.Identity(),
        ]
    )
    inference = fx.nn.inference_mode(model)
    assert inference[0].inference is True
    assert inference[1][0].inference is True
    assert inference[1][1].inference is True
    assert model[0].inference is False and model[1][1].inference is False
    back = fx.nn.inference_mode(inference, value=False)
    assert back == model


def test_inference_mode_reaches_flags_below_a_flagged_layer():
    class Block(fx.Module):
        dropout: fx.nn.Dropout
        inference: bool = False

    model = fx.nn.inference_mode([Block(fx.nn.Dropout())])
    assert model[0].inference is True and model[0].dropout.inference is True


def test_inference_mode_of_a_model_without_flags_is_the_model():
    model = [jnp.ones(2), fx.nn.Identity()]
    assert fx.tree_equal(fx.nn.inference_mode(model), model)


def test_inference_mode_needs_a_bool():
    with pytest.raises(TypeError, match="bool"):
        fx.nn.inference_mode(fx.nn.Dropout(), value=1)  # pyright: ignore[reportArgumentType]
