"""Filtered gradients, forward-mode derivatives and Jacobians.

Every transform here differentiates the *differentiable* leaves only: inexact
arrays outside any `NonDifferentiable`. Everything else is carried through
untouched and gets `None` as its gradient, tangent or Jacobian.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._ad_utils import (
    FunctionWrapper,
    describe_leaf,
    first_argument,
    match_perturbation,
    merge_output,
    skeleton,
    split_output,
    unpack_aux,
)
from ._filters import combine, is_array, partition
from ._nondiff import partition_differentiable
from ._static import Static

__all__ = [
    "filter_grad",
    "filter_hessian",
    "filter_jacfwd",
    "filter_jacrev",
    "filter_jvp",
    "filter_value_and_grad",
]


# ---------------------------------------------------------------------------
# filter_grad, filter_value_and_grad


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


class _ValueAndGrad(FunctionWrapper):
    _transform_name = "filter_value_and_grad"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (has_aux,) = self.options
        return _value_and_grad(self.fun, has_aux, self._transform_name, args, kwargs)


class _Grad(FunctionWrapper):
    _transform_name = "filter_grad"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (has_aux,) = self.options
        value, grad = _value_and_grad(
            self.fun, has_aux, self._transform_name, args, kwargs
        )
        return (grad, value[1]) if has_aux else grad


def _value_and_grad(
    fun: Callable, has_aux: bool, name: str, args: tuple, kwargs: dict
) -> Any:
    x, other_args = first_argument(args, kwargs, name)
    diff, rest = partition_differentiable(x)

    def differentiable_part(diff_x: Any) -> Any:
        result = fun(combine(diff_x, rest), *other_args, **kwargs)
        if not has_aux:
            return _check_scalar_output(result, name)
        value, aux = unpack_aux(result, name)
        aux_arrays, aux_objects = partition(aux, is_array)
        return _check_scalar_output(value, name), (aux_arrays, Static(aux_objects))

    if not has_aux:
        return jax.value_and_grad(differentiable_part)(diff)
    (value, (aux_arrays, aux_objects)), grad = jax.value_and_grad(
        differentiable_part, has_aux=True
    )(diff)
    return (value, combine(aux_arrays, aux_objects.value)), grad


def filter_value_and_grad(
    fun: Callable | None = None, *, has_aux: bool = False
) -> Callable:
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


def filter_grad(fun: Callable | None = None, *, has_aux: bool = False) -> Callable:
    """The gradient of `fun` with respect to the differentiable leaves of its
    first positional argument.

    A leaf is differentiable when it is a floating-point or complex array not
    inside a [`NonDifferentiable`][filterax.NonDifferentiable]. All other leaves
    (integer, boolean and key arrays, Python objects, marked values) and all
    other arguments are held constant.

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


# ---------------------------------------------------------------------------
# filter_jvp


def filter_jvp(
    fun: Callable, primals: Any, tangents: Any, has_aux: bool = False
) -> tuple[Any, ...]:
    """Forward-mode derivative (Jacobian-vector product) of `fun` at `primals`.

    Only differentiable leaves (inexact arrays outside any `NonDifferentiable`)
    are perturbed. A `None` or [`SymbolicZero`][filterax.SymbolicZero] tangent
    means "not perturbed" and costs nothing: that input is held constant.

    **Arguments:**

    - `fun`: called as `fun(*primals)`; may return any pytree.
    - `primals`: a tuple or list of positional arguments.
    - `tangents`: a tuple or list of the same length; each entry has its
      primal's structure, with `None` or a `SymbolicZero` allowed in place of
      any leaf or subtree. Non-differentiable leaves accept only these.
    - `has_aux`: whether `fun` returns `(output, aux)`; `aux` is returned
      undifferentiated.

    **Returns:** `(out, t_out)`, or `(out, t_out, aux)` when `has_aux=True`.
    `t_out` has `out`'s structure with a tangent at every differentiable output
    leaf and `None` at every other one.

    **Raises:** `TypeError` when `primals`/`tangents` are not sequences of equal
    length; `ValueError` naming the key path (e.g. `tangents[0]['n']`) when a
    tangent does not fit its primal.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> def f(p):
    ...     return {"y": p["x"] ** 2, "n": p["n"] + 1}
    >>> primals = ({"x": jnp.array([3.0]), "n": jnp.array([1])},)
    >>> out, t_out = fx.filter_jvp(f, primals, ({"x": jnp.array([1.0]), "n": None},))
    >>> t_out
    {'n': None, 'y': Array([6.], dtype=float32)}

    ```
    """
    if not isinstance(primals, (tuple, list)) or not isinstance(
        tangents, (tuple, list)
    ):
        raise TypeError(
            "filter_jvp needs `primals` and `tangents` to be tuples (or lists) of "
            f"positional arguments; got {type(primals).__name__} and "
            f"{type(tangents).__name__}."
        )
    if len(primals) != len(tangents):
        raise TypeError(
            f"filter_jvp got {len(primals)} primals but {len(tangents)} tangents; "
            "give one tangent (or None) per primal."
        )
    primals = tuple(primals)
    diff, rest = partition_differentiable(primals)
    diff_leaves, diff_def = jtu.tree_flatten(diff)
    live = match_perturbation(tuple(tangents), skeleton(primals), "tangent", "tangents")
    live_indices = tuple(index for index, _ in live)

    def perturbed_part(live_primals: tuple) -> Any:
        # Unperturbed inputs are closed over as constants, so no tangent work
        # is traced for them at all.
        leaves = list(diff_leaves)
        for index, value in zip(live_indices, live_primals):
            leaves[index] = value
        result = fun(*combine(jtu.tree_unflatten(diff_def, leaves), rest))
        out, aux = unpack_aux(result, "filter_jvp") if has_aux else (result, None)
        out_diff, out_arrays, out_objects = split_output(out)
        aux_arrays, aux_objects = partition(aux, is_array)
        return out_diff, (out_arrays, out_objects, aux_arrays, Static(aux_objects))

    live_primals = tuple(diff_leaves[index] for index in live_indices)
    live_tangents = tuple(value for _, value in live)
    out_diff, t_out, (out_arrays, out_objects, aux_arrays, aux_objects) = jax.jvp(
        perturbed_part, (live_primals,), (live_tangents,), has_aux=True
    )
    out = merge_output(out_diff, out_arrays, out_objects)
    if has_aux:
        return out, t_out, combine(aux_arrays, aux_objects.value)
    return out, t_out


# ---------------------------------------------------------------------------
# filter_jacfwd, filter_jacrev, filter_hessian


class _Jacobian(FunctionWrapper):
    _transform_name = "filter_jacobian"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        has_aux, reverse = self.options
        name = "filter_jacrev" if reverse else "filter_jacfwd"
        x, other_args = first_argument(args, kwargs, name)
        diff, rest = partition_differentiable(x)

        def differentiable_part(diff_x: Any, traced: bool = True) -> Any:
            result = self.fun(combine(diff_x, rest), *other_args, **kwargs)
            out, aux = unpack_aux(result, name) if has_aux else (result, None)
            aux_arrays, aux_objects = partition(aux, is_array)
            out_diff, _, _ = split_output(out)
            if traced and not jtu.tree_leaves(out_diff):
                raise _NoOutputs
            return out_diff, (aux_arrays, Static(aux_objects))

        jacobian = jax.jacrev if reverse else jax.jacfwd
        try:
            if not jtu.tree_leaves(diff):
                raise _NoOutputs
            jac, (aux_arrays, aux_objects) = jacobian(
                differentiable_part, has_aux=True
            )(diff)
        except _NoOutputs:
            # JAX cannot build a Jacobian with no inputs or no outputs; every
            # block is empty, so the answer is all `None`s.
            out_diff, (aux_arrays, aux_objects) = differentiable_part(diff, False)
            jac = jtu.tree_map(lambda _: diff, out_diff)
        aux = combine(aux_arrays, aux_objects.value)
        return (jac, aux) if has_aux else jac


class _NoOutputs(Exception):
    """Raised while tracing when there is nothing to differentiate."""


def filter_jacfwd(fun: Callable, has_aux: bool = False) -> Callable:
    """The Jacobian of `fun` with respect to the differentiable leaves of its
    first argument, computed in forward mode (one JVP per input element).

    **Arguments:**

    - `fun`: the function to differentiate; may return any pytree.
    - `has_aux`: whether `fun` returns `(output, aux)`.

    **Returns:** a function with `fun`'s arguments returning the Jacobian: the
    output's structure, where each differentiable output leaf of shape `o`
    holds a pytree of the first argument's structure whose differentiable
    leaves of shape `i` hold arrays of shape `o + i`, and `None` elsewhere.
    Non-differentiable output leaves become `None`. With `has_aux=True`,
    returns `(jacobian, aux)`.

    **Raises:** `TypeError` when the first argument is missing or passed by
    keyword.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> jac = fx.filter_jacfwd(lambda p: p["x"] * p["n"])
    >>> jac({"x": jnp.array([1.0, 2.0]), "n": 3})
    {'n': None, 'x': Array([[3., 0.],
                           [0., 3.]], dtype=float32)}

    ```
    """
    return _Jacobian(fun, (has_aux, False))


def filter_jacrev(fun: Callable, has_aux: bool = False) -> Callable:
    """The Jacobian of `fun` with respect to the differentiable leaves of its
    first argument, computed in reverse mode (one VJP per output element).

    **Arguments:** as for [`filter_jacfwd`][filterax.filter_jacfwd].

    **Returns:** as for [`filter_jacfwd`][filterax.filter_jacfwd].

    **Raises:** as for [`filter_jacfwd`][filterax.filter_jacfwd].

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> jac = fx.filter_jacrev(lambda x, label: {"sum": x.sum(), "label": label})
    >>> jac(jnp.array([1.0, 2.0]), "total")
    {'label': None, 'sum': Array([1., 1.], dtype=float32)}

    ```
    """
    return _Jacobian(fun, (has_aux, True))


def filter_hessian(fun: Callable, has_aux: bool = False) -> Callable:
    """The Hessian of a scalar-valued `fun` with respect to the differentiable
    leaves of its first argument (forward-over-reverse).

    **Arguments:**

    - `fun`: returns a real scalar (or `(scalar, aux)` with `has_aux=True`).
    - `has_aux`: whether `fun` returns auxiliary data.

    **Returns:** a function returning the Hessian: a pytree of the first
    argument's structure whose differentiable leaves each hold a pytree of that
    structure again (blocks of shape `i + j`), `None` elsewhere. With
    `has_aux=True`, returns `(hessian, aux)`.

    **Raises:** `TypeError` when the first argument is missing or passed by
    keyword.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> hess = fx.filter_hessian(lambda x: (x ** 3).sum())
    >>> hess(jnp.array([1.0, 2.0]))
    Array([[ 6.,  0.],
           [ 0., 12.]], dtype=float32)

    ```
    """
    return filter_jacfwd(filter_jacrev(fun, has_aux=has_aux), has_aux=has_aux)
