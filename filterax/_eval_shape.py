"""`filter_eval_shape`: output shapes of a function of arbitrary pytrees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ._filters import is_array
from ._split import StaticPart, split

__all__ = ["filter_eval_shape", "is_shaped"]


def is_shaped(leaf: Any) -> bool:
    """A leaf that stands for an array: an array or a `jax.ShapeDtypeStruct`."""
    return is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)


def traced_call(
    fun: Callable[..., Any], args_static: StaticPart
) -> Callable[[list[Any]], tuple[list[Any], StaticPart]]:
    """The function JAX traces for `fun`: from the traced leaves of a call to
    the array leaves of the output and the output's `StaticPart` (which rides
    out of the trace in the treedef)."""

    def body(traced: list[Any]) -> tuple[list[Any], StaticPart]:
        call_args, call_kwargs = args_static.merge(traced)
        return split(fun(*call_args, **call_kwargs), is_array)

    return body


def filter_eval_shape(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The output shapes and dtypes of `fun(*args, **kwargs)`, computed without
    running it.

    Array leaves of the arguments and of `fun` itself (and
    `jax.ShapeDtypeStruct`s standing for arrays, so an abstract model made by
    `filter_eval_shape` can be called) are traced abstractly; every other leaf
    is passed as it is.

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
    # `fun`'s own arrays are traced too: an abstract model (itself made by
    # `filter_eval_shape`) is called on abstract inputs.
    dynamic, static = split((fun, args, kwargs), is_shaped)

    def body(traced: list[Any]) -> tuple[list[Any], StaticPart]:
        call_fun, call_args, call_kwargs = static.merge(traced)
        return split(call_fun(*call_args, **call_kwargs), is_array)

    out_dynamic, out_static = jax.eval_shape(body, dynamic)
    return out_static.merge(out_dynamic)
