"""`SpectralNorm`."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Inexact, PRNGKeyArray

from .._ad import unfrozen
from .._module import field
from ._sequential import StatefulLayer
from ._shared_helpers import MissingWeightError, check_key, with_weight
from ._stateful import State, StateIndex

__all__ = ["SpectralNorm"]

_Layer = TypeVar("_Layer")
_Vectors = tuple[Inexact[Array, " u_size"], Inexact[Array, " v_size"]]

# Power iterations run at construction, so that the first call already starts
# from a good estimate of the leading singular vectors.
_INITIAL_ITERATIONS = 15


def _power_iteration(
    matrix: Array, u: Array, v: Array, eps: float
) -> tuple[Array, Array]:
    """One step of the power method for the leading singular vectors of
    `matrix`: `u <- normalised(matrix @ v)`, then `v <- normalised(matrix.T @ u)`."""
    u = matrix @ v
    u = u / jnp.maximum(eps, jnp.sqrt(jnp.sum(u**2)))
    v = matrix.T @ u
    v = v / jnp.maximum(eps, jnp.sqrt(jnp.sum(v**2)))
    return u, v


def _as_matrix(weight: Array) -> Array:
    return jnp.reshape(weight, (weight.shape[0], -1))


class SpectralNorm(StatefulLayer, Generic[_Layer]):
    """Wraps a layer so that it uses its weight divided by the weight's spectral
    norm (its largest singular value), as in Miyato et al., "Spectral
    Normalization for Generative Adversarial Networks" (2018).

    The spectral norm is estimated by power iteration, as `u @ W @ v` for
    estimates `u`, `v` of the leading singular vectors of `W` (the weight
    reshaped to `(weight.shape[0], -1)`); the estimates are kept in a
    [`State`][filterax.nn.State] and refined by `num_power_iterations` steps
    on every training call. The iteration sees the weight through
    `lax.stop_gradient`; the gradient does flow through `u @ W @ v`.

    **Arguments:**

    - `layer`: the layer to wrap, e.g. a [`Linear`][filterax.nn.Linear] or a
      convolution.
    - `weight_name`: the name of the layer's weight field, at least
      two-dimensional.
    - `num_power_iterations`: power iterations per training call.
    - `eps`: a lower bound on the norms the vectors are divided by.
    - `inference`: whether to keep the estimates as they are (see
      [`inference_mode`][filterax.nn.inference_mode]).
    - `key`: a PRNG key for the initial vectors (keyword only).

    **Returns:** the layer. Build it with
    [`make_with_state`][filterax.nn.make_with_state] to get its state.

    **Raises:** `ValueError` when the layer has no such weight or it has fewer
    than two dimensions.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> k1, k2 = jax.random.split(jax.random.key(0))
    >>> linear = fx.nn.Linear(4, 3, key=k1)
    >>> layer, state = fx.nn.make_with_state(fx.nn.SpectralNorm)(linear, "weight", key=k2)
    >>> y, state = layer(jnp.ones(4), state)
    >>> u, v = state.get(layer.uv_index)
    >>> sigma = jnp.linalg.svd(linear.weight, compute_uv=False)[0]
    >>> bool(jnp.allclose(u @ linear.weight @ v, sigma, rtol=1e-4))
    True

    ```
    """

    layer: _Layer
    weight_name: str = field(static=True)
    # The power-iteration vectors are small: never split (named `None`).
    uv_index: StateIndex[_Vectors] = field(axes=(None,))
    num_power_iterations: int = field(static=True)
    eps: float = field(static=True)
    inference: bool

    def __init__(
        self,
        layer: _Layer,
        weight_name: str,
        num_power_iterations: int = 1,
        eps: float = 1e-12,
        inference: bool = False,
        *,
        key: PRNGKeyArray,
    ):
        weight = unfrozen(getattr(layer, weight_name, None))
        if weight is None or not hasattr(weight, "ndim"):
            raise MissingWeightError(
                f"SpectralNorm: the layer {type(layer).__name__} has no array "
                f"attribute {weight_name!r} to normalise."
            )
        if weight.ndim < 2:
            raise ValueError(
                f"SpectralNorm: `{weight_name}` must have at least two dimensions, "
                f"got shape {weight.shape}."
            )
        if num_power_iterations < 0:
            raise ValueError(
                "SpectralNorm: `num_power_iterations` must be non-negative, got "
                f"{num_power_iterations}."
            )
        check_key(key, "SpectralNorm")
        matrix = _as_matrix(weight)
        u_key, v_key = jax.random.split(key)
        u = jax.random.normal(u_key, (matrix.shape[0],), matrix.dtype)
        v = jax.random.normal(v_key, (matrix.shape[1],), matrix.dtype)
        for _ in range(_INITIAL_ITERATIONS):
            u, v = _power_iteration(matrix, u, v, eps)
        self.layer = layer
        self.weight_name = weight_name
        self.uv_index = StateIndex((u, v))
        self.num_power_iterations = num_power_iterations
        self.eps = eps
        self.inference = inference

    def __call__(
        self,
        x: Any,
        state: State,
        *,
        key: PRNGKeyArray | None = None,
        inference: bool | None = None,
    ) -> tuple[Any, State]:
        """Calls the wrapped layer with its weight divided by the estimated
        spectral norm; in training, refines the estimate first.

        **Arguments:**

        - `x`: the wrapped layer's input.
        - `state`: the layer's [`State`][filterax.nn.State].
        - `key`: ignored.
        - `inference`: overrides the layer's `inference` flag for this call.

        **Returns:** `(y, state)`: the wrapped layer's output and the new state.

        ```python
        >>> import jax, jax.numpy as jnp
        >>> import filterax as fx
        >>> k1, k2 = jax.random.split(jax.random.key(1))
        >>> layer, state = fx.nn.make_with_state(fx.nn.SpectralNorm)(
        ...     fx.nn.Linear(3, 3, key=k1), "weight", key=k2)
        >>> y, state = layer(jnp.ones(3), state, inference=True)
        >>> y.shape
        (3,)

        ```
        """
        del key
        if inference is None:
            inference = self.inference
        u, v = state.get(self.uv_index)
        weight = unfrozen(getattr(self.layer, self.weight_name))
        matrix = _as_matrix(weight)
        if not inference:
            fixed = jax.lax.stop_gradient(matrix)
            for _ in range(self.num_power_iterations):
                u, v = _power_iteration(fixed, u, v, self.eps)
            state = state.set(self.uv_index, (u, v))
        sigma = jnp.einsum("i,ij,j->", u, matrix, v)
        normalised = jnp.reshape(matrix / sigma, weight.shape)
        return with_weight(self.layer, self.weight_name, normalised)(x), state
