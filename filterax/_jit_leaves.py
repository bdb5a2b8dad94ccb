"""`filter_jit` internals: classifying argument leaves and the static cache keys
of the keyed path (see `_jit`)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

# `jax.tree_util.tree_flatten` is a Python function calling this C++ method.
_flatten = jtu.default_registry.flatten
_PyTreeDef = jtu.PyTreeDef


# --- Leaf classification -----------------------------------------------------------

# A leaf is static (part of the cache key), a concrete array (traced), or a
# tracer (we are inside another transformation: the call runs inline).
_STATIC, _ARRAY, _TRACER = 0, 1, 2

# Classification depends only on a leaf's type, so it is cached per type. The
# containers are mutated in place, never rebound, so the bound methods taken
# from them stay valid after `clear_caches`.
_KIND_BY_TYPE: dict[type, int] = {}
_kind_by_type = _KIND_BY_TYPE.__getitem__
# The concrete (non-tracer) array types seen so far. `issuperset(map(type,
# leaves))` runs entirely in C and stops at the first other type.
_CONCRETE_ARRAY_TYPES: set[type] = set()
_all_concrete_arrays = _CONCRETE_ARRAY_TYPES.issuperset

# A `bytes.translate` table over a kinds mask: 1 where the leaf is static.
_STATIC_MASK = bytes.maketrans(b"\x00\x01\x02", b"\x01\x00\x00")

_ARRAY_CLASSES = (jax.Array, np.ndarray, np.generic)


def _kind_of(leaf: Any) -> int:
    if isinstance(leaf, jax.core.Tracer):
        return _TRACER
    if isinstance(leaf, _ARRAY_CLASSES):
        return _ARRAY
    return _STATIC


def _leaf_kinds(leaves: Sequence[Any]) -> bytes:
    """One byte per leaf: `_STATIC`, `_ARRAY` or `_TRACER`."""
    try:
        return bytes(map(_kind_by_type, map(type, leaves)))
    except KeyError:
        for leaf in leaves:
            leaf_type = type(leaf)
            if leaf_type not in _KIND_BY_TYPE:
                kind = _kind_of(leaf)
                _KIND_BY_TYPE[leaf_type] = kind
                if kind == _ARRAY:
                    _CONCRETE_ARRAY_TYPES.add(leaf_type)
        return bytes(map(_kind_by_type, map(type, leaves)))


def _merge(kinds: bytes, dynamic: Sequence[Any], static: Sequence[Any]) -> list[Any]:
    """Interleaves `dynamic` and `static` leaves back into flattening order."""
    dynamic_iter, static_iter = iter(dynamic), iter(static)
    return [next(dynamic_iter) if kind else next(static_iter) for kind in kinds]


# --- Keyed path: cache keys --------------------------------------------------------


class _ArraysKey:
    """The static key of a keyed call whose leaves are all arrays: the treedef.

    `jax.jit` hashes its static argument on every call and compares it with
    `==` on a hit. A wrapper hands the same `_ArraysKey` back while the
    argument structure repeats, so the hash is computed once (here) and JAX's
    comparison is an identity check.
    """

    __slots__ = ("_hash", "treedef")

    def __init__(self, treedef: _PyTreeDef):
        self.treedef = treedef
        self._hash = hash(treedef)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return other.__class__ is _ArraysKey and self.treedef == other.treedef  # type: ignore[attr-defined]


class _MixedKey:
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

    __slots__ = ("_hash", "kinds", "static", "static_mask", "treedef", "types")

    def __init__(self, treedef: _PyTreeDef, kinds: bytes, leaves: list[Any]):
        self.treedef = treedef
        self.kinds = kinds
        self.static_mask = kinds.translate(_STATIC_MASK)
        self.static = tuple(compress(leaves, self.static_mask))
        self.types = tuple(map(type, self.static))
        self._hash = hash((treedef, kinds, self.static, self.types))

    def reuse_for(self, treedef: _PyTreeDef, leaves: list[Any]) -> list[Any] | None:
        """The array leaves of a call with this key, or `None` if it has another."""
        if self.treedef != treedef:
            return None
        static = tuple(compress(leaves, self.static_mask))
        if static != self.static or tuple(map(type, static)) != self.types:
            return None
        arrays = list(compress(leaves, self.kinds))
        return arrays if _all_concrete_arrays(map(type, arrays)) else None

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        return (
            other.__class__ is _MixedKey
            and self._hash == other._hash  # type: ignore[attr-defined]
            and self.kinds == other.kinds  # type: ignore[attr-defined]
            and self.static == other.static  # type: ignore[attr-defined]
            and self.types == other.types  # type: ignore[attr-defined]
            and self.treedef == other.treedef  # type: ignore[attr-defined]
        )


def _static_key(treedef: _PyTreeDef, kinds: bytes, leaves: list[Any]) -> _MixedKey:
    """The static key of a keyed call with some non-array leaves."""
    return _MixedKey(treedef, kinds, leaves)


def _flatten_call(args: tuple, kwargs: dict) -> tuple[list[Any], _PyTreeDef]:
    """Flattens the arguments of a call: `args` alone when there are no keyword
    arguments (one node fewer to flatten and compare), else the *list*
    `[args, kwargs]`. The root node type, tuple or list, tells the two forms
    apart, so their treedefs are never equal."""
    if kwargs:
        return _flatten([args, kwargs])
    return _flatten(args)


def _unpack_key(key: Any, dynamic: list[Any]) -> tuple[tuple, dict]:
    """Inside the trace: `(args, kwargs)` from a key and the traced arrays."""
    if key.__class__ is _ArraysKey:
        call = key.treedef.unflatten(dynamic)
    else:
        call = key.treedef.unflatten(_merge(key.kinds, dynamic, key.static))
    if call.__class__ is list:
        return call[0], call[1]
    return call, {}
