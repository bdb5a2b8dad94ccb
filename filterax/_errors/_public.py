"""The public functions `error_if` and `branched_error_if`: their argument
validation (predicate, message index, messages, mode), and what a check known
to fail while it is traced does."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import Tracer

from .._tree._filters import is_array
from .._tree._split import split
from .._warnings import FilteraxWarning
from ._program import _checked, _fill_where, _stack_inside_transforms
from ._report import (
    _MODES,
    FilteraxTracetimeError,
    OnError,
    UnknownModeError,
    _message,
    default_on_error,
    runtime_error_from,
)


def _python_bool(pred: Any) -> bool | None:
    """`pred` when it is a Python bool, decided while tracing; `None` for an
    array, concrete or not, which is checked when the program runs (as in
    Equinox, so that a check in a branch that never runs never fails)."""
    return pred if type(pred) is bool else None


def _concretely_false(pred: Any) -> bool:
    """Whether an array predicate is concrete and all false: no check to
    stage."""
    return not isinstance(pred, Tracer) and not np.any(np.asarray(pred))


def _validated_pred(pred: Any) -> Any:
    """`pred` as a bool or boolean array. A number counts by its truth, as
    in Equinox (`error_if(x, jnp.sum(x < 0), ...)`): non-zero fails."""
    if isinstance(pred, (bool, np.bool_)):
        return pred
    if isinstance(pred, (int, float, complex)):
        return bool(pred)
    dtype = getattr(pred, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.bool_):
        return pred
    if dtype is not None and jnp.issubdtype(dtype, jnp.number):
        return pred != 0
    shown = type(pred).__name__ if dtype is None else f"an array of {dtype}"
    raise TypeError(
        f"error_if: `pred` must be a bool or a boolean array (a number counts "
        f"as true when non-zero), got {shown}. Compare to get one, e.g. `x < 0`."
    )


def _validated_index(index: Any, msgs: Sequence[str]) -> Any:
    dtype = getattr(index, "dtype", None)
    integer = isinstance(index, (int, np.integer)) and not isinstance(index, bool)
    if not integer and (dtype is None or not jnp.issubdtype(dtype, jnp.integer)):
        raise TypeError(
            "branched_error_if: `index` must be an int or an integer array, got "
            f"{type(index).__name__ if dtype is None else f'an array of {dtype}'}."
        )
    if not isinstance(index, Tracer) and np.size(index):
        values = np.asarray(index)
        low, high = int(values.min()), int(values.max())
        if not (-len(msgs) <= low and high < len(msgs)):
            raise ValueError(
                f"branched_error_if: `index`={low if low < -len(msgs) else high} "
                f"is out of range for {len(msgs)} message(s)."
            )
    return index


def _validated_msgs(msgs: Any) -> tuple[str, ...]:
    if (
        isinstance(msgs, str)
        or not isinstance(msgs, Sequence)
        or not msgs
        or not all(isinstance(m, str) for m in msgs)
    ):
        raise TypeError(
            "branched_error_if: `msgs` must be a non-empty sequence of strings "
            f"(one per value of `index`), got {msgs!r}."
        )
    return tuple(msgs)


def _validated_mode(on_error: str) -> str:
    if on_error == "default":
        return default_on_error()
    if on_error not in _MODES:
        raise UnknownModeError(
            f"error_if: on_error={on_error!r} is not one of 'default', "
            f"{', '.join(map(repr, _MODES))}."
        )
    return on_error


def _trace_time_failure(x: Any, message: str, mode: str) -> Any:
    if mode == "raise":
        raise FilteraxTracetimeError(
            f"{message}\n\n(This check failed as soon as it was made: its "
            "predicate was already known to be True, before any compiled program "
            "ran. Set FILTERAX_ON_ERROR=breakpoint, or EQX_ON_ERROR=breakpoint, "
            "to stop in the debugger here instead.)"
        )
    if mode == "breakpoint":
        print(f"filterax.FilteraxRuntimeError: {message}", flush=True)
        breakpoint()
        return x
    if mode == "nan":
        warnings.warn(
            "error_if: the check failed while tracing (its predicate was already "
            "known to be True); returning NaN in place of the checked arrays, as "
            "on_error='nan'.",
            FilteraxWarning,
            stacklevel=4,
        )
        return jax.tree.map(
            lambda leaf: _poisoned(jnp.asarray(leaf)) if is_array(leaf) else leaf, x
        )
    return x


def _poisoned(leaf: jax.Array) -> jax.Array:
    """`leaf` filled as a failed check fills it, with the gradient of the
    identity (as inside a compiled program, and as in Equinox): replaced by a
    constant, a floating leaf would pass zero gradients on, so that the NaN
    never reached them."""
    if jnp.issubdtype(leaf.dtype, jnp.inexact):
        return leaf + lax.stop_gradient(_fill_where(True, leaf) - leaf)
    return _fill_where(True, leaf)


def error_if(
    x: Any,
    pred: Any,
    msg: str,
    *,
    on_error: OnError = "default",
) -> Any:
    """Checks a condition on runtime values, under `jit`, `vmap` and
    differentiation alike, and fails with `msg` when it holds.

    The check happens once `x` and `pred` are computed and before the returned
    value is used. What failing does depends on `on_error`:

    - `"raise"`: raise a [`FilteraxRuntimeError`][filterax.FilteraxRuntimeError]
      (under plain `jax.jit`, a `jax.errors.JaxRuntimeError`, or `ValueError`
      on a cache hit, whose message contains `msg`). Under `vmap`, the message names each failing batch index.
    - `"breakpoint"`: print the message and open JAX's debugger (run pytest with
      `-s`). `FILTERAX_ON_ERROR_BREAKPOINT_FRAMES` sets how many frames of your
      code it shows (default 1); it opens in your code, filterax's frames
      hidden as JAX's are. Continuing returns NaN where the check failed.
    - `"nan"`: return `x` with NaN (the largest integer, `True`) in place of
      its arrays where the check failed, and carry on.
    - `"off"`: no check at all.
    - `"default"`: the environment variable `FILTERAX_ON_ERROR`, else
      `EQX_ON_ERROR`, else `"raise"`; read when the check is traced.

    A `pred` that is a Python bool (or number) is decided while tracing: `True`
    fails at once (with a message index that is a Python int), `"raise"`
    raising a [`FilteraxTracetimeError`][filterax.FilteraxTracetimeError],
    `"breakpoint"` opening Python's debugger, `"nan"` warning and filling. An
    array, even a concrete one, is checked when the program runs, as in
    Equinox: a check in a `lax.cond` branch that is not taken never fails.

    **Arguments:**

    - `x`: any pytree holding at least one array, returned unchanged.
    - `pred`: a bool or boolean array; the check fails if any element is `True`
      (a number, or an array of numbers, counts as `True` when non-zero).
    - `msg`: the error message.
    - `on_error`: keyword only, see above.

    **Returns:** `x`. **If the result is not used, the check is removed** with
    the rest of the unused computation.

    **Raises:** `FilteraxRuntimeError` as described; `TypeError` for a `pred`
    that is neither boolean nor numeric; `ValueError` for an unknown `on_error` or if `x` holds
    no array while `pred` is only known at run time.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_jit
    ... def safe_log(x):
    ...     x = fx.error_if(x, x <= 0, "log of a non-positive number")
    ...     return jnp.log(x)
    >>> safe_log(jnp.ones(2))
    Array([0., 0.], dtype=float32)
    >>> try:
    ...     safe_log(jnp.array([1.0, -1.0]))
    ... except RuntimeError as error:
    ...     print("log of a non-positive number" in str(error))
    True

    ```
    """
    if not isinstance(msg, str):
        raise TypeError(f"error_if: `msg` must be a string, got {msg!r}.")
    return branched_error_if(x, pred, 0, (msg,), on_error=on_error)


def branched_error_if(
    x: Any,
    pred: Any,
    index: Any,
    msgs: Sequence[str],
    *,
    on_error: OnError = "default",
) -> Any:
    """As [`error_if`][filterax.error_if], with the message chosen at run time:
    `msgs[index]`.

    Under `vmap` each failing batch element reports its own message.

    **Arguments:**

    - `x`: any pytree holding at least one array, returned unchanged.
    - `pred`: a bool or boolean array; the check fails if any element is `True`
      (a number, or an array of numbers, counts as `True` when non-zero).
    - `index`: an int or integer array selecting the message (of an array,
      the largest element).
    - `msgs`: the messages, a non-empty sequence of strings.
    - `on_error`: keyword only, as for `error_if`.

    **Returns:** `x` (see `error_if` for what happens when the check fails).

    **Raises:** as `error_if`; also `TypeError` for an `index` that is not
    an integer, `ValueError` for one out of range when known.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> def check(x):
    ...     kind = jnp.where(jnp.isnan(x), 1, 0)
    ...     return fx.branched_error_if(
    ...         x, jnp.isnan(x) | (x < 0), kind, ["negative", "NaN"]
    ...     )
    >>> try:
    ...     jax.vmap(check)(jnp.array([1.0, jnp.nan]))
    ... except fx.FilteraxRuntimeError as error:
    ...     print("Batch index (1,) had error:\\nNaN" in str(error))
    True

    ```
    """
    msgs = _validated_msgs(msgs)
    mode = _validated_mode(on_error)
    pred = _validated_pred(pred)
    index = _validated_index(index, msgs)
    if mode == "off":
        return x
    failed = _python_bool(pred)
    if failed is False or (failed is None and _concretely_false(pred)):
        return x
    if failed and type(index) is int:
        return _trace_time_failure(x, _message(index, msgs), mode)
    leaves, static = split(x, is_array)
    if not leaves:
        raise ValueError(
            "error_if: `x` holds no array, so there is nothing to attach a runtime "
            "check to. Pass (a pytree holding) the array that the check guards."
        )
    pred = jnp.any(jnp.asarray(pred))
    # An array of indices (one per element checked) reports the largest.
    index = jnp.max(jnp.asarray(index))
    stack = _stack_inside_transforms() if mode == "raise" else ""
    try:
        leaves = _checked(leaves, pred, index, mode=mode, msgs=msgs, stack=stack)
    except (jax.errors.JaxRuntimeError, ValueError) as error:
        # Run eagerly (under `vmap` or `grad` without `jit`): the check ran here.
        translated = runtime_error_from(error)
        if translated is None:
            raise
        raise translated from None
    return static.merge(leaves)
