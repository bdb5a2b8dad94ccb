"""`RotaryPositionalEmbedding`: rotates pairs of channels by position-dependent
angles (RoFormer, arXiv:2104.09864)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._module import Module, field
from ._shared_helpers import default_floating_dtype

__all__ = ["RotaryPositionalEmbedding"]


# (embedding_size, theta, dtype, default float) -> (cos, sin), each of shape
# (longest sequence seen, embedding_size). Rows depend only on their position, so
# a longer table serves every shorter sequence. NumPy, so that under `jax.jit`
# they become constants of the compiled program.
_ROTATION_TABLES: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}


class RotaryPositionalEmbedding(Module):
    """Rotary positional embedding: encodes each position of a sequence by
    rotating pairs of channels through an angle proportional to the position.

    With `d = embedding_size // 2` and frequencies `f_j = theta ** (-2j / embedding_size)`
    for `j < d`, position `t` pairs channel `j` with channel `j + d` and rotates
    the pair by the angle `t * f_j`:

    - `out[t, j]     = x[t, j] * cos(t f_j) - x[t, j + d] * sin(t f_j)`,
    - `out[t, j + d] = x[t, j + d] * cos(t f_j) + x[t, j] * sin(t f_j)`.

    The cosines and sines are computed once per `(embedding_size, theta, dtype)`
    and reused (they are constants under `jax.jit`). For attention heads of
    shape `(seq_length, num_heads, size)`, map the layer over the heads:
    `jax.vmap(rope, in_axes=1, out_axes=1)`, for example inside the
    `process_heads` of [`MultiheadAttention`][filterax.nn.MultiheadAttention].

    **Arguments:**

    - `embedding_size`: the number of channels; non-negative and even.
    - `theta`: the base of the frequencies (larger: slower rotation).
    - `dtype`: the dtype the cosines and sines are stored in; defaults to
      float32 (float64 when JAX's x64 mode is on). Under
      `jax_numpy_dtype_promotion="strict"` the input must have this dtype.

    **Returns:** calling the layer on `x` of shape `(seq_length, embedding_size)`
    returns the rotated array, of the same shape and dtype.

    **Raises:** `ValueError` if `embedding_size` is negative or odd.

    ```python
    >>> import jax.numpy as jnp, numpy as np
    >>> import filterax as fx
    >>> rope = fx.nn.RotaryPositionalEmbedding(2)
    >>> np.asarray(rope(jnp.ones((3, 2)))).round(3)
    array([[ 1.   ,  1.   ],
           [-0.301,  1.382],
           [-1.325,  0.493]], dtype=float32)

    ```
    """

    embedding_size: int = field(static=True)
    theta: float = field(static=True)
    dtype: Any = field(static=True)

    def __init__(self, embedding_size: int, theta: float = 10_000.0, dtype: Any = None):
        self.embedding_size = embedding_size
        self.theta = theta
        self.dtype = default_floating_dtype() if dtype is None else dtype

    def __check_init__(self) -> None:
        if self.embedding_size < 0:
            raise ValueError(
                "RotaryPositionalEmbedding needs a non-negative embedding_size; "
                f"got {self.embedding_size}."
            )
        if self.embedding_size % 2 != 0:
            raise ValueError(
                "RotaryPositionalEmbedding rotates channels in pairs, so "
                f"embedding_size must be even; got {self.embedding_size}."
            )

    @staticmethod
    def rotate_half(x: Float[Array, "... embedding_size"]) -> Array:
        """Maps the halves `(a, b)` of the last axis to `(-b, a)`.

        **Arguments:**

        - `x`: an array whose last axis has even length.

        **Returns:** an array of `x`'s shape and dtype.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> fx.nn.RotaryPositionalEmbedding.rotate_half(jnp.array([1.0, 2.0, 3.0, 4.0]))
        Array([-3., -4.,  1.,  2.], dtype=float32)

        ```
        """
        half = x.shape[-1] // 2
        return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)

    @staticmethod
    def precompute_freqs_cis(
        embedding_size: int, end: int, theta: float, dtype: Any
    ) -> tuple[Float[Array, "end half_size"], Float[Array, "end half_size"]]:
        """The cosines and sines of the rotation angles, for positions `0..end-1`.

        Computed in the default float dtype and cast to `dtype` at the end.

        **Arguments:**

        - `embedding_size`: the number of channels (even).
        - `end`: the number of positions.
        - `theta`: the base of the frequencies.
        - `dtype`: the dtype of the result.

        **Returns:** `(cos, sin)`, each of shape `(end, embedding_size // 2)`, with
        `cos[t, j] = cos(t * theta ** (-2j / embedding_size))` (and likewise `sin`).

        ```python
        >>> import jax.numpy as jnp, numpy as np
        >>> import filterax as fx
        >>> cos, sin = fx.nn.RotaryPositionalEmbedding.precompute_freqs_cis(
        ...     4, 2, 100.0, jnp.float32)
        >>> np.asarray(cos).round(4)
        array([[1.    , 1.    ],
               [0.5403, 0.995 ]], dtype=float32)

        ```
        """
        exponents = jnp.arange(0.0, embedding_size, 2)[jnp.newaxis, :] / embedding_size
        frequencies = 1.0 / (theta**exponents)
        angles = jnp.outer(jnp.arange(float(end)), frequencies)
        return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)

    def _cos_sin(self, seq_length: int) -> tuple[np.ndarray, np.ndarray]:
        """Cosines and sines tiled to the full embedding, shape
        `(seq_length, embedding_size)`, as NumPy constants."""
        cache_key = (
            self.embedding_size,
            self.theta,
            jnp.dtype(self.dtype),
            default_floating_dtype(),
        )
        tables = _ROTATION_TABLES.get(cache_key)
        if tables is None or tables[0].shape[0] < seq_length:
            with jax.ensure_compile_time_eval():
                cos, sin = self.precompute_freqs_cis(
                    self.embedding_size, seq_length, self.theta, self.dtype
                )
                tables = (
                    np.tile(np.asarray(cos), (1, 2)),
                    np.tile(np.asarray(sin), (1, 2)),
                )
            _ROTATION_TABLES[cache_key] = tables
        cos, sin = tables
        return cos[:seq_length], sin[:seq_length]

    def __call__(
        self,
        x: Float[Array, "seq_length embedding_size"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq_length embedding_size"]:
        """Rotates `x`.

        **Arguments:**

        - `x`: an array of shape `(seq_length, embedding_size)`.
        - `key`: ignored (keyword only).

        **Returns:** the rotated array, of `x`'s shape and dtype.

        **Raises:** `ValueError` on a wrong shape; `jax.dtypes.TypePromotionError`
        under strict dtype promotion if `x.dtype` is not the layer's `dtype`.
        """
        if x.ndim != 2 or x.shape[1] != self.embedding_size:
            raise ValueError(
                f"RotaryPositionalEmbedding(embedding_size={self.embedding_size}) "
                f"expects an input of shape (seq_length, {self.embedding_size}); "
                f"got shape {x.shape}. For attention heads, map over the heads "
                "axis with `jax.vmap(rope, in_axes=1, out_axes=1)`."
            )
        cos, sin = self._cos_sin(x.shape[0])
        dtype = jnp.dtype(self.dtype)
        try:
            rotated = x * cos + self.rotate_half(x) * sin
        except jax.dtypes.TypePromotionError as error:
            raise jax.dtypes.TypePromotionError(
                f"RotaryPositionalEmbedding(dtype={dtype}) received an "
                f"input of dtype {x.dtype}, and strict dtype promotion forbids "
                f"mixing them: cast the input to {dtype}, or build the "
                f"layer with dtype={x.dtype}."
            ) from error
        return rotated.astype(x.dtype)
