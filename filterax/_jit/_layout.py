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
from .._mapping._shard import check_leaf_shardings, recording_constraints
from .._structure import argument_path, path_text

__all__ = ["Layout", "follow_arguments", "on_auto_mesh"]


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


def _is_auto(mesh: Any) -> bool:
    return mesh.size > 1 and all(
        kind == jax.sharding.AxisType.Auto for kind in mesh.axis_types
    )


_CANONICAL: dict[Any, Any] = {}


def canonical(sharding: Any) -> Any:
    """One `NamedSharding` for the equivalent ones that differ only by
    trailing `None`s or one-name tuples in their spec (`P()`, `P(None)`), as
    JAX's own cache keys them alike; other shardings as they are."""
    found = _CANONICAL.get(sharding)
    if found is None:
        found = sharding
        if isinstance(sharding, NamedSharding):
            spec = [
                entry[0] if isinstance(entry, tuple) and len(entry) == 1 else entry
                for entry in sharding.spec
            ]
            while spec and spec[-1] is None:
                spec.pop()
            found = NamedSharding(
                sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind
            )
        found = _CANONICAL.setdefault(sharding, _CANONICAL.setdefault(found, found))
    return found


def on_auto_mesh(leaves: Sequence[Any]) -> bool:
    """Whether an array among `leaves` (traced or not) lies on a mesh of several devices
    whose axes are all `Auto` (its type names the mesh, not the layout: on
    `Explicit` axes JAX makes outputs follow the inputs itself)."""
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            mesh = getattr(jax.typeof(leaf).sharding, "mesh", None)
            if mesh is not None and not mesh.empty and _is_auto(mesh):
                return True
    return False


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


def _learn(
    node: Any, by_id: dict[int, Any], known: dict[Any, list[Any]], depth: int
) -> None:
    """Records the shardings (`by_id`: of each traced leaf) of `node`'s arrays
    under its signature, and of its items' when it is a tuple, list or dict
    (down to `depth`)."""
    signature = _array_signature(node)
    if signature is None:
        return
    shardings = [by_id.get(id(leaf)) for leaf in jtu.tree_leaves(node) if is_array(leaf)]
    known.setdefault(signature, shardings)
    if depth > 0 and type(node) in (tuple, list, dict):
        for item in node.values() if type(node) is dict else node:
            _learn(item, by_id, known, depth - 1)


def follow_arguments(fun: Any, args: tuple, kwargs: dict, by_id: dict[int, Any]) -> Any:
    """Inside the trace of a call without `in_shardings`: `fun(*args,
    **kwargs)`, and when the arguments lie on an `Auto` mesh (`by_id`: the
    concrete sharding of each traced leaf, from the call's key) every output
    subtree that has the array structure, shapes and dtypes of an argument
    (or of an item of a tuple, list or dict argument) constrained to that
    argument's shardings, and every other scalar array replicated. On `Auto`
    axes JAX would leave them to XLA, which puts a value computed from no
    input (the `zeros_like(params)` of optax's `init`, its step counter) on
    one device, so that feeding the outputs back in would compile again.
    Outputs the function laid out itself with `filter_shard` are left alone."""
    mesh = next(
        (
            s.mesh
            for s in by_id.values()
            if isinstance(s, NamedSharding)
            and isinstance(s.mesh, jax.sharding.Mesh)
            and _is_auto(s.mesh)
        ),
        None,
    )
    if mesh is None:
        return fun(*args, **kwargs)
    with recording_constraints() as recorded:
        out = fun(*args, **kwargs)
    by_id = {
        key: s for key, s in by_id.items() if isinstance(s, NamedSharding) and s.mesh == mesh
    }
    known: dict[Any, list[Any]] = {}
    for argument in (*args, *kwargs.values()):
        _learn(argument, by_id, known, depth=2)
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
