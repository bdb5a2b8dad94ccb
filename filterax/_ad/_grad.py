"""`filter_grad` and `filter_value_and_grad`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np

from .._compat import traceback_boundary
from .._module import FunctionWrapper
from .._tree._filters import combine, is_array
from .._tree._split import split
from ._nondiff import partition_differentiable
from ._perturbation import describe_leaf
from ._refs import STOP_GRADIENT, shield_refs, unshield_refs
from ._wrapper import first_argument, unpack_aux, warn_if_nothing_differentiable

__all__ = ["filter_grad", "filter_value_and_grad"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _check_scalar_output(value: Any, name: str) -> Any:
    if isinstance(value, float):
        return value
    if (
        is_array(value)
        and value.shape == ()
        and jnp.issubdtype(value.dtype, np.floating)
    ):
        return value
    if isinstance(value, (tuple, list)):
        hint = " (it returned a tuple; pass has_aux=True if it returns (value, aux))"
    else:
        hint = ""
    raise TypeError(
        f"{name} needs `fun` to return a real floating-point scalar (shape ()), "
        f"but it returned {describe_leaf(value)}{hint}."
    )


def value_and_grad(
    fun: Callable, has_aux: bool, name: str, args: tuple, kwargs: dict
) -> Any:
    """`((value[, aux]), grad)` of `fun(*args, **kwargs)` with respect to the
    differentiable leaves of `args[0]`."""
    x, other_args = first_argument(args, kwargs, name)
    diff, rest = partition_differentiable(x)
    warn_if_nothing_differentiable(diff, x, fun, name, "the first argument")
    rest, other_args, kwargs = shield_refs((rest, other_args, kwargs), STOP_GRADIENT)

    def differentiable_part(diff_x: Any) -> Any:
        result = fun(combine(diff_x, rest), *other_args, **kwargs)
        if not has_aux:
            return _check_scalar_output(result, name)
        value, aux = unpack_aux(result, name)
        return _check_scalar_output(value, name), split(unshield_refs(aux), is_array)

    if not has_aux:
        return jax.value_and_grad(differentiable_part)(diff)
    (value, (aux_arrays, aux_static)), grad = jax.value_and_grad(
        differentiable_part, has_aux=True
    )(diff)
    return (value, aux_static.merge(aux_arrays)), grad


class _ValueAndGrad(FunctionWrapper):
    _transform_name = "filter_value_and_grad"

    @traceback_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (has_aux,) = self.options
        return value_and_grad(self.fun, has_aux, self._transform_name, args, kwargs)


class _Grad(FunctionWrapper):
    _transform_name = "filter_grad"

    @traceback_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (has_aux,) = self.options
        value, grad = value_and_grad(
            self.fun, has_aux, self._transform_name, args, kwargs
        )
        return (grad, value[1]) if has_aux else grad


@overload
def filter_value_and_grad(
    fun: Callable[..., Any], *, has_aux: Literal[False] = False
) -> Callable[..., tuple[Any, Any]]: ...
@overload
def filter_value_and_grad(
    fun: Callable[..., Any], *, has_aux: Literal[True]
) -> Callable[..., tuple[tuple[Any, Any], Any]]: ...
@overload
def filter_value_and_grad(
    fun: None = None, *, has_aux: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def filter_value_and_grad(
    fun: Callable[..., Any] | None = None, *, has_aux: bool = False
) -> Any:
    """Like [`filter_grad`][filterax.filter_grad], but also returns the value.

    **Arguments:** as for [`filter_grad`][filterax.filter_grad]; also usable as
    `@filter_value_and_grad` or `@filter_value_and_grad(has_aux=True)`.

    **Returns:** a function returning `(value, grad)`, or
    `((value, aux), grad)` when `has_aux=True`.

    **Raises:** as for [`filter_grad`][filterax.filter_grad].

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_value_and_grad
    ... def loss(params):
    ...     return (params["w"] ** 2).sum()
    >>> loss({"w": jnp.array([1.0, 2.0]), "name": "quadratic"})
    (Array(5., dtype=float32), {'name': None, 'w': Array([2., 4.], dtype=float32)})

    ```
    """
    if fun is None:
        return functools.partial(filter_value_and_grad, has_aux=has_aux)
    return _ValueAndGrad(fun, (has_aux,))


@overload
def filter_grad(
    fun: Callable[..., Any], *, has_aux: Literal[False] = False
) -> Callable[..., Any]: ...
@overload
def filter_grad(
    fun: Callable[..., Any], *, has_aux: Literal[True]
) -> Callable[..., tuple[Any, Any]]: ...
@overload
def filter_grad(
    fun: None = None, *, has_aux: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def filter_grad(fun: Callable[..., Any] | None = None, *, has_aux: bool = False) -> Any:
    """The gradient of `fun` with respect to the differentiable leaves of its
    first positional argument.

    A leaf is differentiable when it is a floating-point or complex array not
    inside a [`NonDifferentiable`][filterax.NonDifferentiable]. All other leaves
    (integer, boolean and key arrays, Python objects, marked values, Refs) and
    all other arguments are held constant. `fun` may read and write `jax.Ref`s
    in its arguments: a value written is stored with `stop_gradient` applied
    (state is never differentiated), and a Ref's gradient is `None`.

    **Arguments:**

    - `fun`: the function to differentiate. It must return a real
      floating-point scalar, or a pair `(scalar, aux)` when `has_aux=True`
      (`aux` may be any pytree).
    - `has_aux`: whether `fun` returns auxiliary data.

    Use as `filter_grad(fun)`, `@filter_grad` or `@filter_grad(has_aux=True)`.

    **Returns:** a function with `fun`'s arguments, returning the gradient: a
    pytree of the first argument's structure with gradients at differentiable
    leaves and `None` everywhere else (a `NonDifferentiable` becomes one
    `None`). With `has_aux=True` it returns `(gradient, aux)`.

    **Raises:** `TypeError` when `fun` does not return a real scalar (the
    message gives what it returned), or when the first argument is missing or
    passed by keyword.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> params = {"w": jnp.array([1.0, 2.0]), "step": jnp.array(3),
    ...           "key": jax.random.key(0), "frozen": fx.NonDifferentiable(jnp.ones(2))}
    >>> @fx.filter_grad
    ... def loss(params, scale):
    ...     return scale * (params["w"] * params["frozen"].value).sum()
    >>> loss(params, 3.0)
    {'frozen': None, 'key': None, 'step': None, 'w': Array([3., 3.], dtype=float32)}

    ```
    """
    if fun is None:
        return functools.partial(filter_grad, has_aux=has_aux)
    return _Grad(fun, (has_aux,))
