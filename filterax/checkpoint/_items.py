"""What goes to orbax and what comes back: the two items of a checkpoint, and
the pytree rebuilt from them.

A checkpoint is one orbax checkpoint of two items, written by orbax's
`CompositeCheckpointHandler`, and the checksums of its files
(`_integrity.py`):

- `arrays`: the array leaves, as a tree of dicts keyed by their key paths
  (`{"layers": {"0": {"weight": array}}}`, which orbax's metadata reads as
  `layers.0.weight`), saved by orbax's `StandardCheckpointHandler` (each
  process writes the shards it owns; replicated data is written once);
- `filterax`: the description of everything else (`_describe.py`), saved as
  JSON by orbax's `JsonCheckpointHandler` (by the primary process).

Restoring checks the description's file and reads it, checks it against
`like`, and only then reads the arrays, each straight onto the sharding `like`
asks for, once every file has passed its check.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import SingleDeviceSharding

from .._serialisation._arrays import (
    as_like_scalar,
    as_weak,
    replicated_on_every_device,
    with_devices,
)
from .._serialisation._kinds import NUMPY_ARRAY, NUMPY_SCALAR, OBJECT
from .._serialisation._messages import SerialisationError
from .._tree._filters import is_ref
from ._describe import (
    STORED_ARRAY_KINDS,
    Described,
    check_matches,
    describe,
    read_header,
)
from ._integrity import read_checksums, verify

__all__ = [
    "ARRAYS",
    "DESCRIPTION",
    "restore_tree",
    "save_args",
]

ARRAYS = "arrays"
DESCRIPTION = "filterax"
# The file orbax's JSON handler writes the description to, in its item.
_DESCRIPTION_FILE = "metadata"

# `restore_item(args)`: restores the items named in an orbax `Composite`.
RestoreItem = Callable[[Any], Any]


def _nested(named: dict[str, Any]) -> dict[str, Any]:
    """`{"a.b": x}` as `{"a": {"b": x}}` (no name is a prefix of another)."""
    tree: dict[str, Any] = {}
    for name, value in named.items():
        *parents, last = name.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def _lookup(tree: dict[str, Any], name: str) -> Any:
    for part in name.split("."):
        tree = tree[part]
    return tree


def save_args(tree: Any) -> tuple[Any, Described]:
    """The orbax `Composite` arguments that save `tree` (a `jax.Ref` as the
    value it holds now), and its description; every leaf is checked first."""
    described = describe(tree, saving=True)
    arrays: dict[str, Any] = {}
    for leaf, record in zip(described.leaves, described.leaf_records):
        if record["kind"] not in STORED_ARRAY_KINDS:
            continue
        value = leaf[...] if is_ref(leaf) else leaf
        if record["kind"] == NUMPY_SCALAR:
            value = np.asarray(value)
        arrays[record["name"]] = value
    items: dict[str, Any] = {DESCRIPTION: ocp.args.JsonSave(described.header())}
    if arrays:  # orbax refuses an empty item
        items[ARRAYS] = ocp.args.StandardSave(_nested(arrays))
    return ocp.args.Composite(**items), described


def _default_sharding() -> jax.sharding.Sharding:
    """Where an array goes when `like` does not say: the default device, or
    replicated on every device in a multi-process run."""
    if jax.process_count() == 1:
        return SingleDeviceSharding(jax.devices()[0])
    return replicated_on_every_device()


def _concrete_sharding(sharding: Any, path: str) -> jax.sharding.Sharding:
    """`sharding` with devices (see `with_devices`); `None` gives the default."""
    if sharding is None:
        return _default_sharding()
    return with_devices(sharding, path, "restore")


def _target(like_leaf: Any, record: dict[str, Any], path: str) -> Any:
    """What orbax restores one array into: a NumPy array for NumPy leaves, a
    sharded `ShapeDtypeStruct` for JAX ones."""
    value = like_leaf[...] if is_ref(like_leaf) else like_leaf
    if record["kind"] in (NUMPY_ARRAY, NUMPY_SCALAR):
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
    if record["kind"] == NUMPY_SCALAR:
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
    """The saved description, from its item's file (every process reads the
    same small file; its checksum has been checked)."""
    path = os.path.join(checkpoint, DESCRIPTION, _DESCRIPTION_FILE)
    try:
        with open(path, "rb") as file:
            return json.loads(file.read())
    except FileNotFoundError:
        raise SerialisationError(
            f"{where} was not written by filterax.checkpoint (it has no "
            f"{DESCRIPTION!r} item, only {sorted(os.listdir(checkpoint))})."
        ) from None
    except (ValueError, UnicodeDecodeError) as error:
        raise SerialisationError(
            f"{where}: its description {path} cannot be read ({error})."
        ) from None


def _holds(described: Described) -> Callable[[str], str]:
    """What a checkpoint's file holds, in words, for the message that names
    it as damaged."""
    paths = [
        record["path"] or "the root"
        for record in described.leaf_records
        if record["kind"] in STORED_ARRAY_KINDS
    ]

    def holds(relative: str) -> str:
        if relative.startswith(f"{DESCRIPTION}/"):
            return "the description of the tree"
        if not relative.startswith(f"{ARRAYS}/") or not paths:
            return "orbax's record of the checkpoint"
        shown = ", ".join(paths[:4]) + (
            f" and {len(paths) - 4} more" if len(paths) > 4 else ""
        )
        return f"data or metadata of the arrays at {shown}"

    return holds


def restore_tree(
    like: Any, checkpoint: str, restore_item: RestoreItem, where: str
) -> Any:
    """Restores the checkpoint in directory `checkpoint`, whose items
    `restore_item` reads, into a pytree like `like`; no array is read before
    the description matches `like`, nothing is returned unless every file
    passes its check."""
    described: Described = describe(like, saving=False)
    files = read_checksums(checkpoint, where)
    holds = _holds(described)
    description_files = {
        name: sums for name, sums in files.items() if name.startswith(f"{DESCRIPTION}/")
    }
    verify(checkpoint, description_files, where, holds)
    saved = read_header(_read_description(checkpoint, where), where)
    check_matches(saved, described, where)
    # Every other file before orbax reads any: orbax reading a damaged file
    # may give wrong values, or fail leaving its reads half done.
    others = {
        name: sums for name, sums in files.items() if name not in description_files
    }
    verify(checkpoint, others, where, holds)
    saved_leaves = [record for record in saved if "kind" in record]
    targets: dict[str, Any] = {}
    for leaf, path, record, saved_record in zip(
        described.leaves, described.leaf_paths, described.leaf_records, saved_leaves
    ):
        if record["kind"] in STORED_ARRAY_KINDS:
            targets[saved_record["name"]] = _target(
                leaf, record, jax.tree_util.keystr(path)
            )
    arrays: dict[str, Any] = {}
    try:
        if targets:
            arrays = restore_item(
                ocp.args.Composite(
                    **{ARRAYS: ocp.args.StandardRestore(_nested(targets))}
                )
            )[ARRAYS]
    except SerialisationError:
        raise
    except Exception as error:
        raise SerialisationError(
            f"{where}: orbax could not read the arrays ({type(error).__name__}: "
            f"{str(error)[:500]})."
        ) from error
    leaves = []
    for leaf, record, saved_record in zip(
        described.leaves, described.leaf_records, saved_leaves
    ):
        kind = record["kind"]
        if kind in STORED_ARRAY_KINDS:
            leaves.append(_finish(leaf, record, _lookup(arrays, saved_record["name"])))
        elif kind == OBJECT:
            leaves.append(leaf)
        else:
            leaves.append(_python_scalar(saved_record, leaf))
    return described.treedef.unflatten(leaves)
