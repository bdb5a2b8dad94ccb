"""`filter_eval_shape`: output shapes of a function of arbitrary pytrees."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
from jax.core import Tracer

from ._compat import traceback_boundary
from ._tree._filters import is_array, is_ref
from ._tree._split import StaticPart, split

__all__ = ["filter_eval_shape", "is_shaped"]


def is_shaped(leaf: Any) -> bool:
    """A leaf that stands for an array: an array or a `jax.ShapeDtypeStruct`."""
    return is_array(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)


def traced_call(
    fun: Callable[..., Any], args_static: StaticPart
) -> Callable[[list[Any]], tuple[list[Any], StaticPart]]:
    """The function JAX traces for `fun`: from the traced leaves of a call to
    the array leaves of the output and the output's `StaticPart` (which rides
    out of the trace in the treedef)."""

    def body(traced: list[Any]) -> tuple[list[Any], StaticPart]:
        call_args, call_kwargs = args_static.merge(traced)
        return split(fun(*call_args, **call_kwargs), is_array)

    return body


def _is_traced_input(leaf: Any) -> bool:
    return is_shaped(leaf) or is_ref(leaf)


def _ref_struct(leaf: Any) -> Any:
    """An output `jax.Ref` as the struct that stands for it: a traced Ref must
    not leave the trace (and cannot be returned from one)."""
    if is_ref(leaf):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, is_ref=True)
    return leaf


def _input_sharding(leaf: Any) -> Any:
    # An uncommitted array (on the default device because nothing placed it)
    # has no sharding to keep, as in `jax.eval_shape`: templates compare equal
    # whether a value was passed through or computed.
    if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer):
        if not leaf.committed:
            return None
    sharding = getattr(leaf, "sharding", None)
    return sharding if isinstance(sharding, jax.sharding.Sharding) else None


def _concrete_sharding(sharding: Any, meshes: dict[Any, Any]) -> Any:
    """`sharding` with an abstract mesh (what tracing gives on `Explicit` axes)
    turned back into one on the concrete mesh it stands for, found among the
    inputs' meshes or the one set by `jax.set_mesh`."""
    mesh = getattr(sharding, "mesh", None)
    if not isinstance(mesh, jax.sharding.AbstractMesh):
        return sharding
    concrete = meshes.get(mesh)
    if concrete is None:
        try:
            current = jax.sharding.get_mesh()
        except ValueError:
            # Inside a trace (a `filter_eval_shape` nested in another's
            # function): only the abstract mesh exists there; the outermost
            # call makes it concrete.
            current = None
        if getattr(current, "abstract_mesh", None) == mesh:
            concrete = current
    if concrete is None:
        return sharding
    return jax.sharding.NamedSharding(concrete, sharding.spec)


def _known_shardings(
    jaxpr: Any, input_shardings: list[Any], meshes: dict[Any, Any]
) -> list[Any]:
    """For each output of `jaxpr`: the sharding of the input it is, or the
    sharding given to it by the `jit` (its `out_shardings`) or the sharding
    constraint that produced it; `None` where the compiler will decide. Adds
    the concrete meshes the equations name to `meshes`."""
    inputs = {id(var): i for i, var in enumerate(jaxpr.invars)}
    producers: dict[int, tuple[Any, int]] = {}
    for eqn in jaxpr.eqns:
        for position, var in enumerate(eqn.outvars):
            producers[id(var)] = (eqn, position)
        mesh = eqn.params.get("concrete_mesh")  # a `reshard` on Explicit axes
        if isinstance(mesh, jax.sharding.Mesh):
            meshes.setdefault(mesh.abstract_mesh, mesh)
    known: list[Any] = []
    for var in jaxpr.outvars:
        sharding = None
        if id(var) in inputs:
            sharding = input_shardings[inputs[id(var)]]
        elif id(var) in producers:
            eqn, position = producers[id(var)]
            if "out_shardings" in eqn.params:
                sharding = eqn.params["out_shardings"][position]
            elif len(eqn.outvars) == 1:
                sharding = eqn.params.get("sharding", eqn.params.get("dst_sharding"))
        if not isinstance(sharding, jax.sharding.Sharding):
            sharding = None
        mesh = getattr(sharding, "mesh", None)
        if isinstance(mesh, jax.sharding.Mesh):
            meshes.setdefault(mesh.abstract_mesh, mesh)
        known.append(sharding)
    return known


@traceback_boundary
def filter_eval_shape(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The output shapes and dtypes of `fun(*args, **kwargs)`, computed without
    running it.

    Array leaves of the arguments and of `fun` itself (and
    `jax.ShapeDtypeStruct`s standing for arrays, so an abstract model made by
    `filter_eval_shape` can be called) are traced abstractly; so are
    `jax.Ref`s (and structs with `is_ref=True`), which come out as structs with
    `is_ref=True`. Every other leaf is passed as it is.

    Shardings are kept where they are known without compiling: an output that
    is an input passed through keeps the input's sharding; one placed by
    `jax.jit`'s `out_shardings` (such as a model from
    [`sharded_init`][filterax.sharded_init]) or, on `Explicit` mesh axes, by
    JAX's sharding-in-types, gets it on the concrete mesh (JAX's own
    `jax.eval_shape` gives an abstract mesh there, which loaders reject). On
    `Auto` axes the compiler decides the rest: give them shardings with
    [`filter_shard`][filterax.filter_shard] and
    [`sharding_of`][filterax.sharding_of] if a template needs them.

    **Arguments:**

    - `fun`: any callable (a function, a Module, a bound method).
    - `*args`, `**kwargs`: its arguments; arrays may be replaced by
      `jax.ShapeDtypeStruct`s.

    **Returns:** the output of `fun` with each array (and Ref) replaced by a
    `jax.ShapeDtypeStruct`; non-array outputs are the Python objects returned.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> def embed(tokens, table, mode):
    ...     return table[tokens], mode
    >>> fx.filter_eval_shape(embed, jax.ShapeDtypeStruct((5,), jnp.int32),
    ...                      jnp.zeros((100, 16)), "lookup")
    (ShapeDtypeStruct(shape=(5, 16), dtype=float32), 'lookup')
    >>> fx.filter_eval_shape(lambda: jax.new_ref(jnp.zeros(3)))
    ShapeDtypeStruct(shape=(3,), dtype=float32, is_ref=True)

    ```
    """
    # `fun`'s own arrays are traced too: an abstract model (itself made by
    # `filter_eval_shape`) is called on abstract inputs.
    dynamic, static = split((fun, args, kwargs), _is_traced_input)

    def body(traced: list[Any]) -> tuple[list[Any], StaticPart]:
        call_fun, call_args, call_kwargs = static.merge(traced)
        out = jtu.tree_map(_ref_struct, call_fun(*call_args, **call_kwargs))
        return split(out, is_array)

    # One trace, as `jax.eval_shape` would do, but keeping the jaxpr: where an
    # output comes from says what is known of its sharding before compiling.
    closed, (out_dynamic, out_static) = jax.make_jaxpr(body, return_shape=True)(dynamic)
    input_shardings = [_input_sharding(leaf) for leaf in dynamic]
    meshes = {
        sharding.mesh.abstract_mesh: sharding.mesh
        for sharding in input_shardings
        if isinstance(getattr(sharding, "mesh", None), jax.sharding.Mesh)
    }
    known = _known_shardings(closed.jaxpr, input_shardings, meshes)
    structs = []
    for i, struct in enumerate(out_dynamic):
        sharding = struct.sharding if known[i] is None else known[i]
        sharding = _concrete_sharding(sharding, meshes)
        if sharding is not struct.sharding:
            struct = jax.ShapeDtypeStruct(
                struct.shape,
                struct.dtype,
                sharding=sharding,
                weak_type=struct.weak_type,
            )
        structs.append(struct)
    return out_static.merge(structs)
