"""Splitting a pytree into the leaves a JAX transform traces and the rest.

The one home for the mechanism every filtered transform is built on: flatten
once, separate the *dynamic* leaves (what JAX traces, batches or differentiates)
from the *static* ones (everything else, carried as Python values), call JAX,
and merge the two back once.

- `split(tree, is_dynamic)` returns the dynamic leaves as a list and a
  `StaticPart` holding the treedef, where the dynamic leaves sit, and the
  static leaves. `StaticPart.merge(dynamic)` rebuilds the tree.
- `StaticPart` is a pytree node without children: returned from inside a trace,
  it rides out in the treedef, so static outputs come back as the very Python
  objects the trace produced. It is hashable (when its static leaves are), so
  it can be a `static_argnums` argument or a cache key.
- `Static(value)` is the same trick for a single value.
- `leaf_kinds` classifies leaves for `filter_jit`'s hot path by type, cached.

Imports only JAX, `_filters` and `_rebuild`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import compress
from typing import TYPE_CHECKING, Any, cast

import jax.tree_util as jtu
from jax import ShapeDtypeStruct
from jax.core import Tracer

from ._filters import is_array, is_ref
from ._rebuild import flatten, make_builder

__all__ = [
    "ARRAY",
    "InputRef",
    "MixedOutput",
    "PyTreeDef",
    "mark_input_refs",
    "STATIC_MASK",
    "FROZEN_NODE_TYPES",
    "CONCRETE",
    "clear_leaf_kinds",
    "flatten",
    "STATIC",
    "TRACER",
    "Static",
    "StaticPart",
    "interleave",
    "is_dynamic_leaf",
    "is_module_type",
    "is_namedtuple_node",
    "kind_of_type",
    "leaf_kinds",
    "shape_signature",
    "split",
    "split_by_kind",
    "split_leaves",
]

# JAX's treedef class, bound as a plain variable in its own module: type
# checkers cannot use it in annotations, so they see `Any`.
if TYPE_CHECKING:
    PyTreeDef = Any
else:
    PyTreeDef = jtu.PyTreeDef


def is_dynamic_leaf(leaf: Any) -> bool:
    """The default split: arrays (JAX or NumPy, key arrays included) and Refs are
    dynamic; everything else is static."""
    return is_array(leaf) or is_ref(leaf)


# --- Leaf classification by type, for hot paths ----------------------------------

# A leaf is static (part of a cache key), dynamic (a concrete array or a Ref:
# traced), or a tracer (we are inside another transformation).
STATIC, ARRAY, TRACER = 0, 1, 2

# Classification depends only on a leaf's type, so it is cached per type. The
# containers are mutated in place, never rebound, so the bound methods taken
# from them stay valid after `clear_leaf_kinds`.
_KIND_BY_TYPE: dict[type, int] = {}
_kind_by_type = _KIND_BY_TYPE.__getitem__
# The kind of a leaf type seen before, else `None` (for node types too).
kind_of_type = _KIND_BY_TYPE.get

# A `bytes.translate` table over a kinds mask: 1 where the leaf is static.
STATIC_MASK = bytes.maketrans(b"\x00\x01\x02", b"\x01\x00\x00")
# The kinds of a traced output's leaves once it has left the trace: concrete.
CONCRETE = bytes.maketrans(b"\x02", b"\x01")

# Pytree node types (besides Modules, tuples, namedtuples and `None`) whose
# instances never change their children after construction (`filter_jit`
# remembers trees made of these by identity).
FROZEN_NODE_TYPES: set[type] = set()


def shape_signature(tree: Any) -> Any:
    """`tree` with its dynamic leaves replaced by `jax.ShapeDtypeStruct`s: what a
    compiled call fixed, for comparing calls (with `tree_diff`) without comparing
    array values."""
    return jtu.tree_map(
        lambda leaf: (
            ShapeDtypeStruct(leaf.shape, leaf.dtype) if is_dynamic_leaf(leaf) else leaf
        ),
        tree,
    )


def _kind_of(leaf: Any) -> int:
    if isinstance(leaf, Tracer):
        return TRACER
    if is_dynamic_leaf(leaf):
        return ARRAY
    return STATIC


def leaf_kinds(leaves: Sequence[Any]) -> bytes:
    """One byte per leaf: `STATIC`, `ARRAY` (a concrete array or Ref) or
    `TRACER`."""
    try:
        return bytes(map(_kind_by_type, map(type, leaves)))
    except KeyError:
        for leaf in leaves:
            leaf_type = type(leaf)
            if leaf_type not in _KIND_BY_TYPE:
                kind = _kind_of(leaf)
                _KIND_BY_TYPE[leaf_type] = kind
        return bytes(map(_kind_by_type, map(type, leaves)))


def clear_leaf_kinds() -> None:
    _KIND_BY_TYPE.clear()


def interleave(mask: bytes, dynamic: Iterable[Any], static: Iterable[Any]) -> list:
    """Merges `dynamic` and `static` leaves back into flattening order: `mask`
    has a non-zero byte where a dynamic leaf goes."""
    dynamic_iter, static_iter = iter(dynamic), iter(static)
    return [next(dynamic_iter) if kind else next(static_iter) for kind in mask]


# --- The static half of a split tree ---------------------------------------------


class StaticPart:
    """The static half of a split pytree: its treedef, where the dynamic leaves
    sit (`mask`, one byte per leaf, non-zero for dynamic) and the static leaves.

    Equal to another `StaticPart` when treedef, mask, static leaves and their
    types are equal (so `1`, `1.0` and `True` are told apart, as `jax.jit`
    does for static arguments). The hash is computed once, on first use.
    """

    __slots__ = (
        "__weakref__",
        "_build",
        "_hash",
        "_input_refs",
        "_merges",
        "mask",
        "static",
        "treedef",
    )

    def __init__(self, treedef: PyTreeDef, mask: bytes, static: tuple[Any, ...]):
        self.treedef = treedef
        self.mask = mask
        self.static = static
        self._hash: int | None = None
        self._build: Callable[[Sequence[Any]], Any] | None = None
        self._merges = 0
        self._input_refs: tuple[int, ...] | None = None

    def merge(self, dynamic: Iterable[Any]) -> Any:
        """The tree, with `dynamic` in place of its dynamic leaves."""
        build = self._build
        if build is None:
            # A part merged more than once (the output structure of a compiled
            # function) gets a builder of its own: see `_rebuild`.
            self._merges += 1
            if self._merges < 2:
                return self._unflatten(dynamic)
            build = make_builder(self.treedef, self.mask, self.static)
            build = self._build = build if build is not None else self._unflatten
        leaves = cast(list, dynamic) if dynamic.__class__ is list else list(dynamic)
        return build(leaves)

    def merge_restoring_refs(
        self, dynamic: Iterable[Any], inputs: Callable[[], Sequence[Any]]
    ) -> Any:
        """`merge`, with each `InputRef` marker among the static leaves replaced
        by the input Ref it stands for (`inputs()` gives the flattened traced
        inputs of the call). Where the markers sit is found once."""
        slots = self._input_ref_slots()
        if not slots:
            return self.merge(dynamic)
        given = inputs()
        static = list(self.static)
        for index in slots:
            static[index] = given[static[index].position]
        return self.treedef.unflatten(interleave(self.mask, dynamic, static))

    def _input_ref_slots(self) -> tuple[int, ...]:
        slots = self._input_refs
        if slots is None:
            slots = self._input_refs = tuple(
                index
                for index, leaf in enumerate(self.static)
                if type(leaf) is InputRef
            )
        return slots

    def holds_input_refs(self) -> bool:
        """Whether some static leaves are `InputRef` markers."""
        return bool(self._input_ref_slots())

    def _unflatten(self, dynamic: Iterable[Any]) -> Any:
        if not self.static:
            return self.treedef.unflatten(dynamic)
        return self.treedef.unflatten(interleave(self.mask, dynamic, self.static))

    @property
    def num_dynamic(self) -> int:
        return len(self.mask) - len(self.static)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(
                (self.treedef, self.mask, self.static, tuple(map(type, self.static)))
            )
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        try:
            return (
                other.__class__ is StaticPart
                and hash(self) == hash(other)
                and self.mask == other.mask  # type: ignore[attr-defined]
                and self.static == other.static  # type: ignore[attr-defined]
                and tuple(map(type, self.static)) == tuple(map(type, other.static))  # type: ignore[attr-defined]
                and self.treedef == other.treedef  # type: ignore[attr-defined]
            )
        except (TypeError, ValueError):
            # Static values without a plain `==` (an array in a static field,
            # which warned when its Module was built): told apart.
            return False

    def __repr__(self) -> str:
        return f"StaticPart({self.treedef}, static={self.static!r})"


jtu.register_pytree_node(StaticPart, lambda part: ((), part), lambda part, _: part)


def is_module_type(cls: type) -> bool:
    """Whether `cls` is a registered filterax Module class (duck-typed, so that
    this module need not import `_module`)."""
    plan = cls.__dict__.get("__filterax_plan__")
    return plan is not None and plan.registered


def is_namedtuple_node(cls: type, aux: Any) -> bool:
    """Whether a treedef node of type `cls` and node data `aux` is JAX's own
    namedtuple node (children: the items, in order)."""
    return issubclass(cls, tuple) and hasattr(cls, "_fields") and aux is None


def split(
    tree: Any,
    is_dynamic: Callable[[Any], bool] = is_dynamic_leaf,
    is_leaf: Callable[[Any], bool] | None = None,
) -> tuple[list[Any], StaticPart]:
    """Splits `tree` into its dynamic leaves and the `StaticPart` that rebuilds
    it from them.

    **Arguments:**

    - `tree`: any pytree.
    - `is_dynamic`: which leaves are dynamic; by default arrays and Refs.
    - `is_leaf`: as for `jax.tree_util.tree_flatten`.
    """
    if is_leaf is None:
        leaves, treedef = flatten(tree)
    else:
        leaves, treedef = jtu.tree_flatten(tree, is_leaf=is_leaf)
    return split_leaves(leaves, treedef, bytes(map(bool, map(is_dynamic, leaves))))


def split_leaves(
    leaves: Sequence[Any], treedef: PyTreeDef, mask: bytes
) -> tuple[list[Any], StaticPart]:
    """`split`, for leaves already flattened and classified: `mask` (or a kinds
    mask from `leaf_kinds`) is non-zero where a leaf is dynamic. Tracers and
    concrete arrays give the same `StaticPart`: a call under `grad` or
    `vmap` finds the compilation of the same call made outside."""
    static = tuple(compress(leaves, mask.translate(STATIC_MASK)))
    concrete = mask.translate(CONCRETE)
    return list(compress(leaves, mask)), StaticPart(treedef, concrete, static)


def split_by_kind(tree: Any) -> tuple[list[Any], StaticPart, bytes]:
    """`split` with the leaves classified by `leaf_kinds`: the dynamic leaves
    (arrays, Refs and tracers), the `StaticPart`, and the kinds of all the
    leaves. A leaf of a type not seen before comes back as a one-leaf part,
    and `leaf_kinds` knows its type from then on."""
    leaves, treedef = flatten(tree)
    kinds = leaf_kinds(leaves)
    values, part = split_leaves(leaves, treedef, kinds)
    return values, part, kinds


class MixedOutput:
    """An output with non-array leaves as it leaves a trace: the array leaves
    as its children, the output's `StaticPart` as static node data."""

    __slots__ = ("arrays", "static")

    def __init__(self, arrays: list[Any], static: StaticPart):
        self.arrays = arrays
        self.static = static


jtu.register_pytree_node(
    MixedOutput,
    lambda out: ((out.arrays,), out.static),
    lambda static, children: MixedOutput(children[0], static),
)


# --- Refs in outputs ----------------------------------------------------------------


class InputRef:
    """Stands, in the static part of a transform's output, for the input Ref at
    `position` among the transform's flattened traced inputs. JAX refuses to
    return Refs from `jit` and `vmap`; the transforms put the very Ref object
    that went in back in the marker's place."""

    __slots__ = ("position",)

    def __init__(self, position: int):
        self.position = position

    def __eq__(self, other: object) -> bool:
        return type(other) is InputRef and other.position == self.position

    def __hash__(self) -> int:
        return hash((InputRef, self.position))

    def __repr__(self) -> str:
        return f"InputRef({self.position})"


def mark_input_refs(leaves: list[Any], inputs: Sequence[Any], who: str) -> list[Any]:
    """`leaves` (of an output, inside a trace) with each Ref that is one of the
    traced `inputs` replaced by its `InputRef`. A Ref that is not an input is an
    error: it cannot leave the trace."""
    positions = {id(leaf): index for index, leaf in enumerate(inputs)}
    marked = list(leaves)
    for index, leaf in enumerate(leaves):
        if not is_ref(leaf):
            continue
        position = positions.get(id(leaf))
        if position is None:
            raise ValueError(
                f"{who}: the function returns a Ref that is not one of its "
                "arguments (made inside the transformed function, or closed over). "
                "A transformed function can only return the Refs it was given; "
                "return the Ref's value (`ref[...]`) instead, or create the Ref "
                "outside."
            )
        marked[index] = InputRef(position)
    return marked


# --- One value -------------------------------------------------------------------


class Static:
    """Holds `value` in the treedef instead of as a leaf.

    JAX transforms only let arrays out of a traced function; wrapping any other
    output in `Static` hides it in the output treedef, so it comes back as the
    very object the trace produced.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Static({self.value!r})"


jtu.register_pytree_node(
    Static, lambda box: ((), box.value), lambda value, _: Static(value)
)
