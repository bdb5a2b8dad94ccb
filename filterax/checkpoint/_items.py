"""What goes to orbax and what comes back: the two items of a checkpoint, and
the pytree rebuilt from them.

A checkpoint is one orbax checkpoint of two items, written by orbax's
`CompositeCheckpointHandler`:

- `arrays`: the array leaves, as a flat dict `{"leaf<i>": array}` saved by
  orbax's `StandardCheckpointHandler` (each process writes the shards it owns;
  replicated data is written once);
- `filterax`: the description of everything else (`_describe.py`), saved as
  JSON by orbax's `JsonCheckpointHandler` (by the primary process).

Restoring reads the description first and checks it against `like`; only then
are the arrays read, each straight onto the sharding `like` asks for.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from .._filters import is_ref
from .._serialisation._arrays import as_like_scalar, as_weak
from .._serialisation._messages import SerialisationError
from ._describe import ARRAY_KINDS, Described, check_matches, describe, read_header

__all__ = [
    "ARRAYS",
    "DESCRIPTION",
    "restore_tree",
    "save_args",
]

ARRAYS = "arrays"
DESCRIPTION = "filterax"

# `restore_item(args)`: restores the items named in an orbax `Composite`.
RestoreItem = Callable[[Any], Any]


def _array_name(index: int) -> str:
    return f"leaf{index}"


def save_args(tree: Any) -> Any:
    """The orbax `Composite` arguments that save `tree` (a `jax.Ref` as the
    value it holds now)."""
    described = describe(tree, saving=True)
    arrays: dict[str, Any] = {}
    for leaf, record in zip(described.leaves, described.leaf_records):
        if record["kind"] not in ARRAY_KINDS:
            continue
        value = leaf[...] if is_ref(leaf) else leaf
        if record["kind"] == "numpy_scalar":
            value = np.asarray(value)
        arrays[_array_name(len(arrays))] = value
    items: dict[str, Any] = {DESCRIPTION: ocp.args.JsonSave(described.header())}
    if arrays:  # orbax refuses an empty item
        items[ARRAYS] = ocp.args.StandardSave(arrays)
    return ocp.args.Composite(**items)


def _default_sharding() -> jax.sharding.Sharding:
    """Where an array goes when `like` does not say: the default device, or
    replicated on every device in a multi-process run."""
    if jax.process_count() == 1:
        return SingleDeviceSharding(jax.devices()[0])
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("devices",))
    return NamedSharding(mesh, PartitionSpec())


def _concrete_sharding(sharding: Any, path: str) -> jax.sharding.Sharding:
    """`sharding` with devices: a `NamedSharding` over an abstract mesh (what
    `jax.eval_shape` gives on `Explicit` meshes) takes the concrete mesh set
    with `jax.set_mesh`, when it is that mesh."""
    if sharding is None:
        return _default_sharding()
    mesh = getattr(sharding, "mesh", None)
    if isinstance(sharding, NamedSharding) and isinstance(
        mesh, jax.sharding.AbstractMesh
    ):
        current = jax.sharding.get_mesh()
        if current.empty or current.abstract_mesh != mesh:
            raise ValueError(
                f"cannot restore the leaf at {path}: `like` gives it a sharding "
                f"on an abstract mesh ({mesh}), which names no devices. Restore "
                "under `with jax.set_mesh(mesh):` for that mesh, or give `like` "
                "concrete shardings."
            )
        return NamedSharding(current, sharding.spec, memory_kind=sharding.memory_kind)
    return sharding


def _target(like_leaf: Any, record: dict[str, Any], path: str) -> Any:
    """What orbax restores one array into: a NumPy array for NumPy leaves, a
    sharded `ShapeDtypeStruct` for JAX ones."""
    value = like_leaf[...] if is_ref(like_leaf) else like_leaf
    if record["kind"] in ("numpy", "numpy_scalar"):
        # Never written: a template of the right type, dtype and shape.
        return np.empty(np.shape(value), np.dtype(value.dtype))
    if isinstance(value, jax.ShapeDtypeStruct):
        sharding = value.sharding
    else:
        try:
            sharding = value.sharding
        except RuntimeError:  # deleted or donated: nothing to read it from
            sharding = None
    return jax.ShapeDtypeStruct(
        value.shape, value.dtype, sharding=_concrete_sharding(sharding, path)
    )


def _finish(like_leaf: Any, record: dict[str, Any], restored: Any) -> Any:
    """The restored leaf, of `like_leaf`'s kind: a new Ref where `like` has a
    Ref, weakly typed where `like` is."""
    value = like_leaf[...] if is_ref(like_leaf) else like_leaf
    if record["kind"] == "numpy_scalar":
        restored = restored[()]
    elif getattr(value, "weak_type", False):
        restored = as_weak(restored)
    wants_ref = is_ref(like_leaf) or bool(getattr(like_leaf, "is_ref", False))
    return jax.new_ref(restored) if wants_ref else restored


def _python_scalar(record: dict[str, Any], like_leaf: Any) -> Any:
    value = record["value"]
    if record["kind"] == "complex":
        value = complex(*value)
    elif record["kind"] == "float":
        value = float(value)
    return as_like_scalar(value, like_leaf)


def _read_description(checkpoint: str, where: str) -> Any:
    """The saved description, read by orbax's JSON handler straight from its
    item directory (no barrier: every process reads the same small file)."""
    item = os.path.join(checkpoint, DESCRIPTION)
    if not os.path.isdir(item):
        raise SerialisationError(
            f"{where} was not written by filterax.checkpoint (it has no "
            f"{DESCRIPTION!r} item, only {sorted(os.listdir(checkpoint))})."
        )
    return ocp.JsonCheckpointHandler().restore(pathlib.Path(item))  # type: ignore[arg-type]


def restore_tree(
    like: Any, checkpoint: str, restore_item: RestoreItem, where: str
) -> Any:
    """Restores the checkpoint in directory `checkpoint`, whose items
    `restore_item` reads, into a pytree like `like`; no array is read before
    the description matches `like`."""
    described: Described = describe(like, saving=False)
    saved = read_header(_read_description(checkpoint, where), where)
    check_matches(saved, described, where)
    targets: dict[str, Any] = {}
    for leaf, path, record in zip(
        described.leaves, described.leaf_paths, described.leaf_records
    ):
        if record["kind"] in ARRAY_KINDS:
            name = _array_name(len(targets))
            targets[name] = _target(leaf, record, jax.tree_util.keystr(path))
    arrays = {}
    if targets:
        arrays = restore_item(
            ocp.args.Composite(**{ARRAYS: ocp.args.StandardRestore(targets)})
        )[ARRAYS]
    leaves = []
    index = 0
    saved_leaves = [record for record in saved if "kind" in record]
    for leaf, record, saved_record in zip(
        described.leaves, described.leaf_records, saved_leaves
    ):
        kind = record["kind"]
        if kind in ARRAY_KINDS:
            leaves.append(_finish(leaf, record, arrays[_array_name(index)]))
            index += 1
        elif kind == "static":
            leaves.append(leaf)
        else:
            leaves.append(_python_scalar(saved_record, leaf))
    return described.treedef.unflatten(leaves)
