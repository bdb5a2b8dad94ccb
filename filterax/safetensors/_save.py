"""`save`: a pytree's arrays to one safetensors file, by key path."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import safetensors.numpy
from jax.core import Tracer

from .._serialisation._arrays import host_copy, key_impl_of
from ._files import PathLike, atomic_path
from ._names import ArrayLeaf, array_leaves

__all__ = ["KEY_IMPLS", "save"]

# The metadata entry naming the PRNG implementation of every typed key array
# saved: JSON `{tensor name: implementation name}`.
KEY_IMPLS = "filterax.key_impls"

# What safetensors can store (its own list, by NumPy dtype name).
_STORABLE = frozenset(
    "bool int8 uint8 int16 uint16 int32 uint32 int64 uint64 float16 float32 "
    "float64 bfloat16 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz "
    "float8_e8m0fnu complex64".split()
)


def _host_value(entry: ArrayLeaf) -> np.ndarray:
    """The leaf's value as a C-ordered NumPy array (key arrays as their key
    data); `TypeError`/`ValueError` naming the key path where there is none."""
    value = entry.value
    if isinstance(value, jax.ShapeDtypeStruct):
        raise TypeError(
            f"cannot save the leaf at {entry.where}: it is a ShapeDtypeStruct "
            "(an abstract array, with no values). Save a concrete pytree."
        )
    if isinstance(value, Tracer):
        raise TypeError(
            f"cannot save the leaf at {entry.where}: it is a traced array. "
            "Save outside of jit, grad, vmap and the like."
        )
    if entry.is_key:
        value = jax.random.key_data(value)
    if isinstance(value, jax.Array):
        if value.is_deleted():
            raise ValueError(
                f"cannot save the leaf at {entry.where}: the array was deleted "
                "(donated to a jitted function?)."
            )
        host = host_copy(value)
        if host is None:
            raise ValueError(
                f"cannot save the leaf at {entry.where}: this process holds only "
                "part of the array (it is split across processes). Use "
                "filterax.checkpoint for arrays sharded across hosts."
            )
        value = host
    array = np.asarray(value)
    if not array.flags.c_contiguous:  # `ascontiguousarray` would make 0-d 1-d
        array = array.copy(order="C")
    if array.dtype.name not in _STORABLE:
        raise TypeError(
            f"cannot save the leaf at {entry.where}: safetensors cannot store "
            f"dtype {array.dtype.name} (it stores {', '.join(sorted(_STORABLE))})."
        )
    return array


def save(
    path: PathLike, tree: Any, *, metadata: Mapping[str, str] | None = None
) -> None:
    """Saves every array leaf of a pytree to one safetensors file, each under
    its key path joined with dots (`layers.0.weight`).

    The name of a leaf is `jax.tree_util.keystr(path, simple=True,
    separator=".")`: the contents of a [`NonDifferentiable`][filterax.NonDifferentiable]
    are under its field's name (`frozen.value`), those of an `nn.State` under
    the marker of each entry. Non-array leaves (functions, strings, Python
    numbers, `None`) are not saved: they come from `like` when loading.
    Typed PRNG key arrays are saved as their key data, the key implementation
    recorded in the file's metadata so that [`load`][filterax.safetensors.load]
    gives key arrays back; a `jax.Ref` is saved as the value it holds now.

    The file is written to a temporary file beside `path` and renamed over it
    once complete: a writer killed midway leaves `path` as it was. In a
    multi-process run every process calls `save` and process 0 writes the
    file; every array must then be held whole by process 0 (replicated, or
    on its devices alone).

    **Arguments:**

    - `path`: the file to write (`str` or `os.PathLike`); replaced if it exists.
    - `tree`: the pytree to save.
    - `metadata`: text to store in the file's header, as `{str: str}`.

    **Returns:** `None`.

    **Raises:** `TypeError` naming the key path for a leaf that cannot be
    saved (abstract, traced, or of a dtype safetensors does not store) and
    for metadata that is not `{str: str}`; `ValueError` naming the key path
    for a deleted array or one split across processes, and for two leaves
    with the same name. Nothing is written when it raises.

    ```python
    >>> import os, tempfile
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> import filterax.safetensors
    >>> model = fx.nn.MLP(2, 1, width_size=4, depth=1, key=jax.random.key(0))
    >>> path = os.path.join(tempfile.mkdtemp(), "mlp.safetensors")
    >>> fx.safetensors.save(path, model)
    >>> from safetensors import safe_open
    >>> with safe_open(path, framework="numpy") as file:
    ...     sorted(file.keys())
    ['layers.0.bias', 'layers.0.weight', 'layers.1.bias', 'layers.1.weight']

    ```
    """
    user_metadata = dict(metadata or {})
    for key, value in user_metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"metadata must map str to str; it maps {key!r} to "
                f"{type(value).__name__} {value!r}."
            )
    if KEY_IMPLS in user_metadata:
        raise ValueError(f"the metadata key {KEY_IMPLS!r} is filterax's own.")
    _, _, entries = array_leaves(tree)
    tensors: dict[str, np.ndarray] = {}
    key_impls: dict[str, str] = {}
    for entry in entries:  # every leaf checked before anything is written
        tensors[entry.name] = _host_value(entry)
        if entry.is_key:
            key_impls[entry.name] = key_impl_of(entry.value)
    if key_impls:
        user_metadata[KEY_IMPLS] = json.dumps(key_impls, sort_keys=True)
    if jax.process_index() != 0:
        return
    with atomic_path(os.fspath(path)) as temporary:
        safetensors.numpy.save_file(tensors, temporary, metadata=user_metadata or None)
