"""Serialisation: `tree_serialise_leaves` and `tree_deserialise_leaves`.

- `_api.py`: the public functions: walk the pytree, then hand its leaves to
  a format.
- `_registry.py`: what a format declares (`Format`: how it recognises its
  input and output, writes and reads) and the lookups the reader and the
  writer make.
- `_formats.py`: the registered formats, in the order they are tried, and
  the default `filter_spec`s, which give each leaf to the format of its file.
- The formats, one module each: `_filterax.py` (filterax's own, the one
  written), `_equinox.py` (Equinox's checkpoints, read only), `_numpy.py`
  (one `.npy` record in any binary file). A new format is one such module and
  one entry in `FORMATS`.
- What filterax's format is built from: `_framing.py` (header, entries,
  footer, checksums; knows nothing about pytrees or JAX arrays beyond
  dtypes), `_leaf.py` (a leaf as an entry and back), `_key_paths.py`
  (matching stored key paths with `like`'s), and the per-leaf file objects
  in `_io.py`.
- What the Equinox and NumPy formats are built from: `_npy.py` (`.npy`
  records) and `_npy_leaf.py` (a leaf of `like` from the next record).
- Shared by all, and with `filterax.checkpoint`: `_kinds.py` (the vocabulary
  of leaf kinds) and `_fingerprint.py` (the description of a non-array
  value, never pickled).
- Shared by all: `_arrays.py` (describing `like` leaves, key layouts,
  placing restored arrays), `_source.py` (the stream a checkpoint is read
  from, with size checks), `_io.py` (which file a path names, input and
  output streams), `_atomic.py` (atomic writes to paths and the removal of
  stale temporary files), `_messages.py` (`SerialisationError` and the
  phrases of its messages).

May import: `jax`, `numpy`, and the lowest layer of filterax (`_tree._filters`).
Nothing in filterax imports this folder except `filterax/__init__.py` and
`filterax/checkpoint/` (the error type, and how leaves are described and
placed).
"""

from ._api import tree_deserialise_leaves, tree_serialise_leaves
from ._formats import default_deserialise_filter_spec, default_serialise_filter_spec
from ._messages import SerialisationError

__all__ = [
    "SerialisationError",
    "default_deserialise_filter_spec",
    "default_serialise_filter_spec",
    "tree_deserialise_leaves",
    "tree_serialise_leaves",
]
