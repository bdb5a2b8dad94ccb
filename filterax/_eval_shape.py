"""`filter_eval_shape`: output shapes of a function of arbitrary pytrees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from ._filters import is_array
from ._static import Static

__all__ = ["filter_eval_shape"]


def is_shaped(leaf: Any) -> bool:
    """A leaf that stands for an array: an array or a `jax.ShapeDtypeStruct`."""
    return is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)


def split_call(
    args: tuple, kwargs: dict
) -> tuple[list[Any], Callable[[list[Any]], tuple[tuple, dict]]]:
    """The shaped leaves of a call, and how to rebuild `(args, kwargs)` from
    (traced) replacements for them."""
    leaves, treedef = jtu.tree_flatten((args, kwargs))
    mask = [is_shaped(leaf) for leaf in leaves]
    dynamic = [leaf for leaf, shaped in zip(leaves, mask) if shaped]
    static = [leaf for leaf, shaped in zip(leaves, mask) if not shaped]

    def rebuild(new_dynamic: list[Any]) -> tuple[tuple, dict]:
        dynamic_iter, static_iter = iter(new_dynamic), iter(static)
        merged = [next(dynamic_iter if shaped else static_iter) for shaped in mask]
        return treedef.unflatten(merged)

    return dynamic, rebuild


def split_output(out: Any) -> tuple[list[Any], Static]:
    """Inside a trace: the array leaves of `out`, and a box with the rest."""
    leaves, treedef = jtu.tree_flatten(out)
    mask = tuple(is_array(leaf) for leaf in leaves)
    dynamic = [leaf for leaf, array in zip(leaves, mask) if array]
    static = tuple(leaf for leaf, array in zip(leaves, mask) if not array)
    return dynamic, Static((treedef, mask, static))


def merge_output(dynamic: list[Any], box: Static) -> Any:
    treedef, mask, static = box.value
    dynamic_iter, static_iter = iter(dynamic), iter(static)
    return treedef.unflatten(
        [next(dynamic_iter if array else static_iter) for array in mask]
    )


def filter_eval_shape(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The output shapes and dtypes of `fun(*args, **kwargs)`, computed without
    running it.

    Array leaves of the arguments (and `jax.ShapeDtypeStruct`s standing for
    arrays) are traced abstractly; every other leaf is passed as it is.

    **Arguments:**

    - `fun`: any callable (a function, a Module, a bound method).
    - `*args`, `**kwargs`: its arguments; arrays may be replaced by
      `jax.ShapeDtypeStruct`s.

    **Returns:** the output of `fun` with each array replaced by a
    `jax.ShapeDtypeStruct`; non-array outputs are the Python objects returned.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> def embed(tokens, table, mode):
    ...     return table[tokens], mode
    >>> fx.filter_eval_shape(embed, jax.ShapeDtypeStruct((5,), jnp.int32),
    ...                      jnp.zeros((100, 16)), "lookup")
    (ShapeDtypeStruct(shape=(5, 16), dtype=float32), 'lookup')

    ```
    """
    dynamic, rebuild = split_call(args, kwargs)

    def body(traced: list[Any]) -> tuple[list[Any], Static]:
        call_args, call_kwargs = rebuild(traced)
        return split_output(fun(*call_args, **call_kwargs))

    out_dynamic, box = jax.eval_shape(body, dynamic)
    return merge_output(out_dynamic, box)
