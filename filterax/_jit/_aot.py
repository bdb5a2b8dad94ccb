"""Ahead-of-time compilation: `filter_jit(f).lower(*args).compile()`.

`Lowered` and `CompiledCall` wrap JAX's `jax.stages.Lowered` and `Compiled`
for the keyed body of one call. The compiled function is called with the
original arguments, as the `filter_jit` function would be: their static part
must equal the lowered call's (an error names where it differs), their arrays
are passed on, and the output is rebuilt as the `filter_jit` function's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jax

from .._compat import donation_warning_ignored
from .._errors import runtime_error_from
from .._tree._split import MixedOutput, shape_signature
from .._tree._structure import differences_text
from ._compiled import rebuild
from ._describe import CallKey, describe
from ._policy import Policy

__all__ = ["CallPlan", "CompiledCall", "Lowered"]


class CompiledArgumentsError(ValueError, TypeError):
    """A compiled function called with other arguments than it was lowered
    for. A `ValueError`, as filterax documents, and a `TypeError`, as Equinox
    (and JAX's own compiled functions) raise."""


class CallPlan:
    """What a lowered call fixed: the static key, the arrays inside the
    function, how many argument arrays are the first argument's (told apart
    when donating), the `Policy`, and how the wrapper arranges a call."""

    __slots__ = (
        "arrange",
        "example",
        "fun_dynamic",
        "key",
        "n_first",
        "policy",
        "signature",
    )

    def __init__(
        self,
        key: CallKey,
        fun_dynamic: list[Any],
        n_first: int,
        policy: Policy,
        args: tuple,
        kwargs: dict,
        arrange: Callable[[tuple, dict], tuple[tuple, dict]],
    ):
        self.arrange = arrange
        self.key = key
        self.fun_dynamic = fun_dynamic
        self.n_first = n_first
        self.policy = policy
        self.example = shape_signature((args, kwargs))
        self.signature = _signature(describe(args, kwargs)[1])

    def arguments(self, args: tuple, kwargs: dict) -> list[Any]:
        """The dynamic leaves of a call, checked against the plan."""
        args, kwargs = self.arrange(args, kwargs)
        try:
            key, leaves = describe(args, kwargs, self.key, self.fun_dynamic, True)
            same, dynamic = key is self.key, leaves[len(self.fun_dynamic) :]
        except TypeError:  # an unhashable value where the plan has another
            same, dynamic = False, []
        if not same or _signature(dynamic) != self.signature:
            called = shape_signature((args, kwargs))
            listing = differences_text(self.example, called, "(args, kwargs)")
            raise CompiledArgumentsError(
                "filter_jit: a compiled function was called with arguments that "
                f"differ from the ones it was lowered for ({listing or 'they differ'}"
                "). Call it with the same structure, non-array values, shapes and "
                "dtypes, or lower it again."
            )
        return dynamic

    def with_first(self, first: Any) -> CallPlan:
        """This plan, for calls that leave out the first positional argument
        (a method's `self`): `first` is put in front of theirs."""
        plan = copy.copy(self)
        arrange = self.arrange
        plan.arrange = lambda args, kwargs: arrange((first, *args), kwargs)
        return plan

    def inputs(self, dynamic: list[Any]) -> list[Any]:
        """The traced inputs in the order that returned Refs are counted in
        (the function's arrays, then the arguments')."""
        return [*self.fun_dynamic, *dynamic]

    def groups(self, dynamic: list[Any]) -> tuple[list[Any], ...]:
        """The arguments of the keyed body after its key (see `Policy`)."""
        return self.policy.keyed(
            self.inputs(dynamic), len(self.fun_dynamic), self.n_first
        )


def _signature(leaves: Any) -> tuple[tuple[tuple[int, ...], Any], ...]:
    return tuple((tuple(leaf.shape), leaf.dtype) for leaf in leaves)


class Lowered:
    """`filter_jit(f).lower(*args, **kwargs)`: JAX's `Lowered` for that call.

    `compile(compiler_options=...)` gives a [`CompiledCall`][]; `as_text()`,
    `cost_analysis()`, `compiler_ir()` and every other attribute are those of
    `jax.stages.Lowered`, which is also the public attribute `lowered` (as in
    Equinox, where code reaches it as `lowered.lowered`).

    **Arguments:**

    - `lowered`: JAX's `jax.stages.Lowered` of the keyed body of the call.
    - `plan`: how a call of the compiled function is checked and arranged.

    **Returns:** the lowered call (made by `lower`, not by users).

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> lowered = fx.filter_jit(lambda x: 2 * x).lower(jnp.ones(3))
    >>> isinstance(lowered.lowered, jax.stages.Lowered)
    True

    ```
    """

    lowered: jax.stages.Lowered

    def __init__(self, lowered: jax.stages.Lowered, plan: CallPlan):
        self.lowered = lowered
        self._plan = plan

    def compile(self, compiler_options: dict[str, Any] | None = None) -> CompiledCall:
        """Compiles the lowered call.

        **Arguments:**

        - `compiler_options`: XLA compiler options, as for
          `jax.stages.Lowered.compile`.

        **Returns:** a callable taking the same arguments as the `filter_jit`
        function.
        """
        with donation_warning_ignored(self._plan.policy.silences):
            compiled = self.lowered.compile(compiler_options=compiler_options)
        return CompiledCall(compiled, self._plan)

    def bound_to(self, first: Any) -> Lowered:
        """This lowered call, compiling to a function that takes its arguments
        but the first, which is `first` (a bound method's instance)."""
        return Lowered(self.lowered, self._plan.with_first(first))

    def __getattr__(self, name: str) -> Any:
        if name in ("lowered", "_plan"):  # not set yet (`copy.copy`): no recursion
            raise AttributeError(name)
        return getattr(self.lowered, name)


class CompiledCall:
    """A compiled `filter_jit` call, called with the original arguments.

    JAX's `jax.stages.Compiled` is the public attribute `compiled` (as in
    Equinox: `compiled.compiled.cost_analysis()`); its other attributes are
    reached through this object too.

    **Arguments:**

    - `compiled`: JAX's `jax.stages.Compiled` of the keyed body of the call.
    - `plan`: how a call is checked and arranged (the lowered call's).

    **Returns:** a callable taking the `filter_jit` function's arguments.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> compiled = fx.filter_jit(lambda x: 2 * x).lower(jnp.ones(3)).compile()
    >>> isinstance(compiled.compiled, jax.stages.Compiled)
    True
    >>> compiled(jnp.ones(3))
    Array([2., 2., 2.], dtype=float32)

    ```
    """

    compiled: jax.stages.Compiled

    def __init__(self, compiled: jax.stages.Compiled, plan: CallPlan):
        self.compiled = compiled
        self._plan = plan

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dynamic = self._plan.arguments(args, kwargs)
        with donation_warning_ignored(self._plan.policy.silences):
            try:
                out = self.compiled(*self._plan.groups(dynamic))
            except Exception as error:
                translated = runtime_error_from(error)
                if translated is None:
                    raise
                raise translated from None
        if out.__class__ is MixedOutput:
            return rebuild(out, lambda: self._plan.inputs(dynamic))
        return out

    def __getattr__(self, name: str) -> Any:
        if name in ("compiled", "_plan"):  # not set yet (`copy.copy`): no recursion
            raise AttributeError(name)
        return getattr(self.compiled, name)
