"""Property: `combine(*partition(t, spec)) == t` for random pytrees and specs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from hypothesis import given, settings, strategies as st

import filterax as fx


class Pair(fx.Module):
    first: Any
    second: Any


_POOL = [
    jnp.ones(2),
    jnp.arange(3),
    jnp.ones((), jnp.bfloat16),
    np.zeros((1, 2)),
    np.int8(3),
    jax.random.key(0),
    0,
    1.5,
    True,
    "s",
    None,
]

_PREDICATES = [
    fx.is_array,
    fx.is_array_like,
    fx.is_inexact_array,
    fx.is_inexact_array_like,
    fx.is_key_array,
    fx.is_non_differentiable,
    lambda x: isinstance(x, str),
]


def _extend(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abcd"), children, max_size=3),
        children.map(fx.NonDifferentiable),
        st.tuples(children, children).map(lambda c: Pair(*c)),
    )


TREES = st.recursive(st.sampled_from(_POOL), _extend, max_leaves=12)


def _is_node(tree: Any, is_leaf: Any) -> bool:
    if tree is None or (is_leaf is not None and is_leaf(tree)):
        return False
    treedef = jtu.tree_structure(tree, is_leaf=lambda x: x is not tree)
    return not (treedef.num_nodes == 1 and treedef.num_leaves == 1)


def _draw_spec(data: st.DataObject, tree: Any, is_leaf: Any) -> Any:
    """A random `filter_spec` that is a pytree prefix of `tree`."""
    if _is_node(tree, is_leaf) and data.draw(st.booleans()):
        children, treedef = jtu.tree_flatten(tree, is_leaf=lambda x: x is not tree)
        return treedef.unflatten([_draw_spec(data, c, is_leaf) for c in children])
    if tree is None and data.draw(st.booleans()):
        return None  # `None` is an empty node: a `None` spec matches it
    return data.draw(st.one_of(st.booleans(), st.sampled_from(_PREDICATES)))


def _assert_same_tree(a: Any, b: Any) -> None:
    assert jtu.tree_structure(a) == jtu.tree_structure(b)
    assert all(x is y for x, y in zip(jtu.tree_leaves(a), jtu.tree_leaves(b)))


@settings(max_examples=50, deadline=None)
@given(tree=TREES, data=st.data())
def test_combine_inverts_partition(tree, data):
    spec = _draw_spec(data, tree, None)
    combined = fx.combine(*fx.partition(tree, spec))
    _assert_same_tree(combined, tree)
    assert bool(fx.tree_equal(combined, tree))


@settings(max_examples=50, deadline=None)
@given(tree=TREES, data=st.data())
def test_combine_inverts_partition_with_is_leaf(tree, data):
    is_leaf = fx.is_non_differentiable
    spec = _draw_spec(data, tree, is_leaf)
    kept, rest = fx.partition(tree, spec, is_leaf=is_leaf)
    _assert_same_tree(fx.combine(kept, rest, is_leaf=is_leaf), tree)


@settings(max_examples=50, deadline=None)
@given(tree=TREES, data=st.data())
def test_filter_and_inverse_filter_combine_to_the_tree(tree, data):
    spec = _draw_spec(data, tree, None)
    kept = fx.filter(tree, spec)
    rest = fx.filter(tree, spec, inverse=True)
    _assert_same_tree(fx.combine(kept, rest), tree)
    _assert_same_tree(kept, fx.partition(tree, spec)[0])


@settings(max_examples=50, deadline=None)
@given(tree=TREES, data=st.data())
def test_partition_puts_each_leaf_in_exactly_one_half(tree, data):
    spec = _draw_spec(data, tree, None)
    kept, rest = fx.partition(tree, spec)
    leaves = jtu.tree_leaves(tree)
    kept_leaves = jtu.tree_leaves(kept, is_leaf=lambda x: x is None)
    rest_leaves = jtu.tree_leaves(rest, is_leaf=lambda x: x is None)
    # `None` nodes of `tree` show up in both halves; skip them.
    pairs = [
        (k, r)
        for k, r in zip(kept_leaves, rest_leaves)
        if not (k is None and r is None)
    ]
    assert len(pairs) == len(leaves)
    for leaf, (k, r) in zip(leaves, pairs):
        assert (k is leaf and r is None) or (k is None and r is leaf)
