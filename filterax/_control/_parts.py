"""The three parts of a tree that goes through a loop or a branch: the arrays
JAX traces, the Refs it shares, and the static leaves it keeps in Python.

`split_parts` flattens once (through `_tree._split.split`); `Parts.merge` rebuilds.
`check_unchanged` is the carry rule of every loop: same structure, same static
leaves, same array shapes and dtypes, the very same Refs. `first_difference`
finds where two trees part, for the error messages of loops and branches.
`check_count` validates the integer options of loops (`max_steps`,
`checkpoints`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from typing import Any

import jax
import jax.tree_util as jtu

from .._compat import same_structure
from .._tree._filters import is_ref
from .._tree._split import StaticPart, interleave, split
from .._tree._structure import TreeDifference, array_text, describe_value, tree_diff

__all__ = [
    "Parts",
    "array_avals",
    "check_count",
    "check_unchanged",
    "first_difference",
    "same_avals",
    "split_parts",
    "strong_type",
]


class Parts:
    """Everything about a split tree except its arrays: the `StaticPart` (whose
    dynamic leaves are the arrays and the Refs), which of those dynamic leaves
    are Refs (`ref_mask`, one byte per dynamic leaf, non-zero for a Ref), and the
    Refs themselves."""

    __slots__ = ("ref_mask", "refs", "static")

    def __init__(self, static: StaticPart, ref_mask: bytes, refs: tuple):
        self.static = static
        self.ref_mask = ref_mask
        self.refs = refs

    def merge(self, arrays: Sequence[Any]) -> Any:
        """The tree, with `arrays` in place of its arrays and its own Refs."""
        if not self.refs:
            return self.static.merge(arrays)
        return self.static.merge(interleave(self.ref_mask, self.refs, arrays))

    def same_layout(self, other: Parts) -> bool:
        """Same structure and static leaves, and the very same Refs in the same
        places (arrays are not compared)."""
        if self.ref_mask != other.ref_mask or any(
            a is not b for a, b in zip(self.refs, other.refs)
        ):
            return False
        try:
            return self.static == other.static
        except TypeError:  # an unhashable static leaf: compare leaf by leaf
            return (
                same_structure(self.static.treedef, other.static.treedef)
                and not any(
                    _static_leaves_differ(a, b)
                    for a, b in zip(self.static.static, other.static.static)
                )
                and self.static.mask == other.static.mask
            )


def _static_leaves_differ(a: Any, b: Any) -> bool:
    try:
        return type(a) is not type(b) or not bool(a == b)
    except Exception:  # `==` without a truth value
        return a is not b


def split_parts(tree: Any) -> tuple[list[Any], Parts]:
    """The arrays of `tree` (key arrays included), and the `Parts` that
    rebuild it from them."""
    dynamic, static = split(tree)
    ref_mask = bytes(map(is_ref, dynamic))
    if not any(ref_mask):
        return dynamic, Parts(static, ref_mask, ())
    arrays = [leaf for leaf, r in zip(dynamic, ref_mask) if not r]
    refs = tuple(compress(dynamic, ref_mask))
    return arrays, Parts(static, ref_mask, refs)


def same_avals(before: Sequence[Any], after: Sequence[Any]) -> bool:
    """Whether two lists of arrays agree in length, shapes and dtypes."""
    # Weak types may differ: `lax` promotes a weakly typed input to the type
    # the body returns.
    return len(before) == len(after) and all(
        tuple(x.shape) == tuple(y.shape) and x.dtype == y.dtype
        for x, y in zip(before, after)
    )


def first_difference(before: Any, after: Any) -> TreeDifference | None:
    """The first place where `after` stops matching `before` under the carry
    rule (arrays by shape and dtype, other leaves by type and value, Refs by
    identity), or `None`."""
    differences = tree_diff(before, after, compare_values=False, max_differences=1)
    if differences:
        return differences[0]
    after_leaves = jtu.tree_leaves(after)
    for (path, x), y in zip(jtu.tree_flatten_with_path(before)[0], after_leaves):
        if (is_ref(x) or is_ref(y)) and x is not y:
            if is_ref(x) and is_ref(y):
                detail = (
                    f"{_describe(x)} vs another {_describe(y)}: a Ref is shared, "
                    "not copied, so the same Ref object must come back"
                )
            else:
                detail = (
                    f"{_describe(x)} vs {_describe(y)}: an array and a Ref cannot "
                    "take each other's place"
                )
            return TreeDifference(tuple(path), "type", detail)
    return None


def _describe(leaf: Any) -> str:
    if is_ref(leaf):  # also a traced Ref, which `describe_value` shows as an array
        return f"Ref({array_text(leaf.shape, leaf.dtype)})"
    return describe_value(leaf)


def check_unchanged(
    where: str,
    root: str,
    before: Any,
    before_parts: Parts,
    before_arrays: Sequence[Any],
    after: Any,
    after_parts: Parts,
    after_arrays: Sequence[Any],
    what: str,
) -> None:
    """Raises a `TypeError` naming the key path under `root` when `after`
    breaks the carry rule against `before`.

    `where` names the function (`filter_scan`) and `what` says which sides are
    compared (`"given vs returned"`).
    """
    if before_parts.same_layout(after_parts) and same_avals(
        before_arrays, after_arrays
    ):
        return
    difference = first_difference(before, after)
    place = "" if difference is None else f" at {difference.where(root)}"
    detail = "" if difference is None else f": {difference.detail} ({what})"
    hint = ""
    if difference is not None and difference.kind == "type":
        leaf = _leaf_at(before, difference.path)
        if isinstance(leaf, (bool, int, float, complex)):
            hint = (
                f" {root} holds a Python {type(leaf).__name__} there, which is "
                "static (part of the program): to carry a number that changes, "
                "make it an array, e.g. `jnp.asarray(...)`."
            )
    raise TypeError(
        f"{where}: the {root} changed{place}{detail}. A {root} must keep its "
        "structure, its non-array leaves and the shape and dtype of its arrays "
        f"from one step to the next, and give back the same Refs.{hint}"
    )


def _leaf_at(tree: Any, path: tuple) -> Any:
    for leaf_path, leaf in jtu.tree_flatten_with_path(tree)[0]:
        if tuple(leaf_path) == tuple(path):
            return leaf
    return None


def check_count(where: str, name: str, value: Any, minimum: int) -> int | None:
    """`value` (an int option such as `max_steps`), or `None`; raises a
    `TypeError` for a non-int (`bool` included) and a `ValueError` below
    `minimum`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: `{name}` must be an int or None; got {value!r}.")
    if value < minimum:
        raise ValueError(f"{where}: `{name}` must be at least {minimum}; got {value}.")
    return value


def array_avals(arrays: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    """Shape and dtype of each array, for tracing a body ahead of a loop."""
    return [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in arrays]


def strong_type(x: Any) -> Any:
    """`x` without a weak type. A body traced ahead of its loop returns
    strongly typed arrays, so the loop's inputs must be strongly typed too."""
    if getattr(x, "weak_type", False):
        return jax.lax.convert_element_type(x, x.dtype)
    return x
