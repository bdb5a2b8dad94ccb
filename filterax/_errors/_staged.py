"""The check inside the program: a `lax.cond` that calls back to the host
only when the check fails, with tangents passing straight through."""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax import lax

from ._batching import any_over_batch
from ._config import _breakpoint_user_frames
from ._fill import _fill_where
from ._host import (
    _DEBUGGER_NOTE,
    _DEBUGGER_NOTE_UNDER_VMAP,
    _host_failure,
    _pause,
    _report_through_host,
    own_frames_on_top,
)


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
