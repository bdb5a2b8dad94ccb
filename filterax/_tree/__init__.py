"""The tree machinery every other part of filterax is built on, one module per
mechanism. The folder re-exports nothing: each module is imported by its own
name (`from .._tree._split import split`), so that importing one never runs
the others.

- `_filters.py`: the leaf predicates (`is_array`, `is_inexact_array`,
  `is_key_array`, `is_ref`, ...) and `filter`/`partition`/`combine`.
- `_structure.py`: key-path text and the differences between two trees' or a
  prefix's structures, for error messages.
- `_rebuild.py`: the builders that unflatten a structure of Modules at the speed
  of generated code.
- `_split.py`: splitting a pytree into the leaves JAX traces and a hashable
  `StaticPart`, merging them back, and `MixedOutput`, the carrier of outputs
  that leave a trace.
- `_utilities.py`: the public tree utilities (`tree_at`, `tree_equal`,
  `tree_check`, `tree_flatten_one_level`, ...).

May import: `jax`, NumPy, `_compat` and `_typing`.
"""
