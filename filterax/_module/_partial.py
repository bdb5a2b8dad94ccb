"""`Partial`: `functools.partial` as a pytree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._module import Module

__all__ = ["Partial"]


class Partial(Module):
    """Like `functools.partial`, but a pytree: `func`, `args` and `keywords` are
    its children, so arrays bound into it are traced and differentiated.

    **Arguments:**

    - `func`: the callable to wrap (itself a pytree child: a Module or bound
      method contributes its arrays).
    - `*args`, `**kwargs`: leading positional and keyword arguments to bind.

    **Returns:** a callable Module: `partial(*more, **kw)` calls
    `func(*args, *more, **kwargs, **kw)`.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> scale = fx.Partial(jnp.multiply, jnp.array(3.0))
    >>> scale(2.0)
    Array(6., dtype=float32, weak_type=True)
    >>> jax.tree.leaves(fx.filter(scale, fx.is_array))
    [Array(3., dtype=float32, weak_type=True)]

    ```
    """

    func: Callable[..., Any]
    args: tuple[Any, ...]
    keywords: dict[str, Any]

    def __init__(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any):
        if not callable(func):
            raise TypeError(f"Partial needs a callable first argument, got {func!r}.")
        self.func = func
        self.args = args
        self.keywords = kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*self.args, *args, **self.keywords, **kwargs)

    def __tree_pformat__(self) -> tuple[str, list[tuple[str, Any]]]:
        items = [("", self.func), *(("", arg) for arg in self.args)]
        items += [(f"{key}=", value) for key, value in self.keywords.items()]
        return "Partial", items
