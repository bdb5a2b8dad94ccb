"""Static fields holding lists, dicts, sets or NumPy arrays: accepted and read
as in Equinox, but frozen when the Module is built, so that a change made in
place can never give a stale compiled result (issue 31)."""

from __future__ import annotations

import copy
import pickle
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


class Config(fx.Module):
    weight: jax.Array
    options: Any = fx.field(static=True)


def total(config: Config) -> jax.Array:
    return config.weight * sum(config.options)


@pytest.mark.parametrize(
    "change",
    [
        lambda options: options.append(10),
        lambda options: options.__setitem__(0, 10),
        lambda options: options.__iadd__([10]),
        lambda options: options.extend([10]),
        lambda options: options.pop(),
        lambda options: options.sort(),
        lambda options: options.clear(),
    ],
    ids=["append", "setitem", "iadd", "extend", "pop", "sort", "clear"],
)
def test_a_static_list_cannot_be_changed_in_place_after_a_call(change: Any) -> None:
    config = Config(jnp.ones(2), [1, 2])
    jitted = fx.filter_jit(total)
    assert jitted(config).tolist() == [3.0, 3.0]
    with pytest.raises(TypeError, match=r"Config\.options is a list held in a static"):
        change(config.options)
    assert config.options == [1, 2]
    assert jitted(config).tolist() == [3.0, 3.0]


def test_the_callers_list_changed_afterwards_does_not_change_the_module() -> None:
    options = [1, 2]
    config = Config(jnp.ones(2), options)
    jitted = fx.filter_jit(total)
    assert jitted(config).tolist() == [3.0, 3.0]
    options.append(10)
    assert jitted(config).tolist() == [3.0, 3.0]
    assert jitted(Config(jnp.ones(2), options)).tolist() == [13.0, 13.0]


def test_static_dicts_and_sets_cannot_be_changed_in_place() -> None:
    config = Config(jnp.ones(2), {"a": 1})
    with pytest.raises(TypeError, match=r"Config\.options is a dict"):
        config.options["b"] = 2
    with pytest.raises(TypeError, match=r"Config\.options is a dict"):
        config.options.update(b=2)
    assert config.options == {"a": 1}
    config = Config(jnp.ones(2), {1, 2})
    with pytest.raises(TypeError, match=r"Config\.options is a set"):
        config.options.add(3)
    assert config.options == {1, 2}


def test_nested_values_are_frozen_and_named_by_their_path() -> None:
    config = Config(jnp.ones(2), ([1, {"k": [2]}], 3))
    with pytest.raises(TypeError, match=r"Config\.options\[0\]\[1\]\['k'\] is a list"):
        config.options[0][1]["k"].append(4)
    assert config.options == ([1, {"k": [2]}], 3)


def test_a_numpy_array_in_a_static_field_is_a_read_only_copy() -> None:
    table = np.arange(3.0)
    with pytest.warns(fx.StaticArrayWarning, match="Config.options"):
        config = Config(jnp.ones(2), table)
    jitted = fx.filter_jit(lambda c: c.weight * c.options.sum())
    assert jitted(config).tolist() == [3.0, 3.0]
    with pytest.raises(ValueError, match="read-only"):  # NumPy's type, kept
        config.options[0] = 10.0
    table[0] = 10.0  # the caller's array: not the Module's
    assert jitted(config).tolist() == [3.0, 3.0]


class Table(fx.Module):
    weight: jax.Array
    options: Any = fx.field(static=True)


def _static_table() -> Table:
    with warnings.catch_warnings():  # warned once per class field: see above
        warnings.simplefilter("ignore", fx.StaticArrayWarning)
        return Table(jnp.ones(2), np.arange(3.0))


@pytest.mark.parametrize(
    "change",
    [
        lambda table: table.__setitem__(0, 10.0),
        lambda table: table[1:].__setitem__(0, 10.0),  # through a view
        lambda table: table.__iadd__(1.0),
        lambda table: table.__imul__(2.0),
        lambda table: np.add(table, 1.0, out=table),
        lambda table: table.fill(0.0),
        lambda table: table.sort(),
        lambda table: table.put([0], [10.0]),
    ],
    ids=["setitem", "view", "iadd", "imul", "out", "fill", "sort", "put"],
)
def test_a_static_numpy_array_changed_in_place_raises_naming_the_field(
    change: Any,
) -> None:
    config = _static_table()
    jitted = fx.filter_jit(lambda c: c.weight * c.options.sum())
    assert jitted(config).tolist() == [3.0, 3.0]
    with pytest.raises(TypeError, match=r"Table\.options is a read-only NumPy array"):
        change(config.options)
    assert config.options.tolist() == [0.0, 1.0, 2.0]
    assert jitted(config).tolist() == [3.0, 3.0]


def test_a_static_numpy_arrays_writeable_flag_cannot_be_set_back() -> None:
    config = _static_table()
    with pytest.raises(ValueError, match="WRITEABLE"):
        config.options.flags.writeable = True
    assert not config.options.flags.writeable


def test_a_static_numpy_array_reads_and_computes_as_a_plain_one() -> None:
    config = _static_table()
    table = config.options
    assert isinstance(table, np.ndarray)
    assert repr(table) == "array([0., 1., 2.])"
    doubled = table * 2
    assert type(doubled) is np.ndarray and doubled.tolist() == [0.0, 2.0, 4.0]
    mutable = np.array(table)
    mutable[0] = 5.0  # a copy of its own
    assert table.copy().flags.writeable and type(table.copy()) is np.ndarray
    assert jnp.asarray(table).tolist() == [0.0, 1.0, 2.0]
    assert table[0] == 0.0
    for copied in (table[[0, 1]], table[table > 0], table.astype(int), table.flatten()):
        assert type(copied) is np.ndarray and copied.flags.writeable
    for view in (table[1:], table.T, table.reshape(3, 1)):  # the same data
        with pytest.raises(TypeError, match=r"Table\.options"):
            view[0] = 1.0


def test_a_static_numpy_array_survives_pickling_copies_and_unflattening() -> None:
    config = _static_table()
    for copied in (
        pickle.loads(pickle.dumps(config)),
        copy.deepcopy(config),
        jax.tree_util.tree_map(lambda x: x, config),
    ):
        assert copied.options.tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(TypeError, match=r"Table\.options"):
            copied.options[0] = 1.0
    # Unflattening keeps the same frozen array: nothing is copied again.
    assert jax.tree_util.tree_map(lambda x: x, config).options is config.options


def test_frozen_values_read_as_the_originals() -> None:
    config = Config(jnp.ones(2), [1, 2])
    options = config.options
    assert isinstance(options, list) and options == [1, 2]
    assert options + [3] == [1, 2, 3] and len(options) == 2 and options[-1] == 2
    assert repr(config) == "Config(weight=f32[2], options=[1, 2])"
    mutable = list(options)
    mutable.append(3)
    assert mutable == [1, 2, 3]
    assert hash(options) == hash(Config(jnp.ones(2), [1, 2]).options)


def test_frozen_values_survive_pickle_and_copy() -> None:
    config = Config(jnp.ones(2), [1, {"a": {3}}])
    for clone in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config)):
        assert clone.options == [1, {"a": {3}}]
        with pytest.raises(TypeError, match=r"Config\.options is a list"):
            clone.options.append(2)


def test_a_custom_init_may_build_its_static_list_in_place() -> None:
    class Sizes(fx.Module):
        sizes: list = fx.field(static=True)

        def __init__(self, n: int):
            self.sizes = []
            for i in range(n):
                self.sizes.append(i)

    sizes = Sizes(3)
    assert sizes.sizes == [0, 1, 2]
    with pytest.raises(TypeError, match=r"Sizes\.sizes is a list"):
        sizes.sizes.append(3)


def test_equal_static_lists_share_one_trace_and_other_values_trace_again() -> None:
    traces = []

    @fx.filter_jit
    def double(config: Config) -> jax.Array:
        traces.append(config.options)
        return config.weight * 2

    double(Config(jnp.ones(2), [1, 2]))
    double(Config(jnp.ones(2), [1, 2]))
    double(Config(jnp.ones(2), [1, 2, 3]))
    assert traces == [[1, 2], [1, 2, 3]]


def test_hashable_static_values_are_stored_as_they_are() -> None:
    value = (1, "a", jax.nn.relu)
    assert Config(jnp.ones(2), value).options is value
