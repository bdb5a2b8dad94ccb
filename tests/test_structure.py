"""`tree_diff`, `tree_check`, `tree_flatten_one_level` and the structure helpers
every mismatch error is built on."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import filterax as fx
from filterax._tree._structure import path_text, prefix_difference, structure_difference


class Layer(fx.Module):
    weight: jax.Array
    activation: str = fx.field(static=True, default="relu")


# --- tree_diff -------------------------------------------------------------------------


def test_equal_trees_have_no_difference():
    tree = {"w": jnp.ones(2), "layers": [1, "a", None], "m": Layer(jnp.zeros(3))}
    assert fx.tree_diff(tree, tree) == []


def test_a_different_node_type_is_a_structure_difference_and_stops_there():
    [difference] = fx.tree_diff({"a": [1, 2]}, {"a": (1, 3)})
    assert difference.kind == "structure"
    assert difference.path == (jtu.DictKey("a"),)
    assert difference.detail == "a list of length 2 vs a tuple of length 2"


def test_different_dict_keys_are_named():
    [difference] = fx.tree_diff({"a": 1, "b": 2}, {"a": 1})
    assert "keys ['a', 'b']" in difference.detail and "keys ['a']" in difference.detail


def test_array_shape_and_dtype_differences_are_reported_with_short_names():
    shape, dtype = fx.tree_diff(
        [jnp.ones((2, 3)), jnp.ones(2)], [jnp.ones((3, 3)), jnp.ones(2, jnp.int32)]
    )
    assert (shape.kind, shape.detail) == ("shape", "f32[2,3] vs f32[3,3]")
    assert (dtype.kind, dtype.detail) == ("dtype", "f32[2] vs i32[2]")


def test_array_values_are_compared_unless_asked_not_to():
    [difference] = fx.tree_diff(jnp.ones(2), jnp.zeros(2))
    assert difference.kind == "value"
    assert fx.tree_diff(jnp.ones(2), jnp.zeros(2), compare_values=False) == []


def test_leaves_of_different_types_are_a_type_difference():
    [difference] = fx.tree_diff([1], [1.0])
    assert difference.kind == "type" and "(int)" in difference.detail


def test_a_static_field_difference_names_the_field():
    [difference] = fx.tree_diff(Layer(jnp.ones(2)), Layer(jnp.ones(2), "tanh"))
    assert difference.path == (jtu.GetAttrKey("activation"),)
    assert difference.detail == "static field 'relu' vs 'tanh'"


def test_none_against_a_leaf_is_a_structure_difference():
    [difference] = fx.tree_diff({"b": None}, {"b": jnp.ones(2)})
    assert difference.kind == "structure" and difference.detail == "None vs f32[2]"


def test_key_arrays_are_compared_by_key_data():
    assert fx.tree_diff(jax.random.key(0), jax.random.key(0)) == []
    [difference] = fx.tree_diff(jax.random.key(0), jax.random.key(1))
    assert difference.kind == "value"


def test_max_differences_and_is_leaf():
    a, b = [1, 2, 3], [4, 5, 6]
    assert len(fx.tree_diff(a, b)) == 3
    assert len(fx.tree_diff(a, b, max_differences=1)) == 1
    [whole] = fx.tree_diff([a], [b], is_leaf=lambda x: x is a or x is b)
    assert whole.path == (jtu.SequenceKey(0),) and whole.kind == "value"


def test_a_difference_prints_its_path_and_detail():
    [difference] = fx.tree_diff({"a": 1}, {"a": 2})
    assert str(difference) == "['a']: 1 vs 2"
    assert difference.where("model") == "model['a']"


_LEAVES = st.one_of(
    st.integers(-3, 3),
    st.sampled_from(["a", "b"]),
    st.none(),
    st.builds(lambda n: jnp.arange(float(n)), st.integers(0, 3)),
)
_TREES = st.recursive(
    _LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.sampled_from(["x", "y", "z"]), children, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(a=_TREES, b=_TREES)
def test_no_difference_exactly_when_tree_equal(a: Any, b: Any):
    assert (fx.tree_diff(a, b) == []) == bool(fx.tree_equal(a, b))


@settings(max_examples=60, deadline=None)
@given(tree=_TREES)
def test_every_tree_has_no_difference_with_itself(tree: Any):
    assert fx.tree_diff(tree, tree) == []


# --- prefixes and wildcards --------------------------------------------------------


def test_prefix_difference_accepts_a_prefix_and_names_where_it_stops():
    is_spec = lambda x: isinstance(x, bool)  # noqa: E731
    assert prefix_difference({"a": True}, {"a": [1, 2]}, is_spec) is None
    difference = prefix_difference({"a": [True]}, {"a": [1, 2]}, is_spec)
    assert difference is not None and difference.path == (jtu.DictKey("a"),)


def test_structure_difference_ignores_leaves_and_wildcards():
    assert (
        structure_difference([1, None], ["x", [3, 4]], wildcard=lambda x: x is None)
        is None
    )
    assert structure_difference([1, 2], [1, 2, 3]) is not None


def test_path_text():
    assert path_text("", ()) == "the root"
    assert path_text("out", (jtu.DictKey("a"), jtu.SequenceKey(1))) == "out['a'][1]"


# --- tree_check, tree_flatten_one_level ---------------------------------------------


def test_tree_check_refuses_a_node_twice_and_cycles_as_equinox_does():
    shared = [1, 2]
    with pytest.raises(
        ValueError, match=r"list at pytree\[1\] is the very object at pytree\[0\]"
    ):
        fx.tree_check([shared, shared])
    layer = fx.nn.Linear(2, 2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"Linear at pytree\[1\]\[0\]"):
        fx.tree_check([layer, (layer,)])
    # Leaves, None and empty nodes may repeat; equal but distinct nodes too.
    empty = fx.Module()
    fx.tree_check([1, 1, None, None, [], (), empty, empty, [1], [1]])
    fx.tree_check([fx.nn.Linear(2, 2, key=jax.random.key(0)) for _ in range(2)])
    outer: list = []
    inner = [outer]
    outer.append(inner)
    with pytest.raises(ValueError, match="its own ancestor"):
        fx.tree_check(outer)


def test_tree_flatten_one_level():
    children, treedef = fx.tree_flatten_one_level({"a": 3, "b": (1, 2)})
    assert children == [3, (1, 2)]
    assert treedef == jtu.tree_structure({"a": 0, "b": 0})
    assert fx.tree_flatten_one_level(4) == ([4], jtu.tree_structure(0))
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        fx.tree_flatten_one_level(loop)


def test_numpy_arrays_are_described_like_jax_arrays():
    [difference] = fx.tree_diff(np.ones(2, np.float32), np.ones(3, np.float32))
    assert difference.detail == "f32[2] vs f32[3]"


def test_a_ref_is_described_as_a_ref_inside_a_trace_too():
    seen = []

    @jax.jit
    def differ(ref: jax.Ref, x: jax.Array) -> jax.Array:
        [difference] = fx.tree_diff(ref, x, compare_values=False)
        seen.append(difference.detail)
        return x

    ref = jax.new_ref(jnp.ones(2))
    [outside] = fx.tree_diff(ref, jnp.ones(3), compare_values=False)
    differ(ref, jnp.ones(3))
    assert seen == [outside.detail] == ["Ref(f32[2]) vs f32[3]"]


def test_refs_are_compared_by_what_they_hold_and_differ_from_arrays():
    zeros, ones = jax.new_ref(jnp.zeros(2)), jax.new_ref(jnp.ones(2))
    [held] = fx.tree_diff({"state": zeros}, {"state": ones})
    assert (held.kind, held.detail) == (
        "value",
        "Ref(f32[2])s holding different values",
    )
    assert fx.tree_diff(zeros, jax.new_ref(jnp.zeros(2))) == []
    [kind] = fx.tree_diff(zeros, jnp.zeros(2))
    assert (kind.kind, kind.detail) == ("type", "Ref(f32[2]) vs f32[2]")
