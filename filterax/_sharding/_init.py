"""`sharded_init`: a constructor run compiled, each array made on its shard."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.tree_util as jtu
from jax.extend.core import jaxpr_as_fun

from .._eval_shape import filter_eval_shape
from .._filters import is_array
from .._split import split
from ._rules import Rules, flat_shardings

__all__ = ["sharded_init"]

_T = TypeVar("_T")


def sharded_init(
    make: Callable[..., _T],
    mesh: jax.sharding.Mesh,
    rules: Rules,
    *,
    stages: int = 1,
) -> Callable[..., _T]:
    """Wraps a constructor so that it builds its arrays directly on their
    shardings.

    The returned function first evaluates `make(*args, **kwargs)` abstractly
    (no array is made) to find the shardings of its arrays with
    [`sharding_of`][filterax.sharding_of], then runs it once compiled
    (`jax.jit` of its array part, with those shardings as `out_shardings`):
    each device computes only its own shard of each parameter, so no
    parameter is ever whole on one device and a model larger than one
    device's memory can be built. Everything that is not an array (static
    fields, functions) is rebuilt around the arrays. The values are those
    `make` gives when run eagerly with the same arguments.

    **Arguments:**

    - `make`: any callable returning a pytree: a Module class, a function, a
      [`filter_vmap`][filterax.filter_vmap]ped constructor (its layers get the
      leading `"stack"` axis).
    - `mesh`: the `jax.sharding.Mesh`, with `Auto` or `Explicit` axes.
    - `rules`: the rules of [`sharding_of`][filterax.sharding_of].
    - `stages`: in how many compiled stages to build the arrays, each making a
      run of consecutive output arrays of about equal size per device (XLA
      drops the computation of the others), so that the temporaries of only
      one stage are alive at a time. With one stage (the default) the arrays
      are made by one compilation, and a device's peak can reach about twice
      its share of the model (XLA:CPU's random number generator keeps
      temporaries as large as its output); with `stages=8` it stays within
      about 1.2 times its share, for one compilation per stage. A single array
      larger than a stage is still made whole by its own stage.

    **Returns:** a function taking `make`'s arguments and returning what
    `make` returns, with every array placed on its sharding.

    **Raises:** `TypeError` if `make` is not callable, `ValueError` if `stages`
    is not a positive int; what `sharding_of` raises, when the function is
    called and before anything is computed.

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"))
    >>> make = fx.sharded_init(fx.nn.Linear, mesh, {"out": "model", "in": "data"})
    >>> linear = make(16, 8, key=jax.random.key(0))
    >>> linear.weight.sharding.spec, linear.bias.sharding.spec
    (P('model', 'data'), P('model',))
    >>> linear.weight.addressable_shards[0].data.shape
    (4, 4)

    ```
    """
    if not callable(make):
        raise TypeError(f"sharded_init: `make` must be callable, got {make!r}.")
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(
            f"sharded_init: `stages` must be a positive int, got {stages!r}."
        )

    @functools.wraps(make)
    def init(*args: Any, **kwargs: Any) -> _T:
        abstract = filter_eval_shape(make, *args, **kwargs)
        shardings, _ = flat_shardings(abstract, mesh, rules)
        # Only the array leaves of the output leave the compiled function, in
        # the order of the abstract output's leaves.
        arrays_out = [
            (leaf, sharding)
            for leaf, sharding in zip(jtu.tree_leaves(abstract), shardings)
            if isinstance(leaf, jax.ShapeDtypeStruct)
        ]
        out_shardings = [sharding for _, sharding in arrays_out]
        dynamic, static = split((make, args, kwargs), is_array)

        def arrays(traced: list[Any]) -> tuple[list[Any], Any]:
            call_make, call_args, call_kwargs = static.merge(traced)
            return split(call_make(*call_args, **call_kwargs), is_array)

        groups = _stage_groups(
            [_bytes_per_device(leaf, sharding) for leaf, sharding in arrays_out],
            stages,
        )
        if len(groups) <= 1:
            out_dynamic, out_static = jax.jit(
                arrays, out_shardings=(out_shardings, None)
            )(dynamic)
            return out_static.merge(out_dynamic)
        return _built_in_stages(arrays, dynamic, out_shardings, groups)

    return init


def _bytes_per_device(leaf: jax.ShapeDtypeStruct, sharding: Any) -> int:
    shape = sharding.shard_shape(tuple(leaf.shape))
    return math.prod(shape) * jax.numpy.dtype(leaf.dtype).itemsize


def _stage_groups(sizes: list[int], stages: int) -> list[list[int]]:
    """The output arrays' positions, in runs of consecutive arrays of about
    `sum(sizes) / stages` bytes each (an array larger than that alone)."""
    budget = sum(sizes) / stages
    groups: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index, size in enumerate(sizes):
        if current and filled + size > budget:
            groups.append(current)
            current, filled = [], 0
        current.append(index)
        filled += size
    if current:
        groups.append(current)
    return groups


def _built_in_stages(
    arrays: Callable[[list[Any]], tuple[list[Any], Any]],
    dynamic: list[Any],
    out_shardings: list[Any],
    groups: list[list[int]],
) -> Any:
    """Traces the constructor's array part once, then compiles and runs it
    once per group of outputs: each stage computes only its own arrays."""
    closed, (_, out_static) = jax.make_jaxpr(arrays, return_shape=True)(dynamic)
    run = jaxpr_as_fun(closed)
    inputs = jtu.tree_leaves(dynamic)
    built: list[Any] = [None] * len(out_shardings)
    for group in groups:

        def stage(flat: list[Any], group: list[int] = group) -> list[Any]:
            outputs = run(*flat)
            return [outputs[index] for index in group]

        made = jax.jit(stage, out_shardings=[out_shardings[i] for i in group])(inputs)
        for index, array in zip(group, made):
            built[index] = array
    return out_static.merge(built)
