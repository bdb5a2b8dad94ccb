"""The static part of a checkpoint: a JSON description of a pytree.

Orbax stores arrays only. Everything else that makes a filterax pytree (its
structure, the node types and their metadata, static leaves such as strings
and functions, Python scalars) is described here as a list of JSON records, one
per node and leaf in the order JAX flattens them. Leaf kinds are those of
`tree_serialise_leaves`'s format (`_serialisation/_kinds.py`):

- a node: `{"path", "node": "Qualname", "module", "meta": <fingerprint>}`;
  the metadata of a dataclass node (a `Module`'s static fields) is
  fingerprinted field by field, `{"fields": {name: ...}, "rest": [...]}`;
- an array leaf: `{"path", "kind": "jax_array" | "numpy_array" |
  "numpy_scalar", "dtype", "shape", "ref", "name"}`, or `{"path", "kind":
  "key_array", "impl", "shape", "ref", "name"}` for a typed PRNG key array;
  `name` is where orbax stores it (`layers.0.weight`);
- a Python scalar: `{"path", "kind": "bool" | "int" | "float" | "complex",
  "value"}` (saved: restoring gives the saved value);
- any other leaf: `{"path", "kind": "object", "value": <fingerprint>}` (not
  saved: restoring keeps `like`'s leaf, once it matches).

Static values are described as `tree_serialise_leaves` describes its `object`
entries (`_serialisation/_fingerprint.py`): without pickling, names from the
script run as `__main__` given the script's own module name, so that a
checkpoint saved by a script restores in a program that imports its classes.
Node types are compared by their qualified name within the module. Nothing
here can run code when read back.

Imports JAX, NumPy and the lowest layers of filterax only.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .._serialisation._arrays import is_key_dtype, key_impl_of
from .._serialisation._fingerprint import describe_value, module_name
from .._serialisation._kinds import (
    JAX_ARRAY,
    KEY_ARRAY,
    NUMPY_ARRAY,
    NUMPY_SCALAR,
    OBJECT,
    STORED_ARRAY_KINDS,
)
from .._serialisation._messages import SerialisationError, shape_str
from .._tree._filters import is_ref

__all__ = [
    "FORMAT",
    "STORED_ARRAY_KINDS",
    "VERSION",
    "Described",
    "check_matches",
    "describe",
    "digest",
    "first_difference",
    "read_header",
]

FORMAT = "filterax.checkpoint"
VERSION = 2
_PYTHON_SCALARS = {bool: "bool", int: "int", float: "float", complex: "complex"}
_FINGERPRINT_DEPTH = 12
# Dtypes of fewer than 8 bits, which orbax cannot store.
_SUB_BYTE = re.compile(r"^(u?int[124]|float[124]_.*)$")
# What may appear in one part of an orbax name (its parts are joined by ".").
_NAME_PART = re.compile(r"[^A-Za-z0-9_-]")


@dataclasses.dataclass(frozen=True)
class Described:
    """A pytree taken apart: its records, its leaves with their key paths (in
    flattening order, records of leaves alongside) and its treedef."""

    records: list[dict[str, Any]]
    leaves: list[Any]
    leaf_paths: list[tuple[Any, ...]]
    leaf_records: list[dict[str, Any]]
    treedef: Any

    def header(self) -> dict[str, Any]:
        """What is saved as the checkpoint's description."""
        return {"format": FORMAT, "version": VERSION, "tree": self.records}


def _node_meta(node_type: Any, metadata: Any) -> Any:
    """The fingerprint of a node's metadata; a dataclass node's (a Module's
    static fields) by field name, so that a difference names the field."""
    if dataclasses.is_dataclass(node_type) and isinstance(metadata, tuple):
        names = [
            field.name
            for field in dataclasses.fields(node_type)
            if field.metadata.get("static")
        ]
        if names and len(names) <= len(metadata):
            return {
                "fields": {
                    name: describe_value(value)
                    for name, value in zip(names, metadata, strict=False)
                },
                "rest": [describe_value(v) for v in metadata[len(names) :]],
            }
    return describe_value(metadata)


def _refuse_array(path: str, dtype: Any, shape: tuple[int, ...]) -> None:
    """Raises for the arrays orbax cannot store, before anything is written."""
    if _SUB_BYTE.match(str(dtype)):
        raise TypeError(
            f"cannot save the leaf at {path}: it is a {dtype} array, and orbax "
            "cannot store dtypes of fewer than 8 bits. Convert it (to int8 or "
            "uint8, say) before saving, or use filterax.tree_serialise_leaves."
        )
    if math.prod(shape) == 0:
        raise ValueError(
            f"cannot save the leaf at {path}: it is an array of shape {shape}, "
            "with no elements, which orbax cannot store. Leave it out of the "
            "saved tree (it holds no data), or use filterax.tree_serialise_leaves."
        )


def _array_record(value: Any, ref: bool, path: str, saving: bool) -> dict[str, Any]:
    shape = [int(n) for n in value.shape]
    if is_key_dtype(value.dtype):
        record = {"kind": KEY_ARRAY, "impl": key_impl_of(value)}
        if saving:
            _refuse_array(path, "key", tuple(shape))
    else:
        record = {"kind": JAX_ARRAY, "dtype": str(value.dtype)}
        if saving:
            _refuse_array(path, value.dtype, tuple(shape))
    return {**record, "shape": shape, "ref": ref}


def _leaf_record(path: str, leaf: Any, saving: bool) -> dict[str, Any]:
    ref = is_ref(leaf)
    value = leaf[...] if ref else leaf
    if isinstance(value, jax.ShapeDtypeStruct):
        if saving:
            raise TypeError(
                f"cannot save the leaf at {path}: it is a jax.ShapeDtypeStruct, a "
                "description of an array without data. Save the arrays themselves."
            )
        return _array_record(
            value, ref or bool(getattr(value, "is_ref", False)), path, saving
        )
    if isinstance(value, jax.Array):
        if isinstance(value, Tracer):
            raise TypeError(
                f"cannot {'save' if saving else 'restore into'} the leaf at {path}: "
                "it is a traced array. Call filterax.checkpoint outside of "
                "jit/grad/vmap."
            )
        if saving and value.is_deleted():
            raise ValueError(
                f"cannot save the leaf at {path}: its array has been deleted (by "
                "`.delete()`, or by donating it to a jitted function). Save it "
                "before deleting or donating it."
            )
        if saving and jax.process_count() > 1 and value.is_fully_addressable:
            raise ValueError(
                f"cannot save the leaf at {path}: it is an array on this "
                f"process's devices only ({value.sharding}), in a run of "
                f"{jax.process_count()} processes. Make it a global array (with "
                "jax.make_array_from_process_local_data, or replicated over a "
                "mesh of every process's devices) before saving."
            )
        return _array_record(value, ref, path, saving)
    if isinstance(value, (np.ndarray, np.generic)):
        dtype = np.dtype(value.dtype)
        if dtype.kind in "OUSMm" or dtype.fields is not None:
            raise TypeError(
                f"cannot checkpoint the NumPy leaf at {path}: dtype {dtype} is not "
                "supported (only boolean, integer, floating and complex dtypes are)."
            )
        kind = NUMPY_ARRAY if isinstance(value, np.ndarray) else NUMPY_SCALAR
        if saving:
            _refuse_array(path, dtype, tuple(np.shape(value)))
        return {"kind": kind, "dtype": str(dtype), "shape": list(np.shape(value))}
    for cls, kind in _PYTHON_SCALARS.items():
        if isinstance(leaf, cls) and not isinstance(leaf, enum.Enum):
            if kind == "complex":
                return {"kind": kind, "value": [leaf.real, leaf.imag]}
            return {"kind": kind, "value": cls(leaf)}
    if saving and any(
        isinstance(child, (jax.Array, np.ndarray)) for child in jtu.tree_leaves(leaf)
    ):
        raise TypeError(f"cannot save the leaf at {path}: it holds arrays.")
    return {"kind": OBJECT, "value": describe_value(leaf)}


def _name_part(key: Any) -> str:
    if isinstance(key, jtu.DictKey):
        text = str(key.key)
    elif isinstance(key, jtu.SequenceKey):
        text = str(key.idx)
    elif isinstance(key, jtu.GetAttrKey):
        text = key.name
    elif isinstance(key, jtu.FlattenedIndexKey):
        text = str(key.key)
    else:
        text = str(key)
    return _NAME_PART.sub("_", text) or "_"


def _array_names(described: Described) -> None:
    """Gives each array record the name orbax stores it under: its key path,
    dotted (`layers.0.weight`), made unique where two paths read alike."""
    taken: set[str] = set()
    prefixes: set[str] = set()
    for path, record in zip(described.leaf_paths, described.leaf_records):
        if record["kind"] not in STORED_ARRAY_KINDS:
            continue
        parts = [_name_part(key) for key in path] or ["_root"]
        name = ".".join(parts)
        # Unique, and never a prefix of another name (orbax nests by parts).
        if (
            name in taken
            or name in prefixes
            or any(".".join(parts[:i]) in taken for i in range(1, len(parts)))
        ):
            # Two key paths read alike once made names: a top-level name no
            # key path gives (no part of those has a "~").
            parts = [f"~{len(taken)}"]
            name = parts[0]
        taken.add(name)
        prefixes.update(".".join(parts[:i]) for i in range(1, len(parts)))
        record["name"] = name


def _walk(
    treedef: Any,
    path: tuple[Any, ...],
    leaf_paths: list[tuple[Any, ...]],
    leaves: list[Any],
    start: int,
    saving: bool,
    records: list[dict[str, Any]],
    leaf_records: list[dict[str, Any]],
) -> None:
    """Appends the records of the subtree `treedef` at `path`, whose leaves
    begin at index `start` of `leaves`, in pre-order."""
    node_data = treedef.node_data()
    if node_data is None:  # a leaf
        record = {
            "path": jtu.keystr(path),
            **_leaf_record(jtu.keystr(path) or "the root", leaves[start], saving),
        }
        records.append(record)
        leaf_records.append(record)
        return
    node_type, metadata = node_data
    records.append(
        {
            "path": jtu.keystr(path),
            "node": getattr(node_type, "__qualname__", None) or str(node_type),
            "module": module_name(node_type),
            "meta": _node_meta(node_type, metadata),
        }
    )
    depth = len(path)
    for index, child in enumerate(treedef.children()):
        # A child's key is the next key of its first leaf's path; a child
        # without leaves (`None`, an empty container) has no key to read.
        if child.num_leaves:
            child_path = leaf_paths[start][: depth + 1]
        else:
            child_path = (*path, jtu.FlattenedIndexKey(index))
        _walk(
            child, child_path, leaf_paths, leaves, start, saving, records, leaf_records
        )
        start += child.num_leaves


def describe(tree: Any, *, saving: bool) -> Described:
    """Takes `tree` apart into records, leaves and treedef (one flattening).

    `saving`: whether `tree` is about to be saved (abstract arrays, deleted
    arrays and arrays orbax cannot store are refused) rather than a `like` to
    restore into."""
    pairs, treedef = jtu.tree_flatten_with_path(tree)
    leaf_paths = [path for path, _ in pairs]
    leaves = [leaf for _, leaf in pairs]
    records: list[dict[str, Any]] = []
    leaf_records: list[dict[str, Any]] = []
    _walk(treedef, (), leaf_paths, leaves, 0, saving, records, leaf_records)
    described = Described(records, leaves, leaf_paths, leaf_records, treedef)
    _array_names(described)
    return described


def digest(records: list[dict[str, Any]]) -> str:
    """A short hash of a description: equal for equal trees."""
    text = json.dumps(records, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read_header(header: Any, where: str) -> list[dict[str, Any]]:
    """The records of a saved description, after checking its format."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SerialisationError(
            f"{where} was not written by filterax.checkpoint (its description "
            "is missing or of another format)."
        )
    version = header.get("version")
    if version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        raise SerialisationError(
            f"{where} has checkpoint format version {version!r}; this filterax "
            f"reads version {VERSION}. "
            + (
                "Upgrade filterax to read it."
                if newer
                else "It was written by an earlier development version of "
                "filterax.checkpoint: restore it with that version and save again."
            )
        )
    tree = header.get("tree")
    if not isinstance(tree, list) or not all(
        isinstance(r, dict) and isinstance(r.get("path"), str) for r in tree
    ):
        raise SerialisationError(f"{where}: its description is malformed.")
    return tree


def _what(record: dict[str, Any] | None) -> str:
    """A record in words, for error messages."""
    if record is None:
        return "nothing"
    if "node" in record:
        return f"a {record.get('module', '?')}.{record['node']} node"
    kind = record.get("kind")
    if kind == KEY_ARRAY:
        return f"a {record.get('impl')} key array of shape {tuple(record['shape'])}"
    if kind in (JAX_ARRAY, NUMPY_ARRAY):
        array = "a JAX" if kind == JAX_ARRAY else "a NumPy"
        return f"{array} {shape_str(record['dtype'], tuple(record['shape']))} array"
    if kind == NUMPY_SCALAR:
        return f"a NumPy {record.get('dtype')} scalar"
    if kind == OBJECT:
        return f"the static value {_short(record.get('value'))}"
    return f"a Python {kind}"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _same(saved: dict[str, Any], like: dict[str, Any]) -> bool:
    if saved.get("path") != like["path"]:
        return False
    if "node" in like:
        return saved.get("node") == like["node"] and saved.get("meta") == like["meta"]
    kind = like["kind"]
    if saved.get("kind") != kind:
        return False
    if kind == KEY_ARRAY:
        return (
            saved.get("impl") == like["impl"]
            and saved.get("shape") == like["shape"]
            and isinstance(saved.get("name"), str)
        )
    if kind in STORED_ARRAY_KINDS:
        return (
            saved.get("dtype") == like["dtype"]
            and saved.get("shape") == like["shape"]
            and isinstance(saved.get("name"), str)
        )
    if kind == OBJECT:
        return saved.get("value") == like["value"]
    return "value" in saved  # Python scalars: the saved value is restored


def _difference(
    theirs: dict[str, Any] | None,
    mine: dict[str, Any] | None,
    theirs_name: str,
    mine_name: str,
) -> str:
    """Where and how two records differ, in words: `at <path>: ...`."""
    reference = mine if mine is not None else theirs
    assert reference is not None
    path = reference.get("path") or "the root"
    if mine is None or theirs is None or theirs.get("path") != mine["path"]:
        return (
            f"the structure differs at {path}: {theirs_name} has {_what(theirs)}"
            + (f" at {theirs.get('path') or 'the root'}" if theirs else "")
            + f", {mine_name} has {_what(mine)}"
            + (f" at {mine['path'] or 'the root'}" if mine else "")
        )
    if "node" in mine and theirs.get("node") == mine["node"]:
        return _node_difference(theirs, mine, theirs_name, mine_name)
    return (
        f"at {path}: {theirs_name} holds {_what(theirs)}, {mine_name} has "
        f"{_what(mine)} there"
    )


def first_difference(
    theirs: list[dict[str, Any]],
    mine: list[dict[str, Any]],
    theirs_name: str,
    mine_name: str,
) -> str | None:
    """The first difference between two descriptions, in words, or `None`."""
    for index in range(max(len(theirs), len(mine))):
        a = theirs[index] if index < len(theirs) else None
        b = mine[index] if index < len(mine) else None
        if a is not None and b is not None and _same(a, b):
            continue
        return _difference(a, b, theirs_name, mine_name)
    return None


def check_matches(saved: list[dict[str, Any]], like: Described, where: str) -> None:
    """Raises `SerialisationError` naming the first key path where the saved
    description and `like` part (structure, node types and metadata, leaf
    kinds, shapes, dtypes, PRNG implementations, static values)."""
    problem = first_difference(saved, like.records, "the checkpoint", "`like`")
    if problem is not None:
        raise SerialisationError(f"{where} does not match `like`: {problem}.")


def _keys(meta: Any) -> list[Any] | None:
    """The child keys of a dict node, from its metadata's fingerprint."""
    if isinstance(meta, dict) and isinstance(meta.get("list"), list):
        keys = meta["list"]
        return keys if all(isinstance(k, (str, int)) for k in keys) else None
    return None


def _node_difference(
    saved: dict[str, Any], like: dict[str, Any], saved_name: str, like_name: str
) -> str:
    """Where and how two nodes of one type differ: a dict's missing or extra
    key, a dataclass's static field, or else their metadata."""
    path = like["path"]
    saved_meta, like_meta = saved.get("meta"), like["meta"]
    saved_keys, like_keys = _keys(saved_meta), _keys(like_meta)
    if saved_keys is not None and like_keys is not None:
        extra = [k for k in like_keys if k not in saved_keys]
        missing = [k for k in saved_keys if k not in like_keys]
        parts = []
        if extra:
            at = path + jtu.keystr((jtu.DictKey(extra[0]),))
            parts.append(f"{at}: {like_name} has a key {saved_name} lacks")
        if missing:
            at = path + jtu.keystr((jtu.DictKey(missing[0]),))
            parts.append(f"{at}: {saved_name} has a key {like_name} lacks")
        if parts:
            return "the structure differs at " + "; ".join(parts)
    if (
        isinstance(saved_meta, dict)
        and isinstance(like_meta, dict)
        and isinstance(saved_meta.get("fields"), dict)
        and isinstance(like_meta.get("fields"), dict)
    ):
        saved_fields, like_fields = saved_meta["fields"], like_meta["fields"]
        for name in [*like_fields, *(n for n in saved_fields if n not in like_fields)]:
            if saved_fields.get(name, ...) != like_fields.get(name, ...):
                theirs = _short(saved_fields[name]) if name in saved_fields else "none"
                mine = _short(like_fields[name]) if name in like_fields else "none"
                return (
                    f"at {path}.{name} (a static field of {like['node']}): "
                    f"{saved_name.removeprefix('the ')} {theirs}, "
                    f"{like_name.strip('`')} {mine}"
                )
    text = {
        side: json.dumps(record.get("meta"))
        for side, record in (("saved", saved), ("like", like))
    }
    return (
        f"at {path or 'the root'}: the {like['node']} node's static data differ "
        f"({saved_name} has {text['saved'][:200]}, {like_name} has "
        f"{text['like'][:200]})"
    )
