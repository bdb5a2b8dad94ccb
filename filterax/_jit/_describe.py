"""How `filter_jit` describes a call: `describe(args, kwargs) -> (key, leaves)`.

A call is described argument by argument, as a flat list of *tokens*:

- a leaf: `ARRAY_TOKEN` with the leaf itself among the dynamic leaves (a
  concrete array and a tracer alike, so that a call under `grad` or `vmap`
  shares the compilation of the same call made outside), or its type and
  value when static (so that `1`, `1.0` and `True` are told apart);
- a tuple or namedtuple: its type and length, then its items;
- `None`: `None`;
- anything else (a Module, a list, a dict...): its `StaticPart`, with its
  dynamic leaves.

The tokens and the keyword names form the `CallKey`, the static argument of
the inner `jax.jit`. The previous call's key is reused while the tokens are
equal, so that JAX's comparison on a hit is an identity check.

Behind `describe` is a memo: a Module of frozen structure (or holding lists
and dicts, guarded by the very items they held) is flattened once and then
found again by identity, which is what makes feeding a training step's outputs
back in cheap. An entry is a weak reference to its object, dropped when the
object dies; arrays are immutable and Refs are passed as themselves, so an
entry is never stale. Static fields are frozen when the Module is built.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from itertools import islice
from operator import is_
from typing import Any

import jax
import jax.tree_util as jtu
from jax.core import Tracer

from .._tree._split import (
    ARRAY,
    CONCRETE,
    FROZEN_NODE_TYPES,
    STATIC,
    TRACER,
    StaticPart,
    is_module_type,
    is_namedtuple_node,
    kind_of_type,
    leaf_kinds,
    split_by_kind,
)
from .._tree._structure import argument_path
from ._layout import canonical

__all__ = [
    "CallKey",
    "clear_memo",
    "describe",
    "first_argument_leaf_count",
    "lookup",
    "module_parts",
    "raise_if_unhashable",
    "remember_outputs",
    "unpack_key",
]


class _Token:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self) -> str:
        return self.name


ARRAY_TOKEN = _Token("ARRAY_TOKEN")
_DYNAMIC_TOKENS = {ARRAY: ARRAY_TOKEN, TRACER: ARRAY_TOKEN}

# Tuple types walked item by item: `tuple` and the namedtuple classes JAX
# flattens into their items (a namedtuple registered as a custom node is not).
_WALKED_TUPLES: dict[type, bool] = {tuple: True}


def _is_walked_tuple(cls: type, value: tuple) -> bool:
    walked = _WALKED_TUPLES.get(cls)
    if walked is None:
        children, treedef = jtu.tree_flatten(value, is_leaf=lambda x: x is not value)
        walked = _WALKED_TUPLES[cls] = (
            hasattr(cls, "_fields")
            and treedef.node_data() == (cls, None)
            and len(children) == len(value)
            and all(map(lambda a, b: a is b, children, value))
        )
    return walked


class CallKey(int):
    """The static key of a keyed call: its tokens, keyword names and, for a
    function seen on an `Auto` mesh, the shardings of its dynamic leaves.

    An `int` whose value is the key's hash, so that `jax.jit` gets the hash
    from C; on a hit, JAX compares the very same key object. `first_count`
    caches `first_argument_leaf_count`.
    """

    tokens: list[Any]
    names: tuple[str, ...]
    shardings: tuple[Any, ...] | None
    first_count: int | None

    def __new__(
        cls,
        tokens: list[Any],
        names: tuple[str, ...],
        shardings: tuple[Any, ...] | None = None,
    ) -> CallKey:
        key = super().__new__(cls, hash((tuple(tokens), names, shardings)))
        key.tokens = tokens
        key.names = names
        key.shardings = shardings
        key.first_count = None
        return key

    __hash__ = int.__hash__

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        try:
            return (
                other.__class__ is CallKey
                and int(self) == int(other)  # type: ignore[call-overload]
                and self.names == other.names  # type: ignore[attr-defined]
                and self.shardings == other.shardings  # type: ignore[attr-defined]
                and self.tokens == other.tokens  # type: ignore[attr-defined]
            )
        except Exception:
            # A static leaf whose `==` raises: the keys are told apart, and the
            # call that made this key reports the leaf by its key path.
            return False

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return f"CallKey({self.tokens!r}, names={self.names!r})"


_NO_HINTS: list[Any] = []


def describe(
    args: tuple,
    kwargs: dict[str, Any],
    last: CallKey | None = None,
    start: Sequence[Any] = (),
    with_shardings: bool = False,
) -> tuple[CallKey, list[Any]]:
    """`(key, leaves)` of a call: its static key, and its dynamic leaves after
    `start` (the function's own arrays). `last` is the previous call's key,
    returned itself when the call matches it. `with_shardings`: the key holds
    the shardings of the concrete leaves (see `_layout.follow_arguments`).

    **Raises:** whatever hashing a static leaf raises (see
    `raise_if_unhashable` for the message naming it).
    """
    tokens: list[Any] = []
    leaves = [*start]
    hints = _NO_HINTS if last is None else last.tokens
    describe_items(args, tokens, leaves, hints)
    names = tuple(sorted(kwargs))  # after the positional ones, in name order
    if names:
        describe_items([kwargs[name] for name in names], tokens, leaves, hints)
    shardings = None
    if with_shardings:
        shardings = tuple(
            canonical(leaf.sharding)
            if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer)
            else None
            for leaf in leaves
        )
    if (
        last is not None
        and tokens == hints
        and names == last.names
        and shardings == last.shardings
    ):
        return last, leaves
    return CallKey(tokens, names, shardings), leaves


def first_argument_leaf_count(key: CallKey, args: tuple) -> int:
    """How many dynamic leaves the first positional argument of a call with
    this key has: the same for every such call, so worked out once."""
    count = key.first_count
    if count is None:
        count = key.first_count = len(describe(args[:1], {})[1])
    return count


def describe_items(
    values: Sequence[Any], tokens: list[Any], dynamic: list[Any], hints: list
) -> None:
    """Appends the tokens and dynamic leaves of `values` (arguments, in
    order). `hints` are the previous call's tokens (`NO_HINTS` for none)."""
    # Arrays, tuples and remembered Modules are handled here, without a call:
    # they are the most common items (an optimiser state is a tuple of
    # namedtuples), and this is the hot path of every keyed call.
    for value in values:
        cls = type(value)
        kind = kind_of_type(cls)
        if kind:
            tokens.append(_DYNAMIC_TOKENS[kind])
            dynamic.append(value)
            continue
        if _WALKED_TUPLES.get(cls):
            tokens.append(cls)
            tokens.append(len(value))
            describe_items(value, tokens, dynamic, hints)
            continue
        entry = lookup(id(value))
        if (
            entry is not None
            and entry() is value
            and (entry.guard is None or guard_holds(entry.guard))
        ):
            tokens.append(entry.part)
            dynamic += entry.dynamic
        else:
            _describe(value, tokens, dynamic, hints)


def _describe(
    value: Any, tokens: list[Any], dynamic: list[Any], hints: list[Any]
) -> None:
    """An item `describe_items` did not recognise at once (not an array, a
    known tuple type or a remembered object): a static leaf, `None`, a tuple
    type seen for the first time, or a node to flatten."""
    cls = type(value)
    kind = kind_of_type(cls)
    if kind is not None:
        if kind:
            tokens.append(_DYNAMIC_TOKENS[kind])
            dynamic.append(value)
        else:
            tokens.append(cls)
            tokens.append(value)
        return
    if value is None:
        tokens.append(None)
        return
    if issubclass(cls, tuple) and _is_walked_tuple(cls, value):
        # Now known as walked: `describe_items` takes it from here.
        describe_items((value,), tokens, dynamic, hints)
        return
    values, part, kinds = split_by_kind(value)
    if part.treedef.num_nodes == 1 and part.treedef.num_leaves == 1:
        # A leaf of a type not seen before: `leaf_kinds` now knows it.
        _describe(value, tokens, dynamic, hints)
        return
    position = len(tokens)
    hint = hints[position] if position < len(hints) else None
    if isinstance(hint, StaticPart) and hint == part:
        part = hint  # its hash and facts are worked out
    if is_module_type(cls) and TRACER not in kinds and rememberable(part):
        if part is not hint:
            part = interned(part)
        remember(value, part, values)
    tokens.append(part)
    dynamic += values


def unpack_key(key: CallKey, dynamic: Sequence[Any]) -> tuple[tuple, dict[str, Any]]:
    """Inside the trace: `(args, kwargs)` from a key and the traced leaves."""
    tokens, leaves = iter(key.tokens), iter(dynamic)

    def value(token: Any) -> Any:
        if token is ARRAY_TOKEN:
            return next(leaves)
        if token is None:
            return None
        if token.__class__ is StaticPart:
            return token.merge(list(islice(leaves, token.num_dynamic)))
        if _WALKED_TUPLES.get(token, False):
            items = [value(next(tokens)) for _ in range(next(tokens))]
            return tuple(items) if token is tuple else token(*items)
        return next(tokens)  # a static leaf: its type, then its value

    values = [value(token) for token in tokens]
    n_positional = len(values) - len(key.names)
    return tuple(values[:n_positional]), dict(zip(key.names, values[n_positional:]))


class UnhashableArgumentError(TypeError, ValueError):
    """A static argument leaf that cannot be hashed. A `TypeError`, as
    filterax documents, and a `ValueError`, as Equinox raises: code catching
    either keeps working."""


def raise_if_unhashable(args: tuple, kwargs: dict) -> None:
    """Raises a `TypeError` naming the first static argument leaf that cannot
    key a cache: unhashable, or with an `==` that raises."""
    leaves_with_paths = jtu.tree_leaves_with_path((args, kwargs))
    kinds = leaf_kinds([leaf for _, leaf in leaves_with_paths])
    for (path, leaf), kind in zip(leaves_with_paths, kinds):
        if kind != STATIC:
            continue
        try:
            hash(leaf)
        except TypeError as error:
            raise UnhashableArgumentError(
                f"filter_jit: the argument at {argument_path(path)} is an "
                f"unhashable {type(leaf).__name__} ({error}). filter_jit traces "
                "array leaves and treats every other leaf as static, so it must "
                "be hashable. Pass it as a JAX/NumPy array, make it hashable "
                "(e.g. a tuple instead of a set), or register it as a pytree."
            ) from None
        try:
            bool(leaf == leaf)
        except Exception as error:
            raise UnhashableArgumentError(
                f"filter_jit: the argument at {argument_path(path)} is a static "
                f"{type(leaf).__name__} whose `==` raised "
                f"{type(error).__name__}: {error}. filter_jit compares static "
                "leaves with `==` to find their compiled code, so `==` must "
                "return a bool: give the class an `__eq__` that does (and a "
                "matching `__hash__`), pass the value as an array, or close "
                "over it."
            ) from None


# --- The memo ------------------------------------------------------------


# A step of a path into a tree: `(True, name)` reads attribute `name` (a
# Module's field), `(False, key)` item `key` (of a tuple, list or dict).
Step = tuple[bool, Any]


class _Facts(weakref.ref):
    """What the memo knows of one structure (a weak reference to its
    `StaticPart`, found by identity: an output's may hold unhashable values):
    `guard_paths`, the paths of its lists and dicts (`()`: every node
    immutable, `None`: a node of another mutable type, so it is not
    remembered), and `modules`, the outermost rememberable Modules in it as
    `(path, dynamic range, part)`."""

    __slots__ = ("guard_paths", "key", "modules")
    guard_paths: tuple[tuple[Step, ...], ...] | None
    key: int
    modules: list[tuple[tuple[Any, ...], slice, StaticPart]] | None


_FACTS: dict[int, _Facts] = {}


def _facts(part: StaticPart, facts_of: Any = _FACTS.get) -> _Facts:
    facts = facts_of(id(part))
    if facts is None or facts() is not part:
        facts = _Facts(part, _drop)
        found: list[tuple[Step, ...]] = []
        ok = _mutable_paths(part.treedef, (), found)
        facts.guard_paths = tuple(found) if ok else None
        facts.modules = None
        facts.key = id(part)
        _FACTS[facts.key] = facts
    return facts


_INTERNED: weakref.WeakValueDictionary[tuple, StaticPart] = (
    weakref.WeakValueDictionary()
)


def rememberable(part: StaticPart) -> bool:
    """Whether a tree of this structure flattens the same way for as long as
    its lists and dicts keep the very same items."""
    return _facts(part).guard_paths is not None


def interned(part: StaticPart) -> StaticPart:
    """The one `StaticPart` equal to `part` while it lives, so that equal
    parts made apart (an argument flattened, an output rebuilt) compare by
    identity."""
    contents = (part.treedef, part.mask, part.static, tuple(map(type, part.static)))
    try:
        return _INTERNED.setdefault(contents, part)
    except (TypeError, ValueError):  # static values without a plain `==`
        return part


def _mutable_paths(treedef: Any, path: tuple[Step, ...], found: list) -> bool:
    """Appends to `found` the paths of the lists and dicts in `treedef`;
    `False` when it holds a node that is neither immutable nor one of those."""
    data = treedef.node_data()
    if data is None:
        return True
    cls, aux = data
    children = treedef.children()
    steps: Sequence[Step]
    if cls is type(None):
        return True
    if is_module_type(cls):
        steps = [(True, name) for name in cls.__filterax_plan__.data_fields]  # type: ignore[attr-defined]
    elif cls is list or cls is tuple or is_namedtuple_node(cls, aux):
        if cls is list:
            found.append(path)
        steps = [(False, index) for index in range(len(children))]
    elif cls is dict:
        found.append(path)
        steps = [(False, key) for key in aux]
    elif cls in FROZEN_NODE_TYPES:
        # How to reach its children is not known here: they must not change.
        inner: list = []
        return all(_mutable_paths(child, (), inner) for child in children) and not inner
    else:
        return False
    return all(
        _mutable_paths(child, (*path, step), found)
        for step, child in zip(steps, children)
    )


def module_parts(part: StaticPart) -> list[tuple[tuple[Any, ...], slice, StaticPart]]:
    """The outermost rememberable Modules in a tree of this structure, found
    through its tuples, lists, dicts and namedtuples: `(keys from the root,
    range of its dynamic leaves, its own StaticPart)`, traced leaves counted
    as the concrete arrays they become outside the trace."""
    facts = _facts(part)
    if facts.modules is None:
        found: list[tuple[tuple[Any, ...], slice, StaticPart]] = []
        _find_modules(part, part.treedef, (), 0, 0, found)
        facts.modules = found
    return facts.modules


def _find_modules(
    whole: StaticPart,
    treedef: Any,
    path: tuple,
    leaf_start: int,
    dynamic_start: int,
    found: list,
) -> None:
    data = treedef.node_data()
    if data is None:
        return
    cls, aux = data
    if is_module_type(cls):
        mask = whole.mask[leaf_start : leaf_start + treedef.num_leaves].translate(
            CONCRETE
        )
        static_start = leaf_start - dynamic_start
        static = whole.static[static_start : static_start + mask.count(0)]
        part = interned(StaticPart(treedef, mask, static))
        if rememberable(part):
            dynamic_end = dynamic_start + part.num_dynamic
            found.append((path, slice(dynamic_start, dynamic_end), part))
        return
    if cls is dict:
        keys: Sequence[Any] = aux
    elif cls is list or cls is tuple or is_namedtuple_node(cls, aux):
        keys = range(len(treedef.children()))
    else:  # another node type: how to reach its children is not known here
        return
    for key, child in zip(keys, treedef.children()):
        _find_modules(whole, child, (*path, key), leaf_start, dynamic_start, found)
        end = leaf_start + child.num_leaves
        dynamic_start += end - leaf_start - whole.mask[leaf_start:end].count(0)
        leaf_start = end


class _Entry(weakref.ref):
    """A weak reference to a remembered object (made as `_Entry(obj, _drop)`,
    in C), with its flattening set as attributes."""

    __slots__ = ("dynamic", "guard", "key", "part")
    dynamic: list[Any]
    guard: list[tuple[Any, tuple[Any, ...], tuple[Any, ...]]] | None
    key: int
    part: StaticPart


# id(object) -> its entry. Dictionary operations are atomic, so threads and
# the garbage collector's callbacks need no lock.
_ENTRIES: dict[int, _Entry] = {}
lookup = _ENTRIES.get


def _drop(entry: Any, entries: dict = _ENTRIES, facts: dict = _FACTS) -> None:
    # The tables bound here: at interpreter exit the module's globals may be
    # gone before the last objects die. No loop: this runs as a step's old
    # Modules die, right after the collector resumed (see `_compiled.rebuild`),
    # and an iterator would be a new tracked object, starting a collection.
    key = entry.key
    if entries.get(key) is entry:
        entries.pop(key, None)
    if facts.get(key) is entry:
        facts.pop(key, None)


def remember(obj: Any, part: StaticPart, dynamic: list[Any]) -> None:
    """Remembers that `obj` (a Module of rememberable structure) flattens to
    `part` and `dynamic`, guarded by the items of its lists and dicts.
    Objects that cannot be weakly referenced are skipped."""
    paths = _facts(part).guard_paths
    if paths is None:
        return
    guard = []
    for path in paths:
        container = obj
        for is_attribute, key in path:
            container = getattr(container, key) if is_attribute else container[key]
        if container.__class__ is list:
            guard.append((container, (), tuple(container)))
        else:
            guard.append((container, tuple(container), tuple(container.values())))
    try:
        entry = _Entry(obj, _drop)
    except TypeError:
        return
    entry.part = part
    entry.dynamic = dynamic
    entry.guard = guard or None
    entry.key = key = id(obj)
    _ENTRIES[key] = entry


def guard_holds(guard: list[tuple[Any, tuple[Any, ...], tuple[Any, ...]]]) -> bool:
    """Whether every list and dict of a remembered Module still holds the very
    items (and keys, in order) it held when the Module was remembered."""
    for container, keys, items in guard:
        if container.__class__ is list:
            if len(container) != len(items) or not all(map(is_, container, items)):
                return False
        elif (
            len(container) != len(items)
            or tuple(container) != keys
            or not all(map(is_, container.values(), items))
        ):
            return False
    return True


def remember_outputs(out: Any, static: StaticPart, arrays: list[Any]) -> None:
    """After a `filter_jit` output was rebuilt: remembers the Modules in it, so
    that passing them back in finds them. Outputs still inside another trace
    (tracers) and outputs holding input Refs are skipped."""
    modules = module_parts(static)
    if not modules or (arrays and kind_of_type(type(arrays[0])) != ARRAY):
        return
    if static.holds_input_refs():
        return
    for path, dynamic_range, part in modules:
        module = out
        for key in path:
            module = module[key]
        remember(module, part, arrays[dynamic_range])


def clear_memo() -> None:
    _ENTRIES.clear()
