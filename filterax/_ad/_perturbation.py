"""What the differentiation transforms share: which leaves are differentiable,
splitting pytrees into what JAX differentiates and what it carries, and
matching user-given tangents and cotangents against primals and outputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
from jax.dtypes import canonicalize_dtype, float0

from .._tree._filters import (
    combine,
    is_array,
    is_inexact_array,
    is_inexact_array_like,
    partition,
)
from .._tree._split import Static
from .._tree._structure import describe_value, path_text, prefix_difference
from ._nondiff import NonDifferentiable, partition_differentiable
from ._symbolic_zero import SymbolicZero, cotangent_dtype, is_none_or_zero

__all__ = [
    "LeafInfo",
    "PerturbationError",
    "describe_leaf",
    "match_perturbation",
    "merge_differentiable",
    "skeleton",
    "split_differentiable",
]


class PerturbationError(ValueError, TypeError):
    """A tangent or cotangent that does not fit what it perturbs. A
    `ValueError`, as filterax documents, and a `TypeError`, as Equinox raises
    for tangents: code catching either keeps working."""


def split_differentiable(
    tree: Any, differentiable: Callable[[Any], bool] = is_inexact_array
) -> tuple[Any, Any, Static]:
    """Splits a pytree into the part JAX differentiates, the other arrays (which
    JAX can carry but not differentiate), and the non-array leaves (hidden in a
    `Static`, since JAX transforms only let arrays out)."""
    diff, rest = partition_differentiable(tree, differentiable)
    arrays, objects = partition(rest, is_array)
    return diff, arrays, Static(objects)


def merge_differentiable(diff: Any, arrays: Any, objects: Static) -> Any:
    """Inverse of `split_differentiable`."""
    # `arrays` and `objects` share their full structure; `diff` has a single
    # `None` where a whole `NonDifferentiable` sits, so it is merged last.
    return combine(diff, combine(arrays, objects.value))


def describe_leaf(leaf: Any) -> str:
    """A short human description of a pytree leaf for error messages."""
    if isinstance(leaf, SymbolicZero):
        return repr(leaf)
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return f"an array of shape {tuple(leaf.shape)} and dtype {leaf.dtype}"
    return f"a Python {type(leaf).__name__} ({leaf!r:.60})"


class LeafInfo:
    """What a transform knows about one leaf of a primal or output: whether it
    is differentiable, and its shape and dtype if it is an array (or a Python
    float or complex, as a 0-d array).

    Hashable, and deliberately not a pytree node, so that a pytree of them (a
    "skeleton") mirrors the structure of the original and can be matched
    against a user's tangent or cotangent."""

    __slots__ = ("description", "differentiable", "dtype", "python_scalar", "shape")

    def __init__(self, leaf: Any, differentiable: bool):
        self.differentiable = differentiable
        self.python_scalar = isinstance(leaf, (float, complex)) and not is_array(leaf)
        self.shape: tuple[int, ...] | None
        self.dtype: Any
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if is_array(leaf):
            self.shape, self.dtype = tuple(shape or ()), dtype
        elif differentiable:  # a Python float or complex
            self.shape, self.dtype = (), jnp.result_type(leaf)
        else:
            self.shape, self.dtype = None, None
        if differentiable:
            self.description = describe_leaf(leaf)
        elif is_inexact_array(leaf):
            self.description = f"{describe_leaf(leaf)} inside a NonDifferentiable"
        elif is_array(leaf):
            self.description = (
                f"a non-differentiable array of shape {self.shape} and dtype {dtype}"
            )
        else:
            self.description = describe_leaf(leaf)

    def _key(self) -> tuple:
        return (self.differentiable, self.shape, self.dtype, self.description)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LeafInfo) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


def skeleton(
    tree: Any, differentiable: Callable[[Any], bool] = is_inexact_array
) -> Any:
    """`tree` with every leaf replaced by its `LeafInfo`."""
    diff, rest = partition_differentiable(tree, differentiable)
    diff_info = jtu.tree_map(lambda x: LeafInfo(x, True), diff)
    rest_info = jtu.tree_map(lambda x: LeafInfo(x, False), rest)
    return combine(diff_info, rest_info)


def _is_prefix_leaf(node: Any) -> bool:
    return is_none_or_zero(node) or isinstance(node, (LeafInfo, NonDifferentiable))


def match_perturbation(
    perturbation: Any,
    structure: Any,
    kind: str,
    root: str,
    owner: str | None = None,
    keep_python_scalars: bool = False,
    ignore_non_differentiable: bool = False,
) -> list[tuple[int, Any]]:
    """Matches a tangent or cotangent against the `skeleton` of what it perturbs.

    `perturbation` must have `structure`'s structure, except that `None` or a
    `SymbolicZero` may stand in for any leaf or whole subtree. Returns the
    non-zero perturbations as `(index, value)` pairs, where `index` counts the
    differentiable leaves of `structure` in flattening order.

    Raises `PerturbationError` naming the key path (under `root`) of the first
    mismatch; `kind` ("tangent" or "cotangent") and `owner` (what it perturbs:
    "output", "primal", "argument") are used in messages. A Python scalar given
    for a Python scalar stays one with `keep_python_scalars` (custom rules hand
    it back to JAX as such); otherwise it becomes an array. With
    `ignore_non_differentiable`, whatever stands at a non-differentiable leaf
    is dropped rather than refused (a custom rule's copy of the primal there).
    """
    if owner is None:
        owner = "output" if kind == "cotangent" else "primal"
    paths_values, perturbation_def = jtu.tree_flatten_with_path(
        perturbation, is_leaf=is_none_or_zero
    )
    try:
        subtrees = perturbation_def.flatten_up_to(structure)
    except (ValueError, TypeError):
        raise _structure_error(perturbation, structure, kind, owner, root) from None
    live: list[tuple[int, Any]] = []
    index = 0
    for (path, value), subtree in zip(paths_values, subtrees):
        infos = jtu.tree_leaves(subtree)
        if isinstance(subtree, LeafInfo):
            value = _check_leaf(
                value,
                subtree,
                kind,
                owner,
                path_text(root, path),
                keep_python_scalars,
                ignore_non_differentiable,
            )
            if value is not None:
                live.append((index, value))
        elif not is_none_or_zero(value):
            raise PerturbationError(
                f"The {kind} at {path_text(root, path)} is {describe_leaf(value)}, "
                f"but there the {owner} is a pytree with structure "
                f"{jtu.tree_structure(subtree)}; give a {kind} of that structure, "
                "or None for all of it."
            )
        index += sum(info.differentiable for info in infos)
    return live


def _check_leaf(
    value: Any,
    info: LeafInfo,
    kind: str,
    owner: str,
    at: str,
    keep_scalars: bool,
    ignore_non_differentiable: bool,
) -> Any:
    """Validates one tangent/cotangent leaf; returns it as an array, or `None`
    when it is a (symbolic) zero or ignored."""
    if value is None:
        return None
    if isinstance(value, SymbolicZero):
        if info.shape is not None and (
            value.shape != info.shape or value.dtype != cotangent_dtype(info.dtype)
        ):
            raise PerturbationError(
                f"The {kind} at {at} is {value!r}, but the {owner} there is "
                f"{info.description}; expected "
                f"{SymbolicZero(info.shape, info.dtype)!r}."
            )
        return None
    if not info.differentiable:
        if ignore_non_differentiable or _is_float0_zero(value, info):
            return None
        raise PerturbationError(
            f"The {owner} at {at} is {info.description}, so its {kind} must "
            f"be None, a SymbolicZero or JAX's float0 zero of its shape; got "
            f"{describe_leaf(value)}."
        )
    if is_inexact_array_like(value) and not is_array(value):
        if isinstance(value, complex) and not jnp.issubdtype(
            info.dtype, jnp.complexfloating
        ):
            raise PerturbationError(
                f"The {kind} at {at} is {describe_leaf(value)}, but the {owner} "
                f"there is {info.description}. A real {owner} takes a real "
                f"{kind}, never a complex one: pass a real value (its real part, "
                "say)."
            )
        if keep_scalars and info.python_scalar:
            return value
        weak = info.python_scalar and type(value) in (float, complex)
        # A Python scalar for a Python scalar stays weakly typed, as `jax.jvp`
        # takes it (so the output tangent promotes as the primal output does).
        value = jnp.asarray(value) if weak else jnp.asarray(value, dtype=info.dtype)
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        raise PerturbationError(
            f"The {kind} at {at} is {describe_leaf(value)}; expected an array of "
            f"shape {info.shape} and dtype {info.dtype}, or None."
        )
    expected = canonicalize_dtype(info.dtype)
    if value.dtype != expected and canonicalize_dtype(value.dtype) == expected:
        # NumPy's float64 with x64 disabled: JAX takes it as float32, as it
        # does the primals.
        value = jnp.asarray(value, expected)
    if tuple(value.shape) != info.shape or value.dtype != expected:
        hint = ""
        if jnp.iscomplexobj(value) and not jnp.iscomplexobj(jnp.zeros((), info.dtype)):
            hint = f" A real {owner} takes a real {kind}, never a complex one."
        raise PerturbationError(
            f"The {kind} at {at} has shape {tuple(value.shape)} and dtype "
            f"{value.dtype}; expected shape {info.shape} and dtype {expected}, "
            f"matching the {owner} there.{hint}"
        )
    return value


def _is_float0_zero(value: Any, info: LeafInfo) -> bool:
    """Whether `value` is the `float0` array that `jax.jvp`/`jax.vjp` take as
    the (co)tangent of an integer or boolean array: the shape of the leaf it
    stands for (any shape where that leaf is not an array, as JAX does for a
    Python int: a 0-d one)."""
    if getattr(value, "dtype", None) != float0:
        return False
    return info.shape is None or tuple(value.shape) == info.shape


def _structure_error(
    perturbation: Any, structure: Any, kind: str, owner: str, root: str
) -> PerturbationError:
    """Names the first place where `perturbation` leaves `structure`."""
    difference = prefix_difference(perturbation, structure, _is_prefix_leaf)
    where = difference.where(root) if difference else path_text(root, ())
    if difference is None:
        detail = f"{describe_value(perturbation)}, which does not fit"
    elif difference.kind == "structure":
        detail = difference.detail.replace(
            "where the tree has", f"where the {owner} has"
        )
    else:
        detail = difference.detail
    hint = ""
    if difference is not None and difference.kind == "structure":
        hint = _key_hint(perturbation, structure, difference.path, kind)
    return PerturbationError(
        f"The {kind} at {where} has {detail}.{hint} A {kind} must have the "
        f"{owner}'s structure, with None or a SymbolicZero allowed in place of any "
        "leaf or subtree."
    )


def _key_hint(perturbation: Any, structure: Any, path: tuple, kind: str) -> str:
    try:
        for key in path:
            perturbation = dict(jtu.flatten_one_level_with_keys(perturbation)[0])[key]
            structure = dict(jtu.flatten_one_level_with_keys(structure)[0])[key]
    except (KeyError, ValueError, TypeError):
        return ""
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
