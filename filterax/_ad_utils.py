"""Shared machinery of the filtered differentiation transforms: splitting
pytrees into what JAX differentiates and what it carries, matching user-given
tangents and cotangents against primals and outputs, and the callable pytree
returned by the transforms."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu

from ._bound_method import BoundMethod
from ._filters import combine, is_array, is_inexact_array, partition
from ._nondiff import partition_differentiable
from ._static import Static
from ._symbolic_zero import SymbolicZero, cotangent_dtype, is_none_or_zero


def split_output(tree: Any) -> tuple[Any, Any, Static]:
    """Splits a function's output into the part JAX differentiates, the other
    arrays (which JAX can carry but not differentiate), and the non-array leaves
    (hidden in a `Static`, since JAX transforms only let arrays out)."""
    diff, rest = partition_differentiable(tree)
    arrays, objects = partition(rest, is_array)
    return diff, arrays, Static(objects)


def merge_output(diff: Any, arrays: Any, objects: Static) -> Any:
    """Inverse of `split_output`."""
    # `arrays` and `objects` share their full structure; `diff` has a single
    # `None` where a whole `NonDifferentiable` sits, so it is merged last.
    return combine(diff, combine(arrays, objects.value))


def _array_text(leaf: Any) -> str:
    return f"array of shape {tuple(leaf.shape)} and dtype {leaf.dtype}"


def describe_leaf(leaf: Any) -> str:
    """A short human description of a pytree leaf for error messages."""
    if isinstance(leaf, SymbolicZero):
        return repr(leaf)
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return f"an {_array_text(leaf)}"
    return f"a Python {type(leaf).__name__} ({leaf!r:.60})"


def where(root: str, path: jtu.KeyPath) -> str:
    """`root` followed by the key path, e.g. `out['alpha']`."""
    return root + jtu.keystr(path)


class LeafInfo:
    """What a transform knows about one leaf of a primal or output: whether it
    is differentiable, and its shape and dtype if it is an array.

    Hashable, and deliberately not a pytree node, so that a pytree of them (a
    "skeleton") mirrors the structure of the original and can be matched
    against a user's tangent or cotangent."""

    __slots__ = ("differentiable", "shape", "dtype", "description")

    def __init__(self, leaf: Any, differentiable: bool):
        self.differentiable = differentiable
        self.shape = tuple(leaf.shape) if is_array(leaf) else None
        self.dtype = leaf.dtype if is_array(leaf) else None
        if differentiable:
            self.description = describe_leaf(leaf)
        elif is_inexact_array(leaf):
            self.description = f"{describe_leaf(leaf)} inside a NonDifferentiable"
        elif is_array(leaf):
            self.description = f"a non-differentiable {_array_text(leaf)}"
        else:
            self.description = describe_leaf(leaf)

    def _key(self) -> tuple:
        return (self.differentiable, self.shape, self.dtype, self.description)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeafInfo) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def skeleton(tree: Any) -> Any:
    """`tree` with every leaf replaced by its `LeafInfo`."""
    diff, rest = partition_differentiable(tree)
    diff_info = jtu.tree_map(lambda x: LeafInfo(x, True), diff)
    rest_info = jtu.tree_map(lambda x: LeafInfo(x, False), rest)
    return combine(diff_info, rest_info)


def match_perturbation(
    perturbation: Any, structure: Any, kind: str, root: str, owner: str | None = None
) -> list[tuple[int, Any]]:
    """Matches a tangent or cotangent against the `skeleton` of what it perturbs.

    `perturbation` must have `structure`'s structure, except that `None` or a
    `SymbolicZero` may stand in for any leaf or whole subtree. Returns the
    non-zero perturbations as `(index, value)` pairs, where `index` counts the
    differentiable leaves of `structure` in flattening order.

    Raises `ValueError` naming the key path (under `root`) of the first
    mismatch; `kind` ("tangent" or "cotangent") and `owner` (what it perturbs:
    "output", "primal", "argument") are used in messages.
    """
    if owner is None:
        owner = "output" if kind == "cotangent" else "primal"
    paths_values, perturbation_def = jtu.tree_flatten_with_path(
        perturbation, is_leaf=is_none_or_zero
    )
    try:
        subtrees = perturbation_def.flatten_up_to(structure)
    except (ValueError, TypeError):
        raise _structure_error(perturbation, structure, kind, owner, root, ()) from None
    live: list[tuple[int, Any]] = []
    index = 0
    for (path, value), subtree in zip(paths_values, subtrees):
        infos = jtu.tree_leaves(subtree)
        if isinstance(subtree, LeafInfo):
            value = _check_leaf(value, subtree, kind, owner, where(root, path))
            if value is not None:
                live.append((index, value))
        elif not is_none_or_zero(value):
            raise ValueError(
                f"The {kind} at {where(root, path)} is {describe_leaf(value)}, but "
                f"there the {owner} is a pytree with structure "
                f"{jtu.tree_structure(subtree)}; give a {kind} of that structure, "
                "or None for all of it."
            )
        index += sum(info.differentiable for info in infos)
    return live


def _check_leaf(value: Any, info: LeafInfo, kind: str, owner: str, at: str) -> Any:
    """Validates one tangent/cotangent leaf; returns it as an array, or `None`
    when it is a (symbolic) zero."""
    if value is None:
        return None
    if isinstance(value, SymbolicZero):
        if info.shape is not None and (
            value.shape != info.shape or value.dtype != cotangent_dtype(info.dtype)
        ):
            raise ValueError(
                f"The {kind} at {at} is {value!r}, but the {owner} there is "
                f"{info.description}; expected "
                f"{SymbolicZero(info.shape, info.dtype)!r}."
            )
        return None
    if not info.differentiable:
        raise ValueError(
            f"The {owner} at {at} is {info.description}, so its {kind} must "
            f"be None or a SymbolicZero; got {describe_leaf(value)}."
        )
    if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
        value = jnp.asarray(value, dtype=info.dtype)
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        raise ValueError(
            f"The {kind} at {at} is {describe_leaf(value)}; expected an array of "
            f"shape {info.shape} and dtype {info.dtype}, or None."
        )
    if tuple(value.shape) != info.shape or value.dtype != info.dtype:
        raise ValueError(
            f"The {kind} at {at} has shape {tuple(value.shape)} and dtype "
            f"{value.dtype}; expected shape {info.shape} and dtype {info.dtype}, "
            f"matching the {owner} there."
        )
    return value


def _structure_error(
    perturbation: Any, structure: Any, kind: str, owner: str, root: str, path: tuple
) -> ValueError:
    """Finds the first place where `perturbation` leaves `structure`."""
    at = where(root, path)
    if is_none_or_zero(perturbation):
        return ValueError(f"The {kind} does not match the {owner} at {at}.")
    p_children = _one_level(perturbation)
    s_children = _one_level(structure)
    if p_children is None or s_children is None or p_children[1] != s_children[1]:
        expected = (
            structure.description
            if isinstance(structure, LeafInfo)
            else f"a pytree with structure {jtu.tree_structure(structure)}"
        )
        got = (
            describe_leaf(perturbation)
            if p_children is None
            else f"a pytree with structure "
            f"{jtu.tree_structure(perturbation, is_leaf=is_none_or_zero)}"
        )
        return ValueError(
            f"The {kind} at {at} is {got}, but the {owner} there is "
            f"{expected}.{_key_hint(perturbation, structure, kind)} A {kind} must have "
            f"the {owner}'s structure, with None or a SymbolicZero allowed "
            "in place of any leaf or subtree."
        )
    for (key, p_child), (_, s_child) in zip(p_children[0], s_children[0]):
        if is_none_or_zero(p_child):
            continue
        try:
            jtu.tree_structure(p_child, is_leaf=is_none_or_zero).flatten_up_to(s_child)
        except (ValueError, TypeError):
            return _structure_error(p_child, s_child, kind, owner, root, (*path, key))
    return ValueError(f"The {kind} does not match the {owner} at {at}.")


def _key_hint(perturbation: Any, structure: Any, kind: str) -> str:
    if not (isinstance(perturbation, dict) and isinstance(structure, dict)):
        return ""
    missing = sorted(map(repr, structure.keys() - perturbation.keys()))
    extra = sorted(map(repr, perturbation.keys() - structure.keys()))
    hint = ""
    if missing:
        hint += f" Missing keys: {', '.join(missing)} (use None for no {kind})."
    if extra:
        hint += f" Unexpected keys: {', '.join(extra)}."
    return hint


def _one_level(tree: Any) -> tuple[list, Any] | None:
    """`tree`'s children as `(key, child)` pairs with its node type and
    metadata, or `None` if `tree` is a leaf."""
    if isinstance(tree, LeafInfo) or is_none_or_zero(tree):
        return None
    node_def = jtu.tree_structure(tree, is_leaf=lambda x: x is not tree)
    if jtu.treedef_is_leaf(node_def):
        return None
    children, _ = jtu.flatten_one_level_with_keys(tree)
    return children, node_def


def unpack_aux(result: Any, name: str) -> tuple[Any, Any]:
    """Splits `(value, aux)` returned by a `has_aux=True` function."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError(
            f"{name} was given has_aux=True, so `fun` must return a pair "
            f"(output, aux); it returned {describe_leaf(result)}."
        )
    return result[0], result[1]


def first_argument(args: tuple, kwargs: dict, name: str) -> tuple[Any, tuple]:
    """The argument a transform differentiates, with the remaining positional
    arguments; a clear error if it was not given positionally."""
    if args:
        return args[0], args[1:]
    if kwargs:
        raise TypeError(
            f"{name} differentiates with respect to the first positional argument, "
            f"but the function was called with keyword arguments only "
            f"({', '.join(kwargs)}). Pass the argument to differentiate "
            "positionally."
        )
    raise TypeError(
        f"{name} differentiates with respect to the first positional argument, "
        "but the function was called with no arguments."
    )


class FunctionWrapper:
    """Base of the callables returned by the filtered transforms.

    A registered pytree whose child is the wrapped function (so a Module method
    or `Partial` keeps its arrays visible to `filter_jit`), with the transform's
    options as static metadata. As a class attribute it binds like a method:
    `instance.method(*args)` calls the wrapper with `instance` first.
    """

    _transform_name = "transform"

    def __init__(self, fun: Callable, options: tuple):
        self.fun = fun
        self.options = options
        functools.update_wrapper(self, fun, updated=())

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        return BoundMethod(self, instance)

    def __repr__(self) -> str:
        return f"{self._transform_name}({self.fun!r})"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        jtu.register_pytree_with_keys(
            cls,
            lambda w: (((jtu.GetAttrKey("fun"), w.fun),), w.options),
            lambda options, children: cls(children[0], options),
            flatten_func=lambda w: ((w.fun,), w.options),
        )
