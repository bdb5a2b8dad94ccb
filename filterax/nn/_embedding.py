"""`Embedding`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact, Int, PRNGKeyArray

from .._module import Module, field
from .._sharding import axes_overrides_field, declared_axes, layer_axes, row_of
from .._tree._filters import is_array_like
from ._shared_helpers import (
    check_key,
    default_floating_dtype,
    non_negative_int,
)

__all__ = ["Embedding"]


class Embedding(Module):
    """A lookup table: maps an integer index to a row of `weight`.

    The table is drawn from a standard normal distribution, the same values as
    `equinox.nn.Embedding` draws from the same key, unless `weight` is given.

    **Arguments:**

    - `num_embeddings`: the number of rows (indices `0 .. num_embeddings - 1`).
    - `embedding_size`: the length of each row.
    - `weight`: a ready table of shape `(num_embeddings, embedding_size)`; the
      sizes may then be left out, and no key is needed.
    - `dtype`: the dtype of a drawn table. Defaults to `float32`, or `float64`
      when `jax_enable_x64` is on.
    - `key`: a PRNG key for drawing the table (keyword only).
    - `axes`: logical axes replacing the default `weight: ("vocab", "embed")`
      for this layer (keyword only); see [`sharding_of`][filterax.sharding_of].

    **Returns:** the layer.

    **Raises:** `ValueError` when neither `weight` nor the sizes and key are
    given, when `weight` is not two-dimensional or does not match the sizes, or
    when `axes` names another field or gives the wrong number of names.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> embedding = fx.nn.Embedding(10, 3, key=jax.random.key(0))
    >>> embedding
    Embedding(num_embeddings=10, embedding_size=3, weight=f32[10,3])
    >>> bool((embedding(jnp.array(4)) == embedding.weight[4]).all())
    True
    >>> fx.nn.Embedding(weight=jnp.eye(2))(1).tolist()
    [0.0, 1.0]

    ```
    """

    num_embeddings: int = field(static=True)
    embedding_size: int = field(static=True)
    weight: Inexact[Array, "num_embeddings embedding_size"] = field(
        axes=("vocab", "embed")
    )
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        num_embeddings: int | None = None,
        embedding_size: int | None = None,
        weight: Inexact[Array, "num_embeddings embedding_size"] | None = None,
        dtype: Any = None,
        *,
        key: PRNGKeyArray | None = None,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        self.axes = layer_axes("Embedding", axes, declared_axes(type(self)))
        if weight is None:
            if num_embeddings is None or embedding_size is None or key is None:
                raise ValueError(
                    "Embedding needs either `weight=` (a table of shape "
                    "(num_embeddings, embedding_size)) or all of `num_embeddings=`, "
                    "`embedding_size=` and `key=` to draw one."
                )
            rows = non_negative_int(num_embeddings, "Embedding", "num_embeddings")
            columns = non_negative_int(embedding_size, "Embedding", "embedding_size")
            check_key(key, "Embedding")
            dtype = default_floating_dtype() if dtype is None else dtype
            weight = jax.random.normal(key, (rows, columns), dtype)
        else:
            shape = getattr(weight, "shape", None)
            if shape is None or len(shape) != 2:
                raise ValueError(
                    "Embedding: `weight` must be an array of shape (num_embeddings, "
                    f"embedding_size), got {shape if shape is not None else weight!r}."
                )
            rows, columns = shape
            wrong_rows = num_embeddings is not None and num_embeddings != rows
            wrong_columns = embedding_size is not None and embedding_size != columns
            if wrong_rows or wrong_columns:
                raise ValueError(
                    f"Embedding: `weight` has shape {tuple(shape)}, but num_embeddings="
                    f"{num_embeddings} and embedding_size={embedding_size} were given."
                )
        self.num_embeddings = rows
        self.embedding_size = columns
        self.weight = weight

    def __call__(
        self, x: Int[ArrayLike, ""], *, key: PRNGKeyArray | None = None
    ) -> Array:
        """The row of the table at index `x`.

        **Arguments:**

        - `x`: a scalar integer index (a Python int or an integer array of
          shape `()`). Negative indices count from the end; use
          [`filter_vmap`][filterax.filter_vmap] or `jax.vmap` for many.
        - `key`: ignored.

        **Returns:** an array of shape `(embedding_size,)`. On `Explicit` mesh
        axes, mapped over indices split over the mesh or with the table's rows
        split, the whole batch is looked up at once (see "Scaling out"); that
        lookup is differentiable in reverse mode only.

        **Raises:** `ValueError` when `x` is not a scalar; `TypeError` when it
        is not an integer.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> embedding = fx.nn.Embedding(5, 2, key=jax.random.key(0))
        >>> jax.vmap(embedding)(jnp.array([0, 3, 3])).shape
        (3, 2)

        ```
        """
        del key
        if not is_array_like(x) or jnp.shape(x) != ():
            raise ValueError(
                "Embedding must be called with one scalar index, got "
                f"{getattr(x, 'shape', x)!r}; map it with `filterax.filter_vmap` or "
                "`jax.vmap` to look up many."
            )
        if not jnp.issubdtype(jnp.result_type(x), jnp.integer):
            raise TypeError(
                "Embedding: the index must be an integer, got dtype "
                f"{jnp.result_type(x)}."
            )
        return row_of(self.weight, x)
