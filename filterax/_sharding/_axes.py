"""`logical_axes`, and what layers use to declare and override their axes."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.tree_util as jtu

from .._module import Module, field
from .._module._field import AXES_KEY, check_axes_names
from .._tree._filters import is_array, is_ref
from .._tree._structure import one_level

__all__ = [
    "STACK_AXIS",
    "axes_overrides_field",
    "declared_axes",
    "layer_axes",
    "leaf_axes",
    "logical_axes",
    "register_state_types",
    "sublayer_axes",
]

Names = tuple[str | None, ...]

# The logical name of the leading dimension that `filter_vmap` of a constructor
# adds to every parameter (a stack of layers).
STACK_AXIS = "stack"

# Marks the static field in which a layer keeps its per-instance overrides.
_OVERRIDES_KEY = "axes_overrides"

# `(index type, state type)` pairs registered by `filterax.nn`: this layer may
# not import it, so the layer registers its classes here instead.
_STATE_TYPES: list[tuple[type, type]] = []


def register_state_types(index_type: type, state_type: type) -> None:
    """Lets `logical_axes` follow state: the arrays a `State` holds for an index
    get the names declared for the field holding that index. `index_type`
    instances carry a `marker`; a `state_type` node flattens one level with its
    markers as metadata, one per child."""
    _STATE_TYPES.append((index_type, state_type))


def axes_overrides_field() -> Any:
    """The static field in which a layer keeps the `axes=` it was built with:
    static (so it survives `jax.tree.map` and unflattening), hidden from `repr`,
    `None` unless something was overridden."""
    return field(static=True, default=None, repr=False, metadata={_OVERRIDES_KEY: True})


@functools.cache
def _class_axes(cls: type) -> tuple[dict[str, Names], str | None]:
    declared: dict[str, Names] = {}
    overrides_field = None
    if dataclasses.is_dataclass(cls):
        for item in dataclasses.fields(cls):
            if AXES_KEY in item.metadata:
                declared[item.name] = item.metadata[AXES_KEY]
            if item.metadata.get(_OVERRIDES_KEY):
                overrides_field = item.name
    return declared, overrides_field


def declared_axes(cls: type) -> dict[str, Names]:
    """The logical axes declared with `field(axes=...)` on the fields of `cls`,
    by field name."""
    return dict(_class_axes(cls)[0])


def layer_axes(
    layer: str,
    axes: Mapping[str, Any] | None,
    defaults: Mapping[str, Names],
    *,
    keep_defaults: bool = False,
) -> tuple[tuple[str, Names], ...] | None:
    """Validates a layer's `axes=` argument against its `defaults` and returns
    it in the hashable form kept in its overrides field (`None` for none).
    With `keep_defaults`, the defaults are stored too, overridden by `axes`:
    for layers whose parameters' ranks depend on their arguments (a
    convolution's kernel), which no class-level declaration can name.

    Raises `ValueError` naming the field for an unknown field name or names of
    the wrong length, `TypeError` for names that are not a tuple of str/None."""
    if axes is None:
        axes = {}
    if not isinstance(axes, Mapping):
        raise TypeError(
            f"{layer}: `axes` must map a parameter's field name to its logical "
            f"axes, e.g. {{'weight': ('out', 'in')}}; got {axes!r}."
        )
    if keep_defaults:
        axes = {**defaults, **axes}
    stored = []
    for name, names in axes.items():
        if name not in defaults:
            known = ", ".join(repr(known) for known in defaults) or "none"
            raise ValueError(
                f"{layer}: `axes` names the field {name!r}, which has no logical "
                f"axes; the fields that have are: {known}."
            )
        names = check_axes_names(names, f"{layer}: axes[{name!r}]")
        expected = defaults[name]
        if len(names) != len(expected):
            raise ValueError(
                f"{layer}: axes[{name!r}] has {len(names)} names, {names!r}, but "
                f"{name!r} has {len(expected)} dimensions (default names "
                f"{expected!r})."
            )
        stored.append((name, names))
    return tuple(stored) or None


def sublayer_axes(
    layer: str,
    axes: Mapping[str, Any] | None,
    defaults: Mapping[str, Mapping[str, Names]],
) -> dict[str, dict[str, Any]]:
    """For a layer built of sub-layers (an MLP's `Linear`s): the `axes=` to
    give each sub-layer, by role: its `defaults`, updated by the user's `axes`
    (a mapping of role to an `axes=` mapping). Raises `ValueError` naming an
    unknown role; the sub-layers check the rest."""
    if axes is None:
        axes = {}
    if not isinstance(axes, Mapping):
        raise TypeError(
            f"{layer}: `axes` must map a sub-layer's role to its `axes=` mapping, "
            f"e.g. {{{next(iter(defaults))!r}: {{'weight': (...)}}}}; got {axes!r}."
        )
    for role in axes:
        if role not in defaults:
            known = ", ".join(repr(known) for known in defaults)
            raise ValueError(
                f"{layer}: `axes` names {role!r}, which is not one of its "
                f"sub-layers ({known})."
            )
    return {
        role: {**names, **dict(axes.get(role) or {})}
        for role, names in defaults.items()
    }


def leaf_axes(leaf: Any, names: Names | None) -> Names | None:
    """The names `leaf` gets from `names` declared for it: the names themselves
    at the same rank; `("stack", *names)` with one more dimension (a layer
    stacked by `filter_vmap`); `("stack", None, ..., *names)` with several more
    (nested stacks: only the outermost is named); `None` with fewer dimensions,
    for a leaf that is not an array, or when nothing was declared."""
    if names is None or not _is_shaped_leaf(leaf):
        return None
    extra = len(leaf.shape) - len(names)
    if extra < 0:
        return None
    if extra == 0:
        return names
    return (STACK_AXIS, *((None,) * (extra - 1)), *names)


def _is_shaped_leaf(leaf: Any) -> bool:
    return is_array(leaf) or is_ref(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)


def _module_field_names(node: Module) -> tuple[dict[str, Names], dict[str, Names]]:
    declared, overrides_field = _class_axes(type(node))
    overrides = getattr(node, overrides_field, None) if overrides_field else None
    return declared, dict(overrides or ())


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    if not dataclasses.is_dataclass(cls):
        return ()
    return tuple(item.name for item in dataclasses.fields(cls))


def _check_inherited(node: Any, inherited: Mapping[str, Any], source: str) -> None:
    """`ValueError` naming the declaring field when `field(axes={...})` names
    a field that the sub-layer `node` does not have."""
    known = _field_names(type(node))
    for name in inherited:
        if name not in known:
            listed = ", ".join(repr(field) for field in known) or "none"
            raise ValueError(
                f"{source} names the field {name!r}, which "
                f"{type(node).__qualname__} does not have; its fields are: "
                f"{listed}."
            )


def _walk(
    node: Any,
    names: Names | None,
    out: list[Names | None],
    markers: dict[Any, Names | None],
    inherited: Mapping[str, Names] | None = None,
    misfits: dict[int, Names] | None = None,
    source: str = "",
) -> None:
    """Appends the names of `node`'s array leaves to `out`, in the order of
    `jax.tree.leaves(node)`; records the names given to each state index.
    `inherited`: names for the fields of `node`, a Module (or of each Module
    in `node`, a container of them), declared by the field of its parent that
    holds it (below `node`'s own overrides); `source` names that field, for
    errors."""
    for index_type, state_type in _STATE_TYPES:
        if isinstance(node, index_type):
            markers.setdefault(node.marker, names)  # type: ignore[attr-defined]
        elif isinstance(node, state_type):
            level = one_level(node)
            if level is not None:
                for marker, child in zip(level.metadata, level.children):
                    _walk(
                        child,
                        markers.get(marker, names),
                        out,
                        markers,
                        misfits=misfits,
                    )
                return
    level = one_level(node)
    if level is None:
        if node is not None:
            if inherited and _is_shaped_leaf(node):
                raise ValueError(
                    f"{source} maps field names to logical axes, as for a "
                    f"sub-layer, but the field holds an array of shape "
                    f"{tuple(node.shape)}: give a tuple with one name per "
                    "dimension instead."
                )
            if misfits is not None and names is not None and _is_shaped_leaf(node):
                extra = len(node.shape) - len(names)
                if extra < 0 or extra > 1:
                    misfits[len(out)] = names
            out.append(leaf_axes(node, names))
        return
    if isinstance(node, Module):
        declared, overrides = _module_field_names(node)
        if inherited:
            _check_inherited(node, inherited, source)
            overrides = {**inherited, **overrides}
        for key, child in zip(level.keys, level.children):
            name = getattr(key, "name", None)
            child_names = overrides.get(name, declared.get(name, names))  # type: ignore[arg-type]
            if isinstance(child_names, Mapping):  # names for a sub-layer's fields
                _walk(
                    child,
                    None,
                    out,
                    markers,
                    child_names,
                    misfits,
                    f"field(axes={{...}}) of {type(node).__qualname__}.{name}",
                )
            else:
                _walk(child, child_names, out, markers, misfits=misfits)
        return
    # A container of sub-layers (a list of them, say) passes their names on.
    for child in level.children:
        _walk(child, names, out, markers, inherited, misfits, source)


def flat_axes(tree: Any, misfits: dict[int, Names] | None = None) -> list[Names | None]:
    """The names of the leaves of `tree`, in the order of `jax.tree.leaves`.
    `misfits`, when given, receives the position and declared names of every
    array whose rank is neither the names' length nor one more (a stack): its
    names were longer than its rank (it gets none) or shorter by two or more
    (read as a stack of stacks)."""
    markers: dict[Any, Names | None] = {}
    if _STATE_TYPES:
        # A first pass finds the names of every state index, wherever the
        # `State` holding their values sits relative to the model.
        _walk(tree, None, [], markers)
    out: list[Names | None] = []
    _walk(tree, None, out, markers, misfits=misfits)
    return out


def logical_axes(tree: Any) -> Any:
    """The logical names of the dimensions of every array in `tree`.

    Names come from [`field(axes=...)`][filterax.field] declarations (every
    `filterax.nn` layer declares them for its parameters), overridden per
    instance by a layer's `axes=` argument. A field's names reach every array
    below it, through `NonDifferentiable`, a `StateIndex`'s initial value and
    `jax.Ref`s, unless a Module further down declares its own; arrays with one
    more dimension than their names (layers stacked by `filter_vmap` of a
    constructor) get a leading `"stack"`. The values a `filterax.nn.State`
    holds get the names declared for their `StateIndex` when the model is part
    of `tree` too (`logical_axes((model, state))`).

    **Arguments:**

    - `tree`: any pytree, e.g. a model; its arrays may be `jax.Ref`s or
      `jax.ShapeDtypeStruct`s (an abstract model from
      [`filter_eval_shape`][filterax.filter_eval_shape]).

    **Returns:** a pytree of the same structure with, at each array leaf, its
    tuple of names (a `str` or `None` per dimension), and `None` at array
    leaves without names and at every other leaf.

    ```python
    >>> import jax
    >>> import filterax as fx
    >>> linear = fx.nn.Linear(3, 4, key=jax.random.key(0))
    >>> names = fx.logical_axes(linear)
    >>> names.weight, names.bias, names.in_features
    (('out', 'in'), ('out',), 3)
    >>> stack = fx.filter_vmap(lambda k: fx.nn.Linear(3, 4, key=k))(
    ...     jax.random.split(jax.random.key(0), 2))
    >>> fx.logical_axes(stack).weight
    ('stack', 'out', 'in')

    ```
    """
    leaves, treedef = jtu.tree_flatten(tree)
    names = flat_axes(tree)
    if len(names) != len(leaves):  # a node that flattens differently one level down
        raise RuntimeError(
            "logical_axes: the tree's leaves could not be matched with their fields."
        )
    return treedef.unflatten(
        [n if _is_shaped_leaf(leaf) else None for n, leaf in zip(names, leaves)]
    )
