"""`filter_make_jaxpr`: the jaxpr of a function of arbitrary pytrees."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from ._compat import traceback_boundary
from ._eval_shape import is_shaped, traced_call
from ._tree._split import StaticPart, interleave, split

__all__ = ["filter_make_jaxpr"]


def _structs_and_rest(
    out_dynamic: list[Any], out_static: StaticPart
) -> tuple[Any, Any]:
    """The output with `ShapeDtypeStruct`s for arrays and `None` elsewhere, and
    the output with `None` for arrays."""
    nones_static = [None] * len(out_static.static)
    nones_dynamic = [None] * len(out_dynamic)
    unflatten = out_static.treedef.unflatten
    return (
        unflatten(interleave(out_static.mask, out_dynamic, nones_static)),
        unflatten(interleave(out_static.mask, nones_dynamic, out_static.static)),
    )


def filter_make_jaxpr(
    fun: Callable[..., Any],
) -> Callable[..., tuple[Any, Any, Any]]:
    """As `jax.make_jaxpr`, for functions of arbitrary pytrees.

    **Arguments:**

    - `fun`: any callable.

    **Returns:** a function which, given example arguments `*args, **kwargs`,
    returns a triple:

    - the `ClosedJaxpr` of `fun` at those arguments. Its inputs are the array
      leaves (and `jax.ShapeDtypeStruct`s) of `(args, kwargs)`, in flattening
      order; every other leaf is static, baked into the jaxpr.
    - the output's structure with a `jax.ShapeDtypeStruct` for each array and
      `None` elsewhere;
    - the output's structure with its non-array leaves and `None` for arrays
      (so that `filterax.combine` of the last two rebuilds the output's shape).

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> jaxpr, shapes, rest = fx.filter_make_jaxpr(
    ...     lambda x, power: (x**power, "done"))(jnp.ones(3), 2)
    >>> [eqn.primitive.name for eqn in jaxpr.jaxpr.eqns]
    ['integer_pow']
    >>> shapes, rest
    ((ShapeDtypeStruct(shape=(3,), dtype=float32), None), (None, 'done'))

    ```
    """

    # `updated=()`: a Module's fields must not land in the wrapper's `__dict__`.
    @functools.wraps(fun, updated=())
    @traceback_boundary
    def make_jaxpr(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        dynamic, args_static = split((args, kwargs), is_shaped)
        body = traced_call(fun, args_static)
        closed_jaxpr, (out_dynamic, out_static) = jax.make_jaxpr(
            lambda *traced: body(list(traced)), return_shape=True
        )(*dynamic)
        return (closed_jaxpr, *_structs_and_rest(out_dynamic, out_static))

    return make_jaxpr
