"""Runtime checks: `error_if` and `branched_error_if`, and the error they raise.

A check whose predicate is known while tracing is resolved there and then.
Otherwise it becomes a `lax.cond` that calls back to Python only when the check
fails. That callback raises inside the compiled program, where XLA turns the
exception into a `jax.errors.JaxRuntimeError` with a long, JAX-internal message.
The callback therefore also files the readable report under a serial number
written into that message, and `runtime_error_from` (for `filter_jit`, and for
checks run eagerly) swaps the XLA error for a `FilteraxRuntimeError` carrying
the report.

Imports only `jax`, NumPy, `._filters` and `._split`: the package root imports
this module.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
import re
import threading
import traceback
import types
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import Tracer
from jax.custom_batching import custom_vmap

from ._filters import is_array
from ._split import split

__all__ = [
    "EquinoxRuntimeError",
    "EquinoxTracetimeError",
    "FilteraxRuntimeError",
    "FilteraxTracetimeError",
    "branched_error_if",
    "error_if",
    "runtime_error_from",
]

OnError = Literal["default", "raise", "breakpoint", "nan", "off"]
_MODES = ("raise", "breakpoint", "nan", "off")
# Read in this order; the Equinox name keeps ported programs and scripts working.
ON_ERROR_VARIABLES = ("FILTERAX_ON_ERROR", "EQX_ON_ERROR")
BREAKPOINT_FRAMES_VARIABLES = (
    "FILTERAX_ON_ERROR_BREAKPOINT_FRAMES",
    "EQX_ON_ERROR_BREAKPOINT_FRAMES",
)
# A vmapped check that fails for a whole batch lists this many elements at most.
_MAX_LISTED_FAILURES = 10


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


class _CheckFailed(Exception):
    """Raised by the host callback of a failing check. XLA wraps it into a
    `JaxRuntimeError`; it never reaches users as itself."""


class _HideCheckFailures(logging.Filter):
    """JAX logs every exception raised in a callback, traceback included. A
    failed check is reported by the exception that follows, so its log record
    is dropped; other callbacks' records are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc_info = record.exc_info
        return not (exc_info and isinstance(exc_info[1], _CheckFailed))


# JAX's name for the logger; `test_failed_checks_are_not_logged` fails if it changes.
logging.getLogger("jax._src.callback").addFilter(_HideCheckFailures())


# --- Configuration -----------------------------------------------------------------


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


# --- Reports -----------------------------------------------------------------------

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


# --- Stacks ------------------------------------------------------------------------

_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep for path in (jax.__file__, __file__)
)


def _is_library_file(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def _stack_inside_transforms() -> str:
    """The caller's stack below the outermost JAX or filterax frame (the
    `jit`, `vmap`... that is tracing it), without library frames."""
    frames = list(traceback.walk_stack(None))[::-1]
    inside: list[tuple[types.FrameType, int]] = []
    entered = False
    for frame, lineno in frames:
        library = _is_library_file(frame.f_code.co_filename)
        entered = entered or library
        if entered and not library:
            inside.append((frame, lineno))
    return "".join(traceback.StackSummary.extract(iter(inside)).format())


# --- The check inside the program --------------------------------------------------


@custom_vmap
def any_over_batch(flag: jax.Array) -> jax.Array:
    """`flag` itself; under `vmap`, an unbatched "any element is `True`", so
    that the `lax.cond` on it stays a branch instead of becoming a select."""
    return flag


@any_over_batch.def_vmap
def any_over_batch_rule(
    axis_size: int, in_batched: Sequence[bool], flag: jax.Array
) -> tuple[jax.Array, bool]:
    del axis_size
    return (jnp.any(flag, axis=0) if in_batched[0] else flag), False


def _fill_value(dtype: Any) -> Any:
    """NaN, or what stands for it in a non-float dtype; `None` if there is none."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return np.nan
    if jnp.issubdtype(dtype, jnp.integer):
        return np.iinfo(dtype).max
    if jnp.issubdtype(dtype, jnp.bool_):
        return True
    return None


def _fill_where(flag: Any, leaf: jax.Array) -> jax.Array:
    """`leaf`, with the fill value of its dtype where `flag` is `True`."""
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        data = _fill_where(flag, jax.random.key_data(leaf))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    fill = _fill_value(leaf.dtype)
    if fill is None:
        return leaf
    return jnp.where(flag, jnp.asarray(fill, leaf.dtype), leaf)


_DEBUGGER_NOTE = (
    "Entering the debugger. It starts in filterax's own code: enter `u` to move "
    "up to yours (`where` lists the frames; `c` continues, with NaN in place of "
    "the checked values)."
)
_DEBUGGER_NOTE_UNDER_VMAP = (
    "Entering the debugger. Under `vmap` JAX cannot show the frames of your code "
    "(their values are batched); `c` continues, with NaN in place of the checked "
    "values."
)


def _host_failure(
    pred: np.ndarray,
    index: np.ndarray,
    *,
    msgs: Sequence[str],
    stack: str | None,
    note: str,
) -> np.ndarray:
    """Host callback, run only when some element's check failed. With a
    `stack` (mode "raise") it raises; otherwise it prints `note` too. Returns
    which elements failed (under `vmap` the branch may have become a select,
    and then possibly none did)."""
    description = _describe(pred, index, msgs)
    if description is not None:
        if stack is not None:
            serial = _file_report(_runtime_report(description, stack))
            raise _CheckFailed(
                f"{description}\n\n[{_FAILURE_MARKER}{serial}] {_JAX_JIT_HINT}"
            )
        print(f"filterax.FilteraxRuntimeError: {description}\n\n{note}", flush=True)
    return np.asarray(pred, dtype=np.bool_)


def _fill_on_host(mask: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Host side of `_fill_where`; `mask` has the leading (batch) dimensions."""
    filled = []
    for array in arrays:
        fill = _fill_value(array.dtype)
        if fill is not None:
            shaped = mask.reshape(mask.shape + (1,) * (array.ndim - mask.ndim))
            array = np.where(shaped, np.asarray(fill, array.dtype), array)
        filled.append(array)
    return tuple(filled)


def _report_through_host(
    leaves: list[jax.Array],
    pred: jax.Array,
    index: jax.Array,
    report: Any,
) -> tuple[jax.Array, list[jax.Array]]:
    """Runs `report` (a `_host_failure`) on `pred` and `index`, then passes
    `leaves` through the host, filled where the check failed. Returns the
    per-element failure mask and the filled leaves.

    Only the shapes of `leaves` matter when raising, but the compiler must not
    see through the value that depends on the report, or it removes the
    report (`where(failed, nan, x)` is just `x` when `x` is a constant NaN)."""
    failed = jax.pure_callback(
        report,
        jax.ShapeDtypeStruct((), jnp.bool_),
        pred,
        index,
        vmap_method="broadcast_all",
    )
    keys = [jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) for leaf in leaves]
    sent = [
        jax.random.key_data(leaf) if key else leaf for leaf, key in zip(leaves, keys)
    ]
    received = jax.pure_callback(
        _fill_on_host,
        [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in sent],
        failed,
        *sent,
        vmap_method="broadcast_all",
    )
    filled = [
        jax.random.wrap_key_data(new, impl=jax.random.key_impl(old)) if key else new
        for old, new, key in zip(leaves, received, keys)
    ]
    return failed, filled


def own_frames_on_top() -> int:
    """How many filterax frames, starting with the caller's, come before the
    first frame of user code. JAX's debugger hides JAX's own frames, not ours,
    so it lists these first."""
    count = 0
    caller = inspect.currentframe()
    caller = caller.f_back if caller is not None else None
    for frame, _ in traceback.walk_stack(caller):
        filename = frame.f_code.co_filename
        if not _is_library_file(filename):
            break
        if os.path.abspath(filename).startswith(_LIBRARY_DIRS[1]):
            count += 1
    return count


def _pause(token: jax.Array, num_frames: int) -> Any:
    # A frame of its own, holding only unbatched locals: with `num_frames=1`,
    # the debugger captures nothing that `vmap` would have to batch.
    return jax.debug.breakpoint(token=token, num_frames=num_frames)


def _check(
    leaves: list[jax.Array],
    pred: jax.Array,
    index: jax.Array,
    *,
    mode: str,
    msgs: tuple[str, ...],
    stack: str,
) -> list[jax.Array]:
    if mode == "nan":
        # Per element: under vmap a batched predicate turns this into a select.
        return lax.cond(
            pred, lambda ls: [_fill_where(True, leaf) for leaf in ls], list, leaves
        )

    def on_failure(leaves: list[jax.Array], show_frames: bool) -> list[jax.Array]:
        note = _DEBUGGER_NOTE if show_frames else _DEBUGGER_NOTE_UNDER_VMAP
        report = functools.partial(
            _host_failure,
            msgs=msgs,
            stack=stack if mode == "raise" else None,
            note=note,
        )
        failed, leaves = _report_through_host(leaves, pred, index, report)
        if mode == "breakpoint":
            num_frames = 1
            if show_frames:
                # This frame and `_pause`'s are filterax's too.
                num_frames = own_frames_on_top() + 1 + _breakpoint_user_frames()
            paused = _pause(any_over_batch(failed), num_frames)
            # Depending on the debugger's output keeps it from being pruned.
            leaves = [_fill_where(failed & paused, leaf) for leaf in leaves]
        return leaves

    def run(show_frames: bool) -> list[jax.Array]:
        branch = functools.partial(on_failure, show_frames=show_frames)
        return lax.cond(any_over_batch(pred), branch, list, leaves)

    if mode == "breakpoint":
        try:
            return run(show_frames=True)
        except NotImplementedError:
            # `vmap` could not batch the debugger's capture of batched locals.
            return run(show_frames=False)
    return run(show_frames=True)


def _checked(
    leaves: list[jax.Array],
    pred: jax.Array,
    index: jax.Array,
    *,
    mode: str,
    msgs: tuple[str, ...],
    stack: str,
) -> list[jax.Array]:
    """`_check`, with tangents passing straight through: differentiation
    never sees the branch or the callback."""

    @jax.custom_jvp
    def check(leaves: list[jax.Array], pred: jax.Array, index: jax.Array) -> Any:
        return _check(leaves, pred, index, mode=mode, msgs=msgs, stack=stack)

    @check.defjvp
    def check_jvp(primals: tuple, tangents: tuple) -> tuple:
        return check(*primals), tangents[0]

    return check(leaves, pred, index)


# --- Public functions --------------------------------------------------------------


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


class UnknownModeError(ValueError, RuntimeError):
    """An `on_error` that is not a mode. A `ValueError`, as filterax
    documents, and a `RuntimeError`, as Equinox raises."""


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
      code it shows (default 1); it opens in filterax's own frame, so enter
      `u` to move up into yours. Continuing returns NaN where the check failed.
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
