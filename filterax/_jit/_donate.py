"""Buffer donation for `filter_jit`: the modes, and silencing JAX's warning about
unusable donations without paying for it on every call."""

from __future__ import annotations

import enum
import threading
import warnings
from typing import Literal

from .._compat import DONATION_WARNING

__all__ = [
    "Donate",
    "DonateMode",
    "restore_warnings",
    "silence_donation_warnings",
]

Donate = Literal["none", "all", "all-except-first", "warn", "warn-except-first"]


class DonateMode(enum.Enum):
    """What `donate=` asks for, as two independent choices: which arrays are
    donated, and whether JAX's unusable-donation warning is shown."""

    NONE = "none"
    ALL = "all"
    ALL_EXCEPT_FIRST = "all-except-first"
    WARN = "warn"
    WARN_EXCEPT_FIRST = "warn-except-first"

    @property
    def donates(self) -> bool:
        return self is not DonateMode.NONE

    @property
    def except_first(self) -> bool:
        return self in (DonateMode.ALL_EXCEPT_FIRST, DonateMode.WARN_EXCEPT_FIRST)

    @property
    def silences_warning(self) -> bool:
        return self in (DonateMode.ALL, DonateMode.ALL_EXCEPT_FIRST)

    @classmethod
    def parse(cls, donate: str) -> DonateMode:
        try:
            return cls(donate)
        except ValueError:
            raise ValueError(
                f"filter_jit: donate={donate!r} is not one of "
                f"{', '.join(repr(mode.value) for mode in cls)}."
            ) from None


class _SilencedWarnings(threading.local):
    def __init__(self) -> None:
        self.contexts: list[warnings.catch_warnings] = []


_SILENCED = _SilencedWarnings()


def silence_donation_warnings() -> None:
    """Called while tracing: ignores JAX's unusable-donation warning until the
    current call returns (see `restore_warnings`).

    JAX warns while lowering, which follows a trace; a cache hit neither traces
    nor warns. Starting the suppression from inside the trace means calls that
    hit the cache pay nothing for it, where wrapping every call in
    `warnings.catch_warnings()` would cost microseconds each time.
    """
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.filterwarnings("ignore", message=DONATION_WARNING)
    _SILENCED.contexts.append(context)


def silencing_depth() -> int:
    return len(_SILENCED.contexts)


def restore_warnings(depth: int) -> None:
    contexts = _SILENCED.contexts
    while len(contexts) > depth:
        contexts.pop().__exit__(None, None, None)
