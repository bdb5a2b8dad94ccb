"""`sharded_init`: a constructor run compiled, each array made on its shard."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.tree_util as jtu

from .._eval_shape import filter_eval_shape
from .._filters import is_array
from .._split import split
from ._rules import Rules, flat_shardings

__all__ = ["sharded_init"]

_T = TypeVar("_T")


def sharded_init(
    make: Callable[..., _T], mesh: jax.sharding.Mesh, rules: Rules
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

    **Returns:** a function taking `make`'s arguments and returning what
    `make` returns, with every array placed on its sharding.

    **Raises:** what `sharding_of` raises, when the function is called and
    before anything is computed.

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

    @functools.wraps(make)
    def init(*args: Any, **kwargs: Any) -> _T:
        abstract = filter_eval_shape(make, *args, **kwargs)
        shardings, _ = flat_shardings(abstract, mesh, rules)
        # Only the array leaves of the output leave the compiled function, in
        # the order of the abstract output's leaves.
        out_shardings = [
            sharding
            for leaf, sharding in zip(jtu.tree_leaves(abstract), shardings)
            if isinstance(leaf, jax.ShapeDtypeStruct)
        ]
        dynamic, static = split((make, args, kwargs), is_array)

        def arrays(traced: list[Any]) -> tuple[list[Any], Any]:
            call_make, call_args, call_kwargs = static.merge(traced)
            return split(call_make(*call_args, **call_kwargs), is_array)

        out_dynamic, out_static = jax.jit(arrays, out_shardings=(out_shardings, None))(
            dynamic
        )
        return out_static.merge(out_dynamic)

    return init
