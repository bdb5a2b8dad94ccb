"""`module_update_wrapper`: `functools.update_wrapper` for Modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["module_update_wrapper"]

_ModuleT = TypeVar("_ModuleT")
_WRAPPER_ASSIGNMENTS = ("__module__", "__name__", "__qualname__", "__doc__")


def module_update_wrapper(
    wrapper: _ModuleT, wrapped: Callable[..., Any] | None = None
) -> _ModuleT:
    """Like `functools.update_wrapper`, for a Module that wraps a callable: it
    returns a copy of `wrapper` carrying the wrapped callable's `__module__`,
    `__name__`, `__qualname__`, `__doc__` and `__annotations__`, and leaves
    `wrapper` itself unchanged.

    The attributes are copied onto the instance, not into its fields: they are
    not pytree children and are not kept when JAX rebuilds the Module from its
    leaves.

    **Arguments:**

    - `wrapper`: a Module instance; unless `wrapped` is given it must have a
      `__wrapped__` attribute (typically a property returning a field).
    - `wrapped`: the callable being wrapped, if not `wrapper.__wrapped__`.

    **Returns:** the updated copy of `wrapper`.

    **Raises:** `AttributeError` when `wrapped` is omitted and `wrapper` has no
    `__wrapped__`.

    ```python
    >>> import filterax as fx
    >>> class Logged(fx.Module):
    ...     fn: object
    ...     @property
    ...     def __wrapped__(self):
    ...         return self.fn
    ...     def __call__(self, *args):
    ...         return self.fn(*args)
    >>> def double(x):
    ...     "Doubles x."
    ...     return 2 * x
    >>> logged = fx.module_update_wrapper(Logged(double))
    >>> logged.__name__, logged.__doc__, logged(3)
    ('double', 'Doubles x.', 6)

    ```
    """
    if wrapped is None:
        wrapped = wrapper.__wrapped__  # type: ignore[attr-defined]
    copy = object.__new__(type(wrapper))
    attributes = dict(wrapper.__dict__)
    for name in _WRAPPER_ASSIGNMENTS:
        try:
            attributes[name] = getattr(wrapped, name)
        except AttributeError:
            pass
    attributes["__annotations__"] = dict(getattr(wrapped, "__annotations__", {}))
    object.__setattr__(copy, "__dict__", attributes)
    return copy
