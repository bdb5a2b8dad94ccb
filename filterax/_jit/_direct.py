"""The direct route of `filter_jit`: calls whose argument leaves are all arrays.

The arguments go to an inner `jax.jit` as they are: JAX flattens them in C++ and
keys its cache on their structure, shapes and dtypes, so the call costs little
more than `jax.jit` itself. Whether the leaves really are all arrays is checked
once per compilation, while tracing, *before* the user's function runs: a call
that needs the keyed route leaves that trace before anything is traced, so the
function is still traced exactly once per compilation.
"""

from __future__ import annotations

import enum
import threading

import numpy as np

from .._split import STATIC, flatten, leaf_kinds

__all__ = ["PENDING", "Fallback", "RunKeyed", "check_direct_call", "fallback_for"]


class _PendingCall(threading.local):
    def __init__(self) -> None:
        self.call: tuple[tuple, dict] | None = None


# The arguments of the direct call in progress on this thread. Set just before
# the inner `jax.jit` is called and cleared right after (so it never keeps
# arrays alive); the traced body consumes it. It is only read when JAX traces,
# that is on a cache miss.
PENDING = _PendingCall()


class RunKeyed(Exception):
    """Raised while tracing a direct call that needs the keyed route."""


def check_direct_call() -> tuple[tuple, dict] | None:
    """Inside the trace of a direct call: makes sure that the compilation about
    to be cached keeps `filter_jit`'s semantics, and returns the call's
    concrete `(args, kwargs)` (`None` when JAX traces again within one call).

    JAX's cache would let a later call hit it whenever the argument signature
    matches. So every leaf must be dynamic (a Python scalar, a string or a
    function must instead be static). Moreover no leaf may have the signature
    of a Python scalar: JAX gives Python `int`, `float` and `complex` weakly
    typed 0-d signatures, and `bool` a 0-d boolean one, and if such an array
    were accepted here, a later call passing a Python scalar in its place would
    hit this compilation and be traced instead of static. Both cases take the
    keyed route, which keys on the values of static leaves.
    """
    call = PENDING.call
    PENDING.call = None
    if call is None:
        # JAX traced the body again within one call (as `jax_debug_nans` does,
        # say): the first trace of that call made the checks.
        return None
    leaves, _ = flatten(call)
    if STATIC in leaf_kinds(leaves):
        raise RunKeyed
    for leaf in leaves:
        if leaf.ndim == 0 and (
            getattr(leaf, "weak_type", False) or leaf.dtype == np.bool_
        ):
            raise RunKeyed
    return call


class Fallback(enum.Enum):
    """How to run a call after the direct route gave up on it."""

    KEYED = "keyed"
    # JAX rejected a leaf before tracing: if the keyed route copes, a non-array
    # leaf was the problem; otherwise its error (naming the argument) shows.
    KEYED_IF_IT_WORKS = "keyed if it works"


def fallback_for(error: Exception) -> Fallback | None:
    """After a direct call raised `error`: how to run the call instead, or
    `None` to let the error propagate. Clears `PENDING`."""
    call = PENDING.call
    PENDING.call = None
    if isinstance(error, RunKeyed):
        return Fallback.KEYED
    if call is None:  # the body was traced: the error is the program's
        return None
    if isinstance(error, (TypeError, OverflowError)):
        # JAX rejects a leaf it cannot take as an array (a string, a
        # function, an int too large...) before tracing. A program that fails
        # while it runs raises other types (`ValueError` from a cache hit,
        # `JaxRuntimeError`), and must not be run a second time.
        return Fallback.KEYED_IF_IT_WORKS
    if STATIC in leaf_kinds(flatten(call)[0]):
        # Whatever JAX raised (a `ValueError` for an object with
        # `__jax_array__`, say), a non-array leaf makes it the keyed route's
        # call, where the leaf is static; the direct route never ran it.
        return Fallback.KEYED
    return None
