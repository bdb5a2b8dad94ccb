"""The tensors of a pytree: every array leaf (a `jax.Ref` counts as the array
it holds), named by its key path joined with dots."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from .._serialisation._arrays import is_key_dtype
from .._tree._filters import is_ref

__all__ = ["ArrayLeaf", "array_leaves", "tensor_name"]

# What stands for an array in a pytree: concrete arrays, and the abstract
# `ShapeDtypeStruct`s that `filter_eval_shape` gives.
_ARRAY_TYPES = (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)


def tensor_name(path: jtu.KeyPath) -> str:
    """The tensor name of the leaf at `path`: `layers.0.weight`."""
    return jtu.keystr(path, simple=True, separator=".")


@dataclasses.dataclass(frozen=True)
class ArrayLeaf:
    """One array leaf of a flattened pytree."""

    index: int  # its position among all the leaves
    path: jtu.KeyPath
    name: str
    leaf: Any  # as in the pytree: a Ref stays a Ref

    @property
    def value(self) -> Any:
        """The array (or struct) itself: what a Ref holds."""
        return self.leaf[...] if is_ref(self.leaf) else self.leaf

    @property
    def where(self) -> str:
        """The key path as `jax.tree_util.keystr` writes it, for messages."""
        return jtu.keystr(self.path) or "the root"

    @property
    def is_key(self) -> bool:
        return is_key_dtype(getattr(self.value, "dtype", None))


def _is_array(leaf: Any) -> bool:
    if is_ref(leaf):
        return True
    return isinstance(leaf, _ARRAY_TYPES)


def array_leaves(tree: Any) -> tuple[list[Any], Any, list[ArrayLeaf]]:
    """Flattens `tree` once: its leaves, its treedef, and its array leaves
    with their names.

    **Raises:** `ValueError` when two array leaves have the same name (e.g.
    a dict key `"a.b"` beside an attribute `a` holding `b`), naming both key
    paths."""
    with_paths, treedef = jtu.tree_flatten_with_path(tree)
    found = []
    seen: dict[str, ArrayLeaf] = {}
    for index, (path, leaf) in enumerate(with_paths):
        if not _is_array(leaf):
            continue
        entry = ArrayLeaf(index, path, tensor_name(path), leaf)
        if entry.name in seen:
            raise ValueError(
                f"the array leaves at {seen[entry.name].where} and {entry.where} "
                f"have the same tensor name {entry.name!r} (key paths joined "
                "with dots): rename a field or dict key so that they differ."
            )
        seen[entry.name] = entry
        found.append(entry)
    return [leaf for _, leaf in with_paths], treedef, found
