"""`filter_pure_callback`: calls Python from traced code, with arbitrary pytrees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ._tree._filters import is_array
from ._tree._split import split
from ._tree._structure import tree_diff

__all__ = ["filter_pure_callback"]


def _is_struct(leaf: Any) -> bool:
    return isinstance(leaf, jax.ShapeDtypeStruct) or is_array(leaf)


def filter_pure_callback(
    callback: Callable[..., Any],
    *args: Any,
    result_shape_dtypes: Any,
    sharding: jax.sharding.Sharding | None = None,
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
    - `sharding`: as for `jax.pure_callback`: the device the callback is called
      from (a `jax.sharding.SingleDeviceSharding`), or `None`.
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
    in_dynamic, in_static = split((args, kwargs), is_array)
    out_dynamic_structs, out_static = split(result_shape_dtypes, _is_struct)
    out_structs = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in out_dynamic_structs]
    expected = out_static.merge(out_structs)
    expected_shapes = [(struct.shape, struct.dtype) for struct in out_structs]
    in_ranks = [np.ndim(leaf) for leaf in in_dynamic]

    def host_callback(*host_dynamic: Any) -> list[Any]:
        call_args, call_kwargs = in_static.merge(host_dynamic)
        out = callback(*call_args, **call_kwargs)
        out_dynamic, out_static_part = split(out, _is_struct)
        # Under `vmap` with a vectorised `vmap_method`, the callback sees (and
        # returns) arrays with leading batch axes: only the trailing ones are
        # declared.
        batched = any(np.ndim(h) > r for h, r in zip(host_dynamic, in_ranks))
        # As `jax.pure_callback`: a 64-bit result stands for its 32-bit
        # declaration when 64-bit types are disabled (NumPy's defaults).
        if out_static_part == out_static and expected_shapes == [
            (
                leaf.shape[leaf.ndim - len(shape) :] if batched else leaf.shape,
                jax.dtypes.canonicalize_dtype(leaf.dtype),
            )
            for leaf, (shape, _) in zip(out_dynamic, expected_shapes)
        ]:
            return out_dynamic
        # Only on a mismatch: name where the output parts from the expectation.
        differences = tree_diff(expected, out, compare_values=False, max_differences=3)
        if differences:
            listing = "; ".join(
                f"at {d.where('out')}: expected {d.detail.replace(' vs ', ', got ', 1)}"
                for d in differences
            )
            raise ValueError(
                "filter_pure_callback: the callback's output does not match "
                f"result_shape_dtypes ({listing})."
            )
        return out_dynamic

    out_dynamic = jax.pure_callback(
        host_callback,
        out_structs,
        *in_dynamic,
        sharding=sharding,
        vmap_method=vmap_method,
    )
    return out_static.merge(out_dynamic)
