"""The static part of a checkpoint: a JSON description of a pytree.

Orbax stores arrays only. Everything else that makes a filterax pytree (its
structure, the node types and their metadata, static leaves such as strings
and functions, Python scalars) is described here as a list of JSON records, one
per node and leaf in the order JAX flattens them:

- a node: `{"path", "node": "module.Qualname", "meta": <fingerprint>}`;
- an array leaf: `{"path", "kind": "array" | "numpy" | "numpy_scalar",
  "dtype", "shape", "ref"}`, or `{"path", "kind": "key", "impl", "shape",
  "ref"}` for a typed PRNG key array;
- a Python scalar: `{"path", "kind": "bool" | "int" | "float" | "complex",
  "value"}` (saved: restoring gives the saved value);
- any other leaf: `{"path", "kind": "static", "value": <fingerprint>}` (not
  saved: restoring keeps `like`'s leaf, once it matches).

A fingerprint describes a value without pickling it: plain data as itself,
functions and classes by their qualified name, other objects by their type.
Nothing here can run code when read back.

Imports JAX, NumPy and the lowest layers of filterax only.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .._filters import is_ref
from .._serialisation._arrays import is_key_dtype, key_impl_of
from .._serialisation._messages import SerialisationError, shape_str

__all__ = [
    "ARRAY_KINDS",
    "FORMAT",
    "VERSION",
    "Described",
    "check_matches",
    "describe",
    "read_header",
]

FORMAT = "filterax.checkpoint"
VERSION = 1
# The leaf kinds whose values orbax stores.
ARRAY_KINDS = frozenset({"array", "key", "numpy", "numpy_scalar"})
_PYTHON_SCALARS = {bool: "bool", int: "int", float: "float", complex: "complex"}
_FINGERPRINT_DEPTH = 12


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


def qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or "?"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "?")
    return f"{module}.{name}"


def fingerprint(value: Any, depth: int = 0) -> Any:
    """A JSON value that stands for `value` when two static parts are compared:
    equal for equal plain data and for the same function or class."""
    if depth > _FINGERPRINT_DEPTH:
        return {"object": qualified_name(type(value))}
    deeper = functools.partial(fingerprint, depth=depth + 1)
    if value is None or type(value) in (bool, str, int):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if type(value) is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if isinstance(value, enum.Enum):
        return {"enum": qualified_name(type(value)), "name": value.name}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, tuple):
        kind = "tuple" if type(value) is tuple else qualified_name(type(value))
        return {"tuple": kind, "items": [deeper(item) for item in value]}
    if isinstance(value, list):
        return {"list": [deeper(item) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[deeper(k), deeper(v)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"set": sorted(json.dumps(deeper(item)) for item in value)}
    if isinstance(value, type):
        return {"type": qualified_name(value)}
    if isinstance(value, np.dtype):
        return {"dtype": str(value)}
    if isinstance(value, functools.partial):
        return {
            "partial": deeper(value.func),
            "args": deeper(value.args),
            "kwargs": deeper(value.keywords),
        }
    if callable(value) and hasattr(value, "__qualname__"):
        # Functions, builtins and wrapped functions (`jax.nn.relu`, a custom_jvp).
        return {"function": qualified_name(value)}
    return {"object": qualified_name(type(value))}


def _array_record(value: Any, ref: bool) -> dict[str, Any]:
    shape = [int(n) for n in value.shape]
    if is_key_dtype(value.dtype):
        return {"kind": "key", "impl": key_impl_of(value), "shape": shape, "ref": ref}
    return {"kind": "array", "dtype": str(value.dtype), "shape": shape, "ref": ref}


def _leaf_record(path: str, leaf: Any, saving: bool) -> dict[str, Any]:
    ref = is_ref(leaf)
    value = leaf[...] if ref else leaf
    if isinstance(value, jax.ShapeDtypeStruct):
        if saving:
            raise TypeError(
                f"cannot save the leaf at {path}: it is a jax.ShapeDtypeStruct, a "
                "description of an array without data. Save the arrays themselves."
            )
        return _array_record(value, ref or bool(getattr(value, "is_ref", False)))
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
        return _array_record(value, ref)
    if isinstance(value, (np.ndarray, np.generic)):
        dtype = np.dtype(value.dtype)
        if dtype.kind in "OUSMm" or dtype.fields is not None:
            raise TypeError(
                f"cannot checkpoint the NumPy leaf at {path}: dtype {dtype} is not "
                "supported (only boolean, integer, floating and complex dtypes are)."
            )
        kind = "numpy" if isinstance(value, np.ndarray) else "numpy_scalar"
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
    return {"kind": "static", "value": fingerprint(leaf)}


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
            "node": qualified_name(node_type),
            "meta": fingerprint(metadata),
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

    `saving`: whether `tree` is about to be saved (abstract arrays and deleted
    arrays are refused) rather than a `like` to restore into."""
    pairs, treedef = jtu.tree_flatten_with_path(tree)
    leaf_paths = [path for path, _ in pairs]
    leaves = [leaf for _, leaf in pairs]
    records: list[dict[str, Any]] = []
    leaf_records: list[dict[str, Any]] = []
    _walk(treedef, (), leaf_paths, leaves, 0, saving, records, leaf_records)
    return Described(records, leaves, leaf_paths, leaf_records, treedef)


def read_header(header: Any, where: str) -> list[dict[str, Any]]:
    """The records of a saved description, after checking its format."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SerialisationError(
            f"{where} was not written by filterax.checkpoint (its description "
            "is missing or of another format)."
        )
    version = header.get("version")
    if version != VERSION:
        raise SerialisationError(
            f"{where} has checkpoint format version {version!r}; this filterax "
            f"reads version {VERSION}. Upgrade filterax to read it."
        )
    tree = header.get("tree")
    if not isinstance(tree, list) or not all(isinstance(r, dict) for r in tree):
        raise SerialisationError(f"{where}: its description is malformed.")
    return tree


def _what(record: dict[str, Any] | None) -> str:
    """A record in words, for error messages."""
    if record is None:
        return "nothing"
    if "node" in record:
        return f"a {record['node']} node"
    kind = record.get("kind")
    if kind == "key":
        return f"a {record['impl']} key array of shape {tuple(record['shape'])}"
    if kind in ("array", "numpy"):
        array = "a JAX" if kind == "array" else "a NumPy"
        return f"{array} {shape_str(record['dtype'], tuple(record['shape']))} array"
    if kind == "numpy_scalar":
        return f"a NumPy {record['dtype']} scalar"
    if kind == "static":
        text = json.dumps(record.get("value"))
        return f"the static value {text if len(text) <= 80 else text[:77] + '...'}"
    return f"a Python {kind}"


def _same(saved: dict[str, Any], like: dict[str, Any]) -> bool:
    if saved.get("path") != like["path"]:
        return False
    if "node" in like:
        return saved.get("node") == like["node"] and saved.get("meta") == like["meta"]
    kind = like["kind"]
    if saved.get("kind") != kind:
        return False
    if kind == "key":
        return saved.get("impl") == like["impl"] and saved.get("shape") == like["shape"]
    if kind in ARRAY_KINDS:
        return (
            saved.get("dtype") == like["dtype"] and saved.get("shape") == like["shape"]
        )
    if kind == "static":
        return saved.get("value") == like["value"]
    return "value" in saved  # Python scalars: the saved value is restored


def check_matches(saved: list[dict[str, Any]], like: Described, where: str) -> None:
    """Raises `SerialisationError` naming the first key path where the saved
    description and `like` part (structure, node types and metadata, leaf
    kinds, shapes, dtypes, PRNG implementations, static values)."""
    for index in range(max(len(saved), len(like.records))):
        mine = like.records[index] if index < len(like.records) else None
        theirs = saved[index] if index < len(saved) else None
        if mine is not None and theirs is not None and _same(theirs, mine):
            continue
        reference = mine if mine is not None else theirs
        assert reference is not None
        path = reference.get("path") or "the root"
        if mine is None or theirs is None or theirs.get("path") != mine["path"]:
            problem = (
                f"the checkpoint has {_what(theirs)}"
                + (f" at {theirs.get('path') or 'the root'}" if theirs else "")
                + f", `like` has {_what(mine)}"
                + (f" at {mine['path'] or 'the root'}" if mine else "")
            )
            raise SerialisationError(
                f"{where} does not match the structure of `like` at {path}: {problem}."
            )
        if "node" in mine and theirs.get("node") == mine["node"]:
            raise SerialisationError(
                f"{where} does not match the structure of `like` at "
                f"{_node_difference(theirs, mine)}."
            )
        raise SerialisationError(
            f"{where} does not match `like` at {path}: the checkpoint holds "
            f"{_what(theirs)}, `like` has {_what(mine)} there."
        )


def _keys(meta: Any) -> list[Any] | None:
    """The child keys of a dict node, from its metadata's fingerprint."""
    if isinstance(meta, dict) and isinstance(meta.get("list"), list):
        keys = meta["list"]
        return keys if all(isinstance(k, (str, int)) for k in keys) else None
    return None


def _node_difference(saved: dict[str, Any], like: dict[str, Any]) -> str:
    """Where and how two nodes of one type differ: a dict's missing or extra
    key, or else their metadata (a Module's static fields, say)."""
    path = like["path"] or "the root"
    saved_keys, like_keys = _keys(saved.get("meta")), _keys(like["meta"])
    if saved_keys is not None and like_keys is not None:
        extra = [k for k in like_keys if k not in saved_keys]
        missing = [k for k in saved_keys if k not in like_keys]
        parts = []
        if extra:
            at = like["path"] + jtu.keystr((jtu.DictKey(extra[0]),))
            parts.append(f"{at}: `like` has a key the checkpoint lacks")
        if missing:
            at = like["path"] + jtu.keystr((jtu.DictKey(missing[0]),))
            parts.append(f"{at}: the checkpoint has a key `like` lacks")
        if parts:
            return "; ".join(parts)
    text = {
        side: json.dumps(record.get("meta"))
        for side, record in (("saved", saved), ("like", like))
    }
    return (
        f"{path}: the {like['node']} node's static data differ (the checkpoint "
        f"has {text['saved'][:200]}, `like` has {text['like'][:200]})"
    )
