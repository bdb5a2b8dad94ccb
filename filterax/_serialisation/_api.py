"""Saving and loading the leaves of a pytree: `tree_serialise_leaves` and
`tree_deserialise_leaves`.

Both walk the pytree once, pairing each leaf with its key path and the
`filter_spec` callable that covers it, and hand the leaves to a format of the
registry (`_formats.py`): saving writes filterax's own format (`_filterax.py`);
loading also reads Equinox's (`_equinox.py`), the format being told by the
file's first bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from ._formats import (
    FORMATS,
    default_deserialise_filter_spec,
    default_serialise_filter_spec,
)
from ._io import PathOrFile, open_input, open_output
from ._registry import Leaf

__all__ = ["tree_deserialise_leaves", "tree_serialise_leaves"]


def _leaves_by_spec(
    filter_spec: Any, pytree: Any, is_leaf: Callable[[Any], bool] | None
) -> tuple[list[Leaf], Callable[[list[Any]], Any]]:
    """Pairs each leaf of `pytree` with its key path and the `filter_spec`
    callable that covers it; also returns a function that rebuilds `pytree`
    from new leaves given in the same order."""
    if callable(filter_spec):  # a callable pytree (Partial, Module) is one spec
        spec_leaves, spec_def, subtrees = (
            [((), filter_spec)],
            jtu.tree_structure(0),
            [pytree],
        )
    else:
        spec_leaves, spec_def = jtu.tree_flatten_with_path(
            filter_spec, is_leaf=callable
        )
        try:
            subtrees = spec_def.flatten_up_to(pytree)
        except (ValueError, TypeError) as error:
            raise ValueError(
                "filter_spec must be a pytree prefix of the pytree, with callables "
                f"`(file, leaf)` as its leaves: {error}"
            ) from None
    entries: list[Leaf] = []
    subdefs = []
    for (spec_path, spec), subtree in zip(spec_leaves, subtrees):
        if not callable(spec):
            raise TypeError(
                f"filter_spec leaf at {jtu.keystr(spec_path) or 'the root'} is "
                f"{spec!r}; expected a callable `(file, leaf)`."
            )
        leaves, subdef = jtu.tree_flatten_with_path(subtree, is_leaf=is_leaf)
        subdefs.append(subdef)
        for path, leaf in leaves:
            key_path = (*spec_path, *path)
            entries.append(Leaf(jtu.keystr(key_path), key_path, spec, leaf))

    def rebuild(new_leaves: list[Any]) -> Any:
        remaining = iter(new_leaves)
        parts = [
            d.unflatten([next(remaining) for _ in range(d.num_leaves)]) for d in subdefs
        ]
        return spec_def.unflatten(parts)

    return entries, rebuild


def tree_serialise_leaves(
    path_or_file: PathOrFile,
    pytree: Any,
    filter_spec: Any = default_serialise_filter_spec,
    is_leaf: Callable[[Any], bool] | None = None,
) -> None:
    """Saves the leaves of `pytree` to a file, one entry per leaf, each
    addressed by its key path (`jax.tree_util.keystr`).

    Writing to a path is atomic: the data goes to a temporary file
    `.<name>.<random>.tmp` in the same directory, which is flushed, `fsync`-ed
    and then renamed over the path, so a crash mid-write leaves any previous
    file intact. A writer killed mid-write leaves its temporary file behind;
    the next successful write to the same path removes it (temporary files
    still being written by a live writer are left alone). A path whose last
    component has no suffix gets `.eqx` appended, as in Equinox. A file object
    is written from its current position and left open; a failure part-way
    leaves an incomplete checkpoint in it, which loading rejects. Leaves are
    streamed: memory use stays near the size of the largest leaf, and no host
    copy of an array stays cached on it afterwards. The format is described
    in `docs/serialisation-format.md`.

    In a multi-process run (`jax.distributed`), each process that calls it
    writes the file from the values it holds: arrays replicated across
    processes, or split only over the process's own devices, are assembled
    from its local shards. An array split across processes is refused; save
    sharded models with [`filterax.checkpoint`][filterax.checkpoint.save],
    where every process writes its own shards. (Call it from one process, or
    give each process its own path: on a shared filesystem, writers of one
    path replace each other's complete files atomically.)

    **Arguments:**

    - `path_or_file`: a path (`str` or `os.PathLike`), or a binary file object
      open for writing.
    - `pytree`: the pytree to save; arrays inside
      [`NonDifferentiable`][filterax.NonDifferentiable] are saved like any other.
    - `filter_spec`: a pytree prefix of `pytree` whose leaves are callables
      `(file, leaf) -> None`, each applied to every leaf of its subtree. The
      default, [`default_serialise_filter_spec`][filterax.default_serialise_filter_spec],
      stores arrays and scalars; a custom callable may write any bytes to
      `file` (they form that leaf's entry) or call the default.
    - `is_leaf`: as for `jax.tree_util.tree_flatten`: nodes passed to the
      callables whole.

    **Returns:** `None`.

    **Raises:** `TypeError` naming the key path for a leaf that cannot be
    stored (an array split across processes included), `ValueError` for an array that has been deleted (or donated) and
    when `filter_spec` is not a prefix of `pytree`; `OSError` naming the
    destination when it cannot be written. Any error leaves an existing file
    at `path_or_file` untouched.

    ```python
    >>> import os, tempfile
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> model = {"w": jnp.ones((2, 2)), "key": jax.random.key(0), "act": "relu"}
    >>> path = os.path.join(tempfile.mkdtemp(), "model.fx")
    >>> fx.tree_serialise_leaves(path, model)
    >>> like = {"w": jnp.zeros((2, 2)), "key": jax.random.key(1), "act": "relu"}
    >>> loaded = fx.tree_deserialise_leaves(path, like)
    >>> loaded["w"]
    Array([[1., 1.],
           [1., 1.]], dtype=float32)
    >>> bool((jax.random.key_data(loaded["key"]) == jax.random.key_data(model["key"])).all())
    True

    ```
    """
    leaves, _ = _leaves_by_spec(filter_spec, pytree, is_leaf)
    with open_output(path_or_file) as stream:
        FORMATS.written.write(stream, leaves)


def tree_deserialise_leaves(
    path_or_file: PathOrFile,
    like: Any,
    filter_spec: Any = default_deserialise_filter_spec,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Loads a pytree saved by [`tree_serialise_leaves`][filterax.tree_serialise_leaves]
    (or by Equinox's), taking its structure and leaf types from `like`.

    Everything is checked before anything is returned: the magic number,
    checksums and format version, that the file's key paths are exactly those
    of `like` (or of one whole top-level part of what was saved, which is then
    loaded alone: the model of a `(model, opt_state)` checkpoint), and that each
    entry matches its `like` leaf. Every size the file
    claims is checked against what the file holds before memory is allocated
    for it. `like` itself is never modified: a Ref in `like` gives a new Ref
    holding the loaded value. Leaves are read straight into their new buffers
    one at a time, so memory use stays near the size of the result plus one
    leaf.

    Files written by Equinox's `tree_serialise_leaves` (NumPy records one after
    another, without key paths) are recognised by their first bytes and read
    in the order of `like`'s leaves; see `docs/serialisation-format.md` for
    what is checked then.

    **Arguments:**

    - `path_or_file`: a path (`str` or `os.PathLike`; `.eqx` is appended when
      its last component has no suffix, as in Equinox), or a binary file
      object open for reading, positioned at the start of a checkpoint.
    - `like`: a pytree with the structure of the saved one. Its array leaves
      give shape, dtype, type, placement and weak type of the restored leaves
      (they may be `jax.ShapeDtypeStruct`s, e.g. from `jax.eval_shape`); its
      other leaves are returned as they are.
    - `filter_spec`: a pytree prefix of `like` whose leaves are callables
      `(file, like_leaf) -> leaf`. The default is
      [`default_deserialise_filter_spec`][filterax.default_deserialise_filter_spec];
      a custom callable reads back the bytes its saving counterpart wrote, or
      calls the default. Entries a callable leaves unread are skipped.
    - `is_leaf`: as for `jax.tree_util.tree_flatten`.

    **Returns:** a pytree like `like` holding the loaded leaves.

    **Raises:** [`SerialisationError`][filterax.SerialisationError] (a
    `ValueError` and a `RuntimeError`) naming the file and key path when the
    file is truncated, corrupted or malformed, is not a checkpoint or has an
    unsupported format version, has an entry missing or extra relative to
    `like`, or holds a leaf of another kind, shape, dtype or PRNG
    implementation than `like`'s.

    ```python
    >>> import io
    >>> import numpy as np
    >>> import filterax as fx
    >>> file = io.BytesIO()
    >>> fx.tree_serialise_leaves(file, (np.arange(3), 0.5, fx.NonDifferentiable(2)))
    >>> _ = file.seek(0)
    >>> restored = fx.tree_deserialise_leaves(file, (np.zeros(3, int), 0.0, fx.NonDifferentiable(0)))
    >>> restored[0], restored[1], restored[2].value
    (array([0, 1, 2]), 0.5, 2)
    >>> _ = file.seek(0)
    >>> fx.tree_deserialise_leaves(file, (np.zeros(4, int), 0.0, fx.NonDifferentiable(0)))
    Traceback (most recent call last):
    ...
    filterax...SerialisationError: <BytesIO>: entry [0] holds an int64[3] array, but `like` has an int64[4] array there. Deserialised leaf at path (SequenceKey(idx=0),) does not match `like`.

    ```
    """
    leaves, rebuild = _leaves_by_spec(filter_spec, like, is_leaf)
    custom_first_leaf = bool(leaves) and (
        leaves[0].spec is not default_deserialise_filter_spec
    )
    with open_input(path_or_file) as source:
        loaded = FORMATS.input_format(source, custom_first_leaf).read(source, leaves)
    return rebuild(loaded)
