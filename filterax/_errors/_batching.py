"""The batching rule of a check: under `vmap`, the branch that reports a
failure is taken when any batch element fails, so it stays a branch."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap


@custom_vmap
def any_over_batch(flag: jax.Array) -> jax.Array:
    """`flag` itself; under `vmap`, an unbatched "any element is `True`", so
    that the `lax.cond` on it stays a branch instead of becoming a select."""
    return flag


@any_over_batch.def_vmap
def any_over_batch_rule(
    axis_size: int, in_batched: Sequence[bool], flag: jax.Array
) -> tuple[jax.Array, bool]:
    del axis_size
    return (jnp.any(flag, axis=0) if in_batched[0] else flag), False
