"""Serialisation: `tree_serialise_leaves` and `tree_deserialise_leaves`.

- `_api.py`: the public functions, walking the pytree.
- `_leaf.py`: how one leaf is stored and restored (the default `filter_spec`s).
- `_equinox.py`: restoring a leaf from a checkpoint written by Equinox.
- `_arrays.py`: describing `like` leaves, key layouts, placing restored arrays.
- `_format.py`: the on-disk framing (header, entries, footer, checksums); knows
  nothing about pytrees or JAX arrays beyond dtypes.
- `_npy.py`: the NumPy records Equinox's checkpoints are made of.
- `_source.py`: the stream a checkpoint is read from, with size checks.
- `_io.py`: which file a path names, input and output streams, and the
  per-leaf file handles given to `filter_spec` callables.
- `_atomic.py`: atomic writes to paths and the removal of stale temporary files.
- `_messages.py`: `SerialisationError` and the phrases of its messages.

May import: `jax`, `numpy`, and the lowest layer of filterax (`_filters`).
Nothing in filterax imports this folder except `filterax/__init__.py` and
`filterax/checkpoint/` (the error type, and how leaves are described and
placed).
"""

from ._api import tree_deserialise_leaves, tree_serialise_leaves
from ._leaf import default_deserialise_filter_spec, default_serialise_filter_spec
from ._messages import SerialisationError

__all__ = [
    "SerialisationError",
    "default_deserialise_filter_spec",
    "default_serialise_filter_spec",
    "tree_deserialise_leaves",
    "tree_serialise_leaves",
]
