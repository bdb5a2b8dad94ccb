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
- `_explicit.py`: `matmul` and `row_of`, a product and a lookup that name
  their output sharding where JAX asks for one on `Explicit` mesh axes (for
  `filterax.nn`'s `Linear` and `Embedding`).
- `_check.py`: `check_shardings_fit`: shardings (a restore's template, say)
  checked against the arrays' shapes, each misfit named by its key path.

Sits at the transforms layer. May import: `jax`, `_compat`, `_tree._filters`,
`_tree._split`, `_tree._structure`, `_module`, `_eval_shape`, `_warnings`, `_mapping`
(`mesh_context`, the prefix resolution of `_mapping/_axes.py` and the
sharding checks of `_mapping/_shard.py`).
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
from ._check import check_shardings_fit
from ._explicit import matmul, row_of
from ._init import sharded_init
from ._rules import sharding_of

__all__ = [
    "matmul",
    "row_of",
    "STACK_AXIS",
    "axes_overrides_field",
    "check_shardings_fit",
    "declared_axes",
    "layer_axes",
    "logical_axes",
    "register_state_types",
    "sharded_init",
    "sharding_of",
    "sublayer_axes",
]
