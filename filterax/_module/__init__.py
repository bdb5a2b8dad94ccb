"""Module machinery: `Module`, its construction, bound methods, `Partial`.

- `_module.py`: the metaclass, `Module`, `BoundMethod` and the descriptor that
  binds plain methods.
- `_construction.py`: generated and custom `__init__`s, the steps that follow
  `__init__` (defaults, converters, checks), a class's own `__new__` (which may
  assign fields, as in Equinox), pytree registration and JAX's unflatten.
- `_frozen.py`: the read-only lists, dicts, sets and NumPy arrays that static
  fields hold instead of mutable ones.
- `_field.py`: `field`, `static_field`. `_abstract.py`: `AbstractVar`,
  `AbstractClassVar`. `_partial.py`: `Partial`. `_wrappers.py`:
  `module_update_wrapper`, and `FunctionWrapper`, the one base of the callable
  pytrees that the transforms (`_jit`, `_ad`, `_mapping`) return.
  `_attributes.py`: the one list of attributes a wrapper copies from what it
  wraps.

May import: `jax`, `_compat` (the only home of JAX internals), `_tree._filters`,
`_pretty` and `_tree` (printing and equality sit below Modules and know
nothing about them), `_transformed` (recognising JAX transforms),
`_warnings` (deprecations, warnings attributed to the caller) and, deferred to
the display hook, `_treescope` (treescope is an optional extra).
"""

from ._abstract import AbstractClassVar, AbstractVar
from ._attributes import copy_wrapped_attributes
from ._field import StaticArrayWarning, field, static_field
from ._module import BoundMethod, Module, StrictConfig, is_dunder
from ._partial import Partial
from ._wrappers import FunctionWrapper, module_update_wrapper

__all__ = [
    "AbstractClassVar",
    "AbstractVar",
    "BoundMethod",
    "FunctionWrapper",
    "Module",
    "Partial",
    "StaticArrayWarning",
    "StrictConfig",
    "copy_wrapped_attributes",
    "field",
    "is_dunder",
    "module_update_wrapper",
    "static_field",
]
