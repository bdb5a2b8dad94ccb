"""Private helpers that several `filterax.nn` layers share: default and
statistics dtypes, parameter initialisation, argument parsing and checks, the
padding parsers of convolutions and pools, dropout's activity test, the weight
swap of `WeightNorm`/`SpectralNorm`, the "no state passed" sentinel, and the
output sharding of a product on `Explicit` mesh axes.

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
from jax.custom_batching import custom_vmap
from jaxtyping import Array

from .._module import Module
from .._tree import tree_at
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
    "matmul",
    "row_of",
    "non_negative_int",
    "padding_pairs_or_none",
    "parse_ints",
    "parse_padding_pairs",
    "statistics_dtype",
    "uniform_init",
    "with_weight",
]


def _aval(array: Any) -> Any:
    # `.aval` first: `jax.typeof` costs ten times more, and this runs on every
    # call of the layers that use it, sharded or not.
    aval = getattr(array, "aval", None)
    return jax.typeof(array) if aval is None else aval


def _spec(array: Any) -> tuple[Any, ...] | None:
    """The mesh axes each dimension of `array` is split over in its type (only
    `Explicit` axes are), padded to its rank; `None` when no dimension is."""
    aval = _aval(array)
    spec = getattr(getattr(aval, "sharding", None), "spec", None)
    if spec is None or not any(spec):
        return None
    return (*spec, *[None] * (len(aval.shape) - len(spec)))


def _joined_spec(*dims: Any) -> jax.sharding.PartitionSpec:
    """A `PartitionSpec` of `dims`, a mesh axis that an earlier dimension is
    split over left out of the later ones (one mesh axis splits one
    dimension at most)."""
    used: set[Any] = set()
    out = []
    for dim in dims:
        names = dim if isinstance(dim, tuple) else (dim,)
        kept = tuple(name for name in names if name is not None and name not in used)
        used.update(kept)
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return jax.sharding.PartitionSpec(*out)


def matmul(weight: Array, x: Array) -> Array:
    """`weight @ x` (the last dimension of `weight` contracted with the first
    of `x`), with an output sharding where JAX asks for one: on `Explicit`
    mesh axes, when both contracted dimensions are split over the same mesh
    axes (the second layer of a tensor-parallel MLP), the partial products are
    summed and the output keeps the splits of `weight`'s other dimensions and
    of `x`'s. Everywhere else it is `jnp.matmul(weight, x)`, unchanged.

    ```python
    >>> import jax.numpy as jnp
    >>> matmul(jnp.ones((2, 3)), jnp.ones(3))
    Array([3., 3.], dtype=float32)

    ```
    """
    weight_spec = _spec(weight)
    if weight_spec is None or weight_spec[-1] is None:
        return jnp.matmul(weight, x)
    x_spec = _spec(x)
    if x_spec is None or x_spec[0] is None:
        return jnp.matmul(weight, x)
    return jnp.matmul(
        weight, x, out_sharding=_joined_spec(*weight_spec[:-1], *x_spec[1:])
    )


def _on_explicit_axes(array: Any) -> bool:
    """Whether `array`'s type, or the mesh set by `jax.set_mesh`, has an
    `Explicit` axis."""
    aval = _aval(array)
    mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
    explicit = jax.sharding.AxisType.Explicit
    return explicit in getattr(mesh, "axis_types", ()) or (
        explicit in jax.sharding.get_abstract_mesh().axis_types
    )


def _full_spec(array: Array) -> tuple[Any, ...]:
    return _spec(array) or (None,) * jnp.ndim(array)


def _gather_rows(table: Array, index: Array) -> Array:
    """`table[index]` for an integer `index` of any shape, its output sharded
    like `index` followed by the table's columns. A scalar index is looked up
    as a batch of one: alone it is a dynamic slice, which JAX refuses on split
    rows."""
    scalar = jnp.ndim(index) == 0
    batch = index[None] if scalar else index
    out_spec = _joined_spec(*_full_spec(batch), *_full_spec(table)[1:])
    rows = table.at[batch].get(out_sharding=out_spec)
    return rows[0] if scalar else rows


@custom_vmap
def _rows_of(table: Array, index: Array) -> Array:
    return _gather_rows(table, index)


@_rows_of.def_vmap
def _rows_of_batched(
    axis_size: int, in_batched: list[bool], table: Array, index: Array
) -> tuple[Array, bool]:
    # JAX cannot gather per index under `vmap` on `Explicit` axes (it finds no
    # output sharding), so the mapped lookup is one lookup of the whole batch.
    del axis_size
    table_batched, index_batched = in_batched
    if table_batched:
        in_axes = (0, 0 if index_batched else None)
        return jax.vmap(_gather_rows, in_axes=in_axes)(table, index), True
    return _rows_of(table, index), True


def _scatter_rows(table: Array, index: Array, rows: Array) -> Array:
    """Zeros shaped and sharded like `table`, with `rows` added at `index`
    (the transpose of `_gather_rows`)."""
    if jnp.ndim(index) == 0:
        index, rows = index[None], rows[None]
    spec = jax.sharding.PartitionSpec(*_full_spec(table))
    zeros = jnp.zeros(jnp.shape(table), table.dtype, out_sharding=spec)
    # Clipped, as the gather clamps an index out of range (and JAX's own
    # gradient of `table[index]` adds into the clamped row).
    return zeros.at[index].add(rows, mode="clip", out_sharding=spec)


@custom_vmap
def _add_rows(table: Array, index: Array, rows: Array) -> Array:
    return _scatter_rows(table, index, rows)


@_add_rows.def_vmap
def _add_rows_batched(
    axis_size: int, in_batched: list[bool], table: Array, index: Array, rows: Array
) -> tuple[Array, bool]:
    table_batched, index_batched, rows_batched = in_batched
    if table_batched:
        in_axes = (0, 0 if index_batched else None, 0 if rows_batched else None)
        return jax.vmap(_scatter_rows, in_axes=in_axes)(table, index, rows), True
    # An unmapped table: the rows of the whole batch are added at once.
    if not index_batched:
        index = jnp.broadcast_to(index, (axis_size, *jnp.shape(index)))
    if not rows_batched:
        rows = jnp.broadcast_to(rows, (axis_size, *jnp.shape(rows)))
    return _add_rows(table, index, rows), False


@jax.custom_vjp
def _row_on_explicit_axes(table: Array, index: Array) -> Array:
    return _rows_of(table, index)


def _row_forward(table: Array, index: Array) -> tuple[Array, tuple[Array, Array]]:
    # The table is kept (it is alive anyway) only for its shape, sharding and
    # whether it is mapped: its cotangent is mapped exactly when it is.
    return _rows_of(table, index), (table, index)


def _row_backward(
    residuals: tuple[Array, Array], cotangent: Array
) -> tuple[Array, None]:
    table, index = residuals
    return _add_rows(table, index, cotangent), None


_row_on_explicit_axes.defvjp(_row_forward, _row_backward)


def row_of(table: Array, index: Any) -> Array:
    """`table[index]` for a scalar index, that also works on `Explicit` mesh
    axes under `vmap`.

    There JAX cannot gather one row per index from a table whose rows are
    split, or for a batch of indices split over the mesh (it finds no output
    sharding). Those lookups are made for the whole batch at once instead, the
    rows sharded like the batch of indices followed by the table's columns,
    and differentiated in reverse mode (forward mode is not supported on that
    path). Everywhere else it is `table[index]`, unchanged.

    ```python
    >>> import jax.numpy as jnp
    >>> row_of(jnp.eye(3), jnp.array(1))
    Array([0., 1., 0.], dtype=float32)

    ```
    """
    if not _on_explicit_axes(table):
        return table[index]
    table_spec = _spec(table)
    if table_spec is None or table_spec[0] is None:
        try:
            return table[index]
        except Exception:  # noqa: BLE001 - JAX's sharding errors have no public type
            pass
    return _row_on_explicit_axes(table, jnp.asarray(index))


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
