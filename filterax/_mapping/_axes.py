"""Axis specs for `filter_vmap` and `filter_pmap`: `if_array`, resolving a pytree
prefix of specs against the arguments and outputs, and the batch size.

A spec is `None` (broadcast), an int (the axis to map over), or a callable
`leaf -> int | None`. The specs form a pytree *prefix* of what they describe:
they are descended into as JAX sees them (a callable Module is a node, not a
spec), and each spec applies to every leaf below it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu

from .._filters import is_array, is_array_like, is_key_array, is_ref
from .._split import (
    InputRef,
    StaticPart,
    mark_input_refs,
    restore_input_refs,
    split,
)
from .._structure import one_level, path_text, prefix_difference

__all__ = [
    "DEFAULT_AXES",
    "MappedArguments",
    "MappedOutput",
    "batch_size",
    "call_path",
    "if_array",
    "is_batched_ref_write_error",
    "is_spec",
    "map_arguments",
    "named_in_axes",
    "specs_for_leaves",
    "split_mapped_output",
    "unmapped_output_error",
]


class if_array:  # noqa: N801 - a function-like name, as in Equinox
    """An axis spec: `axis` for array leaves (and `jax.Ref`s), `None`
    (broadcast) for the rest.

    For the `in_axes` and `out_axes` of [`filter_vmap`][filterax.filter_vmap]
    and [`filter_pmap`][filterax.filter_pmap]; `if_array(0)` is their default.

    **Arguments:**

    - `axis`: the axis to map over for arrays.

    **Returns:** a callable `leaf -> axis or None`.

    **Raises:** `TypeError` if `axis` is not an int.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> spec = fx.if_array(1)
    >>> spec(jnp.zeros((2, 3))), spec("relu")
    (1, None)

    ```
    """

    __slots__ = ("axis",)

    def __init__(self, axis: int):
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise TypeError(f"if_array: axis must be an int, got {axis!r}.")
        self.axis = axis

    def __call__(self, leaf: Any) -> int | None:
        return self.axis if is_array(leaf) or is_ref(leaf) else None

    def __eq__(self, other: object) -> bool:
        return type(other) is if_array and other.axis == self.axis

    def __hash__(self) -> int:
        return hash((if_array, self.axis))

    def __repr__(self) -> str:
        return f"if_array({self.axis})"


# The default `in_axes` and `out_axes` of `filter_vmap` and `filter_pmap`.
DEFAULT_AXES = if_array(0)


def is_spec(spec: Any) -> bool:
    """A leaf of an axis-spec prefix: `None` (broadcast, although JAX sees it as
    an empty node), an int, or a callable that JAX sees as a leaf."""
    if spec is None or isinstance(spec, int):
        return True
    return callable(spec) and one_level(spec) is None


def call_path(path: Sequence[Any]) -> str:
    """`args[0].weight` or `kwargs['key']` for a path into `(args, kwargs)`."""
    if not path:
        return "the arguments"
    head = "args" if path[0] == jtu.SequenceKey(0) else "kwargs"
    return path_text(head, path[1:])


def specs_for_leaves(
    prefix: Any,
    tree: Any,
    *,
    name: str,
    root: str,
    is_spec: Callable[[Any], bool] = is_spec,
    describe: Callable[[Sequence[Any]], str] | None = None,
) -> tuple[list[Any], list[Any], Any]:
    """`(leaves, specs, treedef)` of `tree`, each leaf with the spec (a leaf of
    `prefix`, as `is_spec` tells) that covers it. `ValueError` naming where
    `prefix` is not a prefix of `tree`."""
    spec_leaves, spec_def = jtu.tree_flatten(prefix, is_leaf=is_spec)
    try:
        subtrees = spec_def.flatten_up_to(tree)
    except (ValueError, TypeError):
        difference = prefix_difference(prefix, tree, is_spec)
        describe_path = describe or (lambda path: path_text(root, path))
        where = describe_path(difference.path) if difference else root
        detail = difference.detail if difference else "a different structure"
        raise ValueError(
            f"{name} must be a pytree prefix of {root}, but at {where} it has {detail}."
        ) from None
    leaves, specs = [], []
    for spec, subtree in zip(spec_leaves, subtrees):
        below = jtu.tree_leaves(subtree)
        leaves += below
        specs += [spec] * len(below)
    return leaves, specs, jtu.tree_structure(tree)


def _axis(spec: Any, leaf: Any, name: str, where: str) -> int | None:
    axis = spec(leaf) if callable(spec) else spec
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)):
        raise ValueError(
            f"{name} at {where}: an axis spec must be an int, None, or a callable "
            f"returning one of those; got {axis!r}."
        )
    return axis


def named_in_axes(
    fun: Callable[..., Any], in_axes: Any, args: tuple, kwargs: dict
) -> tuple[Any, dict[str, Any]]:
    """The `in_axes` prefixes of `args` and of each keyword argument.

    A dict `in_axes` names parameters (positional ones by the signature of
    `fun`); every other argument, and every keyword argument when `in_axes` is
    not a dict, gets `if_array(0)`.
    """
    if not isinstance(in_axes, dict):
        if isinstance(in_axes, list):
            in_axes = tuple(in_axes)
        return in_axes, dict.fromkeys(kwargs, DEFAULT_AXES)
    unused = dict(in_axes)
    try:
        names = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        names = []
    positional = tuple(unused.pop(name, DEFAULT_AXES) for name, _ in zip(names, args))
    positional += (DEFAULT_AXES,) * (len(args) - len(positional))
    keyword = {name: unused.pop(name, DEFAULT_AXES) for name in kwargs}
    if unused:
        raise ValueError(
            f"in_axes names {sorted(unused)}, which are not arguments of this call."
        )
    return positional, keyword


class MappedArguments:
    """The arguments of a mapped call, split: the dynamic leaves (arrays and
    Refs) with their axes, and the `StaticPart` that rebuilds `(args, kwargs)`."""

    __slots__ = ("axes", "dynamic", "mapped", "static")

    def __init__(
        self,
        dynamic: list[Any],
        axes: list[int | None],
        static: StaticPart,
        mapped: list[tuple[str, Any, int]],
    ):
        self.dynamic = dynamic
        self.axes = axes
        self.static = static
        self.mapped = mapped


def map_arguments(
    fun: Callable[..., Any], in_axes: Any, args: tuple, kwargs: dict, who: str
) -> MappedArguments:
    """Resolves `in_axes` against a call. An int axis on a leaf that is not an
    array or Ref is an error naming its key path; an axis out of range too."""
    args_axes, kwargs_axes = named_in_axes(fun, in_axes, args, kwargs)
    leaves_with_paths = jtu.tree_leaves_with_path((args, kwargs))
    leaves, specs, _ = specs_for_leaves(
        (args_axes, kwargs_axes),
        (args, kwargs),
        name=f"{who}: in_axes",
        root="the arguments",
        describe=call_path,
    )
    dynamic, static_part = split((args, kwargs))
    axes: list[int | None] = []
    mapped: list[tuple[str, Any, int]] = []
    for (path, leaf), spec in zip(leaves_with_paths, specs):
        axis = _axis(spec, leaf, f"{who}: in_axes", call_path(path))
        if not (is_array(leaf) or is_ref(leaf)):
            if axis is not None:
                raise ValueError(
                    f"{who}: in_axes gives the argument at {call_path(path)} the "
                    f"axis {axis}, but it is {_describe(leaf)}, not an array: only "
                    "arrays (and Refs) can be mapped over. Give it the axis None, "
                    "or use if_array(0), which maps arrays and broadcasts the rest."
                )
            continue
        ndim = len(leaf.shape)
        if axis is not None:
            if not -ndim <= axis < ndim:
                hint = ""
                if ndim == 0 and (is_key_array(leaf) or is_ref(leaf)):
                    hint = (
                        " To give every example its own RngStream, pass "
                        "`stream.split(batch_size)`; to share one, give it the axis "
                        "None."
                    )
                raise ValueError(
                    f"{who}: in_axes at {call_path(path)}: axis {axis} is out of "
                    f"range for an array of shape {tuple(leaf.shape)}.{hint}"
                )
            axis %= ndim
            mapped.append((call_path(path), leaf, axis))
        axes.append(axis)
    return MappedArguments(dynamic, axes, static_part, mapped)


def _describe(leaf: Any) -> str:
    text = repr(leaf)
    return f"a {type(leaf).__name__} ({text[:40]}{'...' if len(text) > 40 else ''})"


def batch_size(
    mapped: Sequence[tuple[str, Any, int]], axis_size: int | None, who: str
) -> int:
    """The common size of the mapped axes, checked against `axis_size`.

    `mapped` holds `(path, array, axis)` triples.
    """
    sizes: dict[int, list[str]] = {}
    if axis_size is not None:
        sizes[axis_size] = ["axis_size"]
    for path, leaf, axis in mapped:
        sizes.setdefault(leaf.shape[axis], []).append(f"{path} (axis {axis})")
    if len(sizes) > 1:
        listing = "; ".join(
            f"size {size}: {', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''}"
            for size, paths in sizes.items()
        )
        raise ValueError(
            f"{who}: the mapped axes disagree on the batch size: {listing}."
        )
    if not sizes:
        raise ValueError(
            f"{who}: nothing to map over: no argument leaf is an array with an "
            "integer in_axes, so the batch size is unknown. Pass axis_size=..."
        )
    return next(iter(sizes))


# --- Outputs -----------------------------------------------------------------------

_STATIC_OUT, _MAPPED_OUT, _UNMAPPED_OUT = 0, 1, 2


class MappedOutput:
    """How to rebuild a mapped function's output: its `StaticPart` over the
    non-array leaves, which array leaves are mapped (with the requested axis)
    or unmapped, and the paths of the unmapped ones (for errors)."""

    __slots__ = ("axes", "kinds", "static", "unmapped_paths")

    def __init__(
        self,
        static: StaticPart,
        kinds: tuple[int, ...],
        axes: tuple[tuple[int, str], ...],
        unmapped_paths: tuple[str, ...],
    ):
        self.static = static
        self.kinds = kinds
        self.axes = axes
        self.unmapped_paths = unmapped_paths

    def rebuild(
        self,
        mapped: list[Any],
        unmapped: list[Any],
        who: str,
        inputs: Callable[[], Sequence[Any]],
    ) -> Any:
        """Moves each mapped output's batch axis where `out_axes` asked, and
        rebuilds the output pytree."""
        moved = []
        for leaf, (axis, where) in zip(mapped, self.axes):
            if not -leaf.ndim <= axis < leaf.ndim:
                raise ValueError(
                    f"{who}: out_axes at {where} is {axis}, out of range for the "
                    f"batched output of shape {tuple(leaf.shape)}."
                )
            moved.append(leaf if axis % leaf.ndim == 0 else jnp.moveaxis(leaf, 0, axis))
        mapped_iter, unmapped_iter = iter(moved), iter(unmapped)
        dynamic = [
            next(mapped_iter) if kind == _MAPPED_OUT else next(unmapped_iter)
            for kind in self.kinds
            if kind != _STATIC_OUT
        ]
        return restore_input_refs(self.static, inputs).merge(dynamic)


jtu.register_pytree_node(MappedOutput, lambda out: ((), out), lambda out, _: out)


def _out_path(path: Sequence[Any]) -> str:
    return path_text("out", path)


def split_mapped_output(
    out: Any, out_axes: Any, who: str, inputs: Sequence[Any]
) -> tuple[list[Any], list[Any], MappedOutput]:
    """Inside the mapped function: `(mapped arrays, unmapped arrays, info)`.

    Mapped arrays leave the transformation at axis 0 (moved afterwards, see
    `MappedOutput.rebuild`); unmapped arrays with axis `None`. A Python number
    given an integer axis is broadcast along it, as Equinox does; any other
    non-array leaf given an integer axis is an error naming its key path. Refs
    that were inputs come back as the same Refs.
    """
    leaves, specs, treedef = specs_for_leaves(
        out_axes, out, name=f"{who}: out_axes", root="the output", describe=_out_path
    )
    paths = [path for path, _ in jtu.tree_leaves_with_path(out)]
    if any(map(is_ref, leaves)):
        leaves = mark_input_refs(leaves, inputs, who)
    mapped, unmapped, kinds, axes, unmapped_paths, mask = [], [], [], [], [], []
    for path, leaf, spec in zip(paths, leaves, specs):
        where = path_text("out", path)
        if isinstance(leaf, InputRef):
            kinds.append(_STATIC_OUT)
            mask.append(0)
            continue
        axis = _axis(spec, leaf, f"{who}: out_axes", where)
        if not is_array(leaf):
            if axis is None:
                kinds.append(_STATIC_OUT)
                mask.append(0)
                continue
            if not is_array_like(leaf):
                raise ValueError(
                    f"{who}: out_axes gives the output at {where} the axis {axis}, "
                    f"but it is {_describe(leaf)}, not an array: only arrays and "
                    "Python numbers can be stacked. Give it the axis None (it is "
                    "returned once), or use if_array(0)."
                )
            leaf = jnp.asarray(leaf)
        mask.append(1)
        if axis is None:
            kinds.append(_UNMAPPED_OUT)
            unmapped.append(leaf)
            unmapped_paths.append(where)
        else:
            kinds.append(_MAPPED_OUT)
            mapped.append(leaf)
            axes.append((axis, where))
    static = tuple(leaf for leaf, dynamic in zip(leaves, mask) if not dynamic)
    info = MappedOutput(
        StaticPart(treedef, bytes(mask), static),
        tuple(kinds),
        tuple(axes),
        tuple(unmapped_paths),
    )
    return mapped, unmapped, info


def unmapped_output_error(error: Exception, paths: Sequence[str], who: str) -> None:
    """Re-raises JAX's "output was batched" error naming the outputs at fault."""
    raise ValueError(
        f"{who}: out_axes is None for the output(s) at {', '.join(paths)}, but "
        "at least one of them depends on the mapped inputs. Give them an integer "
        "axis (or if_array(0))."
    ) from error


def is_batched_ref_write_error(error: BaseException) -> bool:
    """JAX's refusal to write a per-example value into a Ref shared across the
    batch (its message is the only way to recognise it)."""
    return "unbatched array reference" in str(error)
