"""Products and lookups on `Explicit` mesh axes, where JAX asks for an output
sharding that it cannot infer: `matmul` (a tensor-parallel layer's partial
products summed) and `row_of` (one row per index of a table, also under
`vmap`, where JAX cannot gather per index). Everywhere else each is the plain
JAX operation. Used by `filterax.nn`'s `Linear` and `Embedding`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jaxtyping import Array

from .._compat import ShardingTypeError

__all__ = ["matmul", "row_of"]


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
    >>> from filterax._sharding._explicit import matmul
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
    >>> from filterax._sharding._explicit import row_of
    >>> row_of(jnp.eye(3), jnp.array(1))
    Array([0., 1., 0.], dtype=float32)

    ```
    """
    if not _on_explicit_axes(table):
        return table[index]
    table_spec = _spec(table)
    if table_spec is None or table_spec[0] is None:
        # Rows not split: the plain lookup works unless the index is a batch
        # split over the mesh (under `vmap`), which JAX refuses at trace time
        # with its sharding type error; forward-mode differentiation needs
        # the plain lookup where it works.
        try:
            return table[index]
        except ShardingTypeError:
            pass
    return _row_on_explicit_axes(table, jnp.asarray(index))
