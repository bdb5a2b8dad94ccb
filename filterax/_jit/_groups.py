"""The order in which a call's parts reach the inner `jax.jit`s of `filter_jit`,
in one place: the wrappers pack a call with it, the traced bodies unpack it,
`.lower` uses it, and the donated positions are derived from it.

A call has four parts: the arrays inside the function itself (`fun_dynamic`),
the first positional argument, the other positional arguments and the keyword
arguments. On the keyed route the arguments are already flat leaves (after
the function's, see `_keyed`); on the direct route they are passed as given.

- Nothing donated: the keyed body takes one list (every extra argument adds to
  JAX's dispatch work on each call); the direct body `(fun_dynamic, args,
  kwargs)`.
- Donating: the first argument apart, then the function's arrays, then the
  rest: `(first, fun_dynamic, rest)` keyed, `(args[:1], fun_dynamic, args[1:],
  kwargs)` direct. This is Equinox's order: XLA gives an output the buffer of
  the first donated input of its shape, so it decides which arrays a call
  consumes (with `filter_jit(model, donate="all")(x)`, `x` rather than the
  model's own weights). The `*-except-first` modes donate all but the first
  group.
"""

from __future__ import annotations

from typing import Any

from ._donate import DonateMode

__all__ = ["GroupOrder"]


class GroupOrder:
    """The groups of one donation mode. `keyed_donated` and `direct_donated`
    are the bodies' `donate_argnums` (the keyed body's key is argument 0)."""

    __slots__ = ("direct_donated", "donates", "except_first", "keyed_donated")

    def __init__(self, mode: DonateMode):
        self.donates = mode.donates
        self.except_first = mode.except_first
        if not self.donates:
            self.keyed_donated: tuple[int, ...] = ()
            self.direct_donated: tuple[int, ...] = ()
        elif self.except_first:
            self.keyed_donated, self.direct_donated = (2, 3), (1, 2, 3)
        else:
            self.keyed_donated, self.direct_donated = (1, 2, 3), (0, 1, 2, 3)

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

    def keyed_inside(
        self, groups: tuple[list[Any], ...], n_fun: int
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

    def direct_inside(self, groups: tuple) -> tuple[list[Any], tuple, dict]:
        """Inside the direct body: `(fun_dynamic, args, kwargs)`."""
        if len(groups) == 3:
            return groups  # type: ignore[return-value]
        first, fun_dynamic, rest, kwargs = groups
        return fun_dynamic, (*first, *rest), kwargs
