"""The traced/static split every transform is built on (`filterax._tree._split`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import filterax as fx
from filterax._tree._split import (
    ARRAY,
    STATIC,
    TRACER,
    InputRef,
    Static,
    StaticPart,
    leaf_kinds,
    mark_input_refs,
    split,
)


def test_split_separates_arrays_and_refs_from_everything_else():
    ref = jax.new_ref(jnp.zeros(2))
    tree = {
        "w": jnp.ones(2),
        "n": 3,
        "act": "relu",
        "key": jax.random.key(0),
        "ref": ref,
    }
    dynamic, static = split(tree)  # dict keys flatten sorted: act, key, n, ref, w
    assert len(dynamic) == 3 and dynamic[1] is ref and dynamic[2] is tree["w"]
    assert static.static == ("relu", 3)
    rebuilt = static.merge(dynamic)
    assert rebuilt["act"] == "relu" and rebuilt["ref"] is ref and rebuilt["n"] == 3


def test_split_takes_a_predicate():
    array = jnp.ones(1)
    dynamic, static = split([1, "a", array], lambda leaf: isinstance(leaf, int))
    assert dynamic == [1] and static.static[0] == "a" and static.static[1] is array


def test_static_parts_compare_values_and_types():
    _, one = split([jnp.ones(2), 1])
    _, other_one = split([jnp.zeros(2), 1])
    _, one_float = split([jnp.ones(2), 1.0])
    assert one == other_one and hash(one) == hash(other_one)
    assert one != one_float  # 1 and 1.0 do not share a compilation


def test_a_static_part_rides_out_of_a_trace_in_the_treedef():
    def body(x):
        return split({"y": x * 2, "label": "doubled"})

    dynamic, static = jax.jit(body)(jnp.ones(2))
    assert isinstance(static, StaticPart)
    assert static.merge(dynamic)["label"] == "doubled"
    assert jax.tree.leaves(Static("kept")) == []


def test_leaf_kinds_classify_by_type():
    kinds = leaf_kinds([jnp.ones(1), np.ones(1), 1.0, "s", jax.new_ref(jnp.ones(1))])
    assert list(kinds) == [ARRAY, ARRAY, STATIC, STATIC, ARRAY]

    @jax.jit
    def traced(x):
        assert list(leaf_kinds([x])) == [TRACER]
        return x

    traced(jnp.ones(1))


def test_input_refs_are_marked_and_restored():
    ref = jax.new_ref(jnp.zeros(()))
    marked = mark_input_refs([ref, 1.0], [jnp.ones(()), ref], "who")
    assert marked == [InputRef(1), 1.0]
    with pytest.raises(ValueError, match="who: the function returns a Ref"):
        mark_input_refs([jax.new_ref(jnp.zeros(()))], [ref], "who")
    _, static = split([marked[0], 2], lambda leaf: False)
    restored = static.merge_restoring_refs([], lambda: [None, ref])
    assert restored[0] is ref and restored[1] == 2


_LEAVES = st.one_of(
    st.integers(),
    st.text(max_size=2),
    st.none(),
    st.builds(jnp.arange, st.integers(0, 3)),
)
_TREES = st.recursive(
    _LEAVES,
    lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.text(max_size=1), c)
    ),
    max_leaves=10,
)


@settings(max_examples=60, deadline=None)
@given(tree=_TREES)
def test_merge_inverts_split(tree: Any):
    dynamic, static = split(tree)
    rebuilt = static.merge(dynamic)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(tree)
    assert all(a is b for a, b in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(tree)))


def test_split_of_a_module_keeps_static_fields_in_the_treedef():
    class Layer(fx.Module):
        w: jax.Array
        act: str = fx.field(static=True, default="relu")

    dynamic, static = split(Layer(jnp.ones(2)))
    assert len(dynamic) == 1 and static.static == ()
    assert static.merge(dynamic).act == "relu"
