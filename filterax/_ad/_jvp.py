"""`filter_jvp`: forward-mode derivatives of functions of any pytrees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, overload

import jax
import jax.tree_util as jtu
from jax.core import eval_jaxpr

from .._compat import outputs_depending_on_inputs, traceback_boundary
from .._tree._filters import combine, is_array, is_inexact_array_like
from .._tree._split import split
from ._nondiff import partition_differentiable
from ._perturbation import (
    match_perturbation,
    merge_differentiable,
    skeleton,
    split_differentiable,
)
from ._refs import STOP_GRADIENT, shield_refs, unshield_refs
from ._wrapper import unpack_aux

__all__ = ["filter_jvp"]


@overload
def filter_jvp(
    fun: Callable[..., Any],
    primals: Any,
    tangents: Any,
    has_aux: Literal[False] = False,
) -> tuple[Any, Any]: ...
@overload
def filter_jvp(
    fun: Callable[..., Any], primals: Any, tangents: Any, has_aux: Literal[True]
) -> tuple[Any, Any, Any]: ...
@traceback_boundary
def filter_jvp(
    fun: Callable[..., Any], primals: Any, tangents: Any, has_aux: bool = False
) -> tuple[Any, ...]:
    """Forward-mode derivative (Jacobian-vector product) of `fun` at `primals`.

    The perturbable leaves are the inexact array-likes (floating or complex
    arrays, Python `float`s and `complex`es) outside any `NonDifferentiable`,
    as in Equinox. A `None` or [`SymbolicZero`][filterax.SymbolicZero] tangent
    means "not perturbed" and costs nothing: that input is held constant. `fun`
    may read and write `jax.Ref`s in its arguments; a value written is stored
    with `stop_gradient` applied.

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
    leaf that depends on a perturbed input, and `None` at every other one
    (non-differentiable outputs, and outputs whose tangent is symbolically
    zero).

    **Raises:** `TypeError` when `primals`/`tangents` are not sequences of equal
    length; a `ValueError` (which is also a `TypeError`, as Equinox raises)
    naming the key path (e.g. `tangents[0]['n']`) when a tangent does not fit
    its primal.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> def f(p, scale):
    ...     return {"y": scale * p["x"] ** 2, "n": p["n"] + 1, "c": jnp.ones(1)}
    >>> primals = ({"x": jnp.array([3.0]), "n": jnp.array([1])}, 2.0)
    >>> out, t_out = fx.filter_jvp(f, primals, ({"x": jnp.array([1.0]), "n": None}, None))
    >>> t_out
    {'c': None, 'n': None, 'y': Array([12.], dtype=float32)}

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
    diff, rest = partition_differentiable(primals, is_inexact_array_like)
    diff_leaves, diff_def = jtu.tree_flatten(diff)
    live = match_perturbation(
        tuple(tangents),
        skeleton(primals, is_inexact_array_like),
        "tangent",
        "tangents",
    )
    live_indices = tuple(index for index, _ in live)
    rest = shield_refs(rest, STOP_GRADIENT)

    def perturbed_part(live_primals: tuple) -> Any:
        # Unperturbed inputs are closed over as constants, so no tangent work
        # is traced for them at all.
        leaves = list(diff_leaves)
        for index, value in zip(live_indices, live_primals):
            leaves[index] = value
        result = fun(*combine(jtu.tree_unflatten(diff_def, leaves), rest))
        out, aux = unpack_aux(result, "filter_jvp") if has_aux else (result, None)
        out_diff, out_arrays, out_objects = split_differentiable(
            unshield_refs(out), is_inexact_array_like
        )
        aux_arrays, aux_static = split(unshield_refs(aux), is_array)
        return out_diff, (out_arrays, out_objects, aux_arrays, aux_static)

    live_primals = tuple(diff_leaves[index] for index in live_indices)
    live_tangents = tuple(value for _, value in live)
    out_diff, linear, (out_arrays, out_objects, aux_arrays, aux_static) = jax.linearize(
        perturbed_part, live_primals, has_aux=True
    )
    # `out_diff` holds `None` wherever the output is not differentiable.
    t_out = _tangents_or_none(linear, live_tangents, out_diff)
    out = merge_differentiable(out_diff, out_arrays, out_objects)
    if has_aux:
        return out, t_out, aux_static.merge(aux_arrays)
    return out, t_out


def _tangents_or_none(linear: Callable, live_tangents: tuple, out_diff: Any) -> Any:
    """The output tangents, with `None` where the tangent is symbolically zero:
    the linearised function's output does not depend on any input tangent."""
    leaves, treedef = jtu.tree_flatten(out_diff)
    if not leaves:
        return out_diff
    if not live_tangents:
        return jtu.tree_unflatten(treedef, [None] * len(leaves))
    # Traced once: the jaxpr both says which outputs depend on the tangents
    # and computes them.
    closed = jax.make_jaxpr(lambda t: jtu.tree_leaves(linear(t)))(live_tangents)
    dependent = outputs_depending_on_inputs(closed)
    tangents = eval_jaxpr(closed.jaxpr, closed.consts, *jtu.tree_leaves(live_tangents))
    return jtu.tree_unflatten(
        treedef, [t if d else None for t, d in zip(tangents, dependent)]
    )
