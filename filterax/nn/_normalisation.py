"""Normalisation layers without running statistics: `LayerNorm`, `RMSNorm`,
`GroupNorm`.

Each one computes its statistics in at least float32 (half-precision inputs are
upcast, float64 stays float64) and returns the input's dtype.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, TypeVar, cast, overload

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._module import Module, field
from .._sharding import axes_overrides_field, declared_axes, layer_axes
from .._warnings import warn_deprecated
from ._shared_helpers import NO_STATE, statistics_dtype

__all__ = ["GroupNorm", "LayerNorm", "RMSNorm"]

_State = TypeVar("_State")


def _shape_tuple(shape: int | Sequence[int]) -> tuple[int, ...]:
    """The shape as a tuple of Python ints (from NumPy ints or an array too),
    so that the static field holds no NumPy values."""
    if isinstance(shape, Sequence) or np.ndim(shape) != 0:
        return tuple(map(operator.index, cast(Sequence[int], shape)))
    return (operator.index(cast(int, shape)),)


def _affine_params(
    shape: tuple[int, ...], use_weight: bool, use_bias: bool, dtype: Any
) -> tuple[Array | None, Array | None]:
    """The initial `(weight, bias)`: ones and zeros of `shape`, or `None`."""
    weight = jnp.ones(shape, dtype) if use_weight else None
    bias = jnp.zeros(shape, dtype) if use_bias else None
    return weight, bias


def _check_whole_shape(
    layer: str, variable: str, shape: tuple[int, ...], x: Array
) -> None:
    """Refuses an `x` that is not exactly of `shape` (a batch, say); `variable`
    names the layer in the suggested `jax.vmap` fix."""
    if x.shape != shape:
        raise ValueError(
            f"{layer}(shape={shape}) expects an input of shape "
            f"{shape}; got shape {x.shape}. To normalise over the "
            "trailing axes of a batch, map the layer over the leading axes: "
            f"`jax.vmap({variable})(x)`."
        )


def _affine_output(
    out: Array, weight: Array | None, bias: Array | None, x_dtype: Any, state: Any
) -> Any:
    """Scales `out` by `weight` and shifts it by `bias` (each optional) in
    `out`'s dtype, the statistics dtype; then returns it in the input's dtype,
    paired with `state` when one was passed."""
    if weight is not None:
        out = weight.astype(out.dtype) * out
    if bias is not None:
        out = out + bias.astype(out.dtype)
    out = out.astype(x_dtype)
    return out if state is NO_STATE else (out, state)


def _feature_axes(
    layer: str, axes: dict[str, tuple[str | None, ...]] | None, rank: int
) -> tuple[tuple[str, tuple[str | None, ...]], ...] | None:
    # The rank is the input's, so the names live on the instance: the last
    # dimension (the features, in a transformer the embedding) is "embed".
    names = (*((None,) * (rank - 1)), "embed") if rank else ()
    return layer_axes(layer, axes, {"weight": names, "bias": names}, keep_defaults=True)


class LayerNorm(Module):
    """Normalises a whole array by its mean and variance, then optionally scales
    and shifts it elementwise.

    Computes `(x - mean(x)) / sqrt(var(x) + eps) * weight + bias`, where the mean
    and variance are taken over every element of `x`, and `weight` (ones at
    initialisation) and `bias` (zeros) have the shape of `x`. To normalise over
    the trailing axes only, `jax.vmap` the layer over the leading ones.

    **Arguments:**

    - `shape`: the shape of the input, an `int` or a sequence of `int`s.
    - `eps`: added to the variance before the square root.
    - `use_weight`: whether to hold a learnable `weight` (else `weight` is `None`).
    - `use_bias`: whether to hold a learnable `bias` (else `bias` is `None`).
    - `dtype`: the dtype of `weight` and `bias`; defaults to float32 (float64
      when JAX's x64 mode is on).
    - `elementwise_affine`: deprecated (keyword only); sets both `use_weight`
      and `use_bias`, and warns with a `FilteraxDeprecationWarning`.
    - `axes`: logical axes replacing the defaults for this layer, by field
      name (keyword only). `weight` and `bias` default to `"embed"` for the last
      dimension and `None` for the others; see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** calling the layer on `x` of shape `shape` returns an array of the
    same shape and dtype (and `(output, state)` when a `state` is passed too).

    ```python
    >>> import jax.numpy as jnp, numpy as np
    >>> import filterax as fx
    >>> norm = fx.nn.LayerNorm(4)
    >>> norm.weight.shape, norm.bias.shape
    ((4,), (4,))
    >>> np.asarray(norm(jnp.array([1.0, 2.0, 3.0, 4.0]))).round(3)
    array([-1.342, -0.447,  0.447,  1.342], dtype=float32)

    ```
    """

    shape: tuple[int, ...] = field(static=True)
    eps: float = field(static=True)
    use_weight: bool = field(static=True)
    use_bias: bool = field(static=True)
    weight: Float[Array, "*shape"] | None
    bias: Float[Array, "*shape"] | None
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        shape: int | Sequence[int],
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        elementwise_affine: bool | None = None,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        if elementwise_affine is not None:
            warn_deprecated(
                "LayerNorm(elementwise_affine=...) is deprecated: pass "
                "use_weight=... and use_bias=... instead.",
                stacklevel=2,
            )
            use_weight = use_bias = elementwise_affine
        self.shape = _shape_tuple(shape)
        self.eps = eps
        self.use_weight = use_weight
        self.use_bias = use_bias
        self.weight, self.bias = _affine_params(self.shape, use_weight, use_bias, dtype)
        self.axes = _feature_axes(type(self).__name__, axes, len(self.shape))

    @overload
    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array: ...

    @overload
    def __call__(
        self, x: Array, state: _State, *, key: PRNGKeyArray | None = None
    ) -> tuple[Array, _State]: ...

    def __call__(
        self,
        x: Float[Array, "*shape"],
        state: Any = NO_STATE,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Any:
        """Normalises `x`.

        **Arguments:**

        - `x`: an array of shape `shape`.
        - `state`: optional, returned unchanged (so that the layer can stand
          where a [`BatchNorm`][filterax.nn.BatchNorm] does).
        - `key`: ignored (keyword only).

        **Returns:** the normalised array, of `x`'s shape and dtype; or
        `(output, state)` when `state` is passed.
        """
        _check_whole_shape("LayerNorm", "layer_norm", self.shape, x)
        y = x.astype(statistics_dtype(x.dtype))
        mean = jnp.mean(y, keepdims=True)
        variance = jnp.maximum(0.0, jnp.var(y, keepdims=True))
        out = (y - mean) * jax.lax.rsqrt(variance + self.eps)
        return _affine_output(out, self.weight, self.bias, x.dtype, state)


class RMSNorm(Module):
    """Rescales an array by its root mean square (no centring), then optionally
    scales and shifts it elementwise.

    Computes `x / sqrt(mean(x**2) + eps) * weight + bias`, where the mean is
    taken over every element of `x`, and `weight` (ones at initialisation) and
    `bias` (zeros) have the shape of `x`.

    **Arguments:**

    - `shape`: the shape of the input, an `int` or a sequence of `int`s.
    - `eps`: added to the mean square before the square root.
    - `use_weight`: whether to hold a learnable `weight` (else `weight` is `None`).
    - `use_bias`: whether to hold a learnable `bias` (else `bias` is `None`).
    - `dtype`: the dtype of `weight` and `bias`; defaults to float32 (float64
      when JAX's x64 mode is on).
    - `axes`: logical axes replacing the defaults for this layer, by field
      name (keyword only). `weight` and `bias` default to `"embed"` for the last
      dimension and `None` for the others; see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** calling the layer on `x` of shape `shape` returns an array of the
    same shape and dtype (and `(output, state)` when a `state` is passed too).

    ```python
    >>> import jax.numpy as jnp, numpy as np
    >>> import filterax as fx
    >>> norm = fx.nn.RMSNorm(2, use_bias=False)
    >>> np.asarray(norm(jnp.array([3.0, 4.0]))).round(3)
    array([0.849, 1.131], dtype=float32)

    ```
    """

    shape: tuple[int, ...] = field(static=True)
    eps: float = field(static=True)
    use_weight: bool = field(static=True)
    use_bias: bool = field(static=True)
    weight: Float[Array, "*shape"] | None
    bias: Float[Array, "*shape"] | None
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        shape: int | Sequence[int],
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: Any = None,
        *,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        self.shape = _shape_tuple(shape)
        self.eps = eps
        self.use_weight = use_weight
        self.use_bias = use_bias
        self.weight, self.bias = _affine_params(self.shape, use_weight, use_bias, dtype)
        self.axes = _feature_axes(type(self).__name__, axes, len(self.shape))

    @overload
    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array: ...

    @overload
    def __call__(
        self, x: Array, state: _State, *, key: PRNGKeyArray | None = None
    ) -> tuple[Array, _State]: ...

    def __call__(
        self,
        x: Float[Array, "*shape"],
        state: Any = NO_STATE,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Any:
        """Rescales `x`.

        **Arguments:**

        - `x`: an array of shape `shape`.
        - `state`: optional, returned unchanged (so that the layer can stand
          where a [`BatchNorm`][filterax.nn.BatchNorm] does).
        - `key`: ignored (keyword only).

        **Returns:** the rescaled array, of `x`'s shape and dtype; or
        `(output, state)` when `state` is passed.
        """
        _check_whole_shape("RMSNorm", "rms_norm", self.shape, x)
        y = x.astype(statistics_dtype(x.dtype))
        out = jax.lax.rsqrt(jnp.mean(y**2) + self.eps) * y
        return _affine_output(out, self.weight, self.bias, x.dtype, state)


class GroupNorm(Module):
    """Splits the channels (the first axis) into groups and normalises each group
    by its own mean and variance, then optionally scales and shifts each channel.

    For an input of shape `(channels, *spatial)`, each group of
    `channels // groups` consecutive channels is normalised as
    `(x - mean) / sqrt(var + eps)` over all its elements, then channel `c` is
    mapped to `out[c] * weight[c] + bias[c]`.

    **Arguments:**

    - `groups`: the number of groups; must divide `channels`.
    - `channels`: the number of channels; may be `None` only when
      `channelwise_affine=False`.
    - `eps`: added to the variance before the square root.
    - `channelwise_affine`: whether to hold a learnable per-channel `weight`
      (ones) and `bias` (zeros), each of shape `(channels,)`.
    - `dtype`: the dtype of `weight` and `bias`; defaults to float32 (float64
      when JAX's x64 mode is on).
    - `axes`: logical axes replacing the default `("channel",)` of `weight`
      and `bias`, by field name (keyword only); see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** calling the layer on `x` of shape `(channels, ...)` returns an
    array of the same shape and dtype (and `(output, state)` when a `state` is
    passed too).

    **Raises:** `ValueError` if `groups` does not divide `channels`, or if
    `channels` is `None` while `channelwise_affine=True`.

    ```python
    >>> import jax.numpy as jnp, numpy as np
    >>> import filterax as fx
    >>> norm = fx.nn.GroupNorm(groups=2, channels=4)
    >>> np.asarray(norm(jnp.array([1.0, 3.0, 10.0, 20.0]))).round(3)
    array([-1.,  1., -1.,  1.], dtype=float32)

    ```
    """

    groups: int = field(static=True)
    channels: int | None = field(static=True)
    eps: float = field(static=True)
    channelwise_affine: bool = field(static=True)
    weight: Float[Array, " channels"] | None = field(axes=("channel",))
    bias: Float[Array, " channels"] | None = field(axes=("channel",))
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        groups: int,
        channels: int | None = None,
        eps: float = 1e-5,
        channelwise_affine: bool = True,
        dtype: Any = None,
        *,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        self.axes = layer_axes("GroupNorm", axes, declared_axes(type(self)))
        if groups < 1:
            raise ValueError(
                f"GroupNorm needs at least one group; got groups={groups}."
            )
        if channels is not None and channels % groups != 0:
            raise ValueError(
                f"GroupNorm: groups={groups} must divide channels={channels}."
            )
        if channels is None and channelwise_affine:
            raise ValueError(
                "GroupNorm(channelwise_affine=True) needs the number of channels: "
                "pass channels=..., or channelwise_affine=False."
            )
        self.groups = groups
        self.channels = channels
        self.eps = eps
        self.channelwise_affine = channelwise_affine
        self.weight = jnp.ones(channels, dtype) if channelwise_affine else None
        self.bias = jnp.zeros(channels, dtype) if channelwise_affine else None

    @overload
    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array: ...

    @overload
    def __call__(
        self, x: Array, state: _State, *, key: PRNGKeyArray | None = None
    ) -> tuple[Array, _State]: ...

    def __call__(
        self,
        x: Float[Array, "channels ..."],
        state: Any = NO_STATE,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Any:
        """Normalises `x` group by group.

        **Arguments:**

        - `x`: an array of shape `(channels, ...)`.
        - `state`: optional, returned unchanged (so that the layer can stand
          where a [`BatchNorm`][filterax.nn.BatchNorm] does).
        - `key`: ignored (keyword only).

        **Returns:** the normalised array, of `x`'s shape and dtype; or
        `(output, state)` when `state` is passed.
        """
        if x.ndim == 0:
            raise ValueError(
                "GroupNorm expects an input of shape (channels, ...); got a scalar."
            )
        channels = x.shape[0]
        if channels % self.groups != 0:
            raise ValueError(
                f"GroupNorm(groups={self.groups}) expects a number of channels "
                f"(the first axis) divisible by {self.groups}; got an input of "
                f"shape {x.shape}."
            )
        if self.channelwise_affine and channels != self.channels:
            raise ValueError(
                f"GroupNorm(channels={self.channels}) expects an input of shape "
                f"({self.channels}, ...); got shape {x.shape}."
            )
        grouped = x.astype(statistics_dtype(x.dtype)).reshape(
            self.groups, channels // self.groups, *x.shape[1:]
        )
        within_group = tuple(range(1, grouped.ndim))
        mean = jnp.mean(grouped, axis=within_group, keepdims=True)
        variance = jnp.var(grouped, axis=within_group, keepdims=True)
        variance = jnp.maximum(0.0, variance)
        out = ((grouped - mean) * jax.lax.rsqrt(variance + self.eps)).reshape(x.shape)
        weight = bias = None
        if self.weight is not None and self.bias is not None:
            per_channel = (channels,) + (1,) * (x.ndim - 1)
            weight = jnp.broadcast_to(self.weight.reshape(per_channel), x.shape)
            bias = jnp.broadcast_to(self.bias.reshape(per_channel), x.shape)
        return _affine_output(out, weight, bias, x.dtype, state)
