"""Report serials: the readable report of a failed check is filed under a
serial number, written into the message XLA raises, so that the report can be
found again (`runtime_error_from`) when the error reaches filterax."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

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
