"""The callable pytrees returned by the differentiation transforms, and the
argument handling they share."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.tree_util as jtu

from .._module import BoundMethod
from ._perturbation import describe_leaf

__all__ = ["FunctionWrapper", "first_argument", "unpack_aux"]


def unpack_aux(result: Any, name: str) -> tuple[Any, Any]:
    """Splits `(value, aux)` returned by a `has_aux=True` function."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError(
            f"{name} was given has_aux=True, so `fun` must return a pair "
            f"(output, aux); it returned {describe_leaf(result)}."
        )
    return result[0], result[1]


def first_argument(args: tuple, kwargs: dict, name: str) -> tuple[Any, tuple]:
    """The argument a transform differentiates, with the remaining positional
    arguments; a clear error if it was not given positionally."""
    if args:
        return args[0], args[1:]
    if kwargs:
        raise TypeError(
            f"Functions wrapped with {name} must have their first argument passed "
            "positionally: it is the one differentiated, but the function was "
            f"called with keyword arguments only ({', '.join(kwargs)})."
        )
    raise TypeError(
        f"Functions wrapped with {name} must have their first argument passed "
        "positionally: it is the one differentiated, but the function was called "
        "with no arguments."
    )


def _unflatten_wrapper(cls: type, options: tuple, children: Any) -> Any:
    (fun,) = children
    return cls(fun, options)


class FunctionWrapper:
    """Base of the callables returned by the filtered transforms.

    A registered pytree whose child is the wrapped function (so a Module method
    or `Partial` keeps its arrays visible to `filter_jit`), with the transform's
    options as static metadata: two wrappers of the same function with the
    same options flatten to equal static parts, so `filter_jit` shares their
    compilation. As a class attribute it binds like a method:
    `instance.method(*args)` calls the wrapper with `instance` first.
    """

    _transform_name = "transform"

    def __init__(self, fun: Callable, options: tuple):
        self.fun = fun
        self.options = options
        functools.update_wrapper(self, fun, updated=())  # type: ignore[arg-type]

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
