"""The runtime-error rule for compiled programs: XLA's error for a failed
check becomes the `FilteraxRuntimeError` carrying the check's report."""

from __future__ import annotations

import jax

from ._reports import _FAILURE_PATTERN, _REPORTS, _REPORTS_LOCK
from ._types import FilteraxRuntimeError


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
