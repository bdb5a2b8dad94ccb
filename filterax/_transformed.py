"""What a JAX transform applied directly to a callable wraps.

`jax.jit`, `jax.grad`, `jax.vmap`, `jax.custom_vjp`... applied to a Module
treat the Module as a constant of the transformed function: its arrays are
neither traced nor seen by `filter_grad` or an optimiser. Module construction
and `filter_jit` warn about it, and find the Module with `wrapped_by_transform`.
"""

from __future__ import annotations

import types
from typing import Any

import jax

__all__ = ["TRANSFORM_TYPES", "wrapped_by_transform"]

_PJIT_FUNCTION_TYPE = type(jax.jit(lambda: None))
# Types of values that may be JAX transforms wrapping a Module (jax.grad and
# friends return plain functions carrying `__wrapped__`).
TRANSFORM_TYPES = frozenset(
    {types.FunctionType, _PJIT_FUNCTION_TYPE, jax.custom_jvp, jax.custom_vjp}
)


def wrapped_by_transform(value: Any) -> Any:
    """What a chain of JAX transforms (`jax.hessian` is `jacfwd(jacrev(f))`)
    ultimately wraps when that is not a plain function (a Module, say), or
    `None`.

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> from filterax._transformed import wrapped_by_transform
    >>> layer = fx.nn.Identity()
    >>> wrapped_by_transform(jax.jit(jax.vmap(layer))) is layer
    True
    >>> wrapped_by_transform(jax.vmap(lambda x: x)) is None
    True

    ```
    """
    for _ in range(16):
        if isinstance(value, (jax.custom_jvp, jax.custom_vjp)):
            inner = value.fun
        elif type(value) is types.FunctionType:
            inner = value.__dict__.get("__wrapped__")
        elif type(value) is _PJIT_FUNCTION_TYPE:
            inner = getattr(value, "__wrapped__", None)
        else:
            return value
        if inner is None:
            return None
        value = inner
    return None
