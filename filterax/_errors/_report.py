"""What a failed check reports, and to whom: the exception types
(`FilteraxRuntimeError` and its Equinox name, `FilteraxTracetimeError`,
`UnknownModeError`), the environment's configuration (`FILTERAX_ON_ERROR`,
`EQX_ON_ERROR`, the debugger's frame count), the reports filed under serial
numbers, and `runtime_error_from`, which turns XLA's error for a failed check
back into the `FilteraxRuntimeError` carrying the report."""

from __future__ import annotations

import itertools
import os
import re
import threading
from collections.abc import Sequence
from typing import Any, Literal

import jax
import numpy as np


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


OnError = Literal["default", "raise", "breakpoint", "nan", "off"]
_MODES = ("raise", "breakpoint", "nan", "off")
# Read in this order; the Equinox name keeps ported programs and scripts working.
ON_ERROR_VARIABLES = ("FILTERAX_ON_ERROR", "EQX_ON_ERROR")
BREAKPOINT_FRAMES_VARIABLES = (
    "FILTERAX_ON_ERROR_BREAKPOINT_FRAMES",
    "EQX_ON_ERROR_BREAKPOINT_FRAMES",
)


def _environment_value(names: Sequence[str]) -> tuple[str, str] | None:
    for name in names:
        value = os.environ.get(name, "")
        if value:
            return name, value
    return None


def default_on_error() -> str:
    """The mode that `on_error="default"` means: `FILTERAX_ON_ERROR`, else
    `EQX_ON_ERROR`, else `"raise"`. Read when a check is traced."""
    found = _environment_value(ON_ERROR_VARIABLES)
    if found is None:
        return "raise"
    name, value = found
    if value not in _MODES:
        raise ValueError(
            f"The environment variable {name}={value!r} is not a valid mode for "
            f"runtime errors; expected one of {', '.join(_MODES)}."
        )
    return value


def _breakpoint_user_frames() -> int:
    found = _environment_value(BREAKPOINT_FRAMES_VARIABLES)
    if found is None:
        return 1
    name, value = found
    try:
        frames = int(value)
    except ValueError:
        frames = 0
    if frames < 1:
        raise ValueError(
            f"The environment variable {name}={value!r} must be a positive integer "
            "(the number of frames of your code the debugger shows)."
        )
    return frames


# A vmapped check that fails for a whole batch lists this many elements at most.
_MAX_LISTED_FAILURES = 10

_FAILURE_MARKER = "filterax check failure #"
_FAILURE_PATTERN = re.compile(re.escape(_FAILURE_MARKER) + r"(\d+)")
_MAX_KEPT_REPORTS = 64
_REPORTS: dict[int, str] = {}
_REPORTS_LOCK = threading.Lock()
_SERIALS = itertools.count()

_HELP = """\
--------------------
A check made by `filterax.error_if` (or `branched_error_if`) failed while the
program ran.

- To stop in a debugger at the failing check instead, set the environment
  variable `FILTERAX_ON_ERROR=breakpoint` (`EQX_ON_ERROR=breakpoint` is read too)
  and run the program again in a new Python process. Add `-s` when running under
  pytest. `FILTERAX_ON_ERROR_BREAKPOINT_FRAMES=<n>` shows `n` frames of your code.
- To run the program as ordinary Python and inspect its values, set
  `JAX_DISABLE_JIT=1`.
- `FILTERAX_ON_ERROR=nan` puts NaN in place of the checked values instead of
  raising, and `FILTERAX_ON_ERROR=off` skips every check.
"""

_JAX_JIT_HINT = (
    "(This check was made by `filterax.error_if`. Call the program through "
    "`filterax.filter_jit` rather than `jax.jit` to get this error as a short "
    "`filterax.FilteraxRuntimeError`, or set FILTERAX_ON_ERROR=breakpoint "
    "(or EQX_ON_ERROR=breakpoint) to stop in a debugger at the check.)"
)


def _file_report(report: str) -> int:
    with _REPORTS_LOCK:
        serial = next(_SERIALS)
        _REPORTS[serial] = report
        while len(_REPORTS) > _MAX_KEPT_REPORTS:
            del _REPORTS[next(iter(_REPORTS))]
    return serial


def _message(index: int, msgs: Sequence[str]) -> str:
    if -len(msgs) <= index < len(msgs):
        return msgs[index]
    return (
        f"(branched_error_if: a check failed with index={index}, but only "
        f"{len(msgs)} message(s) were given.)"
    )


def _describe(pred: Any, index: Any, msgs: Sequence[str]) -> str | None:
    """The failure text for a check's per-element `pred` and `index`, whose
    dimensions (if any) are batch dimensions; `None` if nothing failed."""
    pred = np.asarray(pred)
    index = np.broadcast_to(np.asarray(index), pred.shape)
    if pred.ndim == 0:
        return _message(int(index), msgs) if pred else None
    positions = [tuple(int(i) for i in p) for p in np.argwhere(pred)]
    if not positions:
        return None
    parts = [
        f"Batch index {position} had error:\n{_message(int(index[position]), msgs)}"
        for position in positions[:_MAX_LISTED_FAILURES]
    ]
    if len(positions) > _MAX_LISTED_FAILURES:
        parts.append(
            f"...and {len(positions) - _MAX_LISTED_FAILURES} more batch elements."
        )
    return "\n\n".join(parts)


def _runtime_report(description: str, stack: str) -> str:
    return (
        "Above is the stack outside of JIT. Below is the stack inside of JIT:\n"
        f"{stack}\nfilterax.FilteraxRuntimeError: {description}\n\n{_HELP}"
    )


def runtime_error_from(error: BaseException) -> FilteraxRuntimeError | None:
    """If `error` is XLA's report of a failed check, the `FilteraxRuntimeError`
    to raise in its place (`raise ... from None`); otherwise `None`.

    **Arguments:**

    - `error`: an exception raised by running a compiled program.

    **Returns:** a `FilteraxRuntimeError`, or `None`.

    ```python
    >>> from filterax._errors import runtime_error_from
    >>> runtime_error_from(RuntimeError("unrelated")) is None
    True

    ```
    """
    # JAX raises the failure of a running program as `JaxRuntimeError`, or as
    # `ValueError` from its C++ dispatch (a call that hits its cache).
    if not isinstance(error, (jax.errors.JaxRuntimeError, ValueError)):
        return None
    match = _FAILURE_PATTERN.search(str(error))
    if match is None:
        return None
    with _REPORTS_LOCK:
        report = _REPORTS.pop(int(match.group(1)), None)
    return None if report is None else FilteraxRuntimeError(report)
