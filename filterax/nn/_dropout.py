"""`Dropout`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from .._module import Module
from .._rng import RngStream
from ._shared_helpers import deprecated_deterministic, dropout_active

__all__ = ["Dropout"]


class Dropout(Module):
    """Sets each element to zero with probability `p` and scales the others by
    `1 / (1 - p)`, so that the expected value is unchanged.

    In inference (`inference=True`, or `p == 0`) it returns its input as it is.
    `p` and `inference` are ordinary fields (not static), so
    [`tree_at`][filterax.tree_at] and
    [`inference_mode`][filterax.nn.inference_mode] can change them.

    **Arguments:**

    - `p`: the probability of dropping each element.
    - `inference`: whether to return the input unchanged.
    - `deterministic`: deprecated spelling of `inference` (keyword only); it
      warns.

    **Returns:** the layer.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> dropout = fx.nn.Dropout(0.5)
    >>> y = dropout(jnp.ones(8), key=jax.random.key(0))
    >>> sorted(set(y.tolist())) in ([0.0, 2.0], [0.0], [2.0])
    True
    >>> dropout(jnp.ones(2), inference=True).tolist()
    [1.0, 1.0]
    >>> stream = fx.RngStream(0)
    >>> dropout(jnp.ones(3), key=stream).shape
    (3,)

    ```
    """

    p: float
    inference: bool

    def __init__(
        self,
        p: float = 0.5,
        inference: bool = False,
        *,
        deterministic: bool | None = None,
    ):
        if deterministic is not None:
            deprecated_deterministic("Dropout")
            inference = deterministic
        if isinstance(p, (int, float)) and not 0 <= p <= 1:
            raise ValueError(f"Dropout: `p` must be in [0, 1], got {p}.")
        self.p = p
        self.inference = inference

    @property
    def deterministic(self) -> bool:
        """Deprecated alias of `inference`."""
        return self.inference

    def __call__(
        self,
        x: Array,
        *,
        key: PRNGKeyArray | RngStream | None = None,
        inference: bool | None = None,
        deterministic: bool | None = None,
    ) -> Array:
        """Applies dropout to `x`.

        **Arguments:**

        - `x`: an array of any shape.
        - `key`: a PRNG key, or an [`RngStream`][filterax.RngStream] to draw
          one from (only drawn when dropout is applied). Needed unless in
          inference.
        - `inference`: overrides the layer's `inference` flag for this call.
        - `deterministic`: deprecated spelling of `inference`; it warns.

        **Returns:** an array like `x`.

        **Raises:** `RuntimeError` when dropout applies and no key was given.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> fx.nn.Dropout(0.0)(jnp.ones(2)).tolist()
        [1.0, 1.0]
        >>> fx.nn.Dropout(0.5)(jnp.ones(2))
        Traceback (most recent call last):
        ...
        RuntimeError: Dropout needs a key (a PRNG key or a filterax.RngStream) when not in inference mode: call it with `key=...`, or pass `inference=True`.

        ```
        """
        if deterministic is not None:
            deprecated_deterministic("Dropout()")
            inference = deterministic
        if not dropout_active(self, inference):
            return x
        if key is None:
            raise RuntimeError(
                "Dropout needs a key (a PRNG key or a filterax.RngStream) when not in "
                "inference mode: call it with `key=...`, or pass `inference=True`."
            )
        if isinstance(key, RngStream):
            key = key()
        # A Python `p` gives a weakly typed `keep`, so `x / keep` has the dtype
        # of `x` (float16, bfloat16, ...) under every dtype promotion setting.
        keep = 1 - jax.lax.stop_gradient(self.p)
        mask = jax.random.bernoulli(key, keep, jnp.shape(x))
        scaled = x / keep
        return jnp.where(mask, scaled, jnp.zeros_like(scaled))
