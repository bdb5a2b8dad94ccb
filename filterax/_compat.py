"""Every use of JAX internals in filterax lives here.

`tests/test_compat.py` checks each of them, so a JAX release that moves or
changes one fails loudly there instead of somewhere deep in a transform.
"""

from __future__ import annotations

from collections.abc import Sequence

from jax._src import tree_util as _jax_tree_util


def register_dataclass_node(
    cls: type, data_fields: Sequence[str], meta_fields: Sequence[str]
) -> None:
    """Registers `cls` with JAX's C++ dataclass pytree node in every registry.

    The public `jax.tree_util.register_dataclass` insists that the data and meta
    fields are exactly the class's `__init__` fields. `Module` adds one extra
    meta field, the unflatten marker, so that `cls(**fields)` issued by JAX's
    unflatten can be told apart from a user's constructor call. The C++ node
    gives `Module` flattening at the speed of a plain registered dataclass,
    with `GetAttrKey` key paths.
    """
    for registry in _jax_tree_util._all_registries:
        registry.register_dataclass_node(cls, list(data_fields), list(meta_fields))
