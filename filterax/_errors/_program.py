"""The check inside the program: a `lax.cond` that calls back to the host
only when the check fails, with tangents passing straight through; its batching
rule (a branch stays a branch under `vmap`); the values a failed check leaves
in place of the checked ones; the host callbacks and the debugger (stacks,
frames to skip). A failed check's exception is kept out of JAX's callback log."""

from __future__ import annotations

import functools
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
from jax import lax
from jax.custom_batching import custom_vmap

from .._compat import shown_in_tracebacks
from ._report import (
    _FAILURE_MARKER,
    _JAX_JIT_HINT,
    _breakpoint_user_frames,
    _describe,
    _file_report,
    _runtime_report,
)


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
            num_frames = None
            if show_frames:
                # `_pause`'s frame is filterax's too, shown where this one is.
                own = own_frames_on_top()
                num_frames = own + (1 if own else 0) + _breakpoint_user_frames()
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
