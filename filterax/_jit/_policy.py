"""The call policy of a `filter_jit`, built once: donation, `*-except-first`,
shardings, and the order in which a call's parts reach the inner `jax.jit`s.

A call has four parts: the arrays inside the function itself (`fun_dynamic`),
the first positional argument, the other positional arguments and the keyword
arguments. On the keyed route the arguments are flat leaves (after the
function's); on the direct route they are passed as given.

- Nothing donated: the keyed body takes one list (every extra argument adds to
  JAX's dispatch work); the direct body `(fun_dynamic, args, kwargs)`.
- Donating: the first argument apart, then the function's arrays, then the
  rest: `(first, fun_dynamic, rest)` keyed, `(args[:1], fun_dynamic, args[1:],
  kwargs)` direct. XLA gives an output the buffer of the first donated input
  of its shape, so this order decides which arrays a call consumes (with
  `filter_jit(model, donate="all")(x)`, `x` rather than the model's weights).
  The `*-except-first` modes donate all but the first group.

JAX warns about unusable donations while lowering, which follows a trace: the
silencing modes start ignoring the warning from inside the trace
(`silence_donation_warnings`), and the wrapper ends it once the call returns,
so that calls hitting the cache pay nothing for it.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Literal

from .._compat import DONATION_WARNING
from ._layout import Layout

__all__ = ["Donate", "Policy", "restore_warnings", "silence_donation_warnings"]

Donate = Literal["none", "all", "all-except-first", "warn", "warn-except-first"]
_MODES = ("none", "all", "all-except-first", "warn", "warn-except-first")


class Policy:
    """How every call of one `filter_jit` is made. Hashable: with the function,
    it finds the shared `Compiled`.

    `plain` is true when a call needs nothing but the routes themselves (no
    silencing, no first argument kept, no shardings)."""

    __slots__ = (
        "direct_donated",
        "donate",
        "donates",
        "except_first",
        "keyed_donated",
        "layout",
        "plain",
        "silences",
    )

    def __init__(self, donate: str, layout: Layout | None = None):
        if donate not in _MODES:
            raise ValueError(
                f"filter_jit: donate={donate!r} is not one of "
                f"{', '.join(map(repr, _MODES))}."
            )
        self.donate = donate
        self.layout = layout
        self.donates = donate != "none"
        self.except_first = donate.endswith("-except-first")
        self.silences = donate.startswith("all")
        self.plain = not (self.silences or self.except_first or layout is not None)
        if not self.donates:
            self.keyed_donated: tuple[int, ...] = ()
            self.direct_donated: tuple[int, ...] = ()
        elif self.except_first:
            self.keyed_donated, self.direct_donated = (2, 3), (1, 2, 3)
        else:
            self.keyed_donated, self.direct_donated = (1, 2, 3), (0, 1, 2, 3)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Policy
            and other.donate == self.donate
            and other.layout == self.layout
        )

    def __hash__(self) -> int:
        return hash((self.donate, self.layout))

    def __repr__(self) -> str:
        return f"Policy(donate={self.donate!r}, layout={self.layout!r})"

    def keyed(
        self, leaves: list[Any], n_fun: int, n_first: int
    ) -> tuple[list[Any], ...]:
        """The keyed body's arguments after its key, from a call's leaves (the
        function's `n_fun` arrays, then the first argument's `n_first`, then
        the others')."""
        if not self.donates:
            return (leaves,)
        first_end = n_fun + n_first
        return leaves[n_fun:first_end], leaves[:n_fun], leaves[first_end:]

    @staticmethod
    def keyed_inside(
        groups: tuple[list[Any], ...], n_fun: int
    ) -> tuple[list[Any], list[Any]]:
        """Inside the keyed body: `(fun_dynamic, the arguments' leaves)`."""
        if len(groups) == 1:
            return groups[0][:n_fun], groups[0][n_fun:]
        first, fun_dynamic, rest = groups
        return fun_dynamic, [*first, *rest]

    def direct(self, fun_dynamic: list[Any], args: tuple, kwargs: dict) -> tuple | None:
        """The direct body's arguments, or `None` when this call cannot take
        the direct route (a mode that keeps the first argument, called
        without a positional one)."""
        if not self.donates:
            return fun_dynamic, args, kwargs
        if self.except_first and not args:
            return None
        return args[:1], fun_dynamic, args[1:], kwargs

    @staticmethod
    def direct_inside(groups: tuple) -> tuple[list[Any], tuple, dict]:
        """Inside the direct body: `(fun_dynamic, args, kwargs)`."""
        if len(groups) == 3:
            return groups  # type: ignore[return-value]
        first, fun_dynamic, rest, kwargs = groups
        return fun_dynamic, (*first, *rest), kwargs


class _SilencedWarnings(threading.local):
    def __init__(self) -> None:
        self.contexts: list[warnings.catch_warnings] = []


_SILENCED = _SilencedWarnings()


def silence_donation_warnings() -> int:
    """Called while tracing: ignores JAX's unusable-donation warning until
    `restore_warnings` is given the depth from before the call."""
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.filterwarnings("ignore", message=DONATION_WARNING)
    _SILENCED.contexts.append(context)
    return len(_SILENCED.contexts)


def silencing_depth() -> int:
    return len(_SILENCED.contexts)


def restore_warnings(depth: int) -> None:
    contexts = _SILENCED.contexts
    while len(contexts) > depth:
        contexts.pop().__exit__(None, None, None)
