"""`PReLU`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike

from .._module import Module
from .._sharding import axes_overrides_field, layer_axes

__all__ = ["PReLU"]


class PReLU(Module):
    """A parametric ReLU: `x` where `x >= 0`, `negative_slope * x` elsewhere, with
    a learnt `negative_slope`.

    **Arguments:**

    - `init_alpha`: the initial slope: a number (one slope shared by every
      element; a Python float is stored weakly typed, so the output keeps the
      dtype of the input), or an array broadcasting against the input, e.g.
      one slope per channel of shape `(channels,)`.
    - `axes`: logical axes replacing the default of `negative_slope` (keyword
      only): `"channel"` for its last dimension, `None` for the others; see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** the layer.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.nn.PReLU(0.1)(jnp.array([-2.0, 3.0])).tolist()
    [-0.2..., 3.0]
    >>> fx.nn.PReLU(jnp.array([0.0, 1.0]))(jnp.array([[-1.0, -1.0]])).tolist()
    [[-0.0, -1.0]]

    ```
    """

    negative_slope: Array
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        init_alpha: ArrayLike = 0.25,
        *,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        try:
            slope = jnp.asarray(init_alpha)
        except TypeError:
            raise TypeError(
                f"PReLU: `init_alpha` must be a number or an array, got {init_alpha!r}."
            ) from None
        self.negative_slope = slope
        names = (*((None,) * (slope.ndim - 1)), "channel") if slope.ndim else ()
        # The rank is `init_alpha`'s, so the names live on the instance.
        self.axes = layer_axes(
            "PReLU", axes, {"negative_slope": names}, keep_defaults=True
        )

    def __call__(self, x: ArrayLike) -> Array:
        """Applies the activation elementwise.

        **Arguments:**

        - `x`: an array broadcasting against `negative_slope`.

        **Returns:** an array of the broadcast shape, in the dtype that `x` and
        `negative_slope` promote to under JAX's standard promotion (so an
        integer input gives a floating output).

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> fx.nn.PReLU()(jnp.array([-4, 4])).tolist()
        [-1.0, 4.0]

        ```
        """
        slope = self.negative_slope
        # Computed explicitly so that the layer works under the strict dtype and
        # rank promotion settings too, with the result the standard ones give.
        with jax.numpy_dtype_promotion("standard"):
            dtype = jnp.result_type(x, slope)
        shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(slope))
        x = jnp.broadcast_to(jnp.asarray(x, dtype), shape)
        slope = jnp.broadcast_to(jnp.asarray(slope, dtype), shape)
        return jnp.where(x >= 0, x, slope * x)
