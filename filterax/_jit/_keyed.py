"""The keyed route of `filter_jit`: calls whose arguments hold non-array leaves.

`(args, kwargs)` is flattened once, leaves are classified by type (cached per
type, see `_split.leaf_kinds`), and the inner `jax.jit` receives one hashable
static key (treedef, where the non-array leaves sit, and their values) plus the
dynamic leaves (arrays, Refs, tracers) as a list.
"""

from __future__ import annotations

from itertools import compress
from typing import Any

import jax.tree_util as jtu

from .._split import (
    STATIC,
    STATIC_MASK,
    PyTreeDef,
    all_dynamic,
    flatten,
    interleave,
    leaf_kinds,
)
from .._structure import argument_path

__all__ = [
    "ArraysKey",
    "MixedKey",
    "first_argument_leaf_count",
    "flatten_call",
    "raise_if_unhashable",
    "unpack_key",
]


class ArraysKey:
    """The static key of a keyed call whose leaves are all dynamic: the treedef.

    `jax.jit` hashes its static argument on every call and compares it with
    `==` on a hit. A wrapper hands the same `ArraysKey` back while the argument
    structure repeats, so the hash is computed once (here) and JAX's comparison
    is an identity check.
    """

    __slots__ = ("_hash", "first_count", "treedef")

    def __init__(self, treedef: PyTreeDef):
        self.treedef = treedef
        self._hash = hash(treedef)
        self.first_count: int | None = None

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return other.__class__ is ArraysKey and self.treedef == other.treedef  # type: ignore[attr-defined]


class MixedKey:
    """The static key of a keyed call with some non-array leaves.

    `treedef` and `kinds` (bytes: comparing them is a memcmp) fix where the
    static leaves sit. The static leaves are compared with `==`, and so are
    their types, so that `1`, `1.0` and `True` do not share a compilation (as
    with `jax.jit`'s own static arguments). Arrays are not in the key: `jax.jit`
    keys on their shapes, dtypes and shardings itself.

    A wrapper keeps the key of its last keyed call and reuses it while the next
    call matches (`reuse_for`): that skips classifying every leaf, and since the
    hash is computed once and JAX's comparison on a hit is an identity check,
    JAX never walks the treedef either.
    """

    __slots__ = (
        "_hash",
        "first_count",
        "kinds",
        "static",
        "static_mask",
        "treedef",
        "types",
    )

    def __init__(self, treedef: PyTreeDef, kinds: bytes, leaves: list[Any]):
        self.first_count: int | None = None
        self.treedef = treedef
        self.kinds = kinds
        self.static_mask = kinds.translate(STATIC_MASK)
        self.static = tuple(compress(leaves, self.static_mask))
        self.types = tuple(map(type, self.static))
        self._hash = hash((treedef, kinds, self.static, self.types))

    def reuse_for(self, treedef: PyTreeDef, leaves: list[Any]) -> list[Any] | None:
        """The dynamic leaves of a call with this key, or `None` if it has another."""
        if self.treedef != treedef:
            return None
        static = tuple(compress(leaves, self.static_mask))
        if static != self.static or tuple(map(type, static)) != self.types:
            return None
        dynamic = list(compress(leaves, self.kinds))
        return dynamic if all_dynamic(map(type, dynamic)) else None

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        return (
            other.__class__ is MixedKey
            and self._hash == other._hash  # type: ignore[attr-defined]
            and self.kinds == other.kinds  # type: ignore[attr-defined]
            and self.static == other.static  # type: ignore[attr-defined]
            and self.types == other.types  # type: ignore[attr-defined]
            and self.treedef == other.treedef  # type: ignore[attr-defined]
        )


def flatten_call(args: tuple, kwargs: dict) -> tuple[list[Any], PyTreeDef]:
    """Flattens the arguments of a call: `args` alone when there are no keyword
    arguments (one node fewer to flatten and compare), else the *list*
    `[args, kwargs]`. The root node type, tuple or list, tells the two forms
    apart, so their treedefs are never equal."""
    if kwargs:
        return flatten([args, kwargs])
    return flatten(args)


def first_argument_leaf_count(key: ArraysKey | MixedKey) -> int:
    """How many leaves the first positional argument of a call with this key
    has (read off its treedef once, then remembered on the key)."""
    count = key.first_count
    if count is None:
        arguments = key.treedef.children()
        if key.treedef.node_data()[0] is list:  # the `[args, kwargs]` form
            arguments = arguments[0].children()
        count = key.first_count = arguments[0].num_leaves if arguments else 0
    return count


def unpack_key(key: Any, dynamic: list[Any]) -> tuple[tuple, dict]:
    """Inside the trace: `(args, kwargs)` from a key and the traced leaves."""
    if key.__class__ is ArraysKey:
        call = key.treedef.unflatten(dynamic)
    else:
        call = key.treedef.unflatten(interleave(key.kinds, dynamic, key.static))
    if call.__class__ is list:
        return call[0], call[1]
    return call, {}


def raise_if_unhashable(args: tuple, kwargs: dict) -> None:
    """Raises a `TypeError` naming the first unhashable static argument leaf."""
    leaves_with_paths = jtu.tree_leaves_with_path((args, kwargs))
    kinds = leaf_kinds([leaf for _, leaf in leaves_with_paths])
    for (path, leaf), kind in zip(leaves_with_paths, kinds):
        if kind != STATIC:
            continue
        try:
            hash(leaf)
        except TypeError as error:
            raise TypeError(
                f"filter_jit: the argument at {argument_path(path)} is an "
                f"unhashable {type(leaf).__name__} ({error}). filter_jit traces "
                "array leaves and treats every other leaf as static, so it must "
                "be hashable. Pass it as a JAX/NumPy array, make it hashable "
                "(e.g. a tuple instead of a set), or register it as a pytree."
            ) from None
