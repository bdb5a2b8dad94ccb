"""The one vocabulary of leaf kinds, shared by `tree_serialise_leaves`'s file
format and `filterax.checkpoint`'s description of a pytree.

- `jax_array`, `key_array` (a typed PRNG key array), `numpy_array`,
  `numpy_scalar`: leaves whose values are arrays;
- `bool`, `int`, `float`, `complex`: Python scalars, stored by value;
- `object`: any other leaf (a string, a function): not stored (a checkpoint
  describes it by a fingerprint);
- `raw`: bytes a custom `filter_spec` wrote (`tree_serialise_leaves` only).
"""

from __future__ import annotations

__all__ = [
    "ARRAY_KINDS",
    "JAX_ARRAY",
    "KEY_ARRAY",
    "NUMPY_ARRAY",
    "NUMPY_SCALAR",
    "OBJECT",
    "PYTHON_SCALAR_KINDS",
    "RAW",
    "STORED_ARRAY_KINDS",
]

JAX_ARRAY = "jax_array"
KEY_ARRAY = "key_array"
NUMPY_ARRAY = "numpy_array"
NUMPY_SCALAR = "numpy_scalar"
OBJECT = "object"
RAW = "raw"
PYTHON_SCALAR_KINDS = ("bool", "int", "float", "complex")

# Kinds that hold an ordinary (non-key) array; they load into one another.
ARRAY_KINDS = frozenset({JAX_ARRAY, NUMPY_ARRAY, NUMPY_SCALAR})
# Every kind whose value is an array of data (what orbax stores for a checkpoint).
STORED_ARRAY_KINDS = ARRAY_KINDS | {KEY_ARRAY}
