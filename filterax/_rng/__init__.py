"""Randomness that lives in the model: `RngStream`, a typed key plus a counter
held in a `jax.Ref`.

- `_stream.py`: `RngStream`.

The transforms themselves (jit, vmap, the AD transforms, control flow,
serialisation) treat Refs as dynamic leaves; `is_ref` is in `_tree/_filters.py`.
Equinox's functional `State` is part of `filterax.nn`.

May import: `jax`, `_tree._filters`, `_module`.
"""

from ._stream import RngStream

__all__ = ["RngStream"]
