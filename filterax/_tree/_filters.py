"""Leaf predicates and the filter/partition/combine trio."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._typing import PyTree
from ._structure import one_level, path_text, prefix_difference, structure_difference

__all__ = [
    "combine",
    "filter",
    "is_array",
    "is_array_like",
    "is_inexact_array",
    "is_inexact_array_like",
    "is_key_array",
    "is_ref",
    "partition",
    "register_ref_like",
]

_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)


def is_array(element: Any) -> bool:
    """Whether `element` is a JAX array (typed key arrays included) or a NumPy
    array or scalar.

    **Arguments:**

    - `element`: any Python object.

    **Returns:** `True` for `jax.Array` (and tracers), `numpy.ndarray` and NumPy
    scalars such as `numpy.float32(1)`; `False` otherwise, Python scalars included.

    ```python
    >>> import jax.numpy as jnp, numpy as np
    >>> import filterax as fx
    >>> fx.is_array(jnp.ones(3)), fx.is_array(np.int8(1)), fx.is_array(1.0)
    (True, True, False)

    ```
    """
    return isinstance(element, _ARRAY_TYPES)


def is_array_like(element: Any) -> bool:
    """Whether `element` is an array (see [`is_array`][filterax.is_array]) or a
    Python `bool`, `int`, `float` or `complex`.

    **Arguments:**

    - `element`: any Python object.

    **Returns:** a `bool`.

    ```python
    >>> import filterax as fx
    >>> fx.is_array_like(3), fx.is_array_like("3")
    (True, False)

    ```
    """
    return isinstance(element, (*_ARRAY_TYPES, bool, int, float, complex))


def is_inexact_array(element: Any) -> bool:
    """Whether `element` is a floating-point or complex JAX or NumPy array.

    Key arrays, integer arrays and boolean arrays are not inexact, so they are
    never differentiated.

    **Arguments:**

    - `element`: any Python object.

    **Returns:** a `bool`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.is_inexact_array(jnp.ones(2)), fx.is_inexact_array(jnp.arange(2))
    (True, False)
    >>> fx.is_inexact_array(jax.random.key(0))
    False

    ```
    """
    if isinstance(element, _ARRAY_TYPES):
        return _dtype_is_inexact(element.dtype)
    return False


_INEXACT_BY_DTYPE: dict[Any, bool] = {}


def _dtype_is_inexact(dtype: Any) -> bool:
    # `jnp.issubdtype` understands bfloat16 and key dtypes but is slow;
    # there are few dtypes, so remember each answer.
    try:
        return _INEXACT_BY_DTYPE[dtype]
    except KeyError:
        answer = bool(jnp.issubdtype(dtype, np.inexact))
        _INEXACT_BY_DTYPE[dtype] = answer
        return answer


def is_inexact_array_like(element: Any) -> bool:
    """Whether `element` is an inexact array or a Python `float` or `complex`.

    **Arguments:**

    - `element`: any Python object.

    **Returns:** a `bool`.

    ```python
    >>> import filterax as fx
    >>> fx.is_inexact_array_like(1.0), fx.is_inexact_array_like(1)
    (True, False)

    ```
    """
    if isinstance(element, (float, complex)):
        return True
    return is_inexact_array(element)


def is_key_array(element: Any) -> bool:
    """Whether `element` is a typed PRNG key array (made by `jax.random.key`).

    Legacy raw `uint32` keys (from `jax.random.PRNGKey`) cannot be told apart
    from ordinary integer arrays, and are treated as such.

    **Arguments:**

    - `element`: any Python object.

    **Returns:** a `bool`.

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> fx.is_key_array(jax.random.key(0)), fx.is_key_array(jax.random.PRNGKey(0))
    (True, False)

    ```
    """
    return isinstance(element, jax.Array) and jnp.issubdtype(
        element.dtype, jax.dtypes.prng_key
    )


# `jax.Ref`, and the views of Refs that the AD transforms hand to functions
# (`_ad/_refs.py` registers them: this module sits below it).
_REF_TYPES: tuple[type, ...] = (jax.Ref,)


def register_ref_like(cls: type) -> None:
    """Makes `is_ref` recognise instances of `cls` (a stand-in for a Ref)."""
    global _REF_TYPES
    _REF_TYPES = (*_REF_TYPES, cls)


def is_ref(element: Any) -> bool:
    """Whether `element` is a `jax.Ref`: a mutable array reference made by
    `jax.new_ref`.

    Every filtered transform treats a Ref as dynamic state: traced (never
    hashed) by [`filter_jit`][filterax.filter_jit], never differentiated, never
    part of what [`trainable`][filterax.trainable] or `filter(tree,
    is_inexact_array)` selects. A Ref is not an array: `is_array` is `False`.

    **Arguments:**

    - `element`: any Python object.

    **Returns:** a `bool`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.is_ref(jax.new_ref(jnp.zeros(3))), fx.is_ref(jnp.zeros(3))
    (True, False)

    ```
    """
    return isinstance(element, _REF_TYPES)


def _spec_error(path: jtu.KeyPath, spec: Any) -> ValueError:
    return ValueError(
        f"filter_spec leaf at {path_text('', path)} is {spec!r}; expected a bool or "
        "a callable `leaf -> bool`."
    )


def _resolve_leaf_mask(
    path: jtu.KeyPath, spec: Any, subtree: Any, is_leaf: Callable[[Any], bool] | None
) -> Any:
    """Turns one leaf of `filter_spec` into a bool-per-leaf pytree of `subtree`."""
    if isinstance(spec, (bool, np.bool_)):
        keep = bool(spec)
        return jtu.tree_map(lambda _: keep, subtree, is_leaf=is_leaf)
    if callable(spec):

        def apply(leaf: Any) -> bool:
            result = spec(leaf)
            if not isinstance(result, (bool, np.bool_)):
                raise ValueError(
                    f"filter_spec callable at {path_text('', path)} returned "
                    f"{result!r} for a leaf; expected a bool."
                )
            return bool(result)

        return jtu.tree_map(apply, subtree, is_leaf=is_leaf)
    raise _spec_error(path, spec)


def _is_jax_leaf(tree: Any) -> bool:
    return one_level(tree) is None


def _leaf_mask(
    pytree: Any, filter_spec: Any, is_leaf: Callable[[Any], bool] | None
) -> Any:
    """A pytree like `pytree` whose leaves say whether to keep each leaf.

    `filter_spec` is descended into as a pytree, as JAX sees it (a callable
    Module is a node, not a predicate); its leaves are the predicates. Raises a
    `ValueError` naming the key path when it is not a pytree prefix of
    `pytree`.
    """
    if _is_jax_leaf(filter_spec):
        return _resolve_leaf_mask((), filter_spec, pytree, is_leaf)
    spec_paths, spec_def = jtu.tree_flatten_with_path(filter_spec)
    try:
        subtrees = spec_def.flatten_up_to(pytree)
    except (ValueError, TypeError):
        difference = prefix_difference(filter_spec, pytree, _is_jax_leaf)
        where = difference.where() if difference else "the root"
        detail = difference.detail if difference else "a different structure"
        raise ValueError(
            "filter_spec must be a pytree prefix of the pytree being filtered "
            f"(its leaves bools or callables), but at {where} filter_spec has "
            f"{detail}."
        ) from None
    masks = [
        _resolve_leaf_mask(path, spec, subtree, is_leaf)
        for (path, spec), subtree in zip(spec_paths, subtrees)
    ]
    return jtu.tree_unflatten(spec_def, masks)


def filter(
    pytree: Any,
    filter_spec: Any,
    inverse: bool = False,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Keeps the leaves of `pytree` selected by `filter_spec`, replacing the others.

    **Arguments:**

    - `pytree`: any pytree.
    - `filter_spec`: a pytree prefix of `pytree` whose leaves are bools or
      callables `leaf -> bool`; a bool or callable at a node applies to every
      leaf below it.
    - `inverse`: keep the leaves that are *not* selected instead.
    - `replace`: what dropped leaves become.
    - `is_leaf`: as for `jax.tree_util.tree_map`: nodes to treat as leaves.

    **Returns:** a pytree of the same structure as `pytree`.

    **Raises:** `ValueError` naming the key path when `filter_spec` is not a
    prefix of `pytree` or one of its leaves is neither a bool nor a callable.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.filter({"w": jnp.ones(2), "act": "relu"}, fx.is_array)
    {'act': None, 'w': Array([1., 1.], dtype=float32)}

    ```
    """
    mask = _leaf_mask(pytree, filter_spec, is_leaf)
    keep = (lambda m: not m) if inverse else bool
    return jtu.tree_map(
        lambda m, x: x if keep(m) else replace, mask, pytree, is_leaf=is_leaf
    )


def partition(
    pytree: PyTree,
    filter_spec: PyTree,
    replace: Any = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> tuple[PyTree, PyTree]:
    """Splits `pytree` into the leaves selected by `filter_spec` and the rest.

    **Arguments:** as for [`filter`][filterax.filter].

    **Returns:** `(kept, rest)`: two pytrees shaped like `pytree`, each holding
    `replace` where the other holds a leaf. `combine(kept, rest)` rebuilds
    `pytree`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> tree = [jnp.zeros(2), "tanh", 3]
    >>> arrays, other = fx.partition(tree, fx.is_array)
    >>> arrays
    [Array([0., 0.], dtype=float32), None, None]
    >>> other
    [None, 'tanh', 3]
    >>> fx.combine(arrays, other)
    [Array([0., 0.], dtype=float32), 'tanh', 3]

    ```
    """
    mask = _leaf_mask(pytree, filter_spec, is_leaf)
    kept = jtu.tree_map(lambda m, x: x if m else replace, mask, pytree, is_leaf=is_leaf)
    rest = jtu.tree_map(lambda m, x: replace if m else x, mask, pytree, is_leaf=is_leaf)
    return kept, rest


def _is_none(x: Any) -> bool:
    return x is None


def _first_not_none(*leaves: Any) -> Any:
    for leaf in leaves:
        if leaf is not None:
            return leaf
    return None


def combine(*pytrees: PyTree, is_leaf: Callable[[Any], bool] | None = None) -> PyTree:
    """Merges pytrees of the same structure, taking the first non-`None` leaf at
    each position.

    **Arguments:**

    - `*pytrees`: pytrees of the same structure, with `None` where a leaf is
      absent (as produced by [`partition`][filterax.partition]).
    - `is_leaf`: nodes to treat as leaves, besides `None`.

    **Returns:** the merged pytree.

    **Raises:** `ValueError` naming the key path where a pytree does not have
    the structure of the first one (a `None` in the first may stand for a
    whole subtree); `TypeError` when no pytree is given.

    ```python
    >>> import filterax as fx
    >>> fx.combine([1, None], [None, 2])
    [1, 2]

    ```
    """
    if not pytrees:
        raise TypeError("combine() needs at least one pytree.")
    if is_leaf is None:
        leaf_test = _is_none
    else:

        def leaf_test(x: Any) -> bool:
            return x is None or is_leaf(x)

    try:
        return jtu.tree_map(_first_not_none, *pytrees, is_leaf=leaf_test)
    except ValueError:
        for index, other in enumerate(pytrees[1:], start=1):
            difference = structure_difference(pytrees[0], other, wildcard=leaf_test)
            if difference is not None:
                raise ValueError(
                    f"combine: pytree {index} does not have the structure of pytree "
                    f"0 at {difference.where()}: {difference.detail}. The pytrees "
                    "must share one structure, with None where a leaf (or a whole "
                    "subtree) is absent, as `partition` produces them."
                ) from None
        # The same structure but for a None (or an `is_leaf` node) in a later
        # pytree where pytree 0 has a subtree: the structure is pytree 0's.
        for index, other in enumerate(pytrees[1:], start=1):
            difference = prefix_difference(
                pytrees[0], other, lambda x: leaf_test(x) or one_level(x) is None
            )
            if difference is not None:
                stand_in = "None" if is_leaf is None else "None (or an `is_leaf` node)"
                raise ValueError(
                    f"combine: pytree {index} has {stand_in} at {difference.where()}, "
                    "where pytree 0 has a subtree. combine takes the structure of "
                    "pytree 0, where a None may stand for a whole absent subtree, but "
                    "in the later pytrees only leaves may be None: pass the pytree "
                    "holding that subtree first, or give the others None at each of "
                    "its leaves, as `partition` produces them."
                ) from None
        raise
