"""`tree_at` (out-of-place surgery on pytrees) and `tree_equal`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax.core import Tracer

from .._compat import same_structure
from .._typing import PyTree
from ._filters import is_array, is_key_array
from ._structure import path_text

__all__ = ["tree_at", "tree_equal"]


class _Missing:
    """The default of `replace`/`replace_fn`: `None` is a valid replacement."""

    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


class _Position:
    """One node or leaf of the pytree given to `tree_at`, at one place in it.

    `children` is `None` for a leaf (including `None` and nodes that `is_leaf`
    stops at); otherwise it holds one `_Position` per child, and `treedef`
    rebuilds the node from a list of children.
    """

    __slots__ = ("path", "original", "children", "treedef", "marked")

    def __init__(self, path: jtu.KeyPath, original: Any):
        self.path = path
        self.original = original
        self.children: list[_Position] | None = None
        self.treedef: Any = None
        self.marked: Any = None


class _LeafMarker:
    """Stands in for one leaf in the structure-only copy that `where` sees.

    A fresh object per leaf, so object identity tells every leaf apart, even
    `None` (an empty node to JAX) and interned values such as small ints.
    """

    __slots__ = ("position",)

    def __init__(self, position: _Position):
        self.position = position

    def __repr__(self) -> str:
        return f"<leaf at {path_text('', self.position.path)}>"

    def __getitem__(self, index: Any) -> Any:
        where = path_text("", self.position.path)
        raise _LeafIndexError(
            f"tree_at: `where` indexes into the leaf at {where} (with {index!r}), "
            "but `where` must only index into the structure of `pytree`: leaves, "
            "and nodes that `is_leaf` stops at, are selected whole. Select the "
            "leaf and change it with `replace_fn` instead, e.g. "
            "`replace_fn=lambda w: w.at[...].set(...)`."
        )


class _Index:
    """Every place of the pytree given to `tree_at`, found from the objects of
    its placeholder copy.

    `by_id` maps the `id` of every object in the copy to its position (or to
    `_AMBIGUOUS` when a node type hands out one object for several places).
    `nones` lists the positions of the `None`s that stay `None` in the copy
    (all of them, unless `is_leaf` makes `None` a leaf): `None` is an empty
    subtree to JAX, and keeping it lets `where` test `x is None` alike on
    `pytree` and on the copy, as Equinox, which wraps only leaves, allows.
    """

    __slots__ = ("by_id", "nones")

    def __init__(self) -> None:
        self.by_id: dict[int, Any] = {}
        self.nones: list[_Position] = []


class _MarkedTuple(tuple):
    """A tuple of the placeholder copy. Always a fresh object (Python interns
    `()`, so plain empty tuples at two places would be one object), and an
    index past its end names where in `pytree` it is."""

    path: jtu.KeyPath

    def __getitem__(self, index: Any) -> Any:
        try:
            return super().__getitem__(index)
        except IndexError:
            raise _index_error(self, index) from None


class _MarkedList(list):
    """A list of the placeholder copy: an index past its end names where in
    `pytree` it is."""

    path: jtu.KeyPath

    def __getitem__(self, index: Any) -> Any:
        try:
            return super().__getitem__(index)
        except IndexError:
            raise _index_error(self, index) from None


class _MarkedDict(dict):
    """A dict of the placeholder copy: a missing key names where in `pytree`
    the dict is, and which keys it has."""

    path: jtu.KeyPath

    def __missing__(self, key: Any) -> Any:
        keys = ", ".join(repr(k) for k in list(self)[:8])
        more = ", ..." if len(self) > 8 else ""
        raise _PathKeyError(
            f"tree_at: key {key!r} is not in the dict at "
            f"{path_text('', self.path)}, whose keys are {{{keys}{more}}}. "
            "`where` must select nodes that exist in `pytree`."
        )


@functools.cache
def _marked_namedtuple_type(cls: type) -> type:
    """A subclass of the namedtuple type `cls` whose index past the end names
    where in `pytree` it is (JAX flattens it as a namedtuple)."""

    def getitem(self: Any, index: Any) -> Any:
        try:
            return cls.__getitem__(self, index)
        except IndexError:
            raise _index_error(self, index) from None

    return type(cls.__name__, (cls,), {"__getitem__": getitem})


def _unflatten_marked(aux: Any, children: Iterable[Any]) -> Any:
    return list(children)


def _unflatten_marked_dict(keys: Any, children: Iterable[Any]) -> Any:
    return dict(zip(keys, children))


# Pytree nodes like the list, tuple and dict they stand for, so that a `where`
# that walks the tree with `jax.tree_util` sees the same structure.
for _marked in (_MarkedTuple, _MarkedList):
    jtu.register_pytree_with_keys(
        _marked,
        lambda node: (
            tuple((jtu.SequenceKey(i), child) for i, child in enumerate(node)),
            None,
        ),
        _unflatten_marked,
        flatten_func=lambda node: (tuple(node), None),
    )
jtu.register_pytree_with_keys(
    _MarkedDict,
    lambda node: (
        tuple((jtu.DictKey(k), node[k]) for k in sorted(node)),
        tuple(sorted(node)),
    ),
    _unflatten_marked_dict,
    flatten_func=lambda node: (
        tuple(node[k] for k in sorted(node)),
        tuple(sorted(node)),
    ),
)


class _PathIndexError(IndexError, ValueError):
    """An index past the end of a sequence of `pytree`, naming where it is.
    An `IndexError`, as the same index on `pytree` raises, and a
    `ValueError`, as `tree_at`'s other complaints about `where` are."""


class _PathKeyError(KeyError, ValueError):
    """A key missing from a dict of `pytree`, naming where the dict is. A
    `KeyError`, as the same key on `pytree` raises, and a `ValueError`."""

    __str__ = ValueError.__str__


class _LeafIndexError(TypeError, ValueError):
    """`where` indexed into a leaf (a placeholder in the copy). A `TypeError`,
    as indexing Equinox's placeholders raises, and a `ValueError`."""


# The errors of the placeholder copy that name a place in `pytree`.
_PATH_ERRORS = (_PathIndexError, _PathKeyError, _LeafIndexError)


def _index_error(sequence: Any, index: Any) -> IndexError:
    where = path_text("", sequence.path)
    kind = "namedtuple" if hasattr(sequence, "_fields") else "tuple"
    kind = "list" if isinstance(sequence, list) else kind
    return _PathIndexError(
        f"tree_at: index {index!r} is out of range for the {kind} at "
        f"{where}, which has {len(sequence)} element(s). "
        "`where` must select nodes that exist in `pytree`."
    )


def _marked_sequence(marked: Any, path: jtu.KeyPath) -> Any:
    """The placeholder copy of a list, tuple, namedtuple or dict, whose failed
    lookups name their key path in `pytree`."""
    if type(marked) is tuple:
        marked = _MarkedTuple(marked)
    elif type(marked) is list:
        marked = _MarkedList(marked)
    elif type(marked) is dict:
        marked = _MarkedDict(marked)
    elif isinstance(marked, tuple) and hasattr(type(marked), "_fields"):
        marked = _marked_namedtuple_type(type(marked))(*marked)
    else:
        return marked
    marked.path = path
    return marked


_AMBIGUOUS: Any = object()


def _index_tree(
    node: Any,
    path: jtu.KeyPath,
    is_leaf: Callable[[Any], bool] | None,
    index: _Index,
) -> _Position:
    """Records `node` and everything below it in `index`, and builds its
    placeholder copy. The copy is kept alive through `_Position.marked`, so
    the ids in `index.by_id` stay valid while `tree_at` runs."""
    position = _Position(path, node)
    leaf = is_leaf is not None and is_leaf(node)
    if node is None and not leaf:
        position.marked = None
        index.nones.append(position)
        return position
    if leaf:
        marked: Any = _LeafMarker(position)
    else:
        children, treedef = jtu.tree_flatten_with_path(
            node, is_leaf=lambda child: child is not node
        )
        if treedef.num_nodes == 1 and treedef.num_leaves == 1:
            marked = _LeafMarker(position)
        else:
            position.treedef = treedef
            position.children = [
                _index_tree(child, (*path, *keys), is_leaf, index)
                for keys, child in children
            ]
            marked = treedef.unflatten([c.marked for c in position.children])
            marked = _marked_sequence(marked, path)
    position.marked = marked
    key = id(marked)
    index.by_id[key] = _AMBIGUOUS if key in index.by_id else position
    return position


def _describe(obj: Any) -> str:
    if isinstance(obj, _LeafMarker):
        return f"the leaf at {path_text('', obj.position.path)}"
    text = repr(obj)
    if len(text) > 60:
        text = text[:57] + "..."
    name = type(obj).__name__
    article = "an" if name[:1].lower() in "aeio" else "a"
    return f"{article} {name} ({text})"


class NotANodeError(ValueError, TypeError):
    """`tree_at`'s `where` returned something that is not a node of the tree
    (a static field, a computed value). A `ValueError`, as filterax documents,
    and a `TypeError`, as Equinox raises."""


@functools.cache
def _failed_on_placeholders(error_type: type[Exception]) -> type[Exception]:
    """The error for a `where` that fails only on the placeholder copy: a
    `ValueError`, and also of the type `where` raised there (an `IndexError`
    from a list of the leaves that are arrays, say), as Equinox lets that
    through; a plain `ValueError` for types that cannot be mixed in."""
    if issubclass(error_type, ValueError):
        return ValueError
    try:
        mixed = type(
            "WhereFailedError",
            (ValueError, error_type),
            {"__str__": ValueError.__str__, "__module__": __name__},
        )
        mixed("probe")
    except TypeError:
        return ValueError
    return mixed


class _SeveralNones(Exception):
    """`where` returned a `None` and `pytree` has several (internal)."""


def _of_type(error: Exception, error_type: type[Exception]) -> Exception:
    """`error` (which names the place), also of `error_type`, the type that
    the same `where` raised on `pytree` itself, so that code catching that
    type still catches it."""
    if isinstance(error, error_type):
        return error
    return _failed_on_placeholders(error_type)(str(error))


def _lookup_none(index: _Index, what: str) -> _Position:
    """The `None` that `where` returned: the only `None` of `pytree`. `None`
    is one object, so one of several cannot be told apart (Equinox refuses
    it too, for the same reason)."""
    if len(index.nones) == 1:
        return index.nones[0]
    if not index.nones:
        raise NotANodeError(
            f"tree_at: {what} is None, and `pytree` holds no None. `where` must "
            "return nodes or leaves of `pytree` itself."
        )
    raise _SeveralNones


def _several_nones_error(
    where: Callable[[Any], Any],
    pytree: Any,
    index: _Index,
    is_leaf: Callable[[Any], bool] | None,
) -> ValueError:
    """Refuses a `None` that is one of several, naming which one `where`
    meant where that can be found: by running `where` once more, on a copy
    whose `None`s are placeholders too (only on this error path)."""

    def none_or_leaf(x: Any) -> bool:
        return x is None or (is_leaf is not None and is_leaf(x))

    try:
        copy = _index_tree(pytree, (), none_or_leaf, _Index())
        selected = where(copy.marked)
    except Exception:
        selected = ()
    if not isinstance(selected, (list, tuple)):
        selected = (selected,)
    meant = [
        path_text("", item.position.path)
        for item in selected
        if isinstance(item, _LeafMarker) and item.position.original is None
    ]
    named = f"the None at {meant[0]}" if len(meant) == 1 else "a None"
    paths = [path_text("", p.path) for p in index.nones]
    listed = ", ".join(paths[:4]) + (", ..." if len(paths) > 4 else "")
    return ValueError(
        f"tree_at: `where` selects {named}, one of several Nones in `pytree` "
        f"(at {listed}; each an empty subtree to JAX), so the place meant cannot "
        "be told apart. Pass `is_leaf=lambda x: x is None` to treat them as "
        "leaves, one of which can be replaced."
    )


def _lookup(obj: Any, index: _Index, what: str) -> _Position:
    if obj is None:
        return _lookup_none(index, what)
    found = index.by_id.get(id(obj))
    if found is _AMBIGUOUS:
        raise ValueError(
            f"tree_at: {what} is {_describe(obj)}, which occurs at several places "
            "in `pytree` as the very same object, so the place meant cannot be "
            "told apart. Select its parent node instead."
        )
    if found is None or found.marked is not obj:
        raise NotANodeError(
            f"tree_at: {what} is {_describe(obj)}, which is not a node of `pytree`. "
            "`where` must return nodes or leaves of `pytree` itself (e.g. "
            "`lambda m: m.layers[0].weight`), not newly built or computed values; "
            "static fields live in the treedef and cannot be selected."
        )
    return found


def _select(
    where: Callable[[Any], Any],
    pytree: Any,
    root: _Position,
    index: _Index,
    is_leaf: Callable[[Any], bool] | None,
) -> tuple[list[_Position], bool]:
    """Runs `where` and returns the selected positions, and whether `where`
    returned a sequence of nodes (rather than one node)."""
    try:
        marked = where(root.marked)
    except Exception as error:
        # Wrong for the tree itself too (an index past the end, a missing
        # key): ours, naming the place, also of the type the tree's own error
        # has (Equinox lets that through); its own where we cannot name the
        # place. Otherwise `where` used the leaf values.
        try:
            where(pytree)
        except Exception as real_error:
            if isinstance(error, _PATH_ERRORS):
                raise _of_type(error, type(real_error)) from None
            raise
        if isinstance(error, _LeafIndexError):
            raise error from None
        raise _failed_on_placeholders(type(error))(
            "tree_at: `where` failed on a copy of `pytree` whose leaves were "
            f"replaced by placeholders ({type(error).__name__}: {error}). `where` "
            "must only index into the structure of `pytree` (attributes, items), "
            "not compute with its leaf values; nodes that `is_leaf` stops at "
            "count as leaves."
        ) from error
    real = where(pytree)
    found = index.by_id.get(id(marked))
    try:
        if found is not None or not isinstance(marked, (list, tuple)):
            # One node: `marked` itself is in the tree (a list or tuple that is
            # a node of the tree counts as one node, not as a sequence of nodes).
            positions = [_lookup(marked, index, "what `where` returned")]
            is_sequence, reals = False, [real]
        else:
            positions = [
                _lookup(item, index, f"element {i} of the sequence returned by `where`")
                for i, item in enumerate(marked)
            ]
            is_sequence = True
            reals = list(real) if isinstance(real, (list, tuple)) else []
    except _SeveralNones:
        raise _several_nones_error(where, pytree, index, is_leaf) from None
    # `where` ran twice; if the two runs disagree, it looked at leaf values.
    if len(reals) != len(positions) or any(
        r is not p.original for r, p in zip(reals, positions)
    ):
        raise ValueError(
            "tree_at: `where` selected different nodes on `pytree` than on a copy "
            "of it with placeholder leaves, so it depends on leaf values. `where` "
            "must only use the structure of `pytree` (attributes, items, and "
            "which fields are None)."
        )
    seen: set[int] = set()
    for position in positions:
        if id(position) in seen:
            raise ValueError(
                f"tree_at: `where` selects the node at {path_text('', position.path)} "
                "more than once."
            )
        seen.add(id(position))
    return positions, is_sequence


def _first_selected_below(position: _Position, selected: dict[int, Any]) -> Any:
    for child in position.children or ():
        if id(child) in selected:
            return child
        below = _first_selected_below(child, selected)
        if below is not None:
            return below
    return None


def _rebuild(
    position: _Position, replacements: dict[int, Callable[[Any], Any]]
) -> tuple[Any, bool]:
    """Returns the node at `position` with the replacements applied, and
    whether anything changed. Unchanged subtrees are returned as they are."""
    replace = replacements.get(id(position))
    if replace is not None:
        nested = _first_selected_below(position, replacements)
        if nested is not None:
            raise ValueError(
                "tree_at: `where` selects both the node at "
                f"{path_text('', position.path)} and the node at "
                f"{path_text('', nested.path)} inside it; select only one of them."
            )
        return replace(position.original), True
    if position.children is None:
        return position.original, False
    rebuilt = [_rebuild(child, replacements) for child in position.children]
    if not any(changed for _, changed in rebuilt):
        return position.original, False
    return position.treedef.unflatten([node for node, _ in rebuilt]), True


def tree_at(
    where: Callable[[Any], Any],
    pytree: PyTree,
    replace: Any = _MISSING,
    replace_fn: Callable[[Any], Any] = _MISSING,
    is_leaf: Callable[[Any], bool] | None = None,
) -> PyTree:
    """Returns a copy of `pytree` with the nodes selected by `where` replaced.

    This is how to "modify" an immutable Module: nothing is mutated; the
    nodes on the way to each selected node are rebuilt (through their pytree
    flattening, never `setattr`) and every other subtree is shared with
    `pytree`.

    **Arguments:**

    - `where`: a callable `pytree -> node` or `pytree -> sequence of nodes`
      (list or tuple), e.g. `lambda m: m.layers[-1].bias`. A node may be a
      leaf, a whole subtree or a `None` (an empty subtree to JAX); one of
      several `None`s needs `is_leaf=lambda x: x is None`, as in Equinox.
      `where` may only index into the structure of `pytree` (and test which
      fields are `None`, e.g. `[l.bias for l in m.layers if l.bias is not
      None]`): it is also run on a copy whose leaves are placeholders, which
      is how repeated values (small ints, say) are told apart, and an index
      past the end of a list there names the list's key path.
    - `pytree`: the pytree to modify; any registered pytree, Modules included.
    - `replace`: the new value of the selected node; when `where` returns a
      sequence, a sequence of new values of the same length.
    - `replace_fn`: instead of `replace`, a callable `old node -> new node`
      applied to each selected node.
    - `is_leaf`: nodes to treat as leaves (as for `jax.tree_util.tree_map`);
      `where` cannot index into them.

    **Returns:** the modified copy of `pytree`.

    **Raises:** `ValueError` when not exactly one of `replace` and `replace_fn`
    is given; when `where` returns something that is not a node of `pytree`
    (a freshly built array, a computed value) or depends on leaf values; when
    it selects a node twice, a node and another node inside it, or one of
    several `None`s without `is_leaf`; when it fails on the placeholder copy (an index past
    the end of a list, say, naming the list's key path); or when the number
    of `replace` values does not match the number of nodes.
    `TypeError` when `where` or `replace_fn` is not callable.

    ```python
    >>> import filterax as fx
    >>> params = {"layers": [1.0, 2.0], "bias": None}
    >>> fx.tree_at(lambda p: p["layers"][1], params, 5.0)
    {'bias': None, 'layers': [1.0, 5.0]}
    >>> fx.tree_at(lambda p: p["bias"], params, 0.0)
    {'bias': 0.0, 'layers': [1.0, 2.0]}
    >>> fx.tree_at(lambda p: p["layers"], params, replace_fn=lambda l: l[::-1])
    {'bias': None, 'layers': [2.0, 1.0]}
    >>> fx.tree_at(lambda p: (p["layers"][0], p["layers"][1]), params, (0.0, 3.0))
    {'bias': None, 'layers': [0.0, 3.0]}

    ```
    """
    if not callable(where):
        raise TypeError(f"tree_at: `where` must be a callable, got {where!r}.")
    has_replace = replace is not _MISSING
    has_replace_fn = replace_fn is not _MISSING
    if has_replace == has_replace_fn:
        given = "both" if has_replace else "neither"
        raise ValueError(
            f"tree_at needs exactly one of `replace` and `replace_fn`; got {given}."
        )
    if has_replace_fn and not callable(replace_fn):
        raise TypeError(f"tree_at: `replace_fn` must be callable, got {replace_fn!r}.")

    index = _Index()
    root = _index_tree(pytree, (), is_leaf, index)
    positions, is_sequence = _select(where, pytree, root, index, is_leaf)

    if has_replace_fn:
        functions = [replace_fn] * len(positions)
    elif not is_sequence:
        functions = [lambda _: replace]
    else:
        if not isinstance(replace, (list, tuple)):
            raise TypeError(
                f"tree_at: `where` returned a sequence of {len(positions)} nodes, so "
                "`replace` must be a list or tuple of as many values; got "
                f"{type(replace).__name__}."
            )
        if len(replace) != len(positions):
            raise ValueError(
                f"tree_at: `where` returned {len(positions)} nodes but `replace` "
                f"has {len(replace)} values."
            )
        functions = [lambda _, value=value: value for value in replace]

    replacements = {id(p): fn for p, fn in zip(positions, functions)}
    out, _ = _rebuild(root, replacements)
    return out


# --------------------------------------------------------------------- tree_equal


def _is_tracer(x: Any) -> bool:
    return isinstance(x, Tracer)


def _exact(dtype: Any, rtol: float, atol: float) -> bool:
    """Whether to compare exactly: no tolerance given, or a dtype that is not
    inexact (integers, as in Equinox; bool, float0, key data)."""
    return (rtol == 0 and atol == 0) or not jnp.issubdtype(dtype, np.inexact)


def _numpy_values_equal(x: np.ndarray, y: np.ndarray, rtol: float, atol: float) -> bool:
    if _exact(x.dtype, rtol, atol):
        return bool(np.array_equal(x, y))
    wide = np.complex128 if np.iscomplexobj(x) else np.float64
    return bool(
        np.all(np.isclose(x.astype(wide), y.astype(wide), rtol=rtol, atol=atol))
    )


def _arrays_equal(x: Any, y: Any, rtol: float, atol: float) -> Any:
    """Compares two arrays of the same shape and dtype by value: a Python `bool`
    when both are NumPy arrays, otherwise a scalar boolean JAX array (as
    Equinox's `tree_equal` answers; computed without blocking, and traced inside
    a transformation)."""
    if is_key_array(x):
        # Same dtype means same implementation; compare the raw key bits.
        x, y = jax.random.key_data(x), jax.random.key_data(y)
        rtol = atol = 0.0
    if isinstance(x, (np.ndarray, np.generic)) and isinstance(
        y, (np.ndarray, np.generic)
    ):
        return _numpy_values_equal(np.asarray(x), np.asarray(y), rtol, atol)
    if _exact(x.dtype, rtol, atol):
        return jnp.all(jnp.asarray(x) == jnp.asarray(y))
    return jnp.allclose(jnp.asarray(x), jnp.asarray(y), rtol=rtol, atol=atol)


def _leaves_equal(x: Any, y: Any, typematch: bool, rtol: float, atol: float) -> Any:
    if typematch and type(x) is not type(y):
        return False
    x_array, y_array = is_array(x), is_array(y)
    if x_array or y_array:
        if not (x_array and y_array):
            return False
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        return _arrays_equal(x, y, rtol, atol)
    inexact = (float, complex)
    if (rtol != 0 or atol != 0) and isinstance(x, inexact) and isinstance(y, inexact):
        return bool(np.isclose(x, y, rtol=rtol, atol=atol))
    try:
        return bool(x == y)
    except Exception:
        # `==` gave no truth value (e.g. an array-like object): not equal.
        return False


def tree_equal(
    *pytrees: PyTree, typematch: bool = False, rtol: float = 0.0, atol: float = 0.0
) -> Any:
    """Whether all `pytrees` have the same structure and equal leaves.

    Arrays (JAX or NumPy, compared with each other by value) are equal when
    their shapes, dtypes and values are; with `rtol`/`atol`, inexact values
    (floating and complex) are compared as by `numpy.allclose` (integers,
    booleans and other dtypes stay exact, as in Equinox). NaN is never equal to anything, NaN included, as
    for `==`. Typed key arrays are equal when their implementations (part of
    the dtype) and key data are. An array is never equal to a non-array. Other
    leaves are compared with `==` (Python numbers with the tolerances, when
    given).

    **Arguments:**

    - `*pytrees`: one or more pytrees.
    - `typematch`: also require the leaves at each position to have exactly
      the same type (so a NumPy array never equals a JAX array, nor `1` `1.0`).
    - `rtol`, `atol`: relative and absolute tolerance for inexact values.

    **Returns:** `False` (a Python `bool`) as soon as structure, a non-array
    leaf, or an array's shape or dtype differs. Otherwise a Python `bool` when
    every array compared is a NumPy array, and a scalar boolean JAX array as
    soon as a JAX array's values are compared (as Equinox answers; it does not
    block on the computation, and is traced inside `jax.jit` and friends).
    `bool(...)` of either is the answer.

    **Raises:** `TypeError` when no pytree is given.

    ```python
    >>> import jax.numpy as jnp, numpy as np
    >>> import filterax as fx
    >>> fx.tree_equal({"w": jnp.ones(2), "n": 3}, {"w": np.ones(2, np.float32), "n": 3})
    Array(True, dtype=bool)
    >>> fx.tree_equal({"w": np.ones(2), "n": 3}, {"w": np.ones(2), "n": 3})
    True
    >>> fx.tree_equal([jnp.ones(2)], [jnp.ones(3)])
    False
    >>> bool(fx.tree_equal(jnp.array(1.0), jnp.array(1.001), rtol=1e-2))
    True

    ```
    """
    if not pytrees:
        raise TypeError("tree_equal() needs at least one pytree.")
    first_leaves, first_def = jtu.tree_flatten(pytrees[0])
    verdict: Any = True
    for other in pytrees[1:]:
        leaves, treedef = jtu.tree_flatten(other)
        try:
            same = same_structure(treedef, first_def)
        except Exception:  # static metadata whose `==` has no truth value
            same = False
        if not same:
            return False
        for x, y in zip(first_leaves, leaves):
            equal = _leaves_equal(x, y, typematch, rtol, atol)
            if equal is False:
                return False
            if equal is not True:
                verdict = equal if verdict is True else verdict & equal
    return verdict
