"""Private helpers that several `filterax.nn` layers share: default and
statistics dtypes, parameter initialisation, argument parsing and checks, the
padding parsers of convolutions and pools, dropout's activity test, the weight
swap of `WeightNorm`/`SpectralNorm` and the "no state passed" sentinel. (The
products and lookups that need an output sharding on `Explicit` mesh axes live
in `filterax/_sharding/_explicit.py`.)

Every layer module imports these from here rather than from each other. This
module imports only JAX, NumPy and filterax's modules below `nn` (never a layer
module), so that any layer may import it.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Protocol, cast

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array

from .._module import Module
from .._tree._utilities import tree_at
from .._warnings import warn_deprecated

__all__ = [
    "NO_STATE",
    "DropoutLike",
    "MissingWeightError",
    "PaddingPairsLike",
    "check_input",
    "check_key",
    "default_floating_dtype",
    "deprecated_deterministic",
    "dropout_active",
    "is_int",
    "is_pair",
    "non_negative_int",
    "padding_pairs_or_none",
    "parse_ints",
    "parse_padding_pairs",
    "statistics_dtype",
    "uniform_init",
    "with_weight",
]


class DropoutLike(Protocol):
    """What `dropout_active` reads of a `Dropout`."""

    @property
    def p(self) -> Any: ...

    @property
    def inference(self) -> bool: ...


def default_floating_dtype() -> Any:
    """`float64` when `jax_enable_x64` is on, `float32` otherwise: the dtype that
    layers use for their parameters when no `dtype=` is given."""
    return jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32


def statistics_dtype(dtype: Any) -> Any:
    """The dtype that statistics (means, variances, softmaxes) of values of
    `dtype` are computed in: at least float32."""
    with jax.numpy_dtype_promotion("standard"):
        return jnp.result_type(dtype, jnp.float32)


def uniform_init(key: Any, shape: tuple[int, ...], dtype: Any, limit: float) -> Array:
    """Samples uniformly from `[-limit, limit)`. For a complex `dtype` the real
    and imaginary parts are sampled independently, each from its own half of a
    split of `key`; `dtype=None` means `default_floating_dtype()`."""
    dtype = default_floating_dtype() if dtype is None else jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part_dtype = jnp.finfo(dtype).dtype
        real_key, imag_key = jax.random.split(key, 2)
        real = jax.random.uniform(real_key, shape, part_dtype, -limit, limit)
        imag = jax.random.uniform(imag_key, shape, part_dtype, -limit, limit)
        return jax.lax.complex(real, imag).astype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(
            f"Parameters must have a floating or complex dtype, got {jnp.dtype(dtype)}."
        )
    return jax.random.uniform(key, shape, dtype, -limit, limit)


def non_negative_int(value: Any, layer: str, name: str) -> int:
    """`value` as an int, or a `TypeError`/`ValueError` naming `layer`'s argument
    `name` unless it is a non-negative integer (bools are refused)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        size = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{layer}: `{name}` must be a non-negative int, got {value!r}."
        ) from None
    if size < 0:
        raise ValueError(f"{layer}: `{name}` must be non-negative, got {size}.")
    return size


def check_key(key: Any, layer: str) -> None:
    """Raises a `TypeError` unless `key` is a PRNG key (typed, or legacy uint32)."""
    if isinstance(key, (jax.Array, np.ndarray)) and (
        jnp.issubdtype(key.dtype, jax.dtypes.prng_key) or key.dtype == np.uint32
    ):
        return
    raise TypeError(
        f"{layer} needs `key=`, a PRNG key such as `jax.random.key(0)`, to "
        f"initialise its parameters; got {key!r}."
    )


# One int, or one entry per spatial dimension: an int or a `(before, after)` pair.
PaddingPairsLike = int | Sequence[int | Sequence[int]]


def is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def parse_ints(
    value: int | Sequence[int], num_spatial_dims: int, name: str, minimum: int | None
) -> tuple[int, ...]:
    """An int (repeated per spatial dimension) or one int per spatial dimension,
    each at least `minimum` (if given), as a tuple of Python ints."""
    if is_int(value):
        values = (int(cast(int, value)),) * num_spatial_dims
    elif (
        isinstance(value, Sequence)
        and len(value) == num_spatial_dims
        and all(is_int(v) for v in value)
    ):
        values = tuple(int(v) for v in value)
    else:
        raise ValueError(
            f"`{name}` must be an int or a sequence of {num_spatial_dims} ints "
            f"(one per spatial dimension), got {value!r}."
        )
    if minimum is not None and any(v < minimum for v in values):
        raise ValueError(f"`{name}` must be at least {minimum}, got {value!r}.")
    return values


def is_pair(value: object) -> bool:
    return (
        isinstance(value, Sequence)
        and len(value) == 2
        and all(is_int(v) for v in value)
    )


def padding_pairs_or_none(
    padding: PaddingPairsLike, num_spatial_dims: int
) -> tuple[tuple[int, int], ...] | None:
    """`(before, after)` for each spatial dimension, or `None` if `padding` is
    neither an int nor a sequence of ints/pairs of the right length."""
    if is_int(padding):
        p = int(cast(int, padding))
        return ((p, p),) * num_spatial_dims
    if not isinstance(padding, Sequence) or len(padding) != num_spatial_dims:
        return None
    pairs = []
    for entry in padding:
        if is_int(entry):
            pairs.append((int(cast(int, entry)), int(cast(int, entry))))
        elif is_pair(entry):
            before, after = cast(tuple[int, int], entry)
            pairs.append((int(before), int(after)))
        else:
            return None
    return tuple(pairs)


def parse_padding_pairs(
    padding: PaddingPairsLike, num_spatial_dims: int, strings: bool = False
) -> tuple[tuple[int, int], ...]:
    """`(before, after)` for each spatial dimension; the error for anything else
    also lists the padding strings when the caller accepts them (`strings`)."""
    pairs = padding_pairs_or_none(padding, num_spatial_dims)
    if pairs is None:
        also = "'SAME', 'SAME_LOWER', 'VALID', " if strings else ""
        raise ValueError(
            f"`padding` must be {also}an int, or a sequence of {num_spatial_dims} "
            "entries (one per spatial dimension), each an int or a "
            f"`(before, after)` pair of ints; got {padding!r}."
        )
    return pairs


def check_input(
    layer: Module, x: Array, num_spatial_dims: int, channels: int | None = None
) -> None:
    """Refuses an `x` that is not `(channels, *spatial)` with `num_spatial_dims`
    spatial dimensions; any number of channels when `channels` is `None`."""
    if x.ndim != num_spatial_dims + 1 or (
        channels is not None and x.shape[0] != channels
    ):
        shape = "(channels, " if channels is None else f"(channels={channels}, "
        raise ValueError(
            f"{type(layer).__name__} expects an input of shape {shape}*spatial) "
            f"with {num_spatial_dims} spatial dimension(s) and no batch axis (use "
            f"jax.vmap to batch), got shape {tuple(x.shape)}."
        )


def deprecated_deterministic(where: str) -> None:
    """Warns that `where(deterministic=...)` is deprecated, pointing at the code
    that called the method which calls this."""
    warn_deprecated(
        f"{where}(deterministic=...) is deprecated; use {where}(inference=...), "
        "which means the same.",
        stacklevel=3,
    )


def dropout_active(dropout: DropoutLike, inference: bool | None) -> bool:
    """Whether calling `dropout` with this `inference` argument drops elements
    (and so needs a key): not in inference, and `p` not a Python zero."""
    if inference is None:
        inference = dropout.inference
    if isinstance(dropout.p, (int, float)) and dropout.p == 0:
        return False
    return not inference


class MissingWeightError(ValueError, AttributeError):
    """`WeightNorm` or `SpectralNorm` given a layer without the named weight.
    A `ValueError`, as filterax documents, and an `AttributeError`, as
    Equinox raises."""


def with_weight(layer: Any, weight_name: str, weight: Array) -> Any:
    """A copy of `layer` whose field `weight_name` holds `weight`."""
    return tree_at(lambda wrapped: getattr(wrapped, weight_name), layer, weight)


class _NoState:
    """The default of a layer's optional `state` argument: tells "not passed"
    from any value a user may pass, `None` included."""

    def __repr__(self) -> str:
        return "<no state>"


NO_STATE: Any = _NoState()
