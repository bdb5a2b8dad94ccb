"""Mapping: `filter_vmap`, `filter_pmap`, `filter_shard` and `filter_shard_map`.

- `_axes.py`: axis specs (`if_array`), resolving a prefix of specs against the
  arguments and outputs (errors name the key path), the batch size, and
  rebuilding mapped outputs; shared by the three.
- `_vmap.py`, `_pmap.py`, `_shard.py`, `_shard_map.py`: one transform each.

May import: `jax`, `_caches`, `_compat`, `_tree._filters`, `_tree._split`, `_tree._structure`,
`_module`.
"""

from ._axes import if_array
from ._pmap import filter_pmap
from ._shard import filter_shard
from ._shard_map import filter_shard_map
from ._vmap import filter_vmap

__all__ = ["filter_pmap", "filter_shard", "filter_shard_map", "filter_vmap", "if_array"]
