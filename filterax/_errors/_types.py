"""The exception types of runtime checks: `FilteraxRuntimeError` (also named
`EquinoxRuntimeError`), `FilteraxTracetimeError` (`EquinoxTracetimeError`) and
`UnknownModeError`."""

from __future__ import annotations


class FilteraxRuntimeError(RuntimeError):
    """Raised when a check made by [`error_if`][filterax.error_if] or
    [`branched_error_if`][filterax.branched_error_if] fails.

    Raised at trace time when the predicate is already known to be `True`, and
    when a compiled program run by [`filter_jit`][filterax.filter_jit] (or a
    check run eagerly, under `jax.vmap` say) finds it `True`. Under plain
    `jax.jit`, JAX reports the failure as a `jax.errors.JaxRuntimeError` (a
    `ValueError` when the call hits JAX's cache) whose message contains the
    check's. `EquinoxRuntimeError` is another name for
    this class, so code written for Equinox catches it unchanged.

    **Arguments:**

    - `*args`: as for any exception; the first is the message.

    **Returns:** the exception.

    ```python
    >>> import filterax as fx
    >>> try:
    ...     fx.error_if(1.0, True, "the input must be finite")
    ... except fx.FilteraxRuntimeError as error:
    ...     print(error.args[0].splitlines()[0])
    the input must be finite

    ```
    """


class FilteraxTracetimeError(FilteraxRuntimeError):
    """The [`FilteraxRuntimeError`][filterax.FilteraxRuntimeError] raised when
    a check fails while it is traced: its predicate was a Python `True`,
    known before any compiled program ran. `EquinoxTracetimeError` is
    another name for this class, so code written for Equinox that catches it
    keeps working; `except FilteraxRuntimeError` catches it too.

    **Arguments:**

    - `*args`: as for any exception; the first is the message.

    **Returns:** the exception.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> try:
    ...     fx.error_if(jnp.ones(2), True, "known to fail")
    ... except fx.FilteraxTracetimeError as error:
    ...     print(type(error).__name__, isinstance(error, fx.FilteraxRuntimeError))
    FilteraxTracetimeError True

    ```
    """


# Shown as `filterax.FilteraxRuntimeError` in tracebacks: the name users import.
FilteraxRuntimeError.__module__ = "filterax"
FilteraxTracetimeError.__module__ = "filterax"
EquinoxRuntimeError = FilteraxRuntimeError
EquinoxTracetimeError = FilteraxTracetimeError


class UnknownModeError(ValueError, RuntimeError):
    """An `on_error` that is not a mode. A `ValueError`, as filterax
    documents, and a `RuntimeError`, as Equinox raises."""
