"""`cast`: the one place where the leaves of a pytree change dtype."""

from __future__ import annotations

from typing import Any

import jax.tree_util as jtu
import numpy as np

from .._tree._filters import filter, is_inexact_array
from ._dtypes import floating_dtype, is_floating_array

__all__ = ["cast", "cast_leaves", "cast_selected", "register_buffer_type"]

# What `filter` puts where a leaf is not selected: told apart from every value
# a pytree may hold (`None` included) by identity.
_NOT_SELECTED = object()

# Pytree types whose arrays `mixed_precision` never casts: buffers such as the
# running statistics in `nn.State`, whose small updates a half-precision copy
# would round away. Registered by the layers that define them (this layer may
# not import `filterax.nn`).
_BUFFER_TYPES: tuple[type, ...] = ()


def register_buffer_type(cls: type) -> None:
    """Makes `mixed_precision` pass instances of `cls` (a pytree node type)
    through uncast, in its arguments and its outputs."""
    global _BUFFER_TYPES
    _BUFFER_TYPES = (*_BUFFER_TYPES, cls)


def _is_buffer(node: Any) -> bool:
    return isinstance(node, _BUFFER_TYPES)


def _cast_leaf(leaf: Any, dtype: np.dtype | None) -> Any:
    if dtype is None or not is_floating_array(leaf) or leaf.dtype == dtype:
        return leaf
    # `astype` keeps a JAX array's sharding and a NumPy array a NumPy array;
    # under differentiation its transpose casts the cotangent back to the
    # leaf's own dtype.
    return leaf.astype(dtype)


def _on_floating_arrays(spec: Any) -> Any:
    """A predicate of a filter spec, called on floating arrays only (any other
    leaf is never cast), so that `lambda leaf: leaf.ndim == 1` may ask what
    only arrays have."""
    if not callable(spec):
        return spec
    return lambda leaf: is_floating_array(leaf) and spec(leaf)


def cast_selected(
    tree: Any, where: Any, selected: np.dtype | None, other: np.dtype | None
) -> Any:
    """Casts the floating arrays that `where` selects to `selected` and the
    others to `other` (`None`: left as they are), in one walk of `tree`. The
    dtypes are already read by `floating_dtype`: the wrappers call this on
    every call."""
    marks = filter(
        tree, jtu.tree_map(_on_floating_arrays, where), replace=_NOT_SELECTED
    )
    return jtu.tree_map(
        lambda mark, leaf: _cast_leaf(
            leaf, other if mark is _NOT_SELECTED else selected
        ),
        marks,
        tree,
    )


def cast_leaves(tree: Any, dtype: np.dtype, *, buffers: bool = True) -> Any:
    """Casts every floating array of `tree` to `dtype` (already read by
    `floating_dtype`); with `buffers=False`, none inside a registered buffer
    type."""
    if buffers or not _BUFFER_TYPES:
        return jtu.tree_map(lambda leaf: _cast_leaf(leaf, dtype), tree)
    return jtu.tree_map(
        lambda leaf: leaf if _is_buffer(leaf) else _cast_leaf(leaf, dtype),
        tree,
        is_leaf=_is_buffer,
    )


def cast(tree: Any, dtype: Any, where: Any = is_inexact_array) -> Any:
    """Casts the floating arrays of a pytree to `dtype`, leaving every other leaf
    as it is.

    Only the leaves that `where` selects *and* that are real floating arrays
    (JAX or NumPy) change: integers, booleans, key arrays, complex arrays, Python
    scalars, static fields, `None` and [`SymbolicZero`][filterax.SymbolicZero]s
    come back untouched, and so do arrays already of `dtype`. Each cast array
    keeps its sharding. The cast is differentiable: the cotangent of a cast
    leaf comes back in that leaf's original dtype, so gradients with respect to
    float32 parameters cast to bfloat16 inside a loss are float32.

    **Arguments:**

    - `tree`: any pytree (Modules included).
    - `dtype`: the floating dtype to cast to: a dtype such as `jnp.bfloat16`, its
      name, or a short name (`"bf16"`, `"f16"`, `"f32"`, `"f64"`).
    - `where`: a filter spec selecting the leaves that may be cast, as for
      [`partition`][filterax.partition]: a predicate `leaf -> bool`, or a pytree
      prefix of `tree` whose leaves are bools or predicates. The predicates are
      called on floating arrays only. Defaults to every inexact array.

    **Returns:** a pytree of the same structure as `tree`.

    **Raises:** `TypeError` when `dtype` is not a floating dtype; `ValueError`
    naming the key path when `where` is not a prefix of `tree`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> tree = {"w": jnp.ones(2), "step": jnp.arange(3), "key": jax.random.key(0)}
    >>> fx.tree_pformat(fx.cast(tree, jnp.bfloat16))
    "{'key': key<fry>[], 'step': i32[3], 'w': bf16[2]}"
    >>> fx.cast(tree, "f16", where={"w": False, "step": True, "key": True})["w"].dtype
    dtype('float32')

    ```
    """
    dtype = floating_dtype(dtype, "cast(dtype=...)")
    if where is is_inexact_array:  # the default: no filter to resolve
        return cast_leaves(tree, dtype)
    return cast_selected(tree, where, dtype, None)
