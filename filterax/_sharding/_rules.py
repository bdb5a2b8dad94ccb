"""`sharding_of`: rules (logical names and key paths) to `NamedSharding`s."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.tree_util as jtu
from jax.sharding import NamedSharding, PartitionSpec

from .._structure import path_text
from ._axes import Names, _is_shaped_leaf, flat_axes

__all__ = ["Rules", "flat_shardings", "sharding_of"]

Rules = Mapping[Any, Any] | Sequence[tuple[Any, Any]]


class _ParsedRules:
    """Rules split into key-path rules (in order) and logical-name rules."""

    def __init__(self, rules: Rules, mesh: jax.sharding.Mesh):
        pairs = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
        self.paths: list[tuple[re.Pattern[str], PartitionSpec, str]] = []
        self.names: dict[str, tuple[str, ...]] = {}
        for position, pair in enumerate(pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(
                    f"sharding_of: rule #{position} must be a pair (logical name, "
                    f"mesh axes) or (key-path regex, PartitionSpec); got {pair!r}."
                )
            key, value = pair
            if isinstance(value, PartitionSpec):
                if not isinstance(key, (str, re.Pattern)):
                    raise TypeError(
                        f"sharding_of: the key-path rule for {value!r} must be a "
                        f"regex (str or re.Pattern), got {key!r}."
                    )
                for entry in value:
                    _mesh_axes(entry, mesh, f"the rule {key!r}: {value!r}")
                self.paths.append((re.compile(key), value, f"{key!r}"))
                continue
            if not isinstance(key, str):
                raise TypeError(
                    f"sharding_of: a logical-name rule needs a str name, got {key!r} "
                    f"(-> {value!r}). Key-path rules map a regex to a PartitionSpec."
                )
            self.names[key] = _mesh_axes(value, mesh, f"the rule {key!r} -> {value!r}")

    def spec_for(self, path: str, names: Names | None) -> tuple[PartitionSpec, str]:
        for pattern, spec, text in self.paths:
            if pattern.search(path):
                return spec, f"the key-path rule {text}"
        if names is None:
            return PartitionSpec(), ""
        entries = []
        for name in names:
            axes = self.names.get(name) if name is not None else None
            entries.append(
                None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
            )
        return PartitionSpec(*entries), f"the logical axes {names!r}"


def _mesh_axes(value: Any, mesh: jax.sharding.Mesh, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    axes = value if isinstance(value, tuple) else (value,)
    for axis in axes:
        if axis is None and len(axes) == 1:
            return ()
        if not isinstance(axis, str):
            raise TypeError(
                f"sharding_of: {where}: mesh axes must be a mesh axis name, a tuple "
                f"of them, or None; got {value!r}."
            )
        if axis not in mesh.axis_names:
            raise ValueError(
                f"sharding_of: {where} names the mesh axis {axis!r}, which the mesh "
                f"does not have (its axes: {mesh.axis_names})."
            )
    return axes


def _check_spec(
    spec: PartitionSpec, shape: tuple[int, ...], mesh: Any, where: str, why: str
) -> None:
    if len(spec) > len(shape):
        raise ValueError(
            f"sharding_of: at {where}: {why} gives {spec}, with {len(spec)} entries, "
            f"for an array of shape {shape} (rank {len(shape)})."
        )
    seen: dict[str, int] = {}
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    for dim, entry in enumerate(spec):
        axes = () if entry is None else entry if isinstance(entry, tuple) else (entry,)
        for axis in axes:
            if axis not in sizes:
                raise ValueError(
                    f"sharding_of: at {where}: {why} gives {spec}, which names the "
                    f"mesh axis {axis!r}; the mesh has {tuple(sizes)}."
                )
            if axis in seen:
                raise ValueError(
                    f"sharding_of: at {where}: {why} gives {spec}, which splits "
                    f"dimensions {seen[axis]} and {dim} over the same mesh axis "
                    f"{axis!r}; a mesh axis can split one dimension of an array."
                )
            seen[axis] = dim
        parts = math.prod(sizes[axis] for axis in axes)
        if shape[dim] % parts:
            raise ValueError(
                f"sharding_of: at {where}: {why} gives {spec}, which splits "
                f"dimension {dim} (size {shape[dim]}) into {parts} parts over "
                f"{axes}; {parts} does not divide {shape[dim]}."
            )


def sharding_of(tree: Any, mesh: jax.sharding.Mesh, rules: Rules) -> Any:
    """A `NamedSharding` for every array of `tree`, from its logical axes or its
    key path.

    Each array leaf is looked up in order: the first key-path rule whose regex
    is found (`re.search`) in its `jax.tree_util.keystr` path gives its
    `PartitionSpec`; otherwise its [`logical_axes`][filterax.logical_axes] are
    mapped through the logical-name rules (a name without a rule, and `None`,
    leave that dimension whole); an array with neither is replicated. Every
    array is checked before anything is returned, so nothing is placed from
    rules that are wrong for part of the tree.

    **Arguments:**

    - `tree`: any pytree, e.g. a model, a `(model, state)` pair or an abstract
      model of `jax.ShapeDtypeStruct`s.
    - `mesh`: the `jax.sharding.Mesh` (axes `Auto` or `Explicit`).
    - `rules`: a mapping, or a sequence of pairs (in order of precedence for
      key-path rules). A pair `(logical name, mesh axes)` maps a name to a mesh
      axis name, a tuple of them (the dimension is split over their product),
      or `None`. A pair `(regex, PartitionSpec)` gives the spec of every array
      whose key path (such as `.layers[0].weight`) matches; it takes
      precedence over logical names, so a model without annotations (ported
      Equinox code) can be sharded too.

    **Returns:** a pytree of `tree`'s structure with a `NamedSharding` at each
    array leaf and `None` at every other leaf: ready for
    [`filter_shard`][filterax.filter_shard], `jax.jit`'s shardings (as the
    shardings of the arrays) or [`sharded_init`][filterax.sharded_init].

    **Raises:** `ValueError` naming the key path when a mesh axis does not
    divide the dimension it splits, one mesh axis splits two dimensions of one
    array, a `PartitionSpec` has more entries than the array has dimensions,
    or a rule names a mesh axis the mesh lacks; `TypeError` for a malformed
    rule.

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"))
    >>> attention = fx.nn.MultiheadAttention(4, 16, key=jax.random.key(0))
    >>> shardings = fx.sharding_of(attention, mesh, {"heads": "model"})
    >>> shardings.query_proj.weight.spec, shardings.output_proj.weight.spec
    (P('model', None), P(None, 'model'))
    >>> mlp = fx.nn.MLP(8, 4, 16, depth=1, key=jax.random.key(0))
    >>> by_path = fx.sharding_of(mlp, mesh, [(r"layers\\[0\\]\\.weight", P(None, "data"))])
    >>> by_path.layers[0].weight.spec, by_path.layers[1].weight.spec
    (P(None, 'data'), P(None, None))

    ```
    """
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            "sharding_of: `mesh` must be a jax.sharding.Mesh (from jax.make_mesh), "
            f"got {type(mesh).__name__}."
        )
    shardings, treedef = flat_shardings(tree, mesh, rules)
    return treedef.unflatten(shardings)


def flat_shardings(
    tree: Any, mesh: jax.sharding.Mesh, rules: Rules
) -> tuple[list[NamedSharding | None], Any]:
    """`sharding_of` as a list aligned with `jax.tree.leaves(tree)`, and the
    treedef."""
    parsed = _ParsedRules(rules, mesh)
    paths_and_leaves, treedef = jtu.tree_flatten_with_path(tree)
    names = flat_axes(tree)
    shardings: list[NamedSharding | None] = []
    for (path, leaf), leaf_names in zip(paths_and_leaves, names):
        if not _is_shaped_leaf(leaf):
            shardings.append(None)
            continue
        key = jtu.keystr(path)
        spec, why = parsed.spec_for(key, leaf_names)
        _check_spec(spec, tuple(leaf.shape), mesh, path_text("tree", path), why)
        shardings.append(NamedSharding(mesh, spec))
    return shardings, treedef
