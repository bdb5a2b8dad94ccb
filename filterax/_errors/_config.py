"""Environment configuration of runtime checks: which mode `on_error="default"`
means (`FILTERAX_ON_ERROR`, else `EQX_ON_ERROR`), and how many frames of user
code the debugger shows."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

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
