"""`load`: a pytree like `like`, its arrays read from safetensors tensors of
the same name (after renaming), each onto its leaf's sharding."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._serialisation import SerialisationError
from .._serialisation._arrays import key_impl_of, key_layout
from .._warnings import FilteraxWarning
from ._files import Checkpoint, PathLike, Stored, open_checkpoint
from ._names import ArrayLeaf, array_leaves
from ._read import read_leaf, tensor_reader
from ._save import KEY_IMPLS

__all__ = ["load"]

# A renaming rule: `(regex, replacement)`, as `re.sub` takes them.
Rule = tuple[str | re.Pattern[str], str]


def _compiled(rename: Sequence[Rule]) -> list[tuple[re.Pattern[str], str]]:
    if isinstance(rename, (str, bytes)):
        raise TypeError("rename must be a sequence of (regex, replacement) pairs.")
    rules = []
    for number, rule in enumerate(rename):
        if not (isinstance(rule, tuple | list) and len(rule) == 2):
            raise TypeError(
                f"rename[{number}] must be a (regex, replacement) pair, not {rule!r}."
            )
        pattern, replacement = rule
        try:
            rules.append((re.compile(pattern), replacement))
        except (re.error, TypeError) as error:
            raise ValueError(
                f"rename[{number}]: {pattern!r} is no regex: {error}."
            ) from None
    return rules


def _renamed(checkpoint: Checkpoint, rename: Sequence[Rule]) -> dict[str, Stored]:
    """The checkpoint's tensors under their names after `rename`."""
    rules = _compiled(rename)
    renamed: dict[str, Stored] = {}
    for name, stored in checkpoint.tensors.items():
        new = name
        for pattern, replacement in rules:
            new = pattern.sub(replacement, new)
        if new in renamed:
            raise SerialisationError(
                f"renaming the tensors of {checkpoint.where} gives two of them "
                f"the name {new!r}: {renamed[new].name!r} and {name!r}. Change "
                "the rename rules so that names stay distinct."
            )
        renamed[new] = stored
    return renamed


def _tensor_text(name: str, stored: Stored) -> str:
    return repr(name) if name == stored.name else f"{name!r} (from {stored.name!r})"


def _check_names(
    entries: list[ArrayLeaf], renamed: dict[str, Stored], where: str, strict: bool
) -> None:
    names = {entry.name for entry in entries}
    missing = [entry for entry in entries if entry.name not in renamed]
    unused = [name for name in renamed if name not in names]
    if not (missing or unused):
        return
    lines = []
    if missing:
        lines.append(
            f"{len(missing)} leaf(s) of `like` with no tensor: "
            + ", ".join(f"{entry.name!r} (at {entry.where})" for entry in missing)
        )
    if unused:
        lines.append(
            f"{len(unused)} tensor(s) matching no leaf: "
            + ", ".join(_tensor_text(name, renamed[name]) for name in unused)
        )
    report = f"{where} does not match `like` by name (after renaming).\n" + "\n".join(
        f"- {line}" for line in lines
    )
    if strict:
        raise SerialisationError(
            report + "\nAdd `rename` rules that map the file's names onto `like`'s "
            "(key paths joined with dots), or pass strict=False to keep `like`'s "
            "values for missing leaves and ignore extra tensors."
        )
    warnings.warn(
        report + "\nMissing leaves keep `like`'s values; extra tensors are ignored.",
        FilteraxWarning,
        stacklevel=3,
    )


def _saved_key_impls(checkpoint: Checkpoint) -> dict[str, str]:
    text = checkpoint.metadata.get(KEY_IMPLS)
    if text is None:
        return {}
    try:
        impls = json.loads(text)
    except ValueError:
        raise SerialisationError(
            f"{checkpoint.where}: the metadata entry {KEY_IMPLS!r} is not JSON."
        ) from None
    return impls if isinstance(impls, dict) else {}


def _expected_shape(entry: ArrayLeaf) -> tuple[tuple[int, ...], str | None]:
    """The shape of the tensor that loads into `entry`, and its key
    implementation for a key array (`None` otherwise)."""
    shape = tuple(np.shape(entry.value))
    if not entry.is_key:
        return shape, None
    impl = key_impl_of(entry.value)
    return shape + key_layout(impl)[1], impl


def _check_shapes_and_keys(
    matched: list[tuple[ArrayLeaf, str, Stored]],
    key_impls: dict[str, str],
    where: str,
) -> None:
    problems = []
    for entry, name, stored in matched:
        shape, impl = _expected_shape(entry)
        if impl is not None and key_impls.get(stored.name, impl) != impl:
            problems.append(
                f"the tensor {_tensor_text(name, stored)} holds "
                f"{key_impls[stored.name]} keys, but the leaf at {entry.where} "
                f"is a {impl} key array"
            )
        elif stored.shape != shape:
            what = f" (the key data of a {impl} key array)" if impl else ""
            problems.append(
                f"the tensor {_tensor_text(name, stored)} has shape "
                f"{stored.shape}, but the leaf at {entry.where} has shape "
                f"{shape}{what}"
            )
    if problems:
        raise SerialisationError(
            f"{where} does not match `like`:\n"
            + "\n".join(f"- {problem}" for problem in problems)
        )


def _load_dtype(entry: ArrayLeaf) -> np.dtype:
    """The dtype a tensor is cast to on the host: the leaf's, or its key
    data's."""
    value = entry.value
    if entry.is_key:
        return np.dtype(jnp.uint32)
    return np.dtype(value.dtype)


def load(
    path: PathLike,
    like: Any,
    *,
    rename: Sequence[Rule] = (),
    strict: bool = True,
) -> Any:
    """Loads a pytree's arrays from safetensors tensors of the same name: the
    published weights of a model, or a file written by
    [`save`][filterax.safetensors.save].

    Each array leaf of `like` is named by its key path joined with dots
    (`layers.0.weight`, `jax.tree_util.keystr(path, simple=True,
    separator=".")`), and read from the tensor of that name. `rename` rules
    map the file's names onto those first. Every leaf is cast to the dtype of
    `like`'s leaf, and placed as `like`'s is: a JAX array on its sharding
    (a struct's from [`filter_eval_shape`][filterax.filter_eval_shape], or a
    concrete array's where it was placed explicitly; the default device
    otherwise), a NumPy leaf as a NumPy array or scalar, and a new `jax.Ref`
    where `like` has one. On a sharding, each process reads from the file only
    the slices its devices hold, one shard at a time: no host holds a whole
    sharded tensor. Typed key arrays come back from their key data (the key
    implementation is checked against the one recorded by `save`).
    Non-array leaves (functions, strings, Python numbers, `None`) are
    `like`'s. `like` itself is never modified.

    Every name and shape is checked, from the files' headers, before any
    tensor is read.

    **Arguments:**

    - `path`: a safetensors file; or, for a checkpoint in several files, its
      index (`model.safetensors.index.json`, whose `"weight_map"` names each
      tensor's file) or the directory holding the index (or a single
      `*.safetensors` file).
    - `like`: a pytree like the one to load, concrete or abstract.
    - `rename`: a sequence of `(regex, replacement)` pairs, applied in order
      with `re.sub` to every name in the file before matching, e.g.
      `[(r"^transformer\\.", ""), (r"\\.c_fc\\.", ".up.")]`.
    - `strict`: with `True` (the default), a leaf with no tensor or a tensor
      matching no leaf is an error listing every such name. With `False`,
      missing leaves keep `like`'s values and extra tensors are ignored, both
      listed in a [`FilteraxWarning`][filterax.FilteraxWarning].

    **Returns:** a new pytree like `like`, holding the loaded arrays.

    **Raises:** `FileNotFoundError` naming the path when there is no file (or
    an index names a file that does not exist);
    [`SerialisationError`][filterax.SerialisationError] naming the path for a
    file that is not safetensors or is truncated, for names that do not match
    (with `strict=True`), and for shapes that differ (naming the tensor, the
    key path and both shapes); `ValueError` naming the key path for two
    leaves with the same name, or a sharding on an abstract mesh that no mesh
    set with `jax.set_mesh` resolves. Nothing is returned unless every leaf
    was loaded.

    ```python
    >>> import os, tempfile
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> import filterax.safetensors
    >>> import numpy as np
    >>> from safetensors.numpy import save_file
    >>> path = os.path.join(tempfile.mkdtemp(), "published.safetensors")
    >>> save_file({"dense.kernel": np.ones((3, 2), np.float32),
    ...            "dense.bias": np.zeros(3, np.float32)}, path)
    >>> like = fx.filter_eval_shape(fx.nn.Linear, 2, 3, key=jax.random.key(0))
    >>> linear = fx.safetensors.load(
    ...     path, like, rename=[(r"^dense\\.", ""), (r"kernel$", "weight")]
    ... )
    >>> linear(jnp.ones(2))
    Array([2., 2., 2.], dtype=float32)
    >>> fx.safetensors.load(path, like)
    Traceback (most recent call last):
    ...
    filterax...SerialisationError: ... does not match `like` by name (after renaming).
    - 2 leaf(s) of `like` with no tensor: 'weight' (at .weight), 'bias' (at .bias)
    - 2 tensor(s) matching no leaf: 'dense.bias', 'dense.kernel'
    ...

    ```
    """
    checkpoint = open_checkpoint(path)
    renamed = _renamed(checkpoint, rename)
    leaves, treedef, entries = array_leaves(like)
    _check_names(entries, renamed, checkpoint.where, strict)
    matched = [
        (entry, entry.name, renamed[entry.name])
        for entry in entries
        if entry.name in renamed
    ]
    key_impls = _saved_key_impls(checkpoint)
    _check_shapes_and_keys(matched, key_impls, checkpoint.where)
    leaves = list(leaves)
    for entry, _, stored in matched:
        shape, impl = _expected_shape(entry)
        dtype = _load_dtype(entry)
        with tensor_reader(stored.file, stored.name, shape, dtype) as reader:
            leaves[entry.index] = read_leaf(
                entry.leaf, reader, shape, impl, entry.where
            )
    return treedef.unflatten(leaves)
