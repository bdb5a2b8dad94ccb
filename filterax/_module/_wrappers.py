"""`module_update_wrapper`: `functools.update_wrapper` for Modules; and
`FunctionWrapper`, the base of the callable pytrees the filtered transforms
return."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax.tree_util as jtu

from ._attributes import copy_wrapped_attributes
from ._module import bind_wrapper

__all__ = ["FunctionWrapper", "module_update_wrapper"]

_ModuleT = TypeVar("_ModuleT")
_WrapperT = TypeVar("_WrapperT", bound="FunctionWrapper")


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
    copy_wrapped_attributes(attributes, wrapped, annotations=True)
    object.__setattr__(copy, "__dict__", attributes)
    return copy


def _unflatten_wrapper(
    cls: type[FunctionWrapper], options: tuple, children: Any
) -> Any:
    (fun,) = children
    return cls._from_options(fun, options)


class FunctionWrapper:
    """Base of the callables returned by the filtered transforms: one file per
    transform subclasses it and says how to call JAX.

    A registered pytree whose child is the wrapped function (so a Module method
    or `Partial` keeps its arrays visible to `filter_jit`), with the transform's
    options as static metadata: two wrappers of the same function with the
    same options flatten to equal static parts, so `filter_jit` shares their
    compilation. It carries the wrapped function's name, docstring (and
    annotations, unless the transform changes the shapes they describe) and
    `__wrapped__`. As a class attribute it binds like a method:
    `instance.method` is a [`BoundMethod`][filterax.BoundMethod] whose child is
    the instance, with `.lower` where the transform has one.

    Every subclass is registered as a pytree when it is defined. One whose
    `__init__` does not take `(fun, options)` overrides `_from_options`, which
    JAX's unflatten calls.
    """

    _transform_name = "transform"
    # Whether the wrapper shows the wrapped function's `__annotations__`: not
    # for a transform that changes the shapes they describe. (Not annotated: a
    # class annotation would show as the wrappers' own `__annotations__`.)
    _keeps_annotations = True

    def __init__(self, fun: Callable, options: tuple):
        self.fun = fun
        self.options = options
        attributes = self.__dict__
        copy_wrapped_attributes(attributes, fun, annotations=self._keeps_annotations)
        attributes["__wrapped__"] = fun

    @classmethod
    def _from_options(cls: type[_WrapperT], fun: Callable, options: tuple) -> _WrapperT:
        return cls(fun, options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - every transform defines it

    __get__ = bind_wrapper

    def __repr__(self) -> str:
        return (
            f"<{self._transform_name} of {getattr(self, '__qualname__', self.fun)!s}>"
        )

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
