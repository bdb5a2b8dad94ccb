"""The structure of pytrees: key-path text, one level of children, and where two
trees part (`tree_diff`).

This is the one home for those mechanisms: every error in filterax that says
"these trees do not match" names the place through `path_text` and finds it
through `tree_diff` or `prefix_difference`. It sits at the bottom of the package
(it imports only JAX and NumPy), so every other module may use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

__all__ = [
    "Level",
    "array_text",
    "dtype_text",
    "TreeDifference",
    "argument_path",
    "describe_value",
    "differences_text",
    "one_level",
    "path_text",
    "prefix_difference",
    "structure_difference",
    "tree_check",
    "tree_diff",
    "tree_flatten_one_level",
]

KeyPath = tuple[Any, ...]
if TYPE_CHECKING:
    PyTreeDef = Any
else:
    PyTreeDef = jtu.PyTreeDef
DifferenceKind = Literal["structure", "type", "shape", "dtype", "value"]


def path_text(root: str, path: Sequence[Any]) -> str:
    """`root` followed by the key path, e.g. `model.layers[0].weight`.

    With an empty `root` and an empty path, the text is `the root`.
    """
    text = root + jtu.keystr(tuple(path))
    return text or "the root"


def argument_path(path: Sequence[Any]) -> str:
    """`args[1]['opts']` or `kwargs['state']` for a key path into the pair
    `(args, kwargs)` of a call; `the arguments` for the empty path."""
    if not path:
        return "the arguments"
    head = "args" if path[0] == jtu.SequenceKey(0) else "kwargs"
    return head + jtu.keystr(tuple(path[1:]))


def describe_value(value: Any, limit: int = 60) -> str:
    """A short description of a leaf or node for error messages: arrays as
    `f32[3,4]`, everything else as its type and (truncated) `repr`."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, type):
        return _short_array(value)
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return text
    return f"{type(value).__name__} {text}"


_SHORT_DTYPE_NAMES = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "bool": "bool",
    "complex64": "c64",
    "complex128": "c128",
}


def dtype_text(dtype: Any) -> str:
    """`f32`, `bf16`, `key<fry>`, `float0`...: the short name of a dtype."""
    try:
        if jnp.issubdtype(dtype, jax.dtypes.prng_key):
            return str(dtype)  # e.g. `key<fry>`
        if dtype == jax.dtypes.float0:
            return "float0"
        name = str(np.dtype(dtype).name)
    except TypeError:
        return str(dtype)
    return _SHORT_DTYPE_NAMES.get(name, name)


def array_text(shape: Sequence[int], dtype: Any, weak_type: bool = False) -> str:
    """`f32[3,4]`, or `weak_f32[]` for a weakly typed array."""
    weak = "weak_" if weak_type else ""
    return f"{weak}{dtype_text(dtype)}[{','.join(map(str, shape))}]"


def _short_array(value: Any) -> str:
    text = array_text(value.shape, value.dtype, getattr(value, "weak_type", False))
    # `isinstance`: a Ref traced inside a transform is a tracer, not a `jax.Ref`.
    return f"Ref({text})" if isinstance(value, jax.Ref) else text


# --- One level of children ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Level:
    """One pytree node: its type, its children with their keys, and the static
    metadata that JAX compares when it compares treedefs."""

    node_type: type
    keys: tuple[Any, ...]
    children: tuple[Any, ...]
    metadata: Any


def one_level(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> Level | None:
    """The children of `tree` one level down, or `None` when `tree` is a leaf
    (not a registered pytree node, or selected by `is_leaf`). `None` itself is a
    node without children, as for JAX."""
    if is_leaf is not None and is_leaf(tree):
        return None
    try:
        pairs, metadata = jtu.flatten_one_level_with_keys(tree)
    except ValueError:
        return None
    pairs = tuple(pairs)
    return Level(
        type(tree),
        tuple(key for key, _ in pairs),
        tuple(child for _, child in pairs),
        metadata,
    )


def tree_flatten_one_level(pytree: Any) -> tuple[list[Any], PyTreeDef]:
    """Flattens `pytree` by one level only.

    **Arguments:**

    - `pytree`: any pytree.

    **Returns:** `(children, treedef)`: the node's children (themselves
    unflattened) and a treedef that rebuilds the node from a list of children.
    A leaf gives `([leaf], treedef of a leaf)`.

    **Raises:** `ValueError` if `pytree` is a node that contains itself as a
    direct child (a self-referential list, say).

    ```python
    >>> import filterax as fx
    >>> children, treedef = fx.tree_flatten_one_level({"a": 1, "b": (2, 3)})
    >>> children
    [1, (2, 3)]
    >>> treedef.unflatten(["x", "y"])
    {'a': 'x', 'b': 'y'}

    ```
    """
    level = one_level(pytree)
    if level is None:
        return [pytree], jtu.tree_structure(0)
    for child in level.children:
        if child is pytree:
            raise ValueError(
                f"tree_flatten_one_level: the {type(pytree).__name__} contains "
                "itself as a child; a pytree must not be self-referential."
            )
    treedef = jtu.tree_structure(pytree, is_leaf=lambda node: node is not pytree)
    return list(level.children), treedef


def tree_check(pytree: Any) -> None:
    """Checks that `pytree` is a tree, as Equinox does: no node contains itself
    (a cycle would make every tree utility loop forever), and no node with
    children appears twice. A node appearing twice (the same layer put in two
    places, say) becomes two independent copies as soon as the tree crosses a
    transform, which is rarely what was meant; see `filterax.nn.Shared` for
    layers that should stay tied.

    Leaves, `None` and empty nodes may repeat.

    **Arguments:**

    - `pytree`: any pytree.

    **Returns:** `None`.

    **Raises:** `ValueError` naming the key paths where a node reappears,
    inside itself or elsewhere.

    ```python
    >>> import filterax as fx
    >>> fx.tree_check([None, 0, 0, [], []])
    >>> layer = [1.0]
    >>> fx.tree_check({"a": layer, "b": layer})
    Traceback (most recent call last):
    ...
    ValueError: tree_check: the list at pytree['b'] is the very object at pytree['a']: a node with children may appear only once in a pytree (it would become two independent copies when the tree crosses a transform).

    ```
    """
    ancestors: set[int] = set()
    # id -> (node, path); holding the node keeps its id from being reused.
    seen: dict[int, tuple[Any, KeyPath]] = {}

    def visit(node: Any, path: KeyPath) -> None:
        level = one_level(node)
        if level is None or not level.children:
            return
        key = id(node)
        if key in seen:
            first = path_text("pytree", seen[key][1])
            if key in ancestors:
                raise ValueError(
                    f"tree_check: the {type(node).__name__} at "
                    f"{path_text('pytree', path)} is also its own ancestor (at "
                    f"{first}): a pytree must not contain cycles."
                )
            raise ValueError(
                f"tree_check: the {type(node).__name__} at "
                f"{path_text('pytree', path)} is the very object at {first}: a "
                "node with children may appear only once in a pytree (it would "
                "become two independent copies when the tree crosses a "
                "transform)."
            )
        seen[key] = (node, path)
        ancestors.add(key)
        try:
            for child_key, child in zip(level.keys, level.children):
                visit(child, (*path, child_key))
        finally:
            ancestors.discard(key)

    visit(pytree, ())


# --- Where two trees part ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TreeDifference:
    """One place where two pytrees differ, as found by
    [`tree_diff`][filterax.tree_diff].

    **Arguments:**

    - `path`: the key path where the trees part (a tuple of JAX key entries).
    - `kind`: `"structure"` (different node types, keys or lengths), `"type"`
      (leaves of different types), `"shape"`, `"dtype"`, or `"value"` (static
      metadata or leaf values differ).
    - `detail`: what each side holds there, as text.

    **Returns:** a frozen dataclass; `str()` gives `path: detail`.

    ```python
    >>> import filterax as fx
    >>> [difference] = fx.tree_diff({"a": 1}, {"a": 2})
    >>> difference.kind, str(difference)
    ('value', "['a']: 1 vs 2")

    ```
    """

    path: KeyPath
    kind: DifferenceKind
    detail: str

    def where(self, root: str = "") -> str:
        """The key path as text, under `root` (e.g. `carry.weight`)."""
        return path_text(root, self.path)

    def __str__(self) -> str:
        return f"{self.where()}: {self.detail}"


def _node_text(tree: Any, level: Level | None) -> str:
    if level is None:
        return describe_value(tree)
    name = level.node_type.__name__
    if level.node_type in (list, tuple):
        return f"a {name} of length {len(level.children)}"
    if issubclass(level.node_type, dict):
        return f"a {name} with keys {[k.key for k in level.keys]!r}"
    if tree is None:
        return "None"
    return f"a {name}"


def _static_fields(tree: Any) -> list[tuple[str, Any]]:
    """`(name, value)` of the static fields of a Module-like dataclass node."""
    if not dataclasses.is_dataclass(tree) or isinstance(tree, type):
        return []
    return [
        (f.name, tree.__dict__.get(f.name))
        for f in dataclasses.fields(tree)
        if f.metadata.get("static", False)
    ]


def _values_equal(x: Any, y: Any) -> bool:
    try:
        return bool(x == y) and type(x) is type(y)
    except Exception:  # `==` without a truth value (e.g. arrays): not equal
        return False


def _metadata_differences(
    x: Any, y: Any, x_level: Level, y_level: Level, path: KeyPath
) -> list[TreeDifference]:
    """Differences in the static part of two nodes of the same type."""
    x_static, y_static = _static_fields(x), _static_fields(y)
    if x_static and len(x_static) == len(y_static):
        found = [
            TreeDifference(
                (*path, jtu.GetAttrKey(name)),
                "value",
                f"static field {describe_value(x_value)} vs {describe_value(y_value)}",
            )
            for (name, x_value), (_, y_value) in zip(x_static, y_static)
            if not _values_equal(x_value, y_value)
        ]
        if found:
            return found
    return [
        TreeDifference(
            path,
            "value",
            f"{_node_text(x, x_level)} with static data {x_level.metadata!r} vs "
            f"{_node_text(y, y_level)} with static data {y_level.metadata!r}",
        )
    ]


def _leaf_difference(
    x: Any, y: Any, path: KeyPath, compare_values: bool
) -> TreeDifference | None:
    x_array = hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type)
    y_array = hasattr(y, "shape") and hasattr(y, "dtype") and not isinstance(y, type)
    if x_array and y_array:
        if tuple(x.shape) != tuple(y.shape):
            return TreeDifference(
                path, "shape", f"{describe_value(x)} vs {describe_value(y)}"
            )
        if x.dtype != y.dtype:
            return TreeDifference(
                path, "dtype", f"{describe_value(x)} vs {describe_value(y)}"
            )
        if isinstance(x, jax.Ref) != isinstance(y, jax.Ref):
            return TreeDifference(
                path, "type", f"{describe_value(x)} vs {describe_value(y)}"
            )
        detail = f"{describe_value(x)} arrays with different values"
        if isinstance(x, jax.Ref) and isinstance(y, jax.Ref):
            # Compared by what they hold now.
            detail = f"{describe_value(x)}s holding different values"
            x, y = x[...], y[...]
        if not compare_values or _is_abstract(x) or _is_abstract(y):
            return None
        if _arrays_equal(x, y):
            return None
        return TreeDifference(path, "value", detail)
    if x_array != y_array or type(x) is not type(y):
        return TreeDifference(
            path,
            "type",
            f"{describe_value(x)} ({type(x).__name__}) vs {describe_value(y)} "
            f"({type(y).__name__})",
        )
    if x is y or _values_equal(x, y):
        return None
    return TreeDifference(path, "value", f"{describe_value(x)} vs {describe_value(y)}")


def _is_abstract(x: Any) -> bool:
    return isinstance(x, (Tracer, jax.ShapeDtypeStruct))


def _arrays_equal(x: Any, y: Any) -> bool:
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x, y = jax.random.key_data(x), jax.random.key_data(y)
    try:
        return bool(np.array_equal(np.asarray(x), np.asarray(y)))
    except Exception:  # deleted or non-addressable arrays: cannot tell
        return True


def tree_diff(
    a: Any,
    b: Any,
    *,
    compare_values: bool = True,
    is_leaf: Callable[[Any], bool] | None = None,
    max_differences: int | None = None,
) -> list[TreeDifference]:
    """Every place where two pytrees differ, with its key path.

    Where [`tree_equal`][filterax.tree_equal] answers yes or no, this says
    where and how: different node types or keys (`"structure"`), leaves of
    different types (`"type"`), arrays of different shape or dtype, and
    different static data or leaf values (`"value"`). Below a structural
    difference nothing more is reported, as the two sides no longer line up.

    **Arguments:**

    - `a`, `b`: the pytrees to compare.
    - `compare_values`: compare the values of concrete arrays and non-array
      leaves; `False` compares arrays by shape and dtype only (as a trace
      would see them), still comparing non-array leaves.
    - `is_leaf`: nodes to treat as leaves, as for `jax.tree_util.tree_map`.
    - `max_differences`: stop after this many.

    **Returns:** a list of [`TreeDifference`][filterax.TreeDifference]s in
    flattening order; empty when the trees are equal.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> old = {"w": jnp.zeros((2, 3)), "act": "relu", "layers": [1, 2]}
    >>> new = {"w": jnp.zeros((3, 3)), "act": "tanh", "layers": [1]}
    >>> for difference in fx.tree_diff(old, new):
    ...     print(difference.kind, "|", difference)
    value | ['act']: 'relu' vs 'tanh'
    structure | ['layers']: a list of length 2 vs a list of length 1
    shape | ['w']: f32[2,3] vs f32[3,3]

    ```
    """
    leaves = "value" if compare_values else "signature"
    return _differences(a, b, leaves, None, is_leaf, max_differences)


def differences_text(
    expected: Any, got: Any, root: str, *, compare_values: bool = True
) -> str:
    """Where `got` parts from `expected`, for an error message: `at ROOT...:
    detail` for each of the first three differences, joined by `; `; empty when
    `tree_diff` finds none."""
    differences = tree_diff(
        expected, got, compare_values=compare_values, max_differences=3
    )
    return "; ".join(f"at {d.where(root)}: {d.detail}" for d in differences)


def structure_difference(
    a: Any, b: Any, wildcard: Callable[[Any], bool] | None = None
) -> TreeDifference | None:
    """The first place where `a` and `b` differ in structure (leaf values and
    types ignored), or `None`. A node for which `wildcard` is true, on either
    side, matches anything."""
    found = _differences(a, b, "ignore", wildcard, None, 1)
    return found[0] if found else None


def _differences(
    a: Any,
    b: Any,
    leaves: str,
    wildcard: Callable[[Any], bool] | None,
    is_leaf: Callable[[Any], bool] | None,
    limit: int | None,
) -> list[TreeDifference]:
    found: list[TreeDifference] = []

    def visit(x: Any, y: Any, path: KeyPath) -> None:
        if limit is not None and len(found) >= limit:
            return
        if wildcard is not None and (wildcard(x) or wildcard(y)):
            return
        x_level, y_level = one_level(x, is_leaf), one_level(y, is_leaf)
        if x_level is None and y_level is None:
            if leaves != "ignore":
                difference = _leaf_difference(x, y, path, leaves == "value")
                if difference is not None:
                    found.append(difference)
            return
        if (
            x_level is None
            or y_level is None
            or x_level.node_type is not y_level.node_type
            or x_level.keys != y_level.keys
        ):
            found.append(
                TreeDifference(
                    path,
                    "structure",
                    f"{_node_text(x, x_level)} vs {_node_text(y, y_level)}",
                )
            )
            return
        if not _values_equal(x_level.metadata, y_level.metadata):
            found.extend(_metadata_differences(x, y, x_level, y_level, path))
        for key, x_child, y_child in zip(
            x_level.keys, x_level.children, y_level.children
        ):
            visit(x_child, y_child, (*path, key))

    visit(a, b, ())
    if limit is not None:
        del found[limit:]
    return found


def prefix_difference(
    prefix: Any, tree: Any, is_prefix_leaf: Callable[[Any], bool]
) -> TreeDifference | None:
    """The first place where `prefix` stops being a pytree prefix of `tree`, or
    `None` if it is one.

    A prefix matches `tree` node for node down to its own leaves (as told by
    `is_prefix_leaf`), each of which stands for a whole subtree of `tree`.
    """

    def visit(p: Any, t: Any, path: KeyPath) -> TreeDifference | None:
        if is_prefix_leaf(p):
            return None
        p_level, t_level = one_level(p), one_level(t)
        if p_level is None:
            return TreeDifference(
                path,
                "type",
                f"{describe_value(p)}, which is not a valid entry, where the "
                f"tree has {_node_text(t, t_level)}",
            )
        if (
            t_level is None
            or p_level.node_type is not t_level.node_type
            or p_level.keys != t_level.keys
        ):
            return TreeDifference(
                path,
                "structure",
                f"{_node_text(p, p_level)} where the tree has {_node_text(t, t_level)}",
            )
        if not _values_equal(p_level.metadata, t_level.metadata):
            return _metadata_differences(p, t, p_level, t_level, path)[0]
        for key, p_child, t_child in zip(
            p_level.keys, p_level.children, t_level.children
        ):
            difference = visit(p_child, t_child, (*path, key))
            if difference is not None:
                return difference
        return None

    return visit(prefix, tree, ())
