"""`module_update_wrapper`: `functools.update_wrapper` for Modules; and
`FunctionWrapper`, the base of the callable pytrees the filtered transforms
return."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax.tree_util as jtu

from ._module import BoundMethod

__all__ = ["FunctionWrapper", "module_update_wrapper"]

_ModuleT = TypeVar("_ModuleT")
_WrapperT = TypeVar("_WrapperT", bound="FunctionWrapper")
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


def _unflatten_wrapper(
    cls: type[FunctionWrapper], options: tuple, children: Any
) -> Any:
    (fun,) = children
    return cls._from_options(fun, options)


class FunctionWrapper:
    """Base of the callables returned by the filtered transforms.

    A registered pytree whose child is the wrapped function (so a Module method
    or `Partial` keeps its arrays visible to `filter_jit`), with the transform's
    options as static metadata: two wrappers of the same function with the
    same options flatten to equal static parts, so `filter_jit` shares their
    compilation. As a class attribute it binds like a method:
    `instance.method(*args)` calls the wrapper with `instance` first.

    Every subclass is registered as a pytree when it is defined. One whose
    `__init__` does not take `(fun, options)` overrides `_from_options`, which
    JAX's unflatten calls.
    """

    _transform_name = "transform"
    # What `functools.update_wrapper` copies from the wrapped function. (Not
    # annotated: a class annotation would show as the wrappers' own
    # `__annotations__` where this leaves that attribute out.)
    _wrapper_assignments = functools.WRAPPER_ASSIGNMENTS

    def __init__(self, fun: Callable, options: tuple):
        self.fun = fun
        self.options = options
        functools.update_wrapper(
            self,  # type: ignore[arg-type]
            fun,
            assigned=self._wrapper_assignments,
            updated=(),
        )

    @classmethod
    def _from_options(cls: type[_WrapperT], fun: Callable, options: tuple) -> _WrapperT:
        return cls(fun, options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - every transform defines it

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return BoundMethod(self, instance)

    def __repr__(self) -> str:
        return f"{self._transform_name}({self.fun!r})"

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self.fun == other.fun  # type: ignore[attr-defined]
            and self.options == other.options  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        return hash((type(self), self.fun, self.options))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        jtu.register_pytree_with_keys(
            cls,
            lambda w: (((jtu.GetAttrKey("fun"), w.fun),), w.options),
            functools.partial(_unflatten_wrapper, cls),
            flatten_func=lambda w: ((w.fun,), w.options),
        )
