"""Checkpoints at scale: sharded, asynchronous, from several hosts, with orbax
as the engine (the optional extra `pip install "filterax[orbax]"`).

`save(directory, tree)` and `restore(directory, like)` write and read one
checkpoint; `Checkpointer(directory, keep=...)` saves numbered steps
asynchronously and restores the latest complete one. For one host and one
file, `filterax.tree_serialise_leaves` remains the simple default.

- `_describe.py`: the JSON description of a pytree's static part, and its
  check against `like` or another process's tree (no orbax).
- `_items.py`: the orbax items of a checkpoint, and the pytree rebuilt from
  them.
- `_integrity.py`: the checksums of a checkpoint's files, written and
  checked.
- `_processes.py`: agreement between the processes before a save, and
  barriers, with time limits.
- `_lock.py`: a writer's claim on a `Checkpointer` directory.
- `_write.py`: one save, from orbax's write to the complete, renamed
  checkpoint; saves in flight finished at exit.
- `_api.py`: `save` and `restore`.
- `_checkpointer.py`: `Checkpointer`: numbered steps, read from the
  directory on every call.

May import: `jax`, `numpy`, `orbax.checkpoint`, and the filterax layers below
the public surface (`_tree._filters`, `_serialisation`, and `_sharding` for the
checks of a template's shardings). Nothing in filterax imports
this package: `import filterax` never imports orbax.
"""

try:
    import orbax.checkpoint as _orbax_checkpoint  # noqa: F401
except ModuleNotFoundError as _error:
    if not (_error.name or "").startswith("orbax"):
        raise
    raise ModuleNotFoundError(
        "filterax.checkpoint needs orbax-checkpoint, which is not installed: "
        'pip install "filterax[orbax]"',
        name=_error.name,
    ) from _error

from ._api import restore as restore, save as save
from ._checkpointer import Checkpointer as Checkpointer

__all__ = ["Checkpointer", "restore", "save"]
