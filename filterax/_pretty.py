"""`tree_pformat`/`tree_pprint`: short, width-aware printing of pytrees.

Objects are first turned into a small document tree (`_Text`, `_Group`,
`_Prefixed`), then laid out: a group is printed on one line when it fits in the
remaining width, otherwise one item per line, indented.

The printer sits below the classes it prints: a class chooses its printed form
by defining `__tree_pformat__(self) -> (name, [(prefix, child), ...])`, printed
as `name(prefix child, ...)` (`NonDifferentiable` and `Partial` do), or
returning a string printed as it is (an `Enumeration` case does).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np

from ._tree._filters import is_ref
from ._tree._structure import array_text

__all__ = ["tree_pformat", "tree_pprint"]


# ------------------------------------------------------------------ documents


class _Text:
    __slots__ = ("flat",)

    def __init__(self, text: str):
        self.flat = text


class _Prefixed:
    """`prefix` glued to the front of `doc`, e.g. `weight=` or `'a': `."""

    __slots__ = ("prefix", "doc", "_flat")

    def __init__(self, prefix: str, doc: _Doc):
        self.prefix = prefix
        self.doc = doc
        self._flat: str | None = None

    @property
    def flat(self) -> str:
        if self._flat is None:
            self._flat = self.prefix + self.doc.flat
        return self._flat


class _Group:
    """`open item, item, ... close`, laid out on one line or one item per line."""

    __slots__ = ("open", "items", "close", "trailing_comma", "_flat")

    def __init__(
        self, open: str, items: list[_Doc], close: str, trailing_comma: bool = False
    ):
        self.open = open
        self.items = items
        self.close = close
        # A one-element tuple needs its comma even on one line: `(x,)`.
        self.trailing_comma = trailing_comma
        self._flat: str | None = None

    @property
    def flat(self) -> str:
        if self._flat is None:
            inner = ", ".join(item.flat for item in self.items)
            comma = "," if self.trailing_comma else ""
            self._flat = f"{self.open}{inner}{comma}{self.close}"
        return self._flat


_Doc = _Text | _Prefixed | _Group


def _layout(
    doc: _Doc, line_indent: int, column: int, reserve: int, opts: _Options
) -> str:
    """Renders `doc` starting at `column` of a line indented by `line_indent`,
    keeping `reserve` characters free at the end of its last line (for a
    following comma)."""
    if isinstance(doc, _Text):
        # Multi-line text (a full array repr) stays aligned under its start.
        return doc.flat.replace("\n", "\n" + " " * column)
    if isinstance(doc, _Prefixed):
        inner = _layout(doc.doc, line_indent, column + len(doc.prefix), reserve, opts)
        return doc.prefix + inner
    flat = doc.flat
    fits = column + len(flat) + reserve <= opts.width and "\n" not in flat
    if fits or not doc.items:
        return flat
    inner_indent = line_indent + opts.indent
    pad = " " * inner_indent
    lines = [doc.open]
    last = len(doc.items) - 1
    for i, item in enumerate(doc.items):
        comma = "," if (i < last or doc.trailing_comma) else ""
        text = _layout(item, inner_indent, inner_indent, len(comma), opts)
        lines.append(f"{pad}{text}{comma}")
    lines.append(" " * line_indent + doc.close)
    return "\n".join(lines)


# ------------------------------------------------------------------ leaves


def _short_array(shape: tuple[int, ...], dtype: Any, suffix: str = "") -> str:
    return array_text(shape, dtype) + suffix


def _is_function(obj: Any) -> bool:
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        return True
    # Wrapped functions: `jax.jit(f)`, `jax.custom_jvp` (e.g. `jax.nn.relu`), ...
    return (
        callable(obj)
        and not isinstance(obj, type)
        and hasattr(obj, "__wrapped__")
        and isinstance(getattr(obj, "__name__", None), str)
    )


def _is_bound_method(obj: Any) -> bool:
    # Python's bound methods, and Module methods bound into pytrees.
    return isinstance(obj, types.MethodType) or (
        callable(obj)
        and not isinstance(obj, type)
        and hasattr(obj, "__self__")
        and hasattr(obj, "__func__")
        and isinstance(getattr(getattr(obj, "__func__"), "__name__", None), str)  # noqa: B009 - narrowed types lack it
    )


def _has_own_repr(obj: Any) -> bool:
    return type(obj).__repr__ is not object.__repr__


def _is_pytree_node(obj: Any) -> bool:
    treedef = jtu.tree_structure(obj, is_leaf=lambda x: x is not obj)
    return not (treedef.num_nodes == 1 and treedef.num_leaves == 1)


# ------------------------------------------------------------------ objects


@dataclasses.dataclass(frozen=True)
class _Options:
    width: int
    indent: int
    short_arrays: bool
    struct_as_array: bool
    truncate_leaf: Callable[[Any], bool]
    max_items: int | None


def _sequence_items(
    values: list[Any],
    opts: _Options,
    active: set[int],
    prefixes: list[str] | None = None,
) -> list[_Doc]:
    shown = values
    if opts.max_items is not None and len(values) > opts.max_items:
        shown = values[: opts.max_items]
    docs: list[_Doc] = []
    for i, value in enumerate(shown):
        doc = _to_doc(value, opts, active)
        docs.append(doc if prefixes is None else _Prefixed(prefixes[i], doc))
    if len(shown) < len(values):
        docs.append(_Text(f"... ({len(values) - len(shown)} more)"))
    return docs


def _to_doc(obj: Any, opts: _Options, active: set[int]) -> _Doc:
    if opts.truncate_leaf(obj):
        return _Text(f"{type(obj).__name__}(...)")
    if obj is None:
        return _Text("None")
    if isinstance(obj, jax.Array):  # tracers and key arrays included
        if opts.short_arrays:
            return _Text(
                array_text(obj.shape, obj.dtype, getattr(obj, "weak_type", False))
            )
        return _Text(repr(obj))
    if is_ref(obj):
        return _Text(f"Ref({array_text(obj.shape, obj.dtype)})")
    if isinstance(obj, (np.ndarray, np.generic)):
        if opts.short_arrays:
            return _Text(_short_array(obj.shape, obj.dtype, "(numpy)"))
        return _Text(repr(obj))
    if isinstance(obj, jax.ShapeDtypeStruct) and opts.struct_as_array:
        return _Text(_short_array(obj.shape, obj.dtype))
    if isinstance(obj, (str, bytes, int, float, complex, type)):
        return _Text(repr(obj))
    if _is_bound_method(obj):
        owner = type(getattr(obj, "__self__")).__name__  # noqa: B009 - narrowed types lack it
        return _Text(f"<bound method {owner}.{getattr(obj, '__func__').__name__}>")  # noqa: B009 - narrowed types lack it
    if _is_function(obj):
        return _Text(_function_text(obj))

    # Containers from here on: guard against reference cycles.
    if id(obj) in active:
        return _Text("...")
    active.add(id(obj))
    try:
        return _container_doc(obj, opts, active)
    finally:
        active.discard(id(obj))


def _function_text(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or obj.__name__
    if isinstance(obj, types.FunctionType) and "__wrapped__" in obj.__dict__:
        return f"<wrapped function {name}>"  # made by `functools.wraps`
    return f"<function {name}>"


def _container_doc(obj: Any, opts: _Options, active: set[int]) -> _Doc:
    name = type(obj).__name__
    hook = getattr(type(obj), "__tree_pformat__", None)
    if hook is not None:
        shown = hook(obj)
        if isinstance(shown, str):
            return _Text(shown)
        hook_name, children = shown
        items = [
            _Prefixed(prefix, _to_doc(child, opts, active))
            if prefix
            else _to_doc(child, opts, active)
            for prefix, child in children
        ]
        return _Group(f"{hook_name}(", items, ")")
    if isinstance(obj, functools.partial):  # and `jax.tree_util.Partial`
        items = [_to_doc(obj.func, opts, active)]
        items += [_to_doc(arg, opts, active) for arg in obj.args]
        items += [
            _Prefixed(f"{key}=", _to_doc(value, opts, active))
            for key, value in obj.keywords.items()
        ]
        return _Group(f"{name}(", items, ")")
    if dataclasses.is_dataclass(obj):
        items = []
        for field in dataclasses.fields(obj):
            if not field.repr:
                continue
            try:
                value = getattr(obj, field.name)
            except AttributeError:  # not assigned yet (e.g. mid-`__init__`)
                continue
            items.append(_Prefixed(f"{field.name}=", _to_doc(value, opts, active)))
        return _Group(f"{name}(", items, ")")
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):  # namedtuple
        prefixes = [f"{field}=" for field in getattr(obj, "_fields")]  # noqa: B009 - narrowed types lack it
        return _Group(
            f"{name}(", _sequence_items(list(obj), opts, active, prefixes), ")"
        )
    if isinstance(obj, (list, tuple)):
        items = _sequence_items(list(obj), opts, active)
        if isinstance(obj, list):
            open, close = "[", "]"
        else:
            open, close = "(", ")"
        one_tuple = isinstance(obj, tuple) and len(obj) == 1
        if type(obj) not in (list, tuple):
            open, close = f"{name}({open}", f"{close})"
        return _Group(open, items, close, trailing_comma=one_tuple)
    if isinstance(obj, dict):
        keys = list(obj)
        prefixes = [f"{key!r}: " for key in keys]
        items = _sequence_items([obj[k] for k in keys], opts, active, prefixes)
        if type(obj) is dict:
            return _Group("{", items, "}")
        return _Group(f"{name}({{", items, "})")
    if not _has_own_repr(obj) and _is_pytree_node(obj):
        # A registered pytree node with the default `<... object at 0x...>` repr.
        children, _ = jtu.tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
        items = []
        for keys, child in children:
            doc = _to_doc(child, opts, active)
            key = keys[0] if len(keys) == 1 else None
            if isinstance(key, jtu.GetAttrKey) and key is not None:
                doc = _Prefixed(f"{key.name}=", doc)
            items.append(doc)
        return _Group(f"{name}(", items, ")")
    return _Text(repr(obj))


def _never(_: Any) -> bool:
    return False


def tree_pformat(
    tree: Any,
    *,
    width: int = 80,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = False,
    truncate_leaf: Callable[[Any], bool] = _never,
    max_items: int | None = 32,
) -> str:
    """Formats a pytree as a short, readable string.

    - JAX arrays print as their dtype and shape: `f32[3,4]`, `i32[]` (scalar),
      `bf16[2]`, `bool[5]`; typed key arrays as `key<fry>[]`, `key<rbg>[4]`;
      tracers likewise. NumPy arrays and scalars get a `(numpy)` suffix:
      `f64[3](numpy)`.
    - Dataclasses (Modules included) print as `Name(field=..., ...)`, with
      their `repr=True` fields in order; namedtuples alike.
    - Lists, tuples and dicts print as in Python; more than `max_items`
      elements show the first `max_items` and then `... (N more)`.
    - `NonDifferentiable(f32[3])`; functions as `<function relu>`, bound
      methods as `<bound method Linear.apply>`; `filterax.Partial`,
      `functools.partial` and `jax.tree_util.Partial` as
      `Partial(<function f>, args..., key=value)`.
    - Other registered pytree nodes without a `__repr__` of their own print as
      `Name(children...)`; everything else uses `repr`.

    Each bracketed group is printed on one line when it fits in `width`,
    otherwise one item per line, indented by `indent` per level.

    **Arguments:**

    - `tree`: the pytree (or any object) to format.
    - `width`: the line width to fit into.
    - `indent`: spaces of indentation per nesting level.
    - `short_arrays`: print arrays as `f32[3]`; `False` uses their full `repr`.
    - `struct_as_array`: print `jax.ShapeDtypeStruct`s like arrays (`f32[3]`)
      instead of with their `repr`.
    - `truncate_leaf`: a predicate; objects for which it is `True` print as
      `Name(...)`.
    - `max_items`: the most elements of a list, tuple or dict shown; `None`
      for no limit.

    **Returns:** the formatted string (no trailing newline).

    ```python
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import filterax as fx
    >>> fx.tree_pformat({"w": jnp.ones((3, 4)), "key": jax.random.key(0)})
    "{'w': f32[3,4], 'key': key<fry>[]}"
    >>> fx.tree_pformat([np.zeros(2), jax.nn.relu, None, 1.5])
    '[f64[2](numpy), <function relu>, None, 1.5]'
    >>> fx.tree_pprint({"a": list(range(5)), "b": "x" * 20}, width=24)
    {
      'a': [0, 1, 2, 3, 4],
      'b': 'xxxxxxxxxxxxxxxxxxxx'
    }

    ```
    """
    opts = _Options(
        width, indent, short_arrays, struct_as_array, truncate_leaf, max_items
    )
    return _layout(_to_doc(tree, opts, set()), 0, 0, 0, opts)


def tree_pprint(
    tree: Any,
    *,
    width: int = 80,
    indent: int = 2,
    short_arrays: bool = True,
    struct_as_array: bool = False,
    truncate_leaf: Callable[[Any], bool] = _never,
    max_items: int | None = 32,
) -> None:
    """Prints a pytree as formatted by [`tree_pformat`][filterax.tree_pformat].

    **Arguments:** as for [`tree_pformat`][filterax.tree_pformat].

    **Returns:** `None`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> fx.tree_pprint((jnp.zeros(2, jnp.int8), jnp.float32(1.0)))
    (i8[2], f32[])

    ```
    """
    print(
        tree_pformat(
            tree,
            width=width,
            indent=indent,
            short_arrays=short_arrays,
            struct_as_array=struct_as_array,
            truncate_leaf=truncate_leaf,
            max_items=max_items,
        )
    )
