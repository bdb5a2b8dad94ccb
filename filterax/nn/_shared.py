"""`Shared`: ties nodes of a pytree together (weight tying)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._eval_shape import filter_eval_shape
from .._module import Module
from .._pretty import tree_pformat
from .._tree._utilities import tree_at, tree_equal

__all__ = ["Shared"]


class _SharedNode:
    """Stands where a tied node was removed: the node is rebuilt from its source
    on every call of `Shared`, so it is never stored (nor saved) twice.

    All instances are equal and hash alike, so that a model rebuilt with new
    placeholders (unflattened, deserialised, ...) keeps the same static part
    and `filter_jit` does not recompile for it."""

    def __repr__(self) -> str:
        return "SharedNode"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SharedNode)

    def __hash__(self) -> int:
        return hash(_SharedNode)


class Shared(Module):
    """Ties nodes of a pytree together, e.g. an embedding and an output layer
    that use the same weight.

    The nodes selected by `where` are removed from the stored pytree; calling
    the `Shared` returns the pytree with them put back as copies of the nodes
    selected by `get`. A gradient therefore reaches the `get` nodes through
    every use, and an optimizer update keeps the tied nodes equal.

    **Arguments:**

    - `pytree`: the pytree holding all the nodes, e.g. a tuple of layers.
    - `where`: a callable `pytree -> node` (or a tuple of nodes) selecting the
      nodes to replace, as for [`tree_at`][filterax.tree_at].
    - `get`: a callable `pytree -> node` (or a tuple of nodes, one for each of
      `where`'s) giving their values; it may compute them (`lambda p:
      p[0].weight.T`).

    **Returns:** the module; call it with no arguments to get the pytree with
    its tied nodes filled in.

    **Raises:** `ValueError` when what `get` returns differs from what `where`
    selects in structure, shapes or dtypes.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> k1, k2 = jax.random.split(jax.random.key(0))
    >>> embedding = fx.nn.Embedding(5, 3, key=k1)
    >>> head = fx.nn.Linear(3, 5, use_bias=False, key=k2)
    >>> shared = fx.nn.Shared(
    ...     (embedding, head), lambda p: p[1].weight, lambda p: p[0].weight
    ... )
    >>> embedding, head = shared()
    >>> head.weight is embedding.weight
    True

    ```
    """

    pytree: Any
    where: Callable[[Any], Any]
    get: Callable[[Any], Any]

    def __init__(
        self, pytree: Any, where: Callable[[Any], Any], get: Callable[[Any], Any]
    ):
        if not callable(where) or not callable(get):
            raise TypeError("Shared: `where` and `get` must be callables.")
        source = filter_eval_shape(get, pytree)
        destination = filter_eval_shape(where, pytree)
        if tree_equal(source, destination) is not True:
            raise ValueError(
                "Every node being shared together must have the same structure, "
                "array shapes and dtypes as the node it takes its value from. "
                f"`get` gives {tree_pformat(source, struct_as_array=True)}, and "
                f"`where` selects {tree_pformat(destination, struct_as_array=True)}."
            )
        self.pytree = tree_at(where, pytree, replace_fn=lambda _: _SharedNode())
        self.where = where
        self.get = get

    def __call__(self) -> Any:
        """The pytree with its tied nodes filled in from their sources.

        **Returns:** a pytree like the one given to the constructor.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> shared = fx.nn.Shared([jnp.ones(2), jnp.zeros(2)], lambda p: p[1], lambda p: p[0])
        >>> [x.tolist() for x in shared()]
        [[1.0, 1.0], [1.0, 1.0]]

        ```
        """
        return tree_at(self.where, self.pytree, self.get(self.pytree))
