"""`BoundMethod`: a method bound to a Module instance, as a pytree."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

__all__ = ["BoundMethod", "MethodDescriptor"]


class BoundMethod:
    """A method bound to a Module instance, itself a pytree.

    Its only child is the instance, so `jax.tree.leaves(model.method)` sees the
    model's arrays and `filter_jit(model.method)` traces them. Built for you when
    a plain method is read from a Module instance.

    **Arguments:**

    - `func`: the function defined in the class body.
    - `instance`: the Module instance it is bound to.

    **Returns:** a callable pytree; calling it calls `func(instance, ...)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> class Affine(fx.Module):
    ...     w: jax.Array
    ...     def apply(self, x):
    ...         return self.w * x
    >>> model = Affine(jnp.array(2.0))
    >>> jax.tree.leaves(model.apply)
    [Array(2., dtype=float32, weak_type=True)]
    >>> model.apply(3.0)
    Array(6., dtype=float32, weak_type=True)

    ```
    """

    __slots__ = ("__func__", "__self__")

    def __init__(self, func: Callable[..., Any], instance: Any):
        self.__func__ = func
        self.__self__ = instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # `__name__`, `__qualname__`, `__doc__`, `__module__`... of the function.
        if name in ("__name__", "__qualname__", "__module__", "__doc__"):
            return getattr(self.__func__, name)
        raise AttributeError(name)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return functools.partial(self.__func__, self.__self__)

    def __eq__(self, other: object) -> Any:
        if type(other) is not BoundMethod:
            return NotImplemented
        return self.__func__ == other.__func__ and self.__self__ == other.__self__

    def __hash__(self) -> int:
        return hash((BoundMethod, self.__func__, self.__self__))

    def __repr__(self) -> str:
        return f"<bound method {self.__func__.__qualname__} of {self.__self__!r}>"


jtu.register_pytree_with_keys(
    BoundMethod,
    lambda m: (((jtu.GetAttrKey("__self__"), m.__self__),), m.__func__),
    lambda func, children: BoundMethod(func, children[0]),
    flatten_func=lambda m: ((m.__self__,), m.__func__),
)


class MethodDescriptor:
    """Class-level stand-in for a plain method: instance access binds it into a
    `BoundMethod` pytree; class access gives back the function itself."""

    __slots__ = ("__func__",)

    def __init__(self, func: Callable[..., Any]):
        self.__func__ = func

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self.__func__
        return BoundMethod(self.__func__, instance)

    @property
    def __isabstractmethod__(self) -> bool:
        return getattr(self.__func__, "__isabstractmethod__", False)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return self.__func__.__doc__

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return self.__func__
