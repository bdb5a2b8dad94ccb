"""`Enumeration`: named cases with messages, as values that pass through
`jit`, `vmap` and `lax` control flow.

A case (an `EnumerationItem`) is a Module holding an `int32` index and, as
static data, its enumeration class. The index is an array, so a function can
choose a case at run time (`Enumeration.where`) and return it from a compiled
function; the class maps indices back to messages. Equality between cases is
evaluated at trace time whenever both indices are known, so
`result == RESULTS.success` is a concrete boolean outside any trace.

An enumeration that subclasses another has every case of its bases, under
the same names, and may add more. Each enumeration numbers its own cases;
`promote` moves a case of a base into the subclass's numbering.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from ._errors import branched_error_if
from ._module import Module, field, is_dunder
from ._warnings import FilteraxWarning

__all__ = ["Enumeration", "EnumerationItem"]

_RESERVED = ("promote", "where")


class EnumerationItem(Module):
    """One case of an [`Enumeration`][filterax.Enumeration]: what
    `RESULTS.success` returns. A Module whose only array is the case's index,
    so it can be traced, batched and returned from compiled functions.

    **Arguments:**

    - `_value`: the case's index in its enumeration (an `int32` array).
    - `_enumeration`: the enumeration class (static).

    **Returns:** the case. Cases are made by their enumeration, not by hand.

    ```python
    >>> import filterax as fx
    >>> class Colour(fx.Enumeration):
    ...     red = "warm"
    ...     blue = "cold"
    >>> Colour[Colour.red], bool(Colour.red == Colour.blue)
    ('warm', False)

    ```
    """

    _value: Any
    _enumeration: Any = field(static=True)

    def _same_enumeration(self, other: object) -> EnumerationItem:
        if (
            isinstance(other, EnumerationItem)
            and other._enumeration is self._enumeration
        ):
            return other
        name = self._enumeration.__qualname__
        raise ValueError(
            f"A case of {name} can only be compared with another case of {name}, "
            f"not with {_describe(other)}."
        )

    def __eq__(self, other: object) -> jax.Array:  # type: ignore[override]
        other = self._same_enumeration(other)
        with jax.ensure_compile_time_eval():
            return jnp.asarray(self._value == other._value)

    def __ne__(self, other: object) -> jax.Array:  # type: ignore[override]
        other = self._same_enumeration(other)
        with jax.ensure_compile_time_eval():
            return jnp.asarray(self._value != other._value)

    __hash__ = None  # type: ignore[assignment]  # `==` gives an array

    def __repr__(self) -> str:
        enumeration = self._enumeration
        return (
            f"{enumeration.__module__}.{enumeration.__qualname__}<{enumeration[self]}>"
        )

    def __tree_pformat__(self) -> str:
        return repr(self)

    def error_if(self, token: Any, pred: Any) -> Any:
        """Raises this case's message as an error where `pred` is true, as
        [`branched_error_if`][filterax.branched_error_if] does.

        **Arguments:**

        - `token`: a pytree holding at least one array; the check is made
          once it is computed, and it is returned unchanged.
        - `pred`: a boolean (array); the error is raised where it is true.

        **Returns:** `token`.

        **Raises:** `FilteraxRuntimeError` (a `FilteraxTracetimeError` when
        `pred` and the case are known at trace time) with the case's message.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> class Solve(fx.Enumeration):
        ...     ok = ""
        ...     diverged = "the iteration diverged"
        >>> x = jnp.array([1.0, 2.0])
        >>> Solve.diverged.error_if(x, x.sum() > 10.0)
        Array([1., 2.], dtype=float32)

        ```
        """
        messages = self._enumeration._messages
        return branched_error_if(token, pred, self._value, messages)

    def is_traced(self) -> bool:
        """Whether the case is only known at run time (its index is a tracer).

        **Returns:** a bool.

        ```python
        >>> import jax
        >>> import filterax as fx
        >>> class Step(fx.Enumeration):
        ...     accepted = "accepted"
        >>> seen = []
        >>> _ = jax.jit(lambda case: seen.append(case.is_traced()) or case)(Step.accepted)
        >>> Step.accepted.is_traced(), seen
        (False, [True])

        ```
        """
        return isinstance(self._value, Tracer)


def _describe(value: object) -> str:
    if isinstance(value, EnumerationItem):
        return f"a case of {value._enumeration.__qualname__}"
    return f"a {type(value).__name__}"


class _EnumerationType(type):
    """The metaclass of enumerations: turns the class body's string
    attributes into cases, and gives the class its lookups."""

    _items: dict[str, EnumerationItem]
    _messages: list[str]
    _offsets: dict[type, np.ndarray]

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]
    ) -> _EnumerationType:
        cases = {k: v for k, v in namespace.items() if not is_dunder(k)}
        is_root = not bases
        if not is_root:
            _check_cases(name, cases, bases)
            kept = {k: v for k, v in namespace.items() if is_dunder(k)}
        else:
            kept, cases = dict(namespace), {}
        cls = super().__new__(mcs, name, bases, kept)
        cls._items, cls._messages, cls._offsets = {}, [], {}
        for ancestor in dict.fromkeys(a for b in bases for a in b.__mro__):
            if isinstance(ancestor, _EnumerationType) and ancestor._items:
                cls._offsets[ancestor] = np.asarray(
                    [cls._store(n, ancestor._message(n)) for n in ancestor._items],
                    dtype=np.int32,
                )
        for case, message in cases.items():
            cls._store(case, message)
        if not is_root and cls.__doc__ is None:
            cls.__doc__ = _docstring(cls)
        return cls

    def _message(cls, name: str) -> str:
        return cls._messages[int(cls._items[name]._value)]

    def _store(cls, name: str, message: str) -> int:
        item = cls._items.get(name)
        if item is None:
            cls._messages.append(message)
            index = len(cls._messages) - 1
            cls._items[name] = EnumerationItem(np.asarray(index, np.int32), cls)
            return index
        index = int(item._value)
        if cls._messages[index] != message:
            warnings.warn(
                f"{cls.__qualname__}.{name} is defined twice with different "
                f"messages ({cls._messages[index]!r} and {message!r}); the "
                "later one is used.",
                FilteraxWarning,
                stacklevel=4,
            )
            cls._messages[index] = message
        return index

    def __getattr__(cls, name: str) -> EnumerationItem:
        # Only called when ordinary lookup fails: `cls.case`.
        items = type.__getattribute__(cls, "__dict__").get("_items", {})
        try:
            return items[name]
        except KeyError:
            raise AttributeError(
                f"{cls.__qualname__} has no case {name!r}; its cases are "
                f"{', '.join(items) or 'none'}."
            ) from None

    def __getitem__(cls, item: EnumerationItem) -> str:
        if not isinstance(item, EnumerationItem) or item._enumeration is not cls:
            raise ValueError(
                f"{cls.__qualname__}[...] takes a case of {cls.__qualname__}, "
                f"not {_describe(item)}."
            )
        value = item._value
        if isinstance(value, Tracer):
            return "traced"
        if not isinstance(value, (np.ndarray, jax.Array)) or not np.issubdtype(
            value.dtype, np.integer
        ):
            # Replaced by a placeholder (`filter_eval_shape`, `partition`).
            return "unknown"
        indices = np.asarray(value)
        if indices.ndim == 0:
            return cls._messages[int(indices)]
        # A batch of cases (from `vmap`): the messages, as NumPy prints them.
        messages = np.asarray(cls._messages, dtype=object)[indices]
        return str(messages.astype(str))

    def __len__(cls) -> int:
        return len(cls._items)

    def __iter__(cls) -> Iterator[EnumerationItem]:
        return iter(cls._items.values())

    def __contains__(cls, item: object) -> bool:
        return isinstance(item, EnumerationItem) and item._enumeration is cls

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, EnumerationItem) and (
            instance._enumeration is cls or cls is Enumeration
        )

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{cls.__qualname__} is an enumeration: its cases are looked up "
            f"(`{cls.__qualname__}.<name>`), not made by calling it."
        )


def _check_cases(name: str, cases: dict[str, Any], bases: tuple[type, ...]) -> None:
    for base in bases:
        if not isinstance(base, _EnumerationType):
            raise ValueError(
                f"Enumeration {name} can only subclass enumerations, not "
                f"{base.__qualname__}."
            )
    for case, message in cases.items():
        if case in _RESERVED:
            raise ValueError(
                f"Enumeration {name} cannot have a case named {case!r}: that is "
                f"the name of the classmethod `{name}.{case}`."
            )
        if not isinstance(message, str):
            raise TypeError(
                f"Enumeration {name}: the case {case!r} must be given a message "
                f'string (`{case} = "..."`), got a {type(message).__name__}.'
            )


def _docstring(cls: _EnumerationType) -> str:
    lines = ["An enumeration with the cases:", ""]
    for name in cls._items:
        message = cls._message(name)
        lines.append(f"- `{name}`" + (f": {message}" if message else ""))
    return "\n".join(lines)


class Enumeration(metaclass=_EnumerationType):
    """Named cases with messages that pass through JAX transformations, as
    Equinox's `Enumeration`: declare each case as a class attribute holding
    its message.

    `RESULTS.success` is a case (an
    [`EnumerationItem`][filterax.EnumerationItem]); `RESULTS[case]` is its
    message (`"traced"` inside a trace, `"unknown"` when its index was
    replaced, by `filter_eval_shape` or `partition`, say); `case == RESULTS.success` is a boolean array (concrete whenever
    both are known at trace time); `len(RESULTS)` and iteration give the
    cases. Comparing a case with anything other than a case of the same
    enumeration raises `ValueError`. A subclass has the cases of its bases and
    may add more; `promote` converts a base's case into it.

    **Arguments:** none: enumerations are declared, not called.

    **Returns:** the cases, looked up as attributes of the class.

    **Raises:** `ValueError` for a case named `promote` or `where`, or a base
    that is not an enumeration; `TypeError` for a case whose value is not a
    string.

    ```python
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> class RESULTS(fx.Enumeration):
    ...     success = ""
    ...     max_steps_reached = "the solver took too many steps"
    >>> @jax.jit
    ... def outcome(steps):
    ...     return RESULTS.where(steps < 100, RESULTS.success, RESULTS.max_steps_reached)
    >>> result = outcome(jnp.array(150))
    >>> RESULTS[result], bool(result == RESULTS.max_steps_reached)
    ('the solver took too many steps', True)

    ```
    """

    _items: ClassVar[dict[str, EnumerationItem]]
    _messages: ClassVar[list[str]]
    _offsets: ClassVar[dict[type, np.ndarray]]

    @classmethod
    def promote(cls, item: EnumerationItem) -> EnumerationItem:
        """The case of this enumeration with the name of `item`, a case of one
        of its base enumerations.

        **Arguments:**

        - `item`: a case of a (strict) base of this enumeration.

        **Returns:** the same case, as a case of this enumeration (traced when
        `item` is).

        **Raises:** `ValueError` when `item` is not a case of a base.

        ```python
        >>> import filterax as fx
        >>> class Basic(fx.Enumeration):
        ...     ok = "ok"
        ...     failed = "failed"
        >>> class Extended(Basic):
        ...     cancelled = "cancelled"
        >>> case = Extended.promote(Basic.failed)
        >>> Extended[case], bool(case == Extended.failed)
        ('failed', True)

        ```
        """
        source = item._enumeration if isinstance(item, EnumerationItem) else None
        if source is None or source is cls or source not in cls._offsets:
            raise ValueError(
                f"{cls.__qualname__}.promote takes a case of one of its base "
                f"enumerations, not {_describe(item)}."
            )
        with jax.ensure_compile_time_eval():
            index = jnp.asarray(cls._offsets[source])[item._value]
        return EnumerationItem(index, cls)

    @classmethod
    def where(
        cls, pred: Any, a: EnumerationItem, b: EnumerationItem
    ) -> EnumerationItem:
        """`a` where `pred` is true, else `b`: `jnp.where` for cases.

        **Arguments:**

        - `pred`: a scalar boolean (array), possibly traced.
        - `a`, `b`: cases of this enumeration.

        **Returns:** a case of this enumeration.

        **Raises:** `ValueError` when `pred` is not a scalar boolean or a case
        belongs to another enumeration.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> class Sign(fx.Enumeration):
        ...     positive = "positive"
        ...     negative = "negative"
        >>> Sign[Sign.where(jnp.array(-2.0) > 0, Sign.positive, Sign.negative)]
        'negative'

        ```
        """
        if jnp.shape(pred) != () or jnp.result_type(pred) != jnp.bool_:
            raise ValueError(
                f"{cls.__qualname__}.where needs a scalar boolean predicate, got "
                f"shape {jnp.shape(pred)} and dtype {jnp.result_type(pred)}."
            )
        for case in (a, b):
            if not (isinstance(case, EnumerationItem) and case._enumeration is cls):
                raise ValueError(
                    f"{cls.__qualname__}.where chooses between cases of "
                    f"{cls.__qualname__}, not {_describe(case)}."
                )
        with jax.ensure_compile_time_eval():
            return EnumerationItem(jnp.where(pred, a._value, b._value), cls)
