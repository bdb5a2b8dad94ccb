"""What a failed check puts in place of the checked values (modes "nan" and
"breakpoint"): NaN, the largest integer, or `True`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _fill_value(dtype: Any) -> Any:
    """NaN, or what stands for it in a non-float dtype; `None` if there is none."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return np.nan
    if jnp.issubdtype(dtype, jnp.integer):
        return np.iinfo(dtype).max
    if jnp.issubdtype(dtype, jnp.bool_):
        return True
    return None


def _fill_where(flag: Any, leaf: jax.Array) -> jax.Array:
    """`leaf`, with the fill value of its dtype where `flag` is `True`."""
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        data = _fill_where(flag, jax.random.key_data(leaf))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    fill = _fill_value(leaf.dtype)
    if fill is None:
        return leaf
    return jnp.where(flag, jnp.asarray(fill, leaf.dtype), leaf)
