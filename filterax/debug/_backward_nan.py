"""`backward_nan`: prints what flows back through a value, and stops at NaN."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._ad import filter_custom_vjp
from .._errors import error_if
from .._pretty import tree_pformat
from .._tree._filters import combine, is_array, partition

__all__ = ["backward_nan"]


def backward_nan(x: Any, name: str | None = None, terminate: bool = True) -> Any:
    """The identity on the forward pass; on the backward pass, prints the
    primal `x` and its cotangent, and optionally fails if the cotangent holds
    a NaN.

    Use it to find where NaNs appear in a gradient that is finite going
    forward. The printing is a `jax.debug.callback`, so it works under `jit`
    and `vmap` (call `jax.effects_barrier()` to wait for it).

    **Arguments:**

    - `x`: any pytree.
    - `name`: printed before the values, to tell several calls apart.
    - `terminate`: whether a NaN anywhere in the cotangent fails the backward
      pass through [`error_if`][filterax.error_if] (so `FILTERAX_ON_ERROR`
      applies: `breakpoint` stops in the debugger there).

    **Returns:** `x`, unchanged.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> def loss(x):
    ...     return jnp.sum(fx.debug.backward_nan(x, name="x", terminate=False) ** 2)
    >>> gradient = jax.grad(loss)(jnp.array([1.0, 2.0])); jax.effects_barrier()
    x:
       primals=Array([1., 2.], dtype=float32)
    cotangents=Array([2., 4.], dtype=float32)

    ```
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"backward_nan: `name` must be a string or None, got {name!r}.")
    return _backward_nan(x, name, bool(terminate))


@filter_custom_vjp
def _backward_nan(x: Any, name: str | None, terminate: bool) -> Any:
    return x


@_backward_nan.def_fwd
def _backward_nan_fwd(
    perturbed: Any, x: Any, name: str | None, terminate: bool
) -> tuple[Any, None]:
    del perturbed
    return x, None


def _printer(name: str | None, static: Any) -> Any:
    def print_values(primals: Any, cotangents: Any) -> None:
        primals, cotangent_static = combine(primals, static[0]), static[1]
        cotangents = combine(cotangents, cotangent_static)
        head = "" if name is None else f"{name}:\n"
        print(
            f"{head}   primals={tree_pformat(primals, short_arrays=False)}\n"
            f"cotangents={tree_pformat(cotangents, short_arrays=False)}",
            flush=True,
        )

    return print_values


@_backward_nan.def_bwd
def _backward_nan_bwd(
    residuals: None,
    grad_x: Any,
    perturbed: Any,
    x: Any,
    name: str | None,
    terminate: bool,
) -> Any:
    del residuals, perturbed
    primals, primal_static = partition(x, is_array)
    cotangents, cotangent_static = partition(grad_x, is_array)
    jax.debug.callback(
        _printer(name, (primal_static, cotangent_static)), primals, cotangents
    )
    leaves = jax.tree.leaves(cotangents)
    if terminate and leaves:
        has_nan = jnp.any(jnp.stack([jnp.isnan(leaf).any() for leaf in leaves]))
        grad_x = error_if(grad_x, has_nan, "Encountered NaN")
    return grad_x
