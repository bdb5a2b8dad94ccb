"""Axis specs for `filter_vmap` and `filter_pmap`: `if_array`, resolving a pytree
prefix of specs against the arguments and outputs, and the batch size.

A spec is `None` (broadcast), an int (the axis to map over), or a callable
`leaf -> int | None`. The specs form a pytree *prefix* of what they describe:
they are descended into as JAX sees them (a callable Module is a node, not a
spec), and each spec applies to every leaf below it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from .._tree._filters import is_array, is_array_like, is_key_array, is_ref
from .._tree._split import (
    InputRef,
    StaticPart,
    mark_input_refs,
    split,
)
from .._tree._structure import argument_path, one_level, path_text, prefix_difference

__all__ = [
    "DEFAULT_AXES",
    "MappedArguments",
    "MappedOutput",
    "batch_size",
    "if_array",
    "is_batched_ref_write_error",
    "is_spec",
    "map_arguments",
    "named_in_axes",
    "raise_for_batched_unmapped_output",
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


def _covering_specs(
    prefix: Any,
    tree: Any,
    *,
    name: str,
    root: str,
    is_spec: Callable[[Any], bool],
    describe: Callable[[Sequence[Any]], str] | None,
) -> tuple[list[Any], list[Any]]:
    """The leaves of `prefix` (as `is_spec` tells) and the subtrees of `tree`
    they cover. `ValueError` naming where `prefix` is not a prefix of `tree`."""
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
    return spec_leaves, subtrees


def _spread_specs(
    spec_leaves: list[Any], subtrees: list[Any], num_leaves: int
) -> list[Any]:
    """One spec per leaf of the tree (`num_leaves` of them, in flattening
    order): each subtree's leaves get the spec covering it."""
    if all(spec is spec_leaves[0] for spec in spec_leaves):
        # One spec for everything (the defaults): no need to count leaves.
        return [spec_leaves[0]] * num_leaves if spec_leaves else []
    specs: list[Any] = []
    for spec, subtree in zip(spec_leaves, subtrees):
        specs += [spec] * len(jtu.tree_leaves(subtree))
    return specs


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
    spec_leaves, subtrees = _covering_specs(
        prefix, tree, name=name, root=root, is_spec=is_spec, describe=describe
    )
    leaves, treedef = jtu.tree_flatten(tree)
    return leaves, _spread_specs(spec_leaves, subtrees, len(leaves)), treedef


def _axis(
    spec: Any, leaf: Any, name: str, where: Callable[[Any], str], at: Any
) -> int | None:
    """The axis `spec` gives `leaf`; `where(at)` names the leaf in the error."""
    axis = spec(leaf) if callable(spec) else spec
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)):
        raise ValueError(
            f"{name} at {where(at)}: an axis spec must be an int, None, or a "
            f"callable returning one of those; got {axis!r}."
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


def _argument_where(call: tuple[tuple, dict], index: int) -> str:
    """`args[0].weight`-style text for the `index`-th leaf of `(args, kwargs)`:
    key paths are found only for error messages."""
    path, _ = jtu.tree_leaves_with_path(call)[index]
    return argument_path(path)


class MappedArguments:
    """The arguments of a mapped call, split: the dynamic leaves (arrays and
    Refs) with their axes, and the `StaticPart` that rebuilds `(args, kwargs)`.
    `mapped` holds `(leaf index, array, axis)` for each mapped leaf."""

    __slots__ = ("axes", "call", "dynamic", "mapped", "static")

    def __init__(
        self,
        dynamic: list[Any],
        axes: list[int | None],
        static: StaticPart,
        mapped: list[tuple[int, Any, int]],
        call: tuple[tuple, dict],
    ):
        self.dynamic = dynamic
        self.axes = axes
        self.static = static
        self.mapped = mapped
        self.call = call

    def where(self, index: int) -> str:
        """The key path of the `index`-th leaf of the call, as text."""
        return _argument_where(self.call, index)


def map_arguments(
    fun: Callable[..., Any],
    in_axes: Any,
    args: tuple,
    kwargs: dict,
    who: str,
    broadcast_non_arrays: bool = False,
) -> MappedArguments:
    """Resolves `in_axes` against a call. An int axis on a leaf that is not an
    array or Ref is an error naming its key path (or, with
    `broadcast_non_arrays`, ignored: the leaf is passed to every example); an
    axis out of range is an error too."""
    args_axes, kwargs_axes = named_in_axes(fun, in_axes, args, kwargs)
    call = (args, kwargs)
    spec_leaves, subtrees = _covering_specs(
        (args_axes, kwargs_axes),
        call,
        name=f"{who}: in_axes",
        root="the arguments",
        is_spec=is_spec,
        describe=argument_path,
    )
    dynamic, static_part = split(call)
    # The split's mask tells the dynamic leaves (arrays and Refs) from the rest.
    mask = static_part.mask
    specs = _spread_specs(spec_leaves, subtrees, len(mask))
    name = f"{who}: in_axes"
    where = functools.partial(_argument_where, call)
    dynamic_leaves, static_leaves = iter(dynamic), iter(static_part.static)
    axes: list[int | None] = []
    mapped: list[tuple[int, Any, int]] = []
    for index, (is_dynamic, spec) in enumerate(zip(mask, specs)):
        leaf = next(dynamic_leaves) if is_dynamic else next(static_leaves)
        if type(spec) is if_array:
            # What `spec(leaf)` returns, without classifying `leaf` again.
            axis = spec.axis if is_dynamic else None
        else:
            axis = _axis(spec, leaf, name, where, index)
        if not is_dynamic:
            if axis is not None and not broadcast_non_arrays:
                raise UnmappableLeafError(
                    f"{who}: in_axes gives the argument at {where(index)} the "
                    f"axis {axis}, but it is {_describe(leaf)}, not an array: only "
                    "arrays (and Refs) can be mapped over. Give it the axis None, "
                    "or use if_array(0), which maps arrays and broadcasts the rest."
                )
            continue
        if axis is not None:
            ndim = len(leaf.shape)
            if not -ndim <= axis < ndim:
                hint = ""
                if ndim == 0 and (is_key_array(leaf) or is_ref(leaf)):
                    hint = (
                        " To give every example its own RngStream, pass "
                        "`stream.split(batch_size)`; to share one, give it the axis "
                        "None."
                    )
                raise ValueError(
                    f"{who}: in_axes at {where(index)}: axis {axis} is out of "
                    f"range for an array of shape {tuple(leaf.shape)}.{hint}"
                )
            axis %= ndim
            mapped.append((index, leaf, axis))
        axes.append(axis)
    return MappedArguments(dynamic, axes, static_part, mapped, call)


class UnmappableLeafError(ValueError, TypeError):
    """An integer axis given to an argument or output leaf that is not an array
    (nor, for an output, a Python number). A `ValueError`, as filterax
    documents, and a `TypeError`, as Equinox raises for a string or a function
    there."""


def _describe(leaf: Any) -> str:
    text = repr(leaf)
    return f"a {type(leaf).__name__} ({text[:40]}{'...' if len(text) > 40 else ''})"


def batch_size(call: MappedArguments, axis_size: int | None, who: str) -> int:
    """The common size of the mapped axes of `call`, checked against
    `axis_size`."""
    sizes = set() if axis_size is None else {axis_size}
    sizes.update([leaf.shape[axis] for _, leaf, axis in call.mapped])
    if len(sizes) == 1:
        return sizes.pop()
    if not sizes:
        raise ValueError(
            f"{who}: nothing to map over: no argument leaf is an array with an "
            "integer in_axes, so the batch size is unknown. Pass axis_size=..."
        )
    # They disagree: list who says what, in order of appearance.
    where: dict[int, list[str]] = {}
    if axis_size is not None:
        where[axis_size] = ["axis_size"]
    for index, leaf, axis in call.mapped:
        where.setdefault(leaf.shape[axis], []).append(
            f"{call.where(index)} (axis {axis})"
        )
    listing = "; ".join(
        f"size {size}: {', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''}"
        for size, paths in where.items()
    )
    raise ValueError(f"{who}: the mapped axes disagree on the batch size: {listing}.")


# --- Outputs -----------------------------------------------------------------------

# The kind of each output leaf, kept as the mask of the output's `StaticPart`
# (non-zero for the dynamic leaves, as that mask wants).
_STATIC_OUT, _MAPPED_OUT, _UNMAPPED_OUT = 0, 1, 2


class MappedOutput:
    """How to rebuild a mapped function's output: its `StaticPart` over the
    non-array leaves, whose mask also says which array leaves are mapped and
    which unmapped; the requested axis and key path of each mapped leaf, and
    the key paths of the unmapped ones (the paths are for errors)."""

    __slots__ = ("axes", "static", "unmapped_paths")

    def __init__(
        self,
        static: StaticPart,
        axes: tuple[tuple[int, tuple], ...],
        unmapped_paths: tuple[tuple, ...],
    ):
        self.static = static
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
        for leaf, (axis, path) in zip(mapped, self.axes):
            ndim = leaf.ndim
            if not -ndim <= axis < ndim:
                raise ValueError(
                    f"{who}: out_axes at {_out_path(path)} is {axis}, out of range "
                    f"for the batched output of shape {tuple(leaf.shape)}."
                )
            moved.append(leaf if axis % ndim == 0 else jnp.moveaxis(leaf, 0, axis))
        if not unmapped:
            dynamic = moved
        else:
            mapped_iter, unmapped_iter = iter(moved), iter(unmapped)
            dynamic = [
                next(mapped_iter) if kind == _MAPPED_OUT else next(unmapped_iter)
                for kind in self.static.mask
                if kind != _STATIC_OUT
            ]
        return self.static.merge_restoring_refs(dynamic, inputs)


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
    spec_leaves, subtrees = _covering_specs(
        out_axes,
        out,
        name=f"{who}: out_axes",
        root="the output",
        is_spec=is_spec,
        describe=_out_path,
    )
    leaves_with_paths, treedef = jtu.tree_flatten_with_path(out)
    paths = [path for path, _ in leaves_with_paths]
    leaves = [leaf for _, leaf in leaves_with_paths]
    specs = _spread_specs(spec_leaves, subtrees, len(leaves))
    if any(map(is_ref, leaves)):
        leaves = mark_input_refs(leaves, inputs, who)
    name = f"{who}: out_axes"
    mapped, unmapped, axes, unmapped_paths = [], [], [], []
    kinds, static = bytearray(), []
    for path, leaf, spec in zip(paths, leaves, specs):
        if isinstance(leaf, InputRef):
            kinds.append(_STATIC_OUT)
            static.append(leaf)
            continue
        array = is_array(leaf)
        if type(spec) is if_array:
            # What `spec(leaf)` returns: the Refs were all replaced above.
            axis = spec.axis if array else None
        else:
            axis = _axis(spec, leaf, name, _out_path, path)
        if not array:
            if axis is None:
                kinds.append(_STATIC_OUT)
                static.append(leaf)
                continue
            if not is_array_like(leaf):
                raise UnmappableLeafError(
                    f"{who}: out_axes gives the output at {_out_path(path)} the axis "
                    f"{axis}, but it is {_describe(leaf)}, not an array: only arrays "
                    "and Python numbers can be stacked. Give it the axis None (it is "
                    "returned once), or use if_array(0)."
                )
            leaf = jnp.asarray(leaf)
        if axis is None:
            kinds.append(_UNMAPPED_OUT)
            unmapped.append(leaf)
            unmapped_paths.append(path)
        else:
            kinds.append(_MAPPED_OUT)
            mapped.append(leaf)
            axes.append((axis, path))
    info = MappedOutput(
        StaticPart(treedef, bytes(kinds), tuple(static)),
        tuple(axes),
        tuple(unmapped_paths),
    )
    return mapped, unmapped, info


def unmapped_output_error(
    error: Exception, paths: Sequence[Sequence[Any]], who: str
) -> None:
    """Re-raises JAX's "output was batched" error naming the outputs (given by
    key path) at fault."""
    raise ValueError(
        f"{who}: out_axes is None for the output(s) at "
        f"{', '.join(map(_out_path, paths))}, but at least one of them depends on "
        "the mapped inputs. Give them an integer axis (or if_array(0))."
    ) from error


def raise_for_batched_unmapped_output(
    error: ValueError,
    body: Callable[[list[Any]], tuple[list, list, MappedOutput]],
    axes: list[int | None],
    dynamic: list[Any],
    axis_name: Hashable | None,
    axis_size: int | None,
    who: str,
) -> None:
    """When `error` is JAX's "but output was batched" (an output given the
    axis `None` depends on the mapped inputs), re-raises it naming those
    outputs; otherwise returns.

    `body` is the mapped function (returning `split_mapped_output`'s triple),
    `axes` and `dynamic` its per-leaf input axes and inputs: it is traced again,
    shapes only, with every output mapped, to learn the unmapped outputs'
    paths.
    """
    if "but output was batched" not in str(error):
        return
    everything_mapped = jax.vmap(
        body, in_axes=(axes,), axis_name=axis_name, axis_size=axis_size
    )
    _, _, info = jax.eval_shape(everything_mapped, dynamic)
    unmapped_output_error(error, info.unmapped_paths, who)


def is_batched_ref_write_error(error: BaseException) -> bool:
    """JAX's refusal to write a per-example value into a Ref shared across the
    batch (its message is the only way to recognise it)."""
    return "unbatched array reference" in str(error)


def flatten_spec_prefix(
    prefix: Any, is_spec: Callable[[Any], bool], name: str, refusal: str
) -> tuple[Any, tuple[Any, ...]]:
    """`(treedef, leaves)` of a prefix of sharding specs, its hashable form;
    a `TypeError` naming the place of a leaf for which `is_spec` is false,
    `f"{path} is {leaf!r}; {refusal}"`. (`PartitionSpec` is a tuple: `is_spec`
    stops JAX from descending into it.)"""
    leaves_with_paths, treedef = jtu.tree_flatten_with_path(prefix, is_leaf=is_spec)
    for path, leaf in leaves_with_paths:
        if not is_spec(leaf):
            raise TypeError(f"{path_text(name, path)} is {leaf!r}; {refusal}")
    return treedef, tuple(leaf for _, leaf in leaves_with_paths)
