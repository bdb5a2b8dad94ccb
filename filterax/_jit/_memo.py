"""How immutable argument objects flatten, remembered by identity.

A Module whose every node is immutable (see `StaticPart.frozen`) flattens the
same way for as long as it lives: the same structure, the same static leaves,
the very same array and Ref objects. So once one has been flattened (or built
by `filter_jit` as an output), a later call passing the same object reuses its
`StaticPart` and dynamic leaves instead of flattening it again. The training
step that feeds its returned model and optimiser state back, and the loop that
calls a function on one model, both stop paying per leaf in Python.

An entry is a weak reference to its object, so it never keeps the object
alive, and it is dropped when the object dies; it holds the object's dynamic
leaves, which the object holds anyway. Arrays are immutable and Refs are
passed as the Ref objects themselves, so their current values are always the
ones used. What is not seen: a static leaf (a field value that is not an
array) mutated in place after the Module was built, which a Module's
immutability forbids in spirit; `jax.jit` would not see such a change in a
closed-over value either.
"""

from __future__ import annotations

import weakref
from typing import Any

from .._split import ARRAY, StaticPart, kind_of_type

__all__ = ["clear", "lookup", "remember", "remember_outputs"]


class _Entry(weakref.ref):
    """A weak reference to a remembered object (made as `_Entry(obj, _drop)`,
    in C), with its flattening set as attributes."""

    __slots__ = ("dynamic", "key", "part")
    dynamic: list[Any]
    key: int
    part: StaticPart


# id(object) -> its entry. Dictionary operations are atomic, so threads and
# the garbage collector's callbacks need no lock.
_ENTRIES: dict[int, _Entry] = {}
lookup = _ENTRIES.get


def _drop(entry: _Entry) -> None:
    if _ENTRIES.get(entry.key) is entry:
        _ENTRIES.pop(entry.key, None)


def remember(obj: Any, part: StaticPart, dynamic: list[Any]) -> None:
    """Remembers that `obj` (a Module of frozen structure) flattens to `part`
    and `dynamic`. Objects that cannot be weakly referenced are skipped."""
    try:
        entry = _Entry(obj, _drop)
    except TypeError:
        return
    entry.part = part
    entry.dynamic = dynamic
    entry.key = key = id(obj)
    _ENTRIES[key] = entry


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
