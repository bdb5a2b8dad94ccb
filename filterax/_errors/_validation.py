"""Argument validation of `error_if` and `branched_error_if`: the predicate,
the message index, the messages and the mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from ._config import _MODES, default_on_error
from ._types import UnknownModeError


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
