"""`filter_make_jaxpr`: the jaxpr of a function of arbitrary pytrees."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from ._eval_shape import split_call, split_output
from ._static import Static

__all__ = ["filter_make_jaxpr"]


def _structs_and_rest(out_dynamic: list[Any], box: Static) -> tuple[Any, Any]:
    """The output with `ShapeDtypeStruct`s for arrays and `None` elsewhere, and
    the output with `None` for arrays."""
    treedef, mask, static = box.value
    struct_iter, static_iter = iter(out_dynamic), iter(static)
    structs = [next(struct_iter) if array else None for array in mask]
    rest = [None if array else next(static_iter) for array in mask]
    return treedef.unflatten(structs), treedef.unflatten(rest)


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
    def make_jaxpr(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
        dynamic, rebuild = split_call(args, kwargs)

        def body(*traced: Any) -> Any:
            call_args, call_kwargs = rebuild(list(traced))
            return split_output(fun(*call_args, **call_kwargs))

        closed_jaxpr, (out_dynamic, box) = jax.make_jaxpr(body, return_shape=True)(
            *dynamic
        )
        return (closed_jaxpr, *_structs_and_rest(out_dynamic, box))

    return make_jaxpr
