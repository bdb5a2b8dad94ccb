"""Reading the floating dtype a user names, with an error naming the argument."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = ["floating_dtype", "is_floating_array"]

# The short names of jmp's policies, which JAX users already write.
_ALIASES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "half": "float16",
    "f32": "float32",
    "full": "float32",
    "f64": "float64",
}


def floating_dtype(value: Any, argument: str) -> np.dtype:
    """`value` (a dtype, a dtype's name or a short name such as `"bf16"`) as a
    NumPy dtype; a `TypeError` naming `argument` unless it is a real floating
    dtype (not an integer, boolean, complex or key dtype, nor `None`)."""
    name = _ALIASES.get(value, value) if isinstance(value, str) else value
    dtype = None
    if name is not None:
        try:
            dtype = jnp.dtype(name)
        except TypeError:
            dtype = None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"{argument} must be a floating dtype (such as jnp.float32, "
            f"jnp.bfloat16, jnp.float16, or 'f32', 'bf16', 'f16'); got {value!r}"
            + (f", whose dtype is {dtype}." if dtype is not None else ".")
        )
    return dtype


def is_floating_array(x: Any) -> bool:
    """Whether `x` is a JAX or NumPy array (or NumPy scalar) of a real floating
    dtype: what a cast changes. Key, integer, boolean and complex arrays are
    not."""
    dtype = getattr(x, "dtype", None)
    return (
        isinstance(x, (jnp.ndarray, np.ndarray, np.generic))
        and dtype is not None
        and jnp.issubdtype(dtype, jnp.floating)
    )
