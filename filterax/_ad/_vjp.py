"""`filter_vjp`: reverse-mode derivatives whose backward pass only does the work
the given cotangent needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from .._compat import traceback_boundary
from .._tree._filters import combine, is_array
from .._tree._split import PyTreeDef, split
from ._nondiff import partition_differentiable
from ._perturbation import (
    match_perturbation,
    merge_differentiable,
    skeleton,
    split_differentiable,
)
from ._refs import STOP_GRADIENT, shield_refs, unshield_refs
from ._wrapper import unpack_aux, warn_if_nothing_differentiable

__all__ = ["filter_vjp"]


class _VJPStatic:
    """The hashable, array-free part of a `VJPFunction` (its pytree metadata).

    - `out_def`, `out_infos`: the output's treedef and a `LeafInfo` per leaf,
      against which cotangents are matched.
    - `primal_def`, `primal_avals`: the differentiable part of the primals (a
      tuple, `None` at non-differentiable positions) and the shape/dtype of
      each of its leaves, which is what the backward pass produces.
    """

    __slots__ = ("out_def", "out_infos", "primal_avals", "primal_def", "structure")

    def __init__(
        self,
        out_def: PyTreeDef,
        out_infos: tuple,
        primal_def: PyTreeDef,
        primal_avals: tuple[jax.ShapeDtypeStruct, ...],
    ):
        self.out_def = out_def
        self.out_infos = out_infos
        self.primal_def = primal_def
        self.primal_avals = primal_avals
        # The output as a pytree of `LeafInfo`s, to match cotangents against.
        self.structure = jtu.tree_unflatten(out_def, out_infos)

    def _key(self) -> tuple:
        return (self.out_def, self.out_infos, self.primal_def, self.primal_avals)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _VJPStatic) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


class VJPFunction:
    """The `vjp_fn` returned by [`filter_vjp`][filterax.filter_vjp].

    A pytree: its children are the linearised function (whose leaves are the
    residuals saved by the forward pass), its metadata the output and primal
    structures. So it can be returned from one jitted function and passed into
    another.
    """

    __slots__ = ("_transposes", "linear_fn", "static")

    def __init__(self, linear_fn: Callable[..., Any], static: _VJPStatic):
        self.linear_fn = linear_fn
        self.static = static
        # The transposed linear map for each set of live outputs, built once:
        # building it traces the linear map, which would otherwise happen on
        # every (eager) call.
        self._transposes: dict[tuple[int, ...], Callable[..., Any]] = {}

    def __call__(self, cotangent: Any) -> tuple[Any, ...]:
        """Pulls `cotangent` back to the primals.

        **Arguments:**

        - `cotangent`: the output's structure, or a prefix of it, with `None`
          or a [`SymbolicZero`][filterax.SymbolicZero] in place of any leaf or
          subtree; elsewhere an array of the output leaf's shape and dtype.

        **Returns:** a tuple with one cotangent per primal, each with its
        primal's structure and `None` at non-differentiable positions.

        **Raises:** `ValueError` naming the output key path (e.g.
        `out['alpha']`) when a cotangent has the wrong shape, dtype or
        structure, or is given for a non-differentiable output.
        """
        static = self.static
        live = match_perturbation(cotangent, static.structure, "cotangent", "out")
        if not live:
            return tuple(
                jtu.tree_unflatten(
                    static.primal_def,
                    [jnp.zeros(aval.shape, aval.dtype) for aval in static.primal_avals],
                )
            )
        live_indices = tuple(index for index, _ in live)
        transpose = self._transposes.get(live_indices)
        if transpose is None:
            transpose = self._transposes[live_indices] = self._transpose(live_indices)
        (grads,) = transpose(tuple(value for _, value in live))
        return tuple(grads)

    def _transpose(self, live_indices: tuple[int, ...]) -> Callable[..., Any]:
        linear_fn = self.linear_fn

        def live_outputs(diff_tangent: Any) -> tuple[Any, ...]:
            # The linear map restricted to outputs with a cotangent: the others
            # never reach the transposed computation, so their backward work
            # (and the residuals only they need) disappears.
            tangents = jtu.tree_leaves(linear_fn(diff_tangent))
            return tuple(tangents[index] for index in live_indices)

        static = self.static
        diff_avals = jtu.tree_unflatten(static.primal_def, static.primal_avals)
        return jax.linear_transpose(live_outputs, diff_avals)

    def __repr__(self) -> str:
        return f"VJPFunction(out={self.static.out_def})"


def _unflatten_vjp(static: _VJPStatic, children: Any) -> VJPFunction:
    (linear_fn,) = children
    return VJPFunction(linear_fn, static)


jtu.register_pytree_with_keys(
    VJPFunction,
    lambda f: (((jtu.GetAttrKey("linear_fn"), f.linear_fn),), f.static),
    _unflatten_vjp,
    flatten_func=lambda f: ((f.linear_fn,), f.static),
)


@overload
def filter_vjp(
    fun: Callable, *primals: Any, has_aux: Literal[False] = False
) -> tuple[Any, VJPFunction]: ...
@overload
def filter_vjp(
    fun: Callable, *primals: Any, has_aux: Literal[True]
) -> tuple[Any, VJPFunction, Any]: ...
@traceback_boundary
def filter_vjp(fun: Callable, *primals: Any, has_aux: bool = False) -> tuple[Any, ...]:
    """Reverse-mode derivative (vector-Jacobian product) of `fun` at `primals`.

    Differentiates with respect to the differentiable leaves (inexact arrays
    outside any `NonDifferentiable`) of every primal; everything else is held
    constant. `fun` may return any pytree: arrays, integers, keys, Python
    objects, `NonDifferentiable` values.

    **Arguments:**

    - `fun`: called as `fun(*primals)`.
    - `*primals`: its positional arguments.
    - `has_aux`: whether `fun` returns `(output, aux)`; `aux` is returned
      undifferentiated.

    **Returns:** `(out, vjp_fn)`, or `(out, vjp_fn, aux)` with `has_aux=True`.
    `vjp_fn(cotangent)` takes a cotangent with `out`'s structure (or a prefix
    of it), where `None` or a [`SymbolicZero`][filterax.SymbolicZero] may
    replace any leaf or subtree. Outputs without a cotangent cost no backward
    computation: the compiled backward pass is the one for a function that only
    returned the remaining outputs. Non-differentiable outputs (integer, key
    and boolean arrays, Python objects, `NonDifferentiable` contents) only
    accept `None`/`SymbolicZero`. `vjp_fn` returns a tuple with one cotangent
    per primal, shaped like that primal with `None` at its non-differentiable
    leaves. `vjp_fn` is a pytree, so it can cross `jit` boundaries.

    **Raises:** `ValueError` from `vjp_fn` naming the output key path when a
    cotangent has the wrong shape, dtype or structure.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> def losses(params, data):
    ...     return {"fit": ((params["w"] * data) ** 2).sum(),
    ...             "reg": (params["w"] ** 2).sum(), "calls": 1}
    >>> params = {"w": jnp.array([1.0, 2.0]), "name": "toy"}
    >>> out, vjp_fn = fx.filter_vjp(losses, params, jnp.array([3.0, 4.0]))
    >>> out["fit"]
    Array(73., dtype=float32)
    >>> cotangent = {"fit": None, "reg": jnp.ones(()), "calls": None}
    >>> grad_params, grad_data = vjp_fn(cotangent)
    >>> grad_params
    {'name': None, 'w': Array([2., 4.], dtype=float32)}
    >>> grad_data
    Array([0., 0.], dtype=float32)

    ```
    """
    diff, rest = partition_differentiable(primals)
    warn_if_nothing_differentiable(diff, primals, fun, "filter_vjp", "the primals")
    rest = shield_refs(rest, STOP_GRADIENT)

    def differentiable_part(diff_primals: tuple) -> Any:
        result = fun(*combine(diff_primals, rest))
        out, aux = unpack_aux(result, "filter_vjp") if has_aux else (result, None)
        out_diff, out_arrays, out_objects = split_differentiable(unshield_refs(out))
        aux_arrays, aux_static = split(unshield_refs(aux), is_array)
        return out_diff, (out_arrays, out_objects, aux_arrays, aux_static)

    out_diff, linear_fn, (out_arrays, out_objects, aux_arrays, aux_static) = (
        jax.linearize(differentiable_part, diff, has_aux=True)
    )
    out = merge_differentiable(out_diff, out_arrays, out_objects)
    out_infos, out_def = jtu.tree_flatten(skeleton(out))
    diff_leaves, diff_def = jtu.tree_flatten(diff)
    avals = tuple(
        jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=_weak_type(leaf))
        for leaf in diff_leaves
    )
    vjp_fn = VJPFunction(
        linear_fn, _VJPStatic(out_def, tuple(out_infos), diff_def, avals)
    )
    if has_aux:
        return out, vjp_fn, aux_static.merge(aux_arrays)
    return out, vjp_fn


def _weak_type(leaf: Any) -> bool:
    return bool(getattr(leaf, "weak_type", False))
