"""`filter_pure_callback`: calls Python from traced code, with arbitrary pytrees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from ._filters import is_array

__all__ = ["filter_pure_callback"]


def _is_struct(leaf: Any) -> bool:
    return isinstance(leaf, jax.ShapeDtypeStruct) or is_array(leaf)


def filter_pure_callback(
    callback: Callable[..., Any],
    *args: Any,
    result_shape_dtypes: Any,
    vmap_method: str | None = None,
    **kwargs: Any,
) -> Any:
    """Calls the Python function `callback` from traced code, as
    `jax.pure_callback` does, but with arbitrary pytrees in and out.

    Array leaves of the arguments reach `callback` as concrete host arrays (as
    `jax.pure_callback` passes them: CPU `jax.Array`s in JAX 0.10); every other
    leaf is passed as it is. `callback` must be pure: JAX may call it any
    number of times, or not at all.

    **Arguments:**

    - `callback`: the Python function, called as `callback(*args, **kwargs)`.
    - `*args`, `**kwargs`: its arguments: any pytrees.
    - `result_shape_dtypes`: the output's structure, with a
      `jax.ShapeDtypeStruct` (or an example array) for each array leaf; other
      leaves are returned as given, and `callback` must return equal ones.
    - `vmap_method`: as for `jax.pure_callback`: how to batch under `vmap`
      (`"sequential"`, `"expand_dims"`, `"broadcast_all"`...).

    **Returns:** the output of `callback`, with JAX arrays (tracers under a
    transformation) for its array leaves.

    **Raises:** `ValueError`, when the callback runs, if its output does not
    match `result_shape_dtypes` in structure or in its non-array leaves.

    ```python
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import filterax as fx
    >>> def host_sort(values, order):
    ...     return {"sorted": np.sort(values)[::order], "order": order}
    >>> @jax.jit
    ... def f(x):
    ...     spec = {"sorted": jax.ShapeDtypeStruct(x.shape, x.dtype), "order": -1}
    ...     return fx.filter_pure_callback(host_sort, x, -1,
    ...                                    result_shape_dtypes=spec)["sorted"]
    >>> f(jnp.array([2.0, 3.0, 1.0]))
    Array([3., 2., 1.], dtype=float32)

    ```
    """
    in_leaves, in_treedef = jtu.tree_flatten((args, kwargs))
    in_mask = [is_array(leaf) for leaf in in_leaves]
    in_dynamic = [leaf for leaf, array in zip(in_leaves, in_mask) if array]
    in_static = [leaf for leaf, array in zip(in_leaves, in_mask) if not array]

    out_leaves, out_treedef = jtu.tree_flatten(result_shape_dtypes)
    out_mask = [_is_struct(leaf) for leaf in out_leaves]
    out_structs = [
        jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        for leaf, struct in zip(out_leaves, out_mask)
        if struct
    ]
    out_static = [leaf for leaf, struct in zip(out_leaves, out_mask) if not struct]

    def host_callback(*host_dynamic: Any) -> list[Any]:
        dynamic_iter, static_iter = iter(host_dynamic), iter(in_static)
        merged = [next(dynamic_iter if array else static_iter) for array in in_mask]
        call_args, call_kwargs = in_treedef.unflatten(merged)
        out = callback(*call_args, **call_kwargs)
        leaves, treedef = jtu.tree_flatten(out)
        if treedef != out_treedef:
            raise ValueError(
                "filter_pure_callback: the callback returned a pytree structured "
                f"as {treedef}, but result_shape_dtypes is {out_treedef}."
            )
        static = [leaf for leaf, struct in zip(leaves, out_mask) if not struct]
        if static != out_static:
            raise ValueError(
                "filter_pure_callback: the callback returned the non-array "
                f"leaves {static}, but result_shape_dtypes has {out_static}."
            )
        return [leaf for leaf, struct in zip(leaves, out_mask) if struct]

    out_dynamic = jax.pure_callback(
        host_callback, out_structs, *in_dynamic, vmap_method=vmap_method
    )
    dynamic_iter, static_iter = iter(out_dynamic), iter(out_static)
    return out_treedef.unflatten(
        [next(dynamic_iter if struct else static_iter) for struct in out_mask]
    )
