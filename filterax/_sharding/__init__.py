"""Sharding declared on the model: logical axes, rules to shardings, sharded
construction.

- `_axes.py`: `logical_axes` (the logical names of every array's dimensions,
  read from `field(axes=...)`, per-instance overrides and the `"stack"` axis of
  vmapped stacks), the helpers layers use to declare and override them, and the
  registry through which `filterax.nn`'s `StateIndex`/`State` are recognised.
- `_rules.py`: `sharding_of`: logical-name and key-path rules to
  `NamedSharding`s, with every check done before anything is placed.
- `_init.py`: `sharded_init`: a constructor run compiled, its arrays created
  directly on their shardings.

Sits at the transforms layer. May import: `jax`, `_compat`, `_filters`,
`_split`, `_structure`, `_module`, `_eval_shape`, `_mapping`
(`mesh_context`).
"""

from ._axes import (
    STACK_AXIS,
    axes_overrides_field,
    declared_axes,
    layer_axes,
    logical_axes,
    register_state_types,
    sublayer_axes,
)
from ._init import sharded_init
from ._rules import sharding_of

__all__ = [
    "STACK_AXIS",
    "axes_overrides_field",
    "declared_axes",
    "layer_axes",
    "logical_axes",
    "register_state_types",
    "sharded_init",
    "sharding_of",
    "sublayer_axes",
]
