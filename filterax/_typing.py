"""The `PyTree` annotation used in public signatures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

__all__ = ["PyTree"]

if TYPE_CHECKING:
    # For type checkers any value is a pytree (a bare leaf is a tree of one leaf),
    # so the alias is `Any`; `PyTree[T]` stays legal and also means `Any`.
    PyTree = Any
else:

    class PyTree:
        """The annotation for "any pytree": nested tuples, lists, dicts, Modules
        and other registered nodes, with arbitrary leaves (a lone leaf is a tree of
        one leaf). Type checkers read it as `Any`; `PyTree[jax.Array]` documents
        what the leaves are, as in jaxtyping, without being checked.

        **Arguments:** none; used only in annotations (`PyTree` or `PyTree[T]`).

        **Returns:** not instantiable: calling it raises `TypeError`.

        ```python
        >>> import jax, filterax as fx
        >>> def count_leaves(tree: fx.PyTree[jax.Array]) -> int:
        ...     return len(jax.tree.leaves(tree))
        >>> count_leaves({"a": 1.0, "b": (2.0, 3.0)})
        3

        ```
        """

        def __new__(cls, *args: Any, **kwargs: Any) -> NoReturn:
            raise TypeError("`filterax.PyTree` is an annotation, not a container.")

        def __class_getitem__(cls, item: Any) -> type:
            return cls
