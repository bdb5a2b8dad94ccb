"""`WeightNorm`: reparametrises a layer's weight as a magnitude times a
direction (Salimans and Kingma, arXiv:1602.07868)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._ad import unfrozen
from .._module import Module, field
from .._sharding import axes_overrides_field, layer_axes, logical_axes
from .._tree._filters import is_array
from ._shared_helpers import MissingWeightError, with_weight

__all__ = ["WeightNorm"]

_Layer = TypeVar("_Layer")


class _NormExceptAxis(Module):
    """The Euclidean norm of each slice along `axis` (over every other axis),
    with the reduced axes kept; over the whole array when `axis` is `None`.

    A Module, so that two `WeightNorm`s of the same configuration compare equal
    and hash alike (a `filter_jit` cache hit), which a `functools.partial`
    would not.
    """

    axis: int | None = field(static=True)

    def __init__(self, axis: int | None):
        self.axis = axis

    def __call__(self, v: Array) -> Array:
        norm = functools.partial(jnp.linalg.norm, keepdims=True)
        if self.axis is None:
            return norm(v)
        return jax.vmap(norm, in_axes=self.axis, out_axes=self.axis)(v)


def _g_axes(
    layer: Any, weight_name: str, axis: int | None, ndim: int
) -> tuple[str | None, ...]:
    """The names of `g`: the weight's name along `axis`; `None` along the
    dimensions of size 1, which cannot be split."""
    declared = jax.tree.leaves(
        getattr(logical_axes(layer), weight_name, None),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    names = declared[0] if len(declared) == 1 else None
    if axis is None or names is None or len(names) != ndim:
        return (None,) * ndim
    keep = axis % ndim
    return tuple(name if i == keep else None for i, name in enumerate(names))


class WeightNorm(Module, Generic[_Layer]):
    """Weight normalisation: the wrapped layer's weight `v` is used as
    `g * v / norm(v)`, so that its direction (`v`) and magnitude (`g`) are
    learnt separately.

    The norm is the Euclidean norm over every axis except `axis` (for a
    [`Linear`][filterax.nn.Linear] weight of shape `(out, in)` and `axis=0`,
    the norm of each row; for a convolution, of each output channel's kernel),
    or over the whole weight when `axis` is `None`. `g` starts at `norm(v)`, so
    the wrapped layer initially computes what it computed unwrapped.

    **Arguments:**

    - `layer`: the layer to wrap (for example a `Linear` or a `Conv`).
    - `weight_name`: the name of the layer's weight field (an array).
    - `axis`: the axis kept by the norm (`g` has length `v.shape[axis]` along
      it and 1 elsewhere), or `None` to take the norm of the whole weight.
    - `axes`: logical axes replacing the default of `g` (keyword only): the
      wrapped weight's name for `axis`, `None` for the other dimensions (of
      size 1). The wrapped layer keeps its own names; see
      [`sharding_of`][filterax.sharding_of].

    **Returns:** calling the wrapper on `x` returns `layer(x)`, computed with the
    weight `g * v / norm(v)`.

    **Raises:** `ValueError` if the layer has no array field `weight_name`, or
    `axis` is out of range for it.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> linear = fx.nn.Linear(3, 2, key=jax.random.key(0))
    >>> wrapped = fx.nn.WeightNorm(linear)
    >>> wrapped.g.shape
    (2, 1)
    >>> x = jnp.ones(3)
    >>> bool(jnp.allclose(wrapped(x), linear(x)))
    True

    ```
    """

    layer: _Layer
    g: Float[Array, "*weight_shape"]
    weight_name: str = field(static=True)
    axis: int | None = field(static=True)
    _norm: Callable[[Array], Array]
    axes: tuple[tuple[str, tuple[str | None, ...]], ...] | None = axes_overrides_field()

    def __init__(
        self,
        layer: _Layer,
        weight_name: str = "weight",
        axis: int | None = 0,
        *,
        axes: dict[str, tuple[str | None, ...]] | None = None,
    ):
        if not hasattr(layer, weight_name):
            raise MissingWeightError(
                f"WeightNorm: {type(layer).__name__} has no field {weight_name!r}; "
                "pass weight_name=... naming the weight array to normalise."
            )
        weight = unfrozen(getattr(layer, weight_name))
        if not is_array(weight):
            raise ValueError(
                f"WeightNorm: {type(layer).__name__}.{weight_name} must be an array "
                f"to normalise; got {type(weight).__name__}."
            )
        if axis is not None and not -weight.ndim <= axis < weight.ndim:
            raise ValueError(
                f"WeightNorm(axis={axis}) is out of range for the weight "
                f"{weight_name!r} of shape {weight.shape}: expected an axis in "
                f"[{-weight.ndim}, {weight.ndim}) or None."
            )
        self.layer = layer
        self.weight_name = weight_name
        self.axis = axis
        self._norm = _NormExceptAxis(axis)
        self.g = self._norm(weight)
        self.axes = layer_axes(
            "WeightNorm",
            axes,
            {"g": _g_axes(layer, weight_name, axis, weight.ndim)},
            keep_defaults=True,
        )

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Any:
        """Calls the wrapped layer with its normalised weight.

        **Arguments:**

        - `x`: the layer's input.
        - `key`: ignored (keyword only).

        **Returns:** `layer(x)`, computed with the weight `g * v / norm(v)`.
        """
        v = unfrozen(getattr(self.layer, self.weight_name))
        weight = v * self.g / self._norm(v)
        layer = with_weight(self.layer, self.weight_name, weight)
        return layer(x)  # pyright: ignore[reportCallIssue]
