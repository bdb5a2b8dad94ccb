"""A leafless pytree node that carries a Python value through JAX transforms."""

from __future__ import annotations

from typing import Any

import jax.tree_util as jtu

__all__ = ["Static"]


class Static:
    """Holds `value` in the treedef instead of as a leaf.

    JAX transforms only let arrays out of a traced function; wrapping any other
    output in `Static` hides it in the output treedef, so it comes back as the
    very object the trace produced. Used internally by the transforms.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Static({self.value!r})"


jtu.register_pytree_node(
    Static, lambda s: ((), s.value), lambda value, _: Static(value)
)
