"""`filter_shard`: places or constrains the arrays of a pytree, leaving the rest."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.tree_util as jtu
from jax.core import Tracer

from .._tree._filters import is_array
from .._tree._structure import path_text
from ._axes import specs_for_leaves

__all__ = [
    "check_leaf_shardings",
    "filter_shard",
    "mesh_context",
    "recording_constraints",
    "sharding_misfit",
]

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


def _spec_axes(entry: Any) -> tuple[Any, ...]:
    if entry is None or entry is jax.sharding.PartitionSpec.UNCONSTRAINED:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def sharding_misfit(sharding: Any, shape: Sequence[int]) -> str | None:
    """Why `sharding` cannot lay out an array of `shape`, or `None` when it
    can (or when it is not a `NamedSharding` or `PartitionSpec`, whose fit
    JAX checks itself). A `PartitionSpec` is read on the mesh set by
    `jax.set_mesh`, and not checked without one. Checks, in order: the rank
    (a spec with more entries than the array has dimensions), the mesh axes
    (one the mesh lacks, one splitting two dimensions), and that the mesh
    axes' sizes divide the dimensions they split."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec, mesh = sharding.spec, sharding.mesh
    elif isinstance(sharding, jax.sharding.PartitionSpec):
        spec, mesh = sharding, jax.sharding.get_abstract_mesh()
        if mesh.empty:
            return None
    else:
        return None
    return spec_misfit(spec, mesh, shape)


def spec_misfit(spec: Any, mesh: Any, shape: Sequence[int]) -> str | None:
    """Why the `PartitionSpec` `spec` on `mesh` cannot lay out an array of
    `shape`, or `None` when it can (see `sharding_misfit`)."""
    shape = tuple(shape)
    if len(spec) > len(shape):
        return (
            f"{spec} has {len(spec)} entries, for an array of shape {shape} "
            f"(rank {len(shape)})"
        )
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    seen: dict[Any, int] = {}
    for dim, entry in enumerate(spec):
        axes = _spec_axes(entry)
        for axis in axes:
            if axis not in sizes:
                return (
                    f"{spec} names the mesh axis {axis!r}, which the mesh does "
                    f"not have (its axes: {tuple(sizes)})"
                )
            if axis in seen:
                return (
                    f"{spec} splits dimensions {seen[axis]} and {dim} over the "
                    f"same mesh axis {axis!r}; a mesh axis splits one dimension"
                )
            seen[axis] = dim
        parts = math.prod(sizes[axis] for axis in axes)
        if shape[dim] % parts:
            return (
                f"{spec} splits dimension {dim} (size {shape[dim]}) of an array "
                f"of shape {shape} into {parts} parts over {axes}; {parts} does "
                f"not divide {shape[dim]}"
            )
    return None


def check_leaf_shardings(
    leaves: Sequence[Any],
    shardings: Sequence[Any],
    where: Callable[[int], str],
    who: str,
) -> None:
    """Checks that each sharding fits the shape of the leaf at the same
    position (leaves without a shape, and `None` shardings, are skipped).
    `ValueError` starting with `who` and naming `where(index)`, the key path of
    the first leaf that does not fit, and why."""
    for index, (leaf, sharding) in enumerate(zip(leaves, shardings)):
        if sharding is None:
            continue
        shape = getattr(leaf, "shape", None)
        if shape is None:
            continue
        why = sharding_misfit(sharding, shape)
        if why is not None:
            raise ValueError(f"{who}: at {where(index)}: the sharding {why}.")


def leaf_path(tree: Any, root: str) -> Callable[[int], str]:
    """`where(index)`: the key path of `tree`'s leaf at `index`, found only when
    an error needs it."""

    def where(index: int) -> str:
        path, _ = jtu.tree_flatten_with_path(tree)[0][index]
        return path_text(root, path)

    return where


class _Recorder(threading.local):
    def __init__(self) -> None:
        self.stack: list[dict[int, Any]] = []


_RECORDER = _Recorder()


@contextlib.contextmanager
def recording_constraints() -> Iterator[dict[int, Any]]:
    """While the block runs (inside a trace), every tracer that
    `filter_shard` constrains is recorded in the yielded dict, by `id`
    (the value keeps it alive): `filter_jit` leaves the layout of those
    outputs to the user."""
    recorded: dict[int, Any] = {}
    _RECORDER.stack.append(recorded)
    try:
        yield recorded
    finally:
        _RECORDER.stack.pop()


def _constrain(tracers: list[Any], shardings: list[Any]) -> list[Any]:
    out = []
    for tracer, sharding in zip(tracers, shardings):
        if _refers_to_explicit_axes(sharding):
            out.append(jax.sharding.reshard(tracer, sharding))
        else:
            out.append(jax.lax.with_sharding_constraint(tracer, sharding))
    if _RECORDER.stack:
        recorded = _RECORDER.stack[-1]
        for tracer in out:
            recorded[id(tracer)] = tracer
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

    **Raises:** `ValueError` saying where `sharding` is not a prefix of `pytree`,
    or naming the key path of an array (or struct) that its sharding does not
    fit: a `PartitionSpec` with more entries than the array has dimensions, a
    mesh axis the mesh lacks or given to two dimensions, or mesh axes whose
    sizes do not divide the dimension they split.

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
    check_leaf_shardings(leaves, specs, leaf_path(pytree, "pytree"), "filter_shard")
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
