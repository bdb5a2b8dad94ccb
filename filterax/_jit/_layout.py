"""Where `filter_jit`'s arrays are laid out.

A `Layout` holds `in_shardings` (a prefix of `(args, kwargs)`) and
`out_shardings` (of the output) as given, each leaf a `Sharding`, a
`PartitionSpec` (under `jax.set_mesh`) or `None`. Inside the trace, once per
compilation, inputs and outputs get `filter_shard`'s constraint, so the program
is the one `jax.jit` builds with the same shardings. Before a call, `place`
puts arrays not yet committed to devices on their sharding (replicated when
unconstrained), as `jax.jit` does, so feeding outputs back does not compile
again.

Output subtrees left unconstrained that have the array structure, shapes and
dtypes of an argument (an updated model, optax's `mu` and `nu` built by
`zeros_like(params)`) are laid out like it: on `Auto` mesh axes JAX would
leave them to XLA, which puts a value computed from no input on one device.
Without a `Layout`, this happens when the arguments lie on an `Auto` mesh
(`follow_arguments`, given the concrete shardings through the call's key).
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

from .._mapping import filter_shard
from .._mapping._axes import flatten_spec_prefix, specs_for_leaves
from .._mapping._shard import check_leaf_shardings, recording_constraints
from .._tree._filters import is_array
from .._tree._structure import argument_path, path_text

__all__ = ["Layout", "canonical", "follow_arguments", "on_auto_mesh"]


def is_sharding_spec(spec: Any) -> bool:
    """A leaf of a sharding prefix (a `PartitionSpec` is a tuple: caught
    before JAX descends into it)."""
    return spec is None or isinstance(spec, (Sharding, PartitionSpec))


def _check_prefix(prefix: Any, name: str) -> tuple[Any, tuple[Any, ...]]:
    """`(treedef, leaves)` of a sharding prefix, its hashable form; `TypeError`
    naming the place of a leaf that is no sharding."""
    return flatten_spec_prefix(
        prefix,
        is_sharding_spec,
        f"filter_jit: {name}",
        "a sharding prefix holds jax.sharding.Sharding objects (a NamedSharding, "
        "say), PartitionSpecs (under `jax.set_mesh`) or None (unconstrained).",
    )


def _concrete(spec: Any) -> Any:
    """`spec` as a `Sharding` (a `PartitionSpec` on the mesh of `jax.set_mesh`)."""
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


def _concrete_mesh(spec: Any) -> Any:
    mesh = getattr(spec, "mesh", None)
    return mesh if isinstance(mesh, jax.sharding.Mesh) else None


class Layout:
    """The `in_shardings` and `out_shardings` of one `filter_jit`; hashable."""

    __slots__ = ("_hash", "_key", "explicit_mesh", "in_shardings", "out_shardings")

    def __init__(self, in_shardings: Any, out_shardings: Any):
        self.in_shardings = in_shardings
        self.out_shardings = out_shardings
        self._key = (
            _check_prefix(in_shardings, "in_shardings"),
            _check_prefix(out_shardings, "out_shardings"),
        )
        # JAX traces arrays on `Explicit` axes only under `jax.set_mesh`: calls
        # outside one enter this mesh.
        self.explicit_mesh = next(
            (
                mesh
                for mesh in map(_concrete_mesh, [*self._key[0][1], *self._key[1][1]])
                if mesh is not None
                and jax.sharding.AxisType.Explicit in mesh.axis_types
            ),
            None,
        )
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
        """`(leaves, specs, treedef)` of `(args, kwargs)`, each leaf with the
        sharding (or `None`) covering it."""
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
        its sharding (replicated on the mesh when unconstrained); the same
        arguments when every array is committed already."""
        call = (args, kwargs)
        for leaf in jtu.tree_leaves(call):
            if isinstance(leaf, Tracer):
                return call  # under another transform: nothing to place
            if isinstance(leaf, np.ndarray) or (
                isinstance(leaf, jax.Array) and not leaf.committed
            ):
                break
        else:
            return call
        leaves, specs, treedef = self._input_specs(call)
        shardings = [_concrete(spec) for spec in specs]
        _check_inputs(call, leaves, shardings)
        mesh = next((m for m in map(_concrete_mesh, shardings) if m is not None), None)
        where, targets = [], []
        for index, (leaf, sharding) in enumerate(zip(leaves, shardings)):
            if not is_array(leaf) or (isinstance(leaf, jax.Array) and leaf.committed):
                continue
            if sharding is None and mesh is not None:
                sharding = NamedSharding(mesh, PartitionSpec())
            if sharding is not None:
                where.append(index)
                targets.append(sharding)
        if where:
            placed = jax.device_put([leaves[index] for index in where], targets)
            for index, leaf in zip(where, placed):
                leaves[index] = leaf
        return treedef.unflatten(leaves)

    def call(self, fun: Any, args: tuple, kwargs: dict) -> Any:
        """Inside the trace: `fun(*args, **kwargs)` with the inputs and the
        output constrained to their shardings."""
        leaves, in_specs, treedef = self._input_specs((args, kwargs))
        _check_inputs((args, kwargs), leaves, in_specs)
        leaves = _constrained(leaves, in_specs)
        args, kwargs = treedef.unflatten(leaves)
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
        if None in out_specs:
            by_id = {id(leaf): spec for leaf, spec in zip(leaves, in_specs)}
            known = _known(args, kwargs, by_id, depth=0, lone_arrays=False)
            _follow(out, out_leaves, out_specs, known)
        return out_def.unflatten(_constrained(out_leaves, out_specs))


def _check_inputs(call: tuple[tuple, dict], leaves: list, specs: list) -> None:
    """`ValueError` naming the argument's key path where a sharding of
    `in_shardings` does not fit its array."""
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


def _array_signature(node: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """The structure of `node`'s arrays (other leaves read as `None`, so that
    a model and `filter(model, is_array)` agree) with their shapes and
    dtypes; `None` when it holds no array."""
    arrays = [leaf for leaf in jtu.tree_leaves(node) if is_array(leaf)]
    if not arrays:
        return None
    skeleton = jtu.tree_structure(
        jtu.tree_map(lambda leaf: leaf if is_array(leaf) else None, node)
    )
    return skeleton, tuple((tuple(leaf.shape), leaf.dtype) for leaf in arrays)


def _known(
    args: tuple, kwargs: dict, by_id: dict[int, Any], depth: int, lone_arrays: bool
) -> dict[Any, list[Any]]:
    """The shardings (`by_id`: of each traced leaf) of every argument with
    one given, by array signature; of the items of tuple, list and dict
    arguments too, down to `depth`."""
    known: dict[Any, list[Any]] = {}

    def learn(node: Any, depth: int, top: bool) -> None:
        if top and not lone_arrays and is_array(node):
            return
        signature = _array_signature(node)
        if signature is None:
            return
        specs = [
            by_id.get(id(leaf)) for leaf in jtu.tree_leaves(node) if is_array(leaf)
        ]
        if any(spec is not None for spec in specs):
            known.setdefault(signature, specs)
        if depth > 0 and type(node) in (tuple, list, dict):
            for item in node.values() if type(node) is dict else node:
                learn(item, depth - 1, False)

    for argument in (*args, *(kwargs[name] for name in sorted(kwargs))):
        learn(argument, depth, True)
    return known


def _follow(
    out: Any, out_leaves: list[Any], specs: list[Any], known: dict[Any, list[Any]]
) -> None:
    """Fills the `None`s of `specs` (of `out`'s leaves) where an output
    subtree has the array signature of a `known` argument."""
    if not known:
        return
    start = 0

    def visit(node: Any) -> None:
        nonlocal start
        count = len(jtu.tree_leaves(node))
        signature = _array_signature(node) if count else None
        found = known.get(signature) if signature is not None else None
        if found is not None:
            given = iter(found)
            for index in range(start, start + count):
                if is_array(out_leaves[index]):
                    spec = next(given)
                    if specs[index] is None:
                        specs[index] = spec
            start += count
            return
        children = jtu.tree_flatten(node, is_leaf=lambda x: x is not node)[0]
        if len(children) == 1 and children[0] is node:  # a leaf
            start += 1
            return
        for child in children:
            visit(child)

    visit(out)


# --- without `in_shardings`: outputs follow the arguments on an `Auto` mesh --


def _is_auto(mesh: Any) -> bool:
    return mesh.size > 1 and all(
        kind == jax.sharding.AxisType.Auto for kind in mesh.axis_types
    )


def on_auto_mesh(leaves: Sequence[Any]) -> bool:
    """Whether an array among `leaves` (traced or not) lies on a mesh of
    several devices whose axes are all `Auto` (a traced array's type names the
    mesh, not the layout; on `Explicit` axes JAX makes outputs follow the
    inputs itself)."""
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            mesh = getattr(jax.typeof(leaf).sharding, "mesh", None)
            if mesh is not None and not mesh.empty and _is_auto(mesh):
                return True
    return False


_CANONICAL: dict[Any, Any] = {}


def canonical(sharding: Any) -> Any:
    """One `NamedSharding` for those differing only by trailing `None`s or
    one-name tuples in their spec (`P()`, `P(None)`), which JAX's own cache
    keys alike."""
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


def follow_arguments(fun: Any, args: tuple, kwargs: dict, by_id: dict[int, Any]) -> Any:
    """Inside the trace of a call without a `Layout` (`by_id`: the concrete
    sharding of each traced leaf, from the call's key): `fun(*args,
    **kwargs)`, and when the arguments lie on an `Auto` mesh, output subtrees
    shaped like an argument (or an item of a tuple, list or dict argument)
    laid out like it, other scalars replicated. Outputs the function laid out
    itself with `filter_shard` are left alone."""
    mesh = next(
        (
            spec.mesh
            for spec in by_id.values()
            if isinstance(spec, NamedSharding)
            and isinstance(spec.mesh, jax.sharding.Mesh)
            and _is_auto(spec.mesh)
        ),
        None,
    )
    if mesh is None:
        return fun(*args, **kwargs)
    with recording_constraints() as recorded:
        out = fun(*args, **kwargs)
    by_id = {
        key: spec
        for key, spec in by_id.items()
        if isinstance(spec, NamedSharding) and spec.mesh == mesh
    }
    out_leaves, out_def = jtu.tree_flatten(out)
    specs: list[Any] = [None] * len(out_leaves)
    _follow(out, out_leaves, specs, _known(args, kwargs, by_id, 2, lone_arrays=True))
    replicated = NamedSharding(mesh, PartitionSpec())
    for index, leaf in enumerate(out_leaves):
        if not is_array(leaf) or recorded.get(id(leaf)) is leaf:
            specs[index] = None
        elif specs[index] is None and not jax.numpy.ndim(leaf):
            specs[index] = replicated
    if all(spec is None for spec in specs):
        return out
    return out_def.unflatten(_constrained(out_leaves, specs))


def clear() -> None:
    _CANONICAL.clear()
