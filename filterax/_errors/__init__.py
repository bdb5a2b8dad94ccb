"""Runtime checks: `error_if` and `branched_error_if`, and the error they raise.

A check whose predicate is known while tracing is resolved there and then.
Otherwise it becomes a `lax.cond` that calls back to Python only when the check
fails. That callback raises inside the compiled program, where XLA turns the
exception into a `jax.errors.JaxRuntimeError` with a long, JAX-internal message.
The callback therefore also files the readable report under a serial number
written into that message, and `runtime_error_from` (for `filter_jit`, and for
checks run eagerly) swaps the XLA error for a `FilteraxRuntimeError` carrying
the report.

Three modules, from the bottom up:

- `_report.py`: the exception types (`FilteraxRuntimeError` and its Equinox
  name, `FilteraxTracetimeError`, `UnknownModeError`), the environment's
  configuration, the reports filed under serial numbers, and
  `runtime_error_from`, the runtime-error rule for compiled programs.
- `_program.py`: the check inside the program (`lax.cond`, host callbacks, the
  debugger), its batching rule `any_over_batch`, and the fill values of a
  failed check.
- `_public.py`: `error_if`, `branched_error_if` and their argument validation.

May import: `jax`, NumPy, `.._compat`, `.._tree._filters`, `.._tree._split` and
`.._warnings` (the package root imports
this folder). Other modules import it from here.
"""

from ._program import any_over_batch, own_frames_on_top
from ._public import branched_error_if, error_if
from ._report import (
    EquinoxRuntimeError,
    EquinoxTracetimeError,
    FilteraxRuntimeError,
    FilteraxTracetimeError,
    OnError,
    UnknownModeError,
    default_on_error,
    runtime_error_from,
)

__all__ = [
    "EquinoxRuntimeError",
    "EquinoxTracetimeError",
    "FilteraxRuntimeError",
    "FilteraxTracetimeError",
    "OnError",
    "UnknownModeError",
    "any_over_batch",
    "branched_error_if",
    "default_on_error",
    "error_if",
    "own_frames_on_top",
    "runtime_error_from",
]
