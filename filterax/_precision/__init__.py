"""Mixed precision as a filtered transformation.

- `_dtypes.py`: reading a floating dtype (`"bf16"`, `jnp.bfloat16`, ...) with
  an error that names the argument.
- `_cast.py`: `cast`, the one place where leaves change dtype.
- `_policy.py`: `Precision` (a policy) and `mixed_precision` (the wrapper that
  applies it to a function's arguments and outputs).
- `_loss_scale.py`: `NoOpLossScale`, `StaticLossScale`, `DynamicLossScale`,
  `all_finite` and `select_tree`.

May import: `jax`, `numpy`, `_tree._filters`, `_tree._structure`, `_tree`, `_compat` and
`_module`.
Nothing below this folder imports it.
"""

from ._cast import cast, register_buffer_type
from ._loss_scale import (
    DynamicLossScale,
    NoOpLossScale,
    StaticLossScale,
    all_finite,
    select_tree,
)
from ._policy import Precision, mixed_precision

__all__ = [
    "DynamicLossScale",
    "NoOpLossScale",
    "Precision",
    "StaticLossScale",
    "all_finite",
    "cast",
    "mixed_precision",
    "register_buffer_type",
    "select_tree",
]
