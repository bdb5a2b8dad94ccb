"""Properties of the keyed route's call description, for random arguments: it
rebuilds the very arguments, and two calls get equal keys exactly when their
flattened structure, static leaves (and their types) and leaf kinds are equal,
whether their Modules were flattened or found by identity."""

from __future__ import annotations

import collections
from itertools import compress
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

import filterax as fx
from filterax._jit._describe import CallKey, describe, unpack_key
from filterax._tree._split import STATIC_MASK, flatten, leaf_kinds


def _describe(args: tuple, kwargs: dict, last: CallKey | None = None) -> tuple:
    """`(tokens, dynamic leaves, keyword names)` of a call."""
    key, dynamic = describe(args, kwargs, last)
    return key.tokens, dynamic, key.names


class Pair(fx.Module):
    first: Any
    second: Any


class Listed(fx.Module):
    items: list


Point = collections.namedtuple("Point", "x y")

_LEAVES = [
    jnp.ones(2),
    jnp.arange(3),
    np.zeros((1, 2)),
    jax.random.key(0),
    0,
    1,
    1.0,
    True,
    "s",
    jax.nn.relu,
]


def _trees() -> st.SearchStrategy[Any]:
    leaves = st.sampled_from(_LEAVES) | st.none()
    return st.recursive(
        leaves,
        lambda children: (
            st.tuples(children, children).map(lambda t: Pair(*t))
            | st.tuples(children, children).map(lambda t: Point(*t))
            | st.lists(children, max_size=3).map(tuple)
            | st.lists(children, max_size=2)
            | st.dictionaries(st.sampled_from("ab"), children, max_size=2)
            | children.map(lambda c: Listed([c]))
            | children.map(fx.NonDifferentiable)
        ),
        max_leaves=8,
    )


def _arguments() -> st.SearchStrategy[Any]:
    """Top-level arguments, where tuples and namedtuples are walked rather
    than flattened: made likely here."""
    trees = _trees()
    walked = st.recursive(
        trees,
        lambda children: (
            st.lists(children, max_size=3).map(tuple)
            | st.tuples(children, children).map(lambda t: Point(*t))
        ),
        max_leaves=6,
    )
    return st.lists(walked, min_size=0, max_size=3).map(tuple)


def _flat_signature(args: tuple) -> tuple:
    leaves, treedef = flatten(args)
    kinds = leaf_kinds(leaves)
    static = tuple(compress(leaves, kinds.translate(STATIC_MASK)))
    return treedef, kinds, static, tuple(map(type, static))


@settings(max_examples=100, deadline=None)
@given(_arguments())
def test_description_rebuilds_the_arguments(args: tuple) -> None:
    tokens, dynamic, names = _describe(args, {}, None)
    rebuilt, kwargs = unpack_key(CallKey(tokens, names), dynamic)
    assert kwargs == {}
    leaves, treedef = flatten(args)
    rebuilt_leaves, rebuilt_treedef = flatten(rebuilt)
    assert rebuilt_treedef == treedef
    assert all(map(lambda a, b: a is b, rebuilt_leaves, leaves))
    # Described again (now partly from the identity memo): the same key.
    again = _describe(args, {}, CallKey(tokens, names))
    assert again[0] == tokens
    assert all(map(lambda a, b: a is b, again[1], dynamic))


@settings(max_examples=150, deadline=None)
@given(_arguments(), _arguments())
def test_keys_are_equal_exactly_when_flat_signatures_are(a: tuple, b: tuple) -> None:
    key_a = CallKey(*_without_dynamic(_describe(a, {}, None)))
    key_b = CallKey(*_without_dynamic(_describe(b, {}, None)))
    assert (key_a == key_b) == (_flat_signature(a) == _flat_signature(b))
    if key_a == key_b:
        assert hash(key_a) == hash(key_b)


def _without_dynamic(description: tuple) -> tuple:
    tokens, _, names = description
    return tokens, names
