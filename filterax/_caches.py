"""`clear_caches`: empties filterax's compilation caches and JAX's."""

from __future__ import annotations

from collections.abc import Callable

import jax

__all__ = ["clear_caches", "register_cache_clearer"]

# Each transform module that keeps a cache registers a function here that empties
# it; `clear_caches` needs no knowledge of what the caches are.
_CLEARERS: list[Callable[[], None]] = []


def register_cache_clearer(clearer: Callable[[], None]) -> Callable[[], None]:
    """Registers `clearer` to be run by `clear_caches`; returns it, so it can be
    used as a decorator."""
    _CLEARERS.append(clearer)
    return clearer


def clear_caches() -> None:
    """Empties every compilation cache: filterax's and JAX's.

    Compiled code for every [`filter_jit`][filterax.filter_jit] function (and the
    other filtered transforms) is dropped, so the next call traces and compiles
    again. Useful to bound memory in long-running processes that compile many
    distinct functions, and in tests that count traces.

    **Arguments:** none.

    **Returns:** `None`.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> traces = []
    >>> @fx.filter_jit
    ... def double(x):
    ...     traces.append(None)
    ...     return 2 * x
    >>> _ = double(jnp.ones(2)); _ = double(jnp.ones(2))
    >>> len(traces)
    1
    >>> fx.clear_caches()
    >>> _ = double(jnp.ones(2))
    >>> len(traces)
    2

    ```
    """
    for clearer in _CLEARERS:
        clearer()
    jax.clear_caches()
