"""`filter_jacfwd`, `filter_jacrev` and `filter_hessian`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from .._compat import traceback_boundary
from .._module import FunctionWrapper
from .._tree._filters import combine, is_array, is_inexact_array_like
from .._tree._split import split
from ._nondiff import partition_differentiable
from ._perturbation import split_differentiable
from ._refs import STOP_GRADIENT, shield_refs
from ._wrapper import first_argument, unpack_aux

__all__ = ["filter_hessian", "filter_jacfwd", "filter_jacrev"]


class _Jacobian(FunctionWrapper):
    @property
    def _transform_name(self) -> str:  # type: ignore[override]
        return "filter_jacrev" if self.options[1] else "filter_jacfwd"

    @traceback_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        has_aux, reverse = self.options
        name = self._transform_name
        x, other_args = first_argument(args, kwargs, name)
        diff, rest = partition_differentiable(x)
        rest, other_args, kwargs = shield_refs(
            (rest, other_args, kwargs), STOP_GRADIENT
        )

        def differentiable_part(diff_x: Any, traced: bool = True) -> Any:
            result = self.fun(combine(diff_x, rest), *other_args, **kwargs)
            out, aux = unpack_aux(result, name) if has_aux else (result, None)
            aux_parts = split(aux, is_array)
            # A Python float output gets its (zero) Jacobian, as from JAX's.
            out_diff, _, _ = split_differentiable(out, is_inexact_array_like)
            if traced and not jtu.tree_leaves(out_diff):
                raise _NoOutputs
            return out_diff, aux_parts

        jacobian = jax.jacrev if reverse else jax.jacfwd
        try:
            if not jtu.tree_leaves(diff):
                raise _NoOutputs
            jac, (aux_arrays, aux_static) = jacobian(differentiable_part, has_aux=True)(
                diff
            )
        except _NoOutputs:
            # JAX cannot build a Jacobian with no inputs or no outputs; every
            # block is empty, so the answer is all `None`s.
            out_diff, (aux_arrays, aux_static) = differentiable_part(diff, False)
            jac = jtu.tree_map(lambda _: diff, out_diff)
        aux = aux_static.merge(aux_arrays)
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
    Non-differentiable output leaves become `None` (a Python float output
    counts as differentiable: its Jacobian is zeros). With `has_aux=True`,
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
