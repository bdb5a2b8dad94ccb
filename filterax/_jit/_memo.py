"""How argument Modules flatten, remembered by identity.

A Module whose every node is immutable (see `StaticPart.frozen`) flattens the
same way for as long as it lives: the same structure, the same static leaves,
the very same array and Ref objects. So once one has been flattened (or built
by `filter_jit` as an output), a later call passing the same object reuses its
`StaticPart` and dynamic leaves instead of flattening it again. The training
step that feeds its returned model and optimiser state back, and the loop that
calls a function on one model, both stop paying per leaf in Python.

A Module holding lists or dicts (`self.layers = [...]`, the usual way to write
a stack of layers) is remembered too, with a *guard*: each list and dict in it
and the very items it held. A list changed in place (an item replaced, added,
removed) fails the guard, and the Module is flattened again. Checking it costs
an identity comparison per item, in C.

An entry is a weak reference to its object, so it never keeps the object
alive, and it is dropped when the object dies; it holds the object's dynamic
leaves, which the object holds anyway. Arrays are immutable and Refs are
passed as the Ref objects themselves, so their current values are always the
ones used. Static fields cannot change either: their lists, dicts, sets and
NumPy arrays are frozen when the Module is built (`check_static_value`).
"""

from __future__ import annotations

import weakref
from operator import is_
from typing import Any

from .._split import ARRAY, StaticPart, Step, kind_of_type

__all__ = ["clear", "guard_holds", "lookup", "remember", "remember_outputs"]


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


def _drop(entry: _Entry, entries: dict[int, _Entry] = _ENTRIES) -> None:
    # `entries` bound here: at interpreter exit the module's globals may be
    # gone before the last objects die.
    if entries.get(entry.key) is entry:
        entries.pop(entry.key, None)


def remember(obj: Any, part: StaticPart, dynamic: list[Any]) -> None:
    """Remembers that `obj` (a Module of rememberable structure, see
    `StaticPart.rememberable`) flattens to `part` and `dynamic`. Objects that
    cannot be weakly referenced are skipped."""
    guard = None
    if not part.frozen():
        paths = part.guard_paths()
        if paths is None:
            return
        guard = []
        for path in paths:
            container = _resolve(obj, path)
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
    entry.guard = guard
    entry.key = key = id(obj)
    _ENTRIES[key] = entry


def _resolve(tree: Any, path: tuple[Step, ...]) -> Any:
    """The node of `tree` at `path` (as `StaticPart.guard_paths` gives)."""
    for is_attribute, key in path:
        tree = getattr(tree, key) if is_attribute else tree[key]
    return tree


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
    that passing them back in (a training step's model and optimiser state)
    finds them. Outputs still inside another trace are skipped (their leaves
    are tracers), as are outputs holding input Refs."""
    modules = static.module_parts()
    if not modules or (arrays and kind_of_type(type(arrays[0])) != ARRAY):
        return
    if static.holds_input_refs():
        return
    for module in modules:
        remember(module.find(out), module.part, arrays[module.dynamic_range])


def clear() -> None:
    _ENTRIES.clear()
