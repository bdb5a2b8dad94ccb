"""`filter_jit(in_shardings=..., out_shardings=...)`: where arrays are laid out.

A `Layout` holds the two prefixes as the user gave them: the one of the pair
`(args, kwargs)` and the one of the output, each leaf a `jax.sharding.Sharding`,
a `PartitionSpec` (under `jax.set_mesh`) or `None` (unconstrained). It is
hashable, being part of the key that finds a function's shared `Compiled`.

Everything is done inside the trace, once per compilation: the traced inputs
and outputs get `filter_shard`'s constraint (`with_sharding_constraint`, or
`reshard` on `Explicit` axes), so the compiled program is the one `jax.jit`
builds with the same shardings, for the direct and the keyed route, `.lower`
and donation alike. Outputs that `out_shardings` leaves unconstrained and that
have the structure, shapes and dtypes of an argument given shardings (the
`mu` and `nu` optax builds with `zeros_like(params)`, an updated model) are
laid out like that argument: on `Auto` mesh axes JAX would otherwise leave
them to XLA, which places a value computed from no input on one device, or
replicates it.

Before a call, `place` puts arrays that are not committed to devices (fresh
from `jnp.zeros`, NumPy arrays, optax's eager `count`) on their sharding, or
replicated on the mesh when unconstrained, as `jax.jit` does with its
`in_shardings`: the arrays coming back from the call are committed, so
feeding them in again does not compile again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from .._filters import is_array
from .._mapping import filter_shard
from .._mapping._axes import flatten_spec_prefix, specs_for_leaves
from .._mapping._shard import check_leaf_shardings
from .._structure import argument_path, path_text

__all__ = ["KEYED_CALL", "Layout", "follow_arguments"]


def is_sharding_spec(spec: Any) -> bool:
    """A leaf of a sharding prefix: `None`, a `Sharding` or a `PartitionSpec`
    (a tuple, so it must be caught before JAX descends into it)."""
    return spec is None or isinstance(spec, (Sharding, PartitionSpec))


def _check_prefix(prefix: Any, name: str) -> tuple[Any, tuple[Any, ...]]:
    """`(treedef, leaves)` of a sharding prefix: its hashable form. `TypeError`
    naming the place of a leaf that is no sharding."""
    return flatten_spec_prefix(
        prefix,
        is_sharding_spec,
        f"filter_jit: {name}",
        "a sharding prefix holds jax.sharding.Sharding objects (a NamedSharding, "
        "say), PartitionSpecs (under `jax.set_mesh`) or None (unconstrained).",
    )


def _concrete(spec: Any) -> Any:
    """`spec` as a `Sharding`: a `PartitionSpec` on the mesh set by
    `jax.set_mesh`."""
    if not isinstance(spec, PartitionSpec):
        return spec
    mesh = jax.sharding.get_mesh()
    if mesh.empty:
        raise ValueError(
            f"filter_jit: the sharding {spec} is a PartitionSpec, which needs a "
            "mesh: call inside `with jax.set_mesh(mesh):`, or give a "
            "NamedSharding(mesh, spec)."
        )
    return NamedSharding(mesh, spec)


def _mesh_of(specs: Sequence[Any]) -> Any:
    """The concrete mesh of the first `NamedSharding` among `specs`, else
    `None`."""
    for spec in specs:
        if isinstance(spec, NamedSharding) and isinstance(spec.mesh, jax.sharding.Mesh):
            return spec.mesh
    return None


def _explicit_mesh(specs: Sequence[Any]) -> Any:
    """The concrete mesh of the first `NamedSharding` among `specs` with an
    `Explicit` axis, else `None`."""
    for spec in specs:
        mesh = getattr(spec, "mesh", None)
        if isinstance(mesh, jax.sharding.Mesh) and any(
            kind == jax.sharding.AxisType.Explicit for kind in mesh.axis_types
        ):
            return mesh
    return None


def _signature(tree: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """Structure, shapes and dtypes of `tree`'s leaves, or `None` when one of
    them is not an array."""
    leaves, treedef = jtu.tree_flatten(tree)
    if not leaves or not all(map(is_array, leaves)):
        return None
    return treedef, tuple((tuple(leaf.shape), leaf.dtype) for leaf in leaves)


class Layout:
    """The `in_shardings` and `out_shardings` of one `filter_jit`."""

    __slots__ = ("_hash", "_key", "explicit_mesh", "in_shardings", "out_shardings")

    def __init__(self, in_shardings: Any, out_shardings: Any):
        self.in_shardings = in_shardings
        self.out_shardings = out_shardings
        self._key = (
            _check_prefix(in_shardings, "in_shardings"),
            _check_prefix(out_shardings, "out_shardings"),
        )
        # JAX traces a function of arrays on `Explicit` mesh axes only under
        # `jax.set_mesh` (a value computed from no input has no devices
        # otherwise): calls outside one enter this mesh.
        self.explicit_mesh = _explicit_mesh([*self._key[0][1], *self._key[1][1]])
        try:
            self._hash = hash(self._key)
        except TypeError:
            raise TypeError(
                "filter_jit: in_shardings and out_shardings must be hashable "
                "pytrees of shardings (their nodes are part of the compilation "
                "cache key)."
            ) from None

    def __eq__(self, other: object) -> bool:
        return type(other) is Layout and other._key == self._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return (
            f"Layout(in_shardings={self.in_shardings!r}, "
            f"out_shardings={self.out_shardings!r})"
        )

    def _input_specs(self, call: tuple[tuple, dict]) -> tuple[list, list, Any]:
        """`(leaves, specs, treedef)` of a call's `(args, kwargs)`, each leaf
        with the sharding (or `None`) covering it."""
        return specs_for_leaves(
            self.in_shardings,
            call,
            name="filter_jit: in_shardings",
            root="(args, kwargs)",
            is_spec=is_sharding_spec,
            describe=argument_path,
        )

    def place(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Before a call: the arguments with every uncommitted array put on
        its sharding (replicated on the mesh when unconstrained). The same
        arguments when every array is committed already, as in a training
        loop feeding its outputs back in."""
        call = (args, kwargs)
        for leaf in jtu.tree_leaves(call):
            if isinstance(leaf, jax.Array):
                if isinstance(leaf, Tracer):
                    return call  # under another transform: nothing to place
                if not leaf.committed:
                    break
            elif isinstance(leaf, np.ndarray):
                break
        else:
            return call
        leaves, specs, treedef = self._input_specs(call)
        shardings = [_concrete(spec) for spec in specs]
        _check_inputs(call, leaves, shardings)
        mesh = _mesh_of(shardings)
        placed, targets, where = [], [], []
        for index, (leaf, sharding) in enumerate(zip(leaves, shardings)):
            if isinstance(leaf, Tracer) or not is_array(leaf):
                continue
            if isinstance(leaf, jax.Array) and leaf.committed:
                continue
            if sharding is None:
                if mesh is None:
                    continue
                sharding = NamedSharding(mesh, PartitionSpec())
            placed.append(leaf)
            targets.append(sharding)
            where.append(index)
        if placed:
            for index, leaf in zip(where, jax.device_put(placed, targets)):
                leaves[index] = leaf
        return treedef.unflatten(leaves)

    def call(self, fun: Any, args: tuple, kwargs: dict) -> Any:
        """Inside the trace: `fun(*args, **kwargs)` with the inputs and the
        output constrained to their shardings."""
        leaves, in_specs, treedef = self._input_specs((args, kwargs))
        _check_inputs((args, kwargs), leaves, in_specs)
        args, kwargs = treedef.unflatten(_constrained(leaves, in_specs))
        out = fun(*args, **kwargs)
        out_leaves, out_specs, out_def = specs_for_leaves(
            self.out_shardings,
            out,
            name="filter_jit: out_shardings",
            root="the output",
            is_spec=is_sharding_spec,
        )
        check_leaf_shardings(
            out_leaves,
            out_specs,
            lambda index: path_text(
                "the output", jtu.tree_flatten_with_path(out)[0][index][0]
            ),
            "filter_jit: out_shardings",
        )
        if any(spec is None for spec in out_specs):
            out_specs = _following(
                out, out_specs, _argument_specs(args, kwargs, in_specs)
            )
        return out_def.unflatten(_constrained(out_leaves, out_specs))


def _check_inputs(
    call: tuple[tuple, dict], leaves: list[Any], specs: list[Any]
) -> None:
    """`ValueError` naming the argument's key path (`args[0].weight`) where a
    sharding of `in_shardings` does not fit its array."""
    check_leaf_shardings(
        leaves,
        specs,
        lambda index: argument_path(jtu.tree_flatten_with_path(call)[0][index][0]),
        "filter_jit: in_shardings",
    )


def _constrained(leaves: list[Any], specs: list[Any]) -> list[Any]:
    """The array leaves constrained to their (non-`None`) shardings, through
    `filter_shard` (which knows `Auto` from `Explicit` axes)."""
    chosen = [
        index
        for index, (leaf, spec) in enumerate(zip(leaves, specs))
        if spec is not None and is_array(leaf)
    ]
    if not chosen:
        return leaves
    constrained = filter_shard(
        [leaves[index] for index in chosen], [specs[index] for index in chosen]
    )
    leaves = list(leaves)
    for index, leaf in zip(chosen, constrained):
        leaves[index] = leaf
    return leaves


def _argument_specs(
    args: tuple, kwargs: dict, specs: list[Any]
) -> list[tuple[Any, list[Any]]]:
    """`(argument, its leaves' shardings)` for each argument (`specs` being
    those of the call's leaves) that is a pytree node, not a lone array, with
    at least one sharding given."""
    found = []
    start = 0
    # In the order JAX flattens `(args, kwargs)`: keywords sorted by name.
    for argument in (*args, *(kwargs[name] for name in sorted(kwargs))):
        count = len(jtu.tree_leaves(argument))
        own = specs[start : start + count]
        start += count
        if not is_array(argument) and any(spec is not None for spec in own):
            found.append((argument, own))
    return found


def _following(
    out: Any, out_specs: list[Any], argument_specs: list[tuple[Any, list[Any]]]
) -> list[Any]:
    """`out_specs` with the unconstrained leaves of every output subtree that
    has an argument's structure, shapes and dtypes given that argument's
    shardings."""
    known = {}
    for argument, specs in argument_specs:
        signature = _signature(argument)
        if signature is not None:
            known.setdefault(signature, specs)
    if not known:
        return out_specs
    out_specs = list(out_specs)
    start = 0

    def visit(node: Any) -> None:
        nonlocal start
        signature = _signature(node)
        specs = known.get(signature) if signature is not None else None
        if specs is not None:
            for offset, spec in enumerate(specs):
                if out_specs[start + offset] is None:
                    out_specs[start + offset] = spec
            start += len(specs)
            return
        children = jtu.tree_flatten(node, is_leaf=lambda x: x is not node)[0]
        if len(children) == 1 and children[0] is node:  # a leaf
            start += 1
            return
        for child in children:
            visit(child)

    visit(out)
    return out_specs


# --- without `in_shardings`: outputs follow the arguments' layout -----------


class _KeyedCall(threading.local):
    def __init__(self) -> None:
        self.call: tuple[tuple, dict] | None = None


# The arguments of the keyed call in progress on this thread, set around the
# inner `jax.jit` call and read by its body only when JAX traces (a cache
# miss): the concrete arrays' shardings, which the tracers do not carry on
# `Auto` mesh axes. (The direct route has `_direct.PENDING` for this.)
KEYED_CALL = _KeyedCall()


def auto_mesh_of(call: Any) -> Any:
    """The mesh of the first concrete array of `call` laid out by a
    `NamedSharding` over several devices of a mesh whose axes are all `Auto`;
    `None` when there is none (on `Explicit` axes the shardings are part of
    the traced types, and JAX makes outputs follow them itself)."""
    for leaf in jtu.tree_leaves(call):
        if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer):
            sharding = leaf.sharding
            if isinstance(sharding, NamedSharding):
                mesh = sharding.mesh
                if (
                    isinstance(mesh, jax.sharding.Mesh)
                    and mesh.size > 1
                    and all(
                        kind == jax.sharding.AxisType.Auto for kind in mesh.axis_types
                    )
                ):
                    return mesh
    return None


def _array_signature(node: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """The structure of `node`'s arrays (its other leaves read as `None`, so
    that a model and `filter(model, is_array)` agree) with their shapes and
    dtypes; `None` when it holds no array."""
    leaves = jtu.tree_leaves(node)
    arrays = [leaf for leaf in leaves if is_array(leaf)]
    if not arrays:
        return None
    skeleton = jtu.tree_structure(
        jtu.tree_map(lambda leaf: leaf if is_array(leaf) else None, node)
    )
    return skeleton, tuple((tuple(leaf.shape), leaf.dtype) for leaf in arrays)


def _learn(node: Any, mesh: Any, known: dict[Any, list[Any]], depth: int) -> None:
    """Records the shardings on `mesh` of `node`'s arrays under its signature,
    and of its items' when it is a tuple, list or dict (down to `depth`)."""
    signature = _array_signature(node)
    if signature is None:
        return
    shardings = []
    for leaf in jtu.tree_leaves(node):
        if not is_array(leaf):
            continue
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            shardings.append(sharding)
        else:
            shardings.append(None)
    known.setdefault(signature, shardings)
    if depth > 0 and type(node) in (tuple, list, dict):
        for item in node.values() if type(node) is dict else node:
            _learn(item, mesh, known, depth - 1)


def follow_arguments(
    out: Any, call: tuple[tuple, dict], mesh: Any, recorded: dict[int, Any]
) -> Any:
    """Inside the trace of a call without `in_shardings` whose arrays lie on
    the `Auto` mesh `mesh`: `out` with every output subtree that has the
    array structure, shapes and dtypes of an argument (or of an item of a
    tuple, list or dict argument) constrained to that argument's shardings,
    and every other scalar array replicated on `mesh`. On `Auto` axes JAX
    would leave them to XLA, which puts a value computed from no input (the
    `zeros_like(params)` of optax's `init`, its step counter) on one device
    and lays out the others as it finds best, so that feeding the outputs
    back in would compile again. Outputs the function laid out itself with
    `filter_shard` (`recorded`) are left alone.

    Decided once per trace: JAX traces again for another mesh, but not for
    another layout of the same shapes on the same mesh, whose call then
    reuses this one's decisions (the values are the same; the outputs are
    laid out like the first call's arguments)."""
    known: dict[Any, list[Any]] = {}
    args, kwargs = call
    for argument in (*args, *kwargs.values()):
        _learn(argument, mesh, known, depth=2)
    out_leaves, out_def = jtu.tree_flatten(out)
    specs: list[Any] = [None] * len(out_leaves)
    start = 0

    def visit(node: Any) -> None:
        nonlocal start
        count = len(jtu.tree_leaves(node))
        signature = _array_signature(node) if count else None
        shardings = known.get(signature) if signature is not None else None
        if shardings is not None:
            found = iter(shardings)
            for index in range(start, start + count):
                if is_array(out_leaves[index]):
                    specs[index] = next(found)
            start += count
            return
        children = jtu.tree_flatten(node, is_leaf=lambda x: x is not node)[0]
        if len(children) == 1 and children[0] is node:  # a leaf
            start += 1
            return
        for child in children:
            visit(child)

    visit(out)
    replicated = NamedSharding(mesh, PartitionSpec())
    for index, leaf in enumerate(out_leaves):
        if not is_array(leaf) or recorded.get(id(leaf)) is leaf:
            specs[index] = None
        elif specs[index] is None and not jax.numpy.ndim(leaf):
            specs[index] = replicated
    if all(spec is None for spec in specs):
        return out
    return out_def.unflatten(_constrained(out_leaves, specs))
