"""Runtime checks: `error_if` and `branched_error_if`, and the error they raise.

A check whose predicate is known while tracing is resolved there and then.
Otherwise it becomes a `lax.cond` that calls back to Python only when the check
fails. That callback raises inside the compiled program, where XLA turns the
exception into a `jax.errors.JaxRuntimeError` with a long, JAX-internal message.
The callback therefore also files the readable report under a serial number
written into that message, and `runtime_error_from` (for `filter_jit`, and for
checks run eagerly) swaps the XLA error for a `FilteraxRuntimeError` carrying
the report.

One module per concern:

- `_types.py`: the exception types (`FilteraxRuntimeError` and its Equinox
  name, `FilteraxTracetimeError`, `UnknownModeError`).
- `_config.py`: environment configuration (`FILTERAX_ON_ERROR`,
  `EQX_ON_ERROR`, the debugger's frame count).
- `_reports.py`: report serials and the text of reports.
- `_jit_rule.py`: `runtime_error_from`, the runtime-error rule for compiled
  programs.
- `_batching.py`: `any_over_batch`, the batching rule that keeps a check a
  branch under `vmap`.
- `_fill.py`: the values a failed check leaves in place of the checked ones.
- `_host.py`: host callbacks and the debugger (stacks, frames to skip).
- `_staged.py`: the check inside the program.
- `_validation.py`: argument validation.
- `_public.py`: `error_if`, `branched_error_if`.

May import: `jax`, NumPy, `.._filters` and `.._split` (the package root imports
this folder). Other modules import it from here.
"""

from ._batching import any_over_batch
from ._config import OnError, default_on_error
from ._host import own_frames_on_top
from ._jit_rule import runtime_error_from
from ._public import branched_error_if, error_if
from ._types import (
    EquinoxRuntimeError,
    EquinoxTracetimeError,
    FilteraxRuntimeError,
    FilteraxTracetimeError,
    UnknownModeError,
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
