"""`assert_max_traces` and `get_num_traces`: counting how often JAX traces a
function, to catch unintended recompilation."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

import jax

from .._compat import same_structure
from .._module import Module, field, module_update_wrapper
from .._pretty import tree_pformat
from .._tree._filters import is_array

__all__ = ["assert_max_traces", "get_num_traces"]

_F = TypeVar("_F", bound=Callable[..., Any])


class _TraceCount:
    """The count shared by a wrapper and every copy JAX makes of it.

    It is a static field, so it lives in the treedef: flattening and
    unflattening hand the very same object to the copy. Hashed and compared by
    identity, as a cache key must be.
    """

    __slots__ = ("__weakref__", "count", "seen")

    def __init__(self) -> None:
        self.count = 0
        # Argument name -> the abstract values it had in earlier traces.
        self.seen: dict[str, list[Any]] = {}


def _abstract(value: Any) -> Any:
    """What a trace depends on: arrays as shape, dtype and weak type; other
    leaves as themselves."""

    def leaf(x: Any) -> Any:
        if is_array(x):
            return jax.ShapeDtypeStruct(
                x.shape, x.dtype, weak_type=getattr(x, "weak_type", False)
            )
        return x

    return jax.tree.map(leaf, value)


def _same(a: Any, b: Any) -> bool:
    if not same_structure(jax.tree.structure(a), jax.tree.structure(b)):
        return False
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        try:
            if not bool(x == y):
                return False
        except Exception:  # `==` may be undefined or ambiguous: be cautious
            if x is not y:
                return False
    return True


def _named_arguments(fn: Callable[..., Any], args: tuple, kwargs: dict) -> dict:
    try:
        return dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        named = {f"args[{i}]": arg for i, arg in enumerate(args)}
        named.update({f"kwargs[{key!r}]": value for key, value in kwargs.items()})
        return named


class _MaxTraces(Module):
    fn: Callable[..., Any]
    max_traces: int | None = field(static=True)
    trace_count: _TraceCount = field(static=True)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        return self.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = self.trace_count
        state.count += 1
        arguments = {
            name: _abstract(value)
            for name, value in _named_arguments(self.fn, args, kwargs).items()
        }
        if self.max_traces is not None and state.count > self.max_traces:
            raise RuntimeError(self._too_many_traces(arguments))
        for name, value in arguments.items():
            state.seen.setdefault(name, []).append(value)
        return self.fn(*args, **kwargs)

    def _too_many_traces(self, arguments: dict[str, Any]) -> str:
        state = self.trace_count
        head = (
            f"{self.fn!r} can only be traced {self.max_traces} times, but it has "
            f"now been traced {state.count} times."
        )
        for name, value in arguments.items():
            earlier = state.seen.get(name, [])
            if not any(_same(value, old) for old in earlier):
                shown = "\n".join(
                    "  " + tree_pformat(old, struct_as_array=True) for old in earlier
                )
                return (
                    f"{head} The argument '{name}' looks responsible: it is now\n"
                    f"  {tree_pformat(value, struct_as_array=True)}\n"
                    f"and was in earlier traces\n{shown or '  (not passed)'}"
                )
        return (
            f"{head} Every argument has been seen before, so the new trace comes "
            "from something else: a closed-over value, the function itself, or a "
            "cleared cache."
        )


@overload
def assert_max_traces(fn: _F, *, max_traces: int | None) -> _F: ...


@overload
def assert_max_traces(
    fn: None = None, *, max_traces: int | None
) -> Callable[[_F], _F]: ...


def assert_max_traces(fn: Any = None, *, max_traces: int | None) -> Any:
    """Wraps `fn` so that calling it more than `max_traces` times raises.

    Place it inside a JIT (`filter_jit(assert_max_traces(f, max_traces=1))`):
    the wrapped function is then called once per trace, so this guards against
    unintended recompilation. The count is shared by every copy of the wrapper
    that JAX makes by flattening and unflattening it. `fn` may be a function or
    a callable Module (whose arrays stay visible to `filter_jit`).

    **Arguments:**

    - `fn`: the callable to wrap. Omit it to get a decorator.
    - `max_traces`: keyword only; the most calls allowed, or `None` for no
      limit (the count is still available from
      [`get_num_traces`][filterax.debug.get_num_traces]).

    **Returns:** the wrapped callable (a Module).

    **Raises:** `TypeError` for a `max_traces` that is not a non-negative int
    or `None`. When called once too often: `RuntimeError` saying "can only be
    traced N times" and naming the argument whose new shape, dtype or static
    value caused the trace.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_jit
    ... @fx.debug.assert_max_traces(max_traces=1)
    ... def double(x):
    ...     return 2 * x
    >>> double(jnp.ones(3)), double(jnp.zeros(3))  # one trace
    (Array([2., 2., 2.], dtype=float32), Array([0., 0., 0.], dtype=float32))
    >>> try:
    ...     double(jnp.ones(4))  # a new shape: a second trace
    ... except RuntimeError as error:
    ...     print("can only be traced 1 times" in str(error))
    True

    ```
    """
    if max_traces is not None and (
        isinstance(max_traces, bool) or not isinstance(max_traces, int)
    ):
        raise TypeError(
            f"assert_max_traces: max_traces must be an int or None, got {max_traces!r}."
        )
    if max_traces is not None and max_traces < 0:
        raise TypeError(
            f"assert_max_traces: max_traces must be non-negative, got {max_traces}."
        )
    if fn is None:
        return functools.partial(assert_max_traces, max_traces=max_traces)
    if not callable(fn):
        raise TypeError(f"assert_max_traces: expected a callable, got {fn!r}.")
    return module_update_wrapper(_MaxTraces(fn, max_traces, _TraceCount()))


def get_num_traces(fn: Callable[..., Any]) -> int:
    """How many times a function wrapped by
    [`assert_max_traces`][filterax.debug.assert_max_traces] has been traced.

    Looks through wrappers that set `__wrapped__` (`filter_jit`, `jax.jit`,
    `functools.wraps`), and counts the traces of every copy of the wrapper.

    **Arguments:**

    - `fn`: the wrapper, or a wrapper around it.

    **Returns:** the number of calls (traces) so far, an `int`.

    **Raises:** `ValueError` if no `assert_max_traces` wrapper is found.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> square = fx.filter_jit(fx.debug.assert_max_traces(lambda x: x**2, max_traces=None))
    >>> _ = square(jnp.ones(2)), square(jnp.ones(3)), square(jnp.ones(3))
    >>> fx.debug.get_num_traces(square)
    2

    ```
    """
    current: Any = fn
    visited: set[int] = set()
    while id(current) not in visited:
        if isinstance(current, _MaxTraces):
            return current.trace_count.count
        visited.add(id(current))
        try:
            current = current.__wrapped__
        except AttributeError:
            break
    raise ValueError(
        f"get_num_traces: {fn!r} is not wrapped by "
        "`filterax.debug.assert_max_traces` (looked through `__wrapped__`)."
    )
