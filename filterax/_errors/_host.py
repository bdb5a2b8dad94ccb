"""Host callbacks and the debugger: the callback that reports a failed check
(raising, or printing before the debugger opens), the stack of user code shown
in a report, and the frames the debugger skips. A failed check's exception is
kept out of JAX's callback log."""

from __future__ import annotations

import inspect
import logging
import os
import traceback
import types
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._compat import shown_in_tracebacks
from ._fill import _fill_value
from ._reports import (
    _FAILURE_MARKER,
    _JAX_JIT_HINT,
    _describe,
    _file_report,
    _runtime_report,
)


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


# JAX's folder and filterax's (two levels above this file).
_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(jax.__file__)) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
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


_DEBUGGER_NOTE = (
    "Entering the debugger at your code (`where` lists the frames; `c` "
    "continues, with NaN in place of the checked values)."
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
    first frame of user code among those JAX's debugger shows. It hides the
    frames that JAX's traceback filtering hides, filterax's included (see
    `_compat`), so this is 0 and the debugger opens in user code."""
    count = 0
    caller = inspect.currentframe()
    caller = caller.f_back if caller is not None else None
    for frame, _ in traceback.walk_stack(caller):
        filename = frame.f_code.co_filename
        if not _is_library_file(filename):
            break
        if os.path.abspath(filename).startswith(
            _LIBRARY_DIRS[1]
        ) and shown_in_tracebacks(filename):
            count += 1
    return count


def _pause(token: jax.Array, num_frames: int | None) -> Any:
    # A frame of its own, holding only unbatched locals. `num_frames=None`
    # shows only this frame (filterax's, which JAX's filtering would hide), so
    # the debugger captures nothing that `vmap` would have to batch.
    if num_frames is None:
        return jax.debug.breakpoint(token=token, num_frames=1, filter_frames=False)
    return jax.debug.breakpoint(token=token, num_frames=num_frames)
