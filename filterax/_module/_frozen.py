"""Static values that cannot be changed in place: what a static field holds
instead of a list, dict, set or NumPy array (see `check_static_value`).

A static value is part of the structure of every program compiled for its
Module, and a compilation keyed on the same object would not see a change made
in place: each of these types refuses such a change with an error naming the
field, and reads like the type it replaces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._pretty import tree_pformat

__all__ = [
    "FROZEN_STATIC_TYPES",
    "FrozenStaticArray",
    "FrozenStaticDict",
    "FrozenStaticList",
    "FrozenStaticSet",
    "freeze_static",
]


def freeze_static(value: Any, where: str) -> Any:
    """`value` with its lists, dicts, sets and NumPy arrays (inside tuples,
    lists and dicts too) replaced by read-only equivalents; `where` names it
    in the error that a change raises."""
    cls = type(value)
    if cls is list:
        return FrozenStaticList(
            [freeze_static(item, f"{where}[{i}]") for i, item in enumerate(value)],
            where,
        )
    if cls is dict:
        return FrozenStaticDict(
            {k: freeze_static(v, f"{where}[{k!r}]") for k, v in value.items()},
            where,
        )
    if cls is set:
        return FrozenStaticSet(value, where)
    if cls is tuple:
        items = tuple(
            freeze_static(item, f"{where}[{i}]") for i, item in enumerate(value)
        )
        return value if all(map(_same, items, value)) else items
    if cls is np.ndarray:
        return FrozenStaticArray.of(value, where)
    return value


def _same(a: Any, b: Any) -> bool:
    return a is b


def _refusal_text(where: str, kind: str, method: str, copy: str) -> str:
    return (
        f"{where} is a {kind} held in a static field: part of the structure "
        "of every program compiled for the Module, so it cannot be changed in "
        f"place (`{method}`), as code compiled before would not see the "
        f"change. Build a new Module with a new value instead (`{copy}` of "
        "this one gives a mutable copy)."
    )


def _refusal(kind: str, method: str) -> Callable[..., Any]:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(_refusal_text(self.where, kind, method, f"{kind}(...)"))

    refuse.__name__ = method
    return refuse


class FrozenStaticList(list):
    """A list stored in a static field: reads as a `list`, refuses changes
    (`TypeError` naming the field), hashable by its items."""

    __slots__ = ("where",)

    def __init__(self, items: Any = (), where: str = "a static value"):
        list.__init__(self, items)
        self.where = where

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (list(self), self.where)

    def __repr__(self) -> str:
        return repr(list(self))

    def __tree_pformat__(self) -> str:
        return tree_pformat(list(self))


class FrozenStaticDict(dict):
    """A dict stored in a static field: reads as a `dict`, refuses changes
    (`TypeError` naming the field), hashable by its items."""

    __slots__ = ("where",)

    def __init__(self, items: Any = (), where: str = "a static value"):
        dict.__init__(self, items)
        self.where = where

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (dict(self), self.where)

    def __repr__(self) -> str:
        return repr(dict(self))

    def __tree_pformat__(self) -> str:
        return tree_pformat(dict(self))


class FrozenStaticSet(set):
    """A set stored in a static field: reads as a `set`, refuses changes
    (`TypeError` naming the field), hashable by its items."""

    __slots__ = ("where",)

    def __init__(self, items: Any = (), where: str = "a static value"):
        set.__init__(self, items)
        self.where = where

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (set(self), self.where)

    def __repr__(self) -> str:
        return repr(set(self))

    def __tree_pformat__(self) -> str:
        return tree_pformat(set(self))


class StaticArrayChangeError(TypeError, ValueError):
    """A change in place of a NumPy array held in a static field. A
    `TypeError`, as for the lists and dicts held there, and a `ValueError`, as
    NumPy raises for any read-only array."""


class FrozenStaticArray(np.ndarray):
    """A NumPy array stored in a static field: a read-only copy of the array
    given, that refuses changes (`__setitem__`, in-place operators, `out=`,
    `fill`, `sort`, `put`) with an error naming the field. Computations on it
    give plain NumPy arrays; `np.array(...)` of it is a mutable copy.

    Its data belongs to a read-only base array, so that its `writeable` flag
    cannot be set back to `True` either.
    """

    where: str

    @classmethod
    def of(cls, value: np.ndarray, where: str) -> FrozenStaticArray:
        """A frozen copy of `value`, for the static value named `where`."""
        # A copy: the caller's array may still be changed through other names.
        base = np.array(value, copy=True)
        base.flags.writeable = False
        frozen = base.view(cls)
        frozen.where = where
        return frozen

    def __array_finalize__(self, obj: Any) -> None:
        # Views (`frozen[1:]`) name the field too.
        self.where = getattr(obj, "where", "a static value")

    def __array_ufunc__(
        self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any
    ) -> Any:
        outputs = kwargs.get("out", ())
        for output in outputs:
            if isinstance(output, FrozenStaticArray) and not output.flags.writeable:
                output._refuse(f"{ufunc.__name__}(..., out=...)")
        # Computed on plain arrays, so that results are plain arrays.
        inputs = tuple(map(_plain, inputs))
        if outputs:
            kwargs["out"] = tuple(map(_plain, outputs))
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __setitem__(self, index: Any, value: Any) -> None:
        if not self.flags.writeable:
            self._refuse("__setitem__")
        super().__setitem__(index, value)

    def fill(self, value: Any) -> None:
        if not self.flags.writeable:
            self._refuse("fill")
        super().fill(value)

    def sort(self, *args: Any, **kwargs: Any) -> None:
        if not self.flags.writeable:
            self._refuse("sort")
        super().sort(*args, **kwargs)

    def put(self, *args: Any, **kwargs: Any) -> None:
        if not self.flags.writeable:
            self._refuse("put")
        super().put(*args, **kwargs)

    def copy(self, order: Any = "C") -> np.ndarray:  # type: ignore[override]
        return np.array(self, order=order)

    # Copies made by indexing and conversion are plain arrays of their own;
    # views (`frozen[1:]`, `.T`, `.reshape`) share the data and stay frozen.
    def __getitem__(self, index: Any) -> Any:
        return _plain_if_copy(super().__getitem__(index))

    def astype(self, *args: Any, **kwargs: Any) -> Any:
        return _plain_if_copy(super().astype(*args, **kwargs))

    def flatten(self, *args: Any, **kwargs: Any) -> Any:
        return _plain_if_copy(super().flatten(*args, **kwargs))

    def __copy__(self) -> FrozenStaticArray:
        return self  # immutable: a copy need not be made

    def __deepcopy__(self, memo: Any) -> FrozenStaticArray:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return FrozenStaticArray.of, (np.asarray(self), self.where)

    def __repr__(self) -> str:
        return repr(np.asarray(self))

    def _refuse(self, method: str) -> None:
        raise StaticArrayChangeError(
            _refusal_text(self.where, "read-only NumPy array", method, "np.array(...)")
        )


def _plain(value: Any) -> Any:
    return value.view(np.ndarray) if isinstance(value, FrozenStaticArray) else value


def _plain_if_copy(value: Any) -> Any:
    if isinstance(value, FrozenStaticArray) and value.flags.writeable:
        return value.view(np.ndarray)
    return value


_MUTATORS: dict[type, tuple[str, str]] = {
    FrozenStaticList: (
        "list",
        "__setitem__ __delitem__ __iadd__ __imul__ append extend insert pop "
        "remove clear sort reverse",
    ),
    FrozenStaticDict: (
        "dict",
        "__setitem__ __delitem__ __ior__ pop popitem clear update setdefault",
    ),
    FrozenStaticSet: (
        "set",
        "__iand__ __ior__ __isub__ __ixor__ add discard remove pop clear update "
        "difference_update intersection_update symmetric_difference_update",
    ),
}
for _frozen_type, (_kind, _methods) in _MUTATORS.items():
    for _method in _methods.split():
        setattr(_frozen_type, _method, _refusal(_kind, _method))


# The types that `freeze_static` makes: already frozen, so never checked again.
FROZEN_STATIC_TYPES = (
    FrozenStaticList,
    FrozenStaticDict,
    FrozenStaticSet,
    FrozenStaticArray,
)
