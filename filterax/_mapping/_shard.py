"""`filter_shard`: places or constrains the arrays of a pytree, leaving the rest."""

from __future__ import annotations

import contextlib
from typing import Any

import jax
from jax.core import Tracer

from .._filters import is_array
from ._axes import specs_for_leaves

__all__ = ["filter_shard", "mesh_context"]

_SPEC_TYPES = (jax.sharding.Sharding, jax.sharding.PartitionSpec, jax.Device)


def _is_sharding_spec(spec: Any) -> bool:
    # `PartitionSpec` is a tuple: it must be caught before being descended into.
    return spec is None or isinstance(spec, _SPEC_TYPES)


def _as_sharding(spec: Any) -> Any:
    if isinstance(spec, jax.Device):
        return jax.sharding.SingleDeviceSharding(spec)
    return spec


def _refers_to_explicit_axes(sharding: Any) -> bool:
    """Whether `sharding` names a mesh axis of type `Explicit`: JAX then wants
    `jax.sharding.reshard` inside a trace, not `with_sharding_constraint`."""
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if mesh is None or spec is None:
        return False
    kinds = dict(zip(mesh.axis_names, mesh.axis_types))
    for entry in spec:
        names = entry if isinstance(entry, tuple) else (entry,)
        if any(kinds.get(name) == jax.sharding.AxisType.Explicit for name in names):
            return True
    return False


def _constrain(tracers: list[Any], shardings: list[Any]) -> list[Any]:
    out = []
    for tracer, sharding in zip(tracers, shardings):
        if _refers_to_explicit_axes(sharding):
            out.append(jax.sharding.reshard(tracer, sharding))
        else:
            out.append(jax.lax.with_sharding_constraint(tracer, sharding))
    return out


def _with_sharding(struct: jax.ShapeDtypeStruct, sharding: Any) -> Any:
    if isinstance(sharding, jax.sharding.PartitionSpec):
        mesh = jax.sharding.get_abstract_mesh()
        sharding = jax.sharding.NamedSharding(mesh, sharding)
    return jax.ShapeDtypeStruct(
        struct.shape,
        struct.dtype,
        sharding=sharding,
        weak_type=struct.weak_type,
        is_ref=getattr(struct, "is_ref", False),
    )


def filter_shard(pytree: Any, sharding: Any) -> Any:
    """Shards the arrays of `pytree`; every other leaf is left alone.

    Outside of a trace each array is placed with `jax.device_put`; inside one
    (`filter_jit`, `jax.jit`...) tracers get a
    `jax.lax.with_sharding_constraint` (or `jax.sharding.reshard` when the
    sharding names `Explicit` mesh axes), telling the compiler how the value
    must be laid out over the devices. NumPy arrays become JAX arrays. A
    `jax.ShapeDtypeStruct` (from an abstract model) gets the sharding as its
    `sharding`, making a template to build or restore arrays into.

    **Arguments:**

    - `pytree`: any pytree, e.g. a Module or a batch of data.
    - `sharding`: a `jax.sharding.Sharding` (such as a `NamedSharding`), a
      `jax.Device`, or a `PartitionSpec` under a mesh context; or a pytree
      prefix of `pytree` whose leaves are such specs, or `None` to leave that
      part of `pytree` alone: the tree [`sharding_of`][filterax.sharding_of]
      returns, for instance.

    **Returns:** `pytree` with its arrays sharded.

    **Raises:** `ValueError` saying where `sharding` is not a prefix of `pytree`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    >>> batch = {"x": jnp.zeros((8, 3)), "name": "train"}
    >>> placed = fx.filter_shard(batch, {"x": rows, "name": None})
    >>> placed["x"].sharding == rows, placed["name"]
    (True, 'train')

    ```
    """
    leaves, specs, treedef = specs_for_leaves(
        sharding,
        pytree,
        name="filter_shard: sharding",
        root="pytree",
        is_spec=_is_sharding_spec,
    )
    traced, traced_specs, traced_at = [], [], []
    placed, placed_specs, placed_at = [], [], []
    for index, (leaf, spec) in enumerate(zip(leaves, specs)):
        if spec is None:
            continue
        if isinstance(leaf, jax.ShapeDtypeStruct):
            leaves[index] = _with_sharding(leaf, _as_sharding(spec))
            continue
        if not is_array(leaf):
            continue
        if isinstance(leaf, Tracer):
            traced.append(leaf)
            traced_specs.append(_as_sharding(spec))
            traced_at.append(index)
        else:
            placed.append(leaf)
            placed_specs.append(_as_sharding(spec))
            placed_at.append(index)
    if traced:
        for index, leaf in zip(traced_at, _constrain(traced, traced_specs)):
            leaves[index] = leaf
    if placed:
        # One transfer call for all the arrays, not one per leaf.
        for index, leaf in zip(placed_at, jax.device_put(placed, placed_specs)):
            leaves[index] = leaf
    return treedef.unflatten(leaves)


def mesh_context(mesh: Any) -> contextlib.AbstractContextManager[Any]:
    """`jax.set_mesh(mesh)`, or nothing inside a trace, where JAX refuses to
    enter one (the enclosing call's context holds there)."""
    try:
        return jax.set_mesh(mesh)  # type: ignore[return-value]
    except ValueError:
        return contextlib.nullcontext()
