"""`sharding_of`: rules (logical names and key paths) to `NamedSharding`s."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.tree_util as jtu
from jax.sharding import NamedSharding, PartitionSpec

from .._mapping._shard import spec_misfit
from .._tree._structure import path_text
from .._warnings import FilteraxWarning
from ._axes import STACK_AXIS, Names, _is_shaped_leaf, flat_axes

__all__ = ["Rules", "flat_shardings", "sharding_of"]

Rules = Mapping[Any, Any] | Sequence[tuple[Any, Any]]


class _ParsedRules:
    """Rules split into key-path rules (in order) and logical-name rules."""

    def __init__(self, rules: Rules, mesh: jax.sharding.Mesh):
        pairs = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
        self.paths: list[tuple[re.Pattern[str], PartitionSpec, str]] = []
        self.names: dict[str, tuple[str, ...]] = {}
        self.given: dict[str, Any] = {}  # the mesh axes as written, for errors
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
                try:
                    pattern = re.compile(key)
                except re.error as error:
                    raise ValueError(
                        f"sharding_of: the key-path rule {key!r} -> {value!r} is "
                        f"not a valid regular expression: {error}."
                    ) from None
                self.paths.append((pattern, value, f"{key!r}"))
                continue
            if not isinstance(key, str):
                raise TypeError(
                    f"sharding_of: a logical-name rule needs a str name, got {key!r} "
                    f"(-> {value!r}). Key-path rules map a regex to a PartitionSpec."
                )
            self.names[key] = _mesh_axes(value, mesh, f"the rule {key!r} -> {value!r}")
            self.given[key] = value

    def spec_for(
        self, path: str, names: Names | None, matched: set[int] | None = None
    ) -> tuple[PartitionSpec, str]:
        """The spec for the array at `path` with logical axes `names`, and
        why; adds to `matched` the positions of the key-path rules whose regex
        is found in `path`."""
        chosen = None
        for position, (pattern, spec, text) in enumerate(self.paths):
            if pattern.search(path):
                if chosen is None:
                    chosen = spec, f"the key-path rule {text}"
                if matched is None:
                    break
                matched.add(position)
        if chosen is not None:
            return chosen
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
    misfit = spec_misfit(spec, mesh, shape)
    if misfit is not None:
        raise ValueError(f"sharding_of: at {where}: {why}: {misfit}.")


def sharding_of(
    tree: Any, mesh: jax.sharding.Mesh, rules: Rules, *, strict: bool = True
) -> Any:
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
    - `strict`: whether rules that cannot be meant for `tree` are errors. With
      `True` (default), `sharding_of` refuses a logical-name rule whose name
      no array of `tree` has, a key-path rule whose regex is found in no
      array's key path, and an array whose declared axes are longer than its
      rank or shorter by more than one (one less is a stack's leading
      `"stack"` axis): each is most likely a typo, which would otherwise
      leave arrays replicated without a word. With `False` (a rule set shared
      between several models), each is a `FilteraxWarning` instead.

    **Returns:** a pytree of `tree`'s structure with a `NamedSharding` at each
    array leaf and `None` at every other leaf: ready for
    [`filter_shard`][filterax.filter_shard], `jax.jit`'s shardings (as the
    shardings of the arrays) or [`sharded_init`][filterax.sharded_init].

    **Raises:** `ValueError` naming the key path when a mesh axis does not
    divide the dimension it splits, one mesh axis splits two dimensions of one
    array, a `PartitionSpec` has more entries than the array has dimensions,
    or a rule names a mesh axis the mesh lacks; naming the rule (and listing
    the names or key paths `tree` has) for an unused rule or an invalid regex;
    naming the key path for declared axes that do not fit an array's rank;
    `TypeError` for a malformed rule.

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
    >>> fx.sharding_of(attention, mesh, {"haeds": "model"})
    Traceback (most recent call last):
    ...
    ValueError: sharding_of: the logical-name rule 'haeds' -> 'model' names no axis of any array of the tree; the names in use are: 'embed', 'heads'. ...

    ```
    """
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            "sharding_of: `mesh` must be a jax.sharding.Mesh (from jax.make_mesh), "
            f"got {type(mesh).__name__}."
        )
    if not isinstance(strict, bool):
        raise TypeError(f"sharding_of: `strict` must be a bool, got {strict!r}.")
    shardings, treedef = flat_shardings(tree, mesh, rules, strict=strict)
    return treedef.unflatten(shardings)


def flat_shardings(
    tree: Any, mesh: jax.sharding.Mesh, rules: Rules, *, strict: bool = True
) -> tuple[list[NamedSharding | None], Any]:
    """`sharding_of` as a list aligned with `jax.tree.leaves(tree)`, and the
    treedef."""
    parsed = _ParsedRules(rules, mesh)
    paths_and_leaves, treedef = jtu.tree_flatten_with_path(tree)
    misfits: dict[int, Names] = {}
    names = flat_axes(tree, misfits)
    shardings: list[NamedSharding | None] = []
    matched: set[int] = set()
    used: set[str] = set()
    array_paths: list[str] = []
    for position, ((path, leaf), leaf_names) in enumerate(zip(paths_and_leaves, names)):
        if not _is_shaped_leaf(leaf):
            shardings.append(None)
            continue
        if position in misfits:
            used.update(name for name in misfits[position] if name is not None)
            _refuse(_misfit_text(path, leaf, misfits[position]), strict)
        if leaf_names is not None:
            used.update(name for name in leaf_names if name is not None)
        key = jtu.keystr(path)
        array_paths.append(key)
        spec, why = parsed.spec_for(key, leaf_names, matched)
        _check_spec(spec, tuple(leaf.shape), mesh, path_text("tree", path), why)
        shardings.append(NamedSharding(mesh, spec))
    for name, value in parsed.given.items():
        if name not in used:
            _refuse(_unused_name_text(name, value, used), strict)
    for position, (_, spec, text) in enumerate(parsed.paths):
        if position not in matched:
            _refuse(_unmatched_path_text(text, spec, array_paths), strict)
    return shardings, treedef


def _refuse(message: str, strict: bool) -> None:
    if strict:
        raise ValueError(message)
    warnings.warn(message, FilteraxWarning, stacklevel=4)


_STRICT_HINT = (
    "Pass strict=False to sharding_of (or sharded_init) to turn this into a "
    "warning, e.g. for rules shared between models."
)


def _names_text(names: set[str]) -> str:
    return ", ".join(repr(name) for name in sorted(names)) or "none"


def _unused_name_text(name: str, value: Any, used: set[str]) -> str:
    hint = ""
    if name == STACK_AXIS:
        hint = " (the tree holds no stack of layers)"
    return (
        f"sharding_of: the logical-name rule {name!r} -> {value!r} names no axis "
        f"of any array of the tree{hint}; the names in use are: "
        f"{_names_text(used)}. {_STRICT_HINT}"
    )


def _unmatched_path_text(text: str, spec: PartitionSpec, paths: list[str]) -> str:
    shown = ", ".join(paths[:8]) + (
        f", ... ({len(paths)} in all)" if len(paths) > 8 else ""
    )
    return (
        f"sharding_of: the key-path rule {text} -> {spec} matches no array's key "
        f"path (matched with re.search against jax.tree_util.keystr paths such "
        f"as: {shown or 'none: the tree has no arrays'}). {_STRICT_HINT}"
    )


def _misfit_text(path: Any, leaf: Any, names: Names) -> str:
    shape = tuple(leaf.shape)
    if len(shape) < len(names):
        how = "more names than the array has dimensions"
    else:
        how = (
            f"{len(shape) - len(names)} fewer names than the array has "
            "dimensions (one fewer is read as a stack's leading 'stack' axis)"
        )
    return (
        f"sharding_of: at {path_text('tree', path)}: the declared logical axes "
        f"{names!r} do not fit the array of shape {shape} (rank {len(shape)}): "
        f"{how}. Declare one name per dimension. {_STRICT_HINT}"
    )
