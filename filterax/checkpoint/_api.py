"""`save` and `restore`: one checkpoint in one directory."""

from __future__ import annotations

import os
import uuid
from typing import Any

import jax
import orbax.checkpoint as ocp

from .._sharding import check_shardings_fit
from ._items import restore_tree, save_args
from ._processes import agree, next_save_number
from ._write import Write, staging_path

__all__ = ["SaveInProgress", "restore", "save"]

PathLike = str | os.PathLike[str]


def absolute(directory: PathLike) -> str:
    """`directory` as an absolute path (orbax wants one), checked to be a path."""
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(
            f"directory must be a str or os.PathLike, not {type(directory).__name__}."
        )
    return os.path.abspath(os.fspath(directory))


class SaveInProgress:
    """A checkpoint that `save(..., wait=False)` is still writing."""

    def __init__(self, write: Write):
        self._write: Write | None = write
        self.directory = write.target

    def wait(self) -> None:
        """Blocks until the checkpoint is complete on every process (and
        raises what the write raised, if it failed)."""
        if self._write is None:
            return
        try:
            self._write.wait()
        finally:
            self._write = None

    def __repr__(self) -> str:
        state = "done" if self._write is None else "writing"
        return f"SaveInProgress({self.directory!r}, {state})"


def save(directory: PathLike, tree: Any, *, wait: bool = True) -> SaveInProgress | None:
    """Saves a pytree as a checkpoint directory, with orbax as the engine:
    sharded, and from every process of a multi-process run.

    Any filterax pytree can be saved: Modules holding functions, strings and
    other static leaves, typed PRNG key arrays,
    [`NonDifferentiable`][filterax.NonDifferentiable], `nn.State`, `jax.Ref`s
    (saved as the value they hold now), optax states, NumPy arrays and scalars.
    Only arrays go to orbax: in a multi-process run every process calls
    `save`, and each writes the shards it owns (replicated data once). The
    rest of the pytree is described in a small JSON record saved with them,
    without pickling anything: its structure, node types and metadata, Python
    scalars (saved: `restore` gives the saved values), and a fingerprint of
    every other leaf (not saved: `restore` checks it against `like`'s and
    keeps `like`'s). No host copy of the arrays stays cached on them.

    Only arrays orbax can store are accepted: every leaf is checked before
    anything is written, and in a multi-process run the processes first check
    that they all save the same tree (within 30 s; a difference raises on
    every process, naming the first differing key path).

    The checkpoint appears at `directory` only once it is complete on every
    process, with a checksum of every file it holds (computed in the
    background for `wait=False`): it is written to a temporary directory beside
    it and renamed when done, so a writer killed mid-save leaves no
    `directory` behind, and a save that fails removes its temporary directory.
    A save still in flight when the program ends is finished before it exits.

    **Arguments:**

    - `directory`: where to save (`str` or `os.PathLike`); it must not exist
      yet. On several hosts it must be on a filesystem they share.
    - `tree`: the pytree to save.
    - `wait`: `True` (the default) returns once the checkpoint is complete.
      `False` returns once the arrays have been copied off the devices (they
      may then be changed, donated or deleted) and writes them in a background
      thread; call `.wait()` on the result before relying on the checkpoint or
      ending the program.

    **Returns:** `None` when `wait` is `True`; otherwise an object whose
    `.wait()` blocks until the checkpoint is complete.

    **Raises:** `FileExistsError` when `directory` exists; `TypeError` naming
    the key path for a leaf that cannot be saved (a traced array, a NumPy
    array of strings or objects, a `ShapeDtypeStruct`, an array of a dtype of
    fewer than 8 bits); `ValueError` naming the key path for a deleted
    (donated) array, an array with no elements, or, in a multi-process run, an
    array on one process's devices only; `ValueError` naming the first
    differing key path when the processes save different trees, and
    `TimeoutError` when one does not reach the save within 30 s. Nothing is
    written when it raises.

    ```python
    >>> import os, tempfile
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> import filterax.checkpoint
    >>> model = fx.nn.Linear(2, 3, key=jax.random.key(0))
    >>> directory = os.path.join(tempfile.mkdtemp(), "model")
    >>> fx.checkpoint.save(directory, model)
    >>> like = fx.filter_eval_shape(fx.nn.Linear, 2, 3, key=jax.random.key(1))
    >>> restored = fx.checkpoint.restore(directory, like)
    >>> bool(fx.tree_equal(restored, model))
    True

    ```
    """
    path = absolute(directory)
    args, described = save_args(tree)  # every leaf checked before anything is written
    number = next_save_number()
    refusal = None
    if jax.process_index() == 0 and os.path.exists(path):
        refusal = (
            f"{path} already exists: filterax.checkpoint.save writes a new "
            "directory. Choose another, or use filterax.checkpoint.Checkpointer "
            "for a series of numbered steps."
        )
        if jax.process_count() == 1:
            raise FileExistsError(refusal)
    token = agree(number, path, None, described.records, uuid.uuid4().hex[:16], refusal)
    write = Write(path, staging_path(path, token), args, number, asynchronous=not wait)
    return None if wait else SaveInProgress(write)


def restore(directory: PathLike, like: Any) -> Any:
    """Restores a checkpoint written by [`save`][filterax.checkpoint.save] into
    a pytree like `like`, each array directly onto the sharding `like` gives
    it.

    `like` gives the structure, the static leaves and, for every array, its
    shape, dtype and sharding. It may be concrete (a model built as usual) or
    abstract (from [`filter_eval_shape`][filterax.filter_eval_shape], or
    `jax.ShapeDtypeStruct`s with shardings). The shardings may differ from
    those the checkpoint was saved with: another mesh shape, device count or
    process count. In a multi-process run every process calls `restore`, and
    each reads only what its devices hold. A `ShapeDtypeStruct` without a
    sharding restores onto the default device (in a multi-process run,
    replicated on every device); a sharding on an abstract mesh (what
    `jax.eval_shape` gives on `Explicit` meshes) is resolved against the mesh
    set with `jax.set_mesh`.

    Every file is checked against the checksum written with it: a flipped
    bit, a truncated or missing file raises. The checkpoint's description is
    checked against `like` before any array is read: its structure, node types and their metadata, leaf kinds, shapes,
    dtypes and PRNG implementations, and the fingerprints of static leaves
    (classes are matched by name within their module, the script run as
    `__main__` counting as the module it would be imported as: a checkpoint
    saved by `python train.py` restores in a program that imports `train`).
    `like` is never modified: where it has a `jax.Ref` (or a
    `ShapeDtypeStruct` with `is_ref=True`), the result has a new Ref holding
    the saved value. Python scalars take their saved values; NumPy leaves come
    back as NumPy arrays and scalars; arrays are weakly typed where `like`'s
    are.

    **Arguments:**

    - `directory`: a checkpoint directory written by `save` (`str` or
      `os.PathLike`).
    - `like`: a pytree like the one saved, concrete or abstract.

    **Returns:** a new pytree like `like`, holding the saved values.

    **Raises:** `FileNotFoundError` when there is no checkpoint at `directory`;
    [`SerialisationError`][filterax.SerialisationError] naming the key path
    where the checkpoint and `like` differ (a Module's static field by its
    name, `.layers[1].out_features`), naming the file for a damaged or
    missing file, and when `directory` was not written by
    `filterax.checkpoint`; `ValueError` naming the key path for an
    abstract sharding that no mesh set with `jax.set_mesh` resolves. Nothing is
    returned unless every leaf was restored.

    ```python
    >>> import os, tempfile
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> import filterax.checkpoint
    >>> directory = os.path.join(tempfile.mkdtemp(), "state")
    >>> fx.checkpoint.save(directory, {"w": jnp.arange(3.0), "step": 7, "act": "relu"})
    >>> fx.checkpoint.restore(directory, {"w": jnp.zeros(3), "step": 0, "act": "relu"})
    {'act': 'relu', 'step': 7, 'w': Array([0., 1., 2.], dtype=float32)}
    >>> fx.checkpoint.restore(directory, {"w": jnp.zeros(4), "step": 0, "act": "relu"})
    Traceback (most recent call last):
    ...
    filterax...SerialisationError: ... does not match `like`: at ['w']: the checkpoint holds a JAX float32[3] array, `like` has a JAX float32[4] array there.

    ```
    """
    path = absolute(directory)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"no checkpoint at {path}"
            + (
                " (it is a file, not a checkpoint directory)."
                if os.path.exists(path)
                else "."
            )
        )
    return restore_from(path, like, path)


def restore_from(path: str, like: Any, where: str) -> Any:
    """Restores the checkpoint directory `path` (named `where` in messages)."""
    # Before orbax (or JAX) sees a sharding: their errors name no key path.
    check_shardings_fit(like, who="filterax.checkpoint.restore", root="like")
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        return restore_tree(
            like, path, lambda args: checkpointer.restore(path, args=args), where
        )
