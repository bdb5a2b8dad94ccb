"""`filter_jit` internals: the check made while tracing a direct call, mixed
outputs, argument errors and donation warnings (see `_jit`)."""

from __future__ import annotations

import threading
import warnings
from itertools import compress
from typing import Any

import jax.tree_util as jtu
import numpy as np

from ._jit_leaves import (
    _STATIC,
    _STATIC_MASK,
    _TRACER,
    _flatten,
    _kind_of,
    _leaf_kinds,
    _merge,
    _PyTreeDef,
)

# --- Direct path: the check made while tracing -------------------------------------


class _PendingCall(threading.local):
    def __init__(self) -> None:
        self.call: tuple[tuple, dict] | None = None


# The arguments of the direct call in progress on this thread. Set just before
# the inner `jax.jit` is called and cleared right after (so it never keeps
# arrays alive); the traced body consumes it. It is only read when JAX traces,
# that is on a cache miss.
_PENDING = _PendingCall()


class _RunInline(Exception):
    """Raised while tracing a direct call whose arguments hold tracers."""


class _UseKeyedPath(Exception):
    """Raised while tracing a direct call that needs the keyed path."""


def _check_direct_call() -> None:
    """Inside the trace of a direct call: makes sure that the compilation about
    to be cached keeps `filter_jit`'s semantics.

    JAX's cache would let a later call hit it whenever the argument signature
    matches. So every leaf must be a concrete array (a Python scalar, a string
    or a function must instead be static). Moreover no leaf may have the
    signature of a Python scalar: JAX gives Python `int`, `float` and
    `complex` weakly typed 0-d signatures, and `bool` a 0-d boolean one, and
    if such an array were accepted here, a later call passing a Python scalar
    in its place would hit this compilation and be traced instead of static.
    Both cases take the keyed path, which keys on the values of static leaves.
    """
    call = _PENDING.call
    _PENDING.call = None
    if call is None:
        # JAX traced the body again within one call (as `jax_debug_nans` does,
        # say): the first trace of that call made the checks.
        return
    leaves, _ = _flatten(call)
    kinds = _leaf_kinds(leaves)
    if _TRACER in kinds:
        raise _RunInline
    if _STATIC in kinds:
        raise _UseKeyedPath
    for leaf in leaves:
        if leaf.ndim == 0 and (
            getattr(leaf, "weak_type", False) or leaf.dtype == np.bool_
        ):
            raise _UseKeyedPath


_INLINE, _KEYED, _KEYED_IF_IT_WORKS = "inline", "keyed", "keyed if it works"


def _fallback_for(error: Exception) -> str | None:
    """After a direct call raised `error`: how to run the call instead, or
    `None` to let the error propagate. Clears `_PENDING`."""
    never_traced = _PENDING.call is not None
    _PENDING.call = None
    if isinstance(error, _RunInline):
        return _INLINE
    if isinstance(error, _UseKeyedPath):
        return _KEYED
    if never_traced and isinstance(error, (TypeError, ValueError)):
        # JAX rejects a leaf it cannot take as an array (a string, a
        # function...) before tracing.
        return _KEYED_IF_IT_WORKS
    return None


# --- Outputs -----------------------------------------------------------------------


class _MixedOutput:
    """An output with non-array leaves, as it leaves the compiled function: the
    array leaves are its children; the treedef, the kinds mask and the
    non-array leaves ride in the (static) node data."""

    __slots__ = ("arrays", "info")

    def __init__(self, arrays: list[Any], info: tuple[_PyTreeDef, bytes, tuple]):
        self.arrays = arrays
        self.info = info

    def rebuild(self) -> Any:
        treedef, kinds, static = self.info
        return treedef.unflatten(_merge(kinds, self.arrays, static))


jtu.register_pytree_node(
    _MixedOutput,
    lambda out: ((out.arrays,), out.info),
    lambda info, children: _MixedOutput(children[0], info),
)


def _filter_output(out: Any) -> Any:
    """Inside the trace: `out` itself when all its leaves are arrays (the
    common case, rebuilt by JAX in C++), else a `_MixedOutput`."""
    leaves, treedef = _flatten(out)
    kinds = _leaf_kinds(leaves)
    if _STATIC not in kinds:
        return out
    static = tuple(compress(leaves, kinds.translate(_STATIC_MASK)))
    return _MixedOutput(list(compress(leaves, kinds)), (treedef, kinds, static))


def _finish(out: Any) -> Any:
    return out.rebuild() if out.__class__ is _MixedOutput else out


# --- Argument errors ---------------------------------------------------------------


def _argument_path(path: jtu.KeyPath) -> str:
    """`args[1]['opts']` or `kwargs['opts']` for a key path into `(args, kwargs)`."""
    head = "args" if path[0] == jtu.SequenceKey(0) else "kwargs"
    return head + jtu.keystr(path[1:])


def _raise_if_unhashable(args: tuple, kwargs: dict) -> None:
    """Raises a `TypeError` naming the first unhashable static argument leaf."""
    for path, leaf in jtu.tree_leaves_with_path((args, kwargs)):
        if _kind_of(leaf) != _STATIC:
            continue
        try:
            hash(leaf)
        except TypeError as error:
            raise TypeError(
                f"filter_jit: the argument at {_argument_path(path)} is an "
                f"unhashable {type(leaf).__name__} ({error}). filter_jit traces "
                "array leaves and treats every other leaf as static, so it must "
                "be hashable. Pass it as a JAX/NumPy array, make it hashable "
                "(e.g. a tuple instead of a set), or register it as a pytree."
            ) from None


# --- Donation warnings -------------------------------------------------------------

_DONATION_WARNING = "Some donated buffers were not usable"


class _SilencedWarnings(threading.local):
    def __init__(self) -> None:
        self.contexts: list[warnings.catch_warnings] = []


_SILENCED = _SilencedWarnings()


def _silence_donation_warnings() -> None:
    """Called while tracing: ignores JAX's unusable-donation warning until the
    current call returns (see `_restore_warnings`).

    JAX warns while lowering, which follows a trace; a cache hit neither traces
    nor warns. Starting the suppression from inside the trace means calls that
    hit the cache pay nothing for it, where wrapping every call in
    `warnings.catch_warnings()` would cost microseconds each time.
    """
    context = warnings.catch_warnings()
    context.__enter__()
    warnings.filterwarnings("ignore", message=_DONATION_WARNING)
    _SILENCED.contexts.append(context)


def _restore_warnings(depth: int) -> None:
    contexts = _SILENCED.contexts
    while len(contexts) > depth:
        contexts.pop().__exit__(None, None, None)
