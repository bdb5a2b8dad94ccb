"""`filter_jit`: compiles a function, tracing its arrays and hashing everything else.

A call takes one of two paths; both let `jax.jit`'s C++ fast path do the cache
lookup, and neither builds closures per call.

- **Direct** (every argument leaf a concrete array, the common case): the
  arguments go to an inner `jax.jit` as they are. JAX flattens them in C++ and
  keys its cache on their structure, shapes and dtypes, so the call costs
  little more than `jax.jit` itself. Whether the leaves really are all arrays
  is checked once per compilation, while tracing (see `_check_direct_call`).
- **Keyed** (some leaves are not arrays): `(args, kwargs)` is flattened once,
  leaves are classified by type through per-type caches, and an inner
  `jax.jit` receives one hashable static key (treedef, where the non-array
  leaves sit, and their values) plus the array leaves as a list.

A function that turns out to need the keyed path uses it from then on. When
every output leaf is an array, the traced body returns the output itself (JAX
rebuilds it in C++); otherwise it returns the array leaves and, in a leafless
box, the treedef and the non-array outputs.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from itertools import compress
from typing import Any, Literal, TypeVar, overload

import jax
import jax.tree_util as jtu

from ._caches import register_cache_clearer
from ._jit_leaves import (
    _ARRAY,
    _CONCRETE_ARRAY_TYPES,
    _KIND_BY_TYPE,
    _STATIC_MASK,
    _TRACER,
    _all_concrete_arrays,
    _ArraysKey,
    _flatten,
    _flatten_call,
    _leaf_kinds,
    _merge,
    _MixedKey,
    _PyTreeDef,
    _static_key,
    _unpack_key,
)
from ._jit_trace import (
    _DONATION_WARNING,
    _INLINE,
    _KEYED,
    _PENDING,
    _SILENCED,
    _check_direct_call,
    _fallback_for,
    _filter_output,
    _MixedOutput,
    _raise_if_unhashable,
    _restore_warnings,
    _silence_donation_warnings,
)

__all__ = ["filter_jit"]

_F = TypeVar("_F", bound=Callable[..., Any])

Donate = Literal["none", "all", "all-except-first", "warn", "warn-except-first"]
_DONATE_MODES = ("none", "all", "all-except-first", "warn", "warn-except-first")

# --- Compiled bodies, held weakly by function --------------------------------------


class _Compiled:
    """The inner `jax.jit`s of one function, for one donation mode.

    `keyed(key, kept, donated)` and `direct(args, kwargs, fun_arrays)` (or
    `direct(args[:1], args[1:], kwargs, fun_arrays)` for the `*-except-first`
    modes). `direct_ok` turns false, for good, once a call needed the keyed
    path.
    """

    __slots__ = ("__weakref__", "direct", "direct_ok", "keyed")

    def __init__(self, keyed: Any, direct: Any):
        self.keyed = keyed
        self.direct = direct
        self.direct_ok = True


def _new_compiled(
    fun: Any, fun_source: Callable[[], Any], fun_kinds: bytes, donate: str
) -> _Compiled:
    """Builds the inner jitted functions.

    `fun_source` returns the wrapped function. It is a weak reference whenever
    possible, so that the bodies, which JAX keeps as long as the jitted
    functions live, never keep the function alive.
    """
    n_fun_arrays = fun_kinds.count(_ARRAY)
    fun_static_mask = fun_kinds.translate(_STATIC_MASK)
    silence = donate in ("all", "all-except-first")
    except_first = donate.endswith("except-first")

    def resolve_fun(fun_arrays: Sequence[Any]) -> Any:
        fun = fun_source()
        if fun is None:  # pragma: no cover - every wrapper holds `fun` strongly
            raise RuntimeError("filter_jit: the wrapped function no longer exists.")
        if n_fun_arrays:
            # Swap the tracers in for the function's own arrays.
            fun_leaves, fun_treedef = _flatten(fun)
            fun_static = list(compress(fun_leaves, fun_static_mask))
            fun = fun_treedef.unflatten(_merge(fun_kinds, fun_arrays, fun_static))
        if silence:
            _silence_donation_warnings()
        return fun

    def keyed(key: Any, kept: list[Any], donated: list[Any]) -> Any:
        dynamic = [*kept, *donated]
        fun = resolve_fun(dynamic[:n_fun_arrays])
        args, kwargs = _unpack_key(key, dynamic[n_fun_arrays:])
        return _filter_output(fun(*args, **kwargs))

    def direct(*groups: Any) -> Any:
        if except_first:
            first, rest, kwargs, fun_arrays = groups
            args = (*first, *rest)
        else:
            args, kwargs, fun_arrays = groups
        _check_direct_call()
        return _filter_output(resolve_fun(fun_arrays)(*args, **kwargs))

    # Named after `fun`, for readable jaxprs, HLO and profiles.
    for body in (keyed, direct):
        body.__name__ = getattr(fun, "__name__", type(fun).__name__)
        body.__qualname__ = getattr(fun, "__qualname__", type(fun).__qualname__)
    if donate == "none":
        keyed_donated: tuple[int, ...] = ()
        direct_donated: tuple[int, ...] = ()
    else:
        keyed_donated = (2,)
        direct_donated = (1, 2) if except_first else (0, 1)
    compiled = _Compiled(
        jax.jit(keyed, static_argnums=0, donate_argnums=keyed_donated),
        jax.jit(direct, donate_argnums=direct_donated),
    )
    _LIVE_COMPILED.add(compiled)
    return compiled


# id(fun) -> (weak reference to fun, {donate mode: compiled}). Keyed by
# identity, as a Module's `==` and `hash` look at its leaves. The weak
# reference's callback drops the entry (and with it the jitted functions and
# their compiled code) once `fun` is garbage collected. One entry per function
# means that `filter_jit(f)(x)` in a loop compiles once, as `jax.jit(f)(x)` does.
_BY_FUN: dict[int, tuple[weakref.ref, dict[str, _Compiled]]] = {}
_LIVE_COMPILED: weakref.WeakSet[_Compiled] = weakref.WeakSet()
_REGISTRY_LOCK = threading.RLock()


def _forget(fun_id: int, ref: weakref.ref) -> None:
    # Runs from garbage collection, possibly while this thread holds the lock;
    # dict operations are atomic, so no lock is taken.
    entry = _BY_FUN.get(fun_id)
    if entry is not None and entry[0] is ref:
        _BY_FUN.pop(fun_id, None)


def _compiled_for(fun: Any, fun_kinds: bytes, donate: str) -> _Compiled:
    try:
        weakref.ref(fun)
    except TypeError:
        # Not weakly referenceable (a `BoundMethod`, say): the entry belongs to
        # this wrapper alone and dies with it.
        return _new_compiled(fun, lambda: fun, fun_kinds, donate)
    with _REGISTRY_LOCK:
        fun_id = id(fun)
        entry = _BY_FUN.get(fun_id)
        if entry is None or entry[0]() is not fun:
            entry = (weakref.ref(fun, functools.partial(_forget, fun_id)), {})
            _BY_FUN[fun_id] = entry
        compiled = entry[1].get(donate)
        if compiled is None:
            compiled = _new_compiled(fun, entry[0], fun_kinds, donate)
            entry[1][donate] = compiled
        return compiled


@register_cache_clearer
def _clear_jit_caches() -> None:
    for compiled in list(_LIVE_COMPILED):
        compiled.keyed.clear_cache()
        compiled.direct.clear_cache()
    _KIND_BY_TYPE.clear()
    _CONCRETE_ARRAY_TYPES.clear()


# --- The wrappers ------------------------------------------------------------------

# Never equal to the treedef of a call's arguments (see `_flatten_call`).
_NO_KEY = _ArraysKey(jtu.tree_structure(None))
_MAX_KEYS = 256


class _JitWrapper:
    """What `filter_jit` returns: for `donate="none"` and `"warn"`."""

    def __init__(
        self, fun: Callable[..., Any], donate: str, fun_leaves: list, fun_kinds: bytes
    ):
        self._fun = fun
        self._donate = donate
        # Arrays inside `fun` itself (a Module, a bound method) are traced too;
        # `fun` is immutable, so they are collected once, here.
        self._fun_arrays = list(compress(fun_leaves, fun_kinds))
        self._compiled = self._make_compiled(fun, fun_kinds, donate)
        self._direct = self._compiled.direct if self._compiled.direct_ok else None
        self._keyed = self._compiled.keyed
        self._last_key = _NO_KEY
        self._last_mixed_key: _MixedKey | None = None
        self._keys: dict[_PyTreeDef, _ArraysKey] = {}
        self.__wrapped__ = fun
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                setattr(self, attribute, getattr(fun, attribute))
            except AttributeError:
                pass

    @staticmethod
    def _make_compiled(fun: Any, fun_kinds: bytes, donate: str) -> _Compiled:
        return _compiled_for(fun, fun_kinds, donate)

    def _direct_groups(self, args: tuple, kwargs: dict) -> tuple | None:
        """The positional arguments of the direct body for this call, or `None`
        to take the keyed path."""
        return args, kwargs, self._fun_arrays

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        direct = self._direct
        groups = None if direct is None else self._direct_groups(args, kwargs)
        if groups is None:
            return self._call_keyed(args, kwargs)
        _PENDING.call = (args, kwargs)
        try:
            out = direct(*groups)
        except Exception as error:
            fallback = _fallback_for(error)
            if fallback is None:
                raise
        except BaseException:
            _PENDING.call = None
            raise
        else:
            _PENDING.call = None
            if out.__class__ is _MixedOutput:
                return out.rebuild()
            return out
        # Out of the `except` block, so that errors raised from here on are
        # not chained to the one that sent the call here.
        return self._run_fallback(fallback, args, kwargs)

    def _run_fallback(self, fallback: str, args: tuple, kwargs: dict) -> Any:
        if fallback == _INLINE:
            return self._fun(*args, **kwargs)
        if fallback == _KEYED:
            self._use_keyed_path()
            return self._call_keyed(args, kwargs)
        # `_KEYED_IF_IT_WORKS`: if the keyed path copes, a non-array leaf was
        # the problem; otherwise its error (naming the argument, say) shows.
        out = self._call_keyed(args, kwargs)
        self._use_keyed_path()
        return out

    def _use_keyed_path(self) -> None:
        self._direct = None
        self._compiled.direct_ok = False

    def _call_keyed(self, args: tuple, kwargs: dict) -> Any:
        # `_flatten_call`, inlined: this is the hot path of calls that pass
        # non-array leaves.
        if kwargs:
            leaves, treedef = _flatten([args, kwargs])
        else:
            leaves, treedef = _flatten(args)
        last_mixed = self._last_mixed_key
        if last_mixed is not None:
            arrays = last_mixed.reuse_for(treedef, leaves)
            if arrays is not None:
                return self._call_compiled(
                    args, kwargs, last_mixed, last_mixed.kinds, arrays
                )
        if _all_concrete_arrays(map(type, leaves)):
            key = self._last_key
            # Usually the same structure as last time: one treedef comparison,
            # and JAX then finds its entry by identity.
            if key.treedef != treedef:
                key = self._arrays_key(treedef)
            kinds = None
        else:
            kinds = _leaf_kinds(leaves)
            if _TRACER in kinds:
                return self._fun(*args, **kwargs)
            try:
                key = self._last_mixed_key = _static_key(treedef, kinds, leaves)
            except TypeError:
                _raise_if_unhashable(args, kwargs)
                raise
            leaves = list(compress(leaves, kinds))
        return self._call_compiled(args, kwargs, key, kinds, leaves)

    def _call_compiled(
        self, args: tuple, kwargs: dict, key: Any, kinds: bytes | None, leaves: list
    ) -> Any:
        kept, donated = self._split_donated(args, kinds, leaves)
        try:
            out = self._keyed(key, kept, donated)
        except (TypeError, ValueError):
            _raise_if_unhashable(args, kwargs)
            raise
        if out.__class__ is _MixedOutput:
            return out.rebuild()
        return out

    def _split_donated(
        self, args: tuple, kinds: bytes | None, arrays: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        """The array leaves `(kept, donated)`: `fun`'s own first, never donated."""
        if self._donate == "none":
            return self._fun_arrays + arrays, []
        n_kept = 0
        if self._donate.endswith("except-first") and args:
            # The first argument's leaves come first in flattening order.
            n_first = len(jtu.tree_leaves(args[0]))
            n_kept = n_first if kinds is None else kinds[:n_first].count(_ARRAY)
        return self._fun_arrays + arrays[:n_kept], arrays[n_kept:]

    def _arrays_key(self, treedef: _PyTreeDef) -> _ArraysKey:
        """The interned key for `treedef`; becomes the one tried first."""
        key = self._keys.get(treedef)
        if key is None:
            if len(self._keys) >= _MAX_KEYS:
                self._keys.clear()
            key = self._keys[treedef] = _ArraysKey(treedef)
        self._last_key = key
        return key

    def lower(self, /, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """Lowers `fun(*args, **kwargs)` ahead of time, without running it.

        **Arguments:** the arguments of a call, as for the wrapped function.

        **Returns:** JAX's `jax.stages.Lowered` for the compiled body:
        `as_text()`, `cost_analysis()` and `compile()` work as for `jax.jit`. Its
        inputs are the array leaves of `fun` and of the arguments, so run the
        computation by calling the `filter_jit` function itself.

        **Raises:** `TypeError` naming the argument's key path when a non-array
        leaf is unhashable; `ValueError` if an argument is a tracer.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> power = fx.filter_jit(lambda x, n: x**n)
        >>> "stablehlo" in power.lower(jnp.ones(3), 2).as_text()
        True

        ```
        """
        leaves, treedef = _flatten_call(args, kwargs)
        kinds = _leaf_kinds(leaves)
        if _TRACER in kinds:
            raise ValueError(
                "filter_jit(...).lower: an argument is a tracer; lower outside of "
                "other JAX transformations."
            )
        depth = len(_SILENCED.contexts)
        try:
            key = _static_key(treedef, kinds, leaves)
            kept, donated = self._split_donated(
                args, kinds, list(compress(leaves, kinds))
            )
            with warnings.catch_warnings():
                if self._donate in ("all", "all-except-first"):
                    warnings.filterwarnings("ignore", message=_DONATION_WARNING)
                return self._keyed.lower(key, kept, donated)
        except (TypeError, ValueError):
            _raise_if_unhashable(args, kwargs)
            raise
        finally:
            _restore_warnings(depth)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        # Used as a decorator in a class body: `model.method` becomes a pytree
        # whose child is `model`, so the model's arrays are traced, not hashed.
        if instance is None:
            return self
        return _JitBoundMethod(self, instance)

    def __repr__(self) -> str:
        return f"<filter_jit of {getattr(self, '__qualname__', self._fun)!s}>"


class _JitBoundMethod(functools.partial):
    """`model.method` for a method decorated with `filter_jit` in its class
    body: a pytree whose child is `model` (like `BoundMethod`), which also
    offers `.lower`.

    A `functools.partial` subclass: creating and calling one happens in C, which
    keeps `model(x)` on a decorated `__call__` almost as cheap as calling the
    `filter_jit` function directly.
    """

    __slots__ = ()

    @property
    def __func__(self) -> _JitWrapper:
        return self.func

    @property
    def __self__(self) -> Any:
        return self.args[0]

    def lower(self, /, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """As [`filter_jit(...).lower`][filterax.filter_jit], for this method."""
        return self.func.lower(self.args[0], *args, **kwargs)

    def __repr__(self) -> str:
        return f"<bound method {self.func!r} of {self.args[0]!r}>"


jtu.register_pytree_with_keys(
    _JitBoundMethod,
    lambda bound: (((jtu.GetAttrKey("__self__"), bound.args[0]),), bound.func),
    lambda wrapper, children: _JitBoundMethod(wrapper, children[0]),
    flatten_func=lambda bound: ((bound.args[0],), bound.func),
)


class _ExceptFirstJitWrapper(_JitWrapper):
    """For `donate="warn-except-first"`: the direct path passes the first
    argument apart, so that it is not donated."""

    def _direct_groups(self, args: tuple, kwargs: dict) -> tuple | None:
        if not args:
            return None
        return args[:1], args[1:], kwargs, self._fun_arrays


class _SilencingMixin(_JitWrapper):
    """For `donate="all"` and `"all-except-first"`: undoes, once the call
    returns, the warning filter that tracing installed."""

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        depth = len(_SILENCED.contexts)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            _restore_warnings(depth)


class _SilencingJitWrapper(_SilencingMixin, _JitWrapper):
    pass


class _SilencingExceptFirstJitWrapper(_SilencingMixin, _ExceptFirstJitWrapper):
    pass


class _InlineJitWrapper(_JitWrapper):
    """For a `fun` that itself holds tracers (it was made inside another
    transformation): every call runs inline."""

    @staticmethod
    def _make_compiled(fun: Any, fun_kinds: bytes, donate: str) -> _Compiled:
        # Only `.lower` could use it. Tracers are short-lived: never registered.
        return _new_compiled(fun, lambda: fun, fun_kinds, donate)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._fun(*args, **kwargs)


_WRAPPER_TYPES: dict[str, type[_JitWrapper]] = {
    "none": _JitWrapper,
    "warn": _JitWrapper,
    "all": _SilencingJitWrapper,
    "warn-except-first": _ExceptFirstJitWrapper,
    "all-except-first": _SilencingExceptFirstJitWrapper,
}


@overload
def filter_jit(fun: _F, *, donate: Donate = "none") -> _F: ...


@overload
def filter_jit(fun: None = None, *, donate: Donate = "none") -> Callable[[_F], _F]: ...


def filter_jit(fun: Any = None, *, donate: Donate = "none") -> Any:
    """Compiles `fun`, tracing every array it is given and hashing everything else.

    Every JAX or NumPy array leaf of the arguments (NumPy scalars and typed key
    arrays included) is traced: calling again with new values of the same
    shapes and dtypes reuses the compiled code. Every other leaf (Python
    numbers, strings, functions...) is static: part of the compilation cache
    key, so it must be hashable, and a new value compiles again. Outputs that
    are not arrays come back as the very Python objects the trace produced.

    `fun` may be a function, a Module method (also as a decorator in the class
    body) or a callable Module; arrays inside `fun` itself are traced too.
    Called while another transformation is tracing (an argument is a tracer),
    the function simply runs inline.

    The compiled code is held weakly: it is freed once `fun` is garbage
    collected. Pass a changing model as an argument rather than wrapping a new
    `filter_jit(model)` at every step, so that new values reuse the code.

    **Arguments:**

    - `fun`: the callable to compile. Omit it to get a decorator, as in
      `@filter_jit(donate="all")`.
    - `donate`: which argument buffers JAX may reuse for the outputs.
      `"none"` (default); `"all"`: every array argument; `"all-except-first"`:
      all but those in the first positional argument; `"warn"` and
      `"warn-except-first"`: the same, but JAX's "Some donated buffers were
      not usable" warning is shown (the other modes silence it). Arrays inside
      `fun` itself are never donated.

    **Returns:** the compiled function, with a `.lower(*args, **kwargs)` method
    giving JAX's ahead-of-time `jax.stages.Lowered`.

    **Raises:** `ValueError` for an unknown `donate`. When called: `TypeError`
    naming the argument's key path (like `args[1]['opts']`) if a non-array leaf
    is unhashable.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_jit
    ... def scale(x, factor, label):
    ...     return {"value": x * factor, "label": label.upper()}
    >>> scale(jnp.arange(3.0), 2.0, label="doubled")
    {'label': 'DOUBLED', 'value': Array([0., 2., 4.], dtype=float32)}

    ```
    """
    if donate not in _DONATE_MODES:
        raise ValueError(
            f"filter_jit: donate={donate!r} is not one of "
            f"{', '.join(map(repr, _DONATE_MODES))}."
        )
    if fun is None:
        return functools.partial(filter_jit, donate=donate)
    if not callable(fun):
        raise TypeError(f"filter_jit: expected a callable, got {fun!r}.")
    fun_leaves = jtu.tree_leaves(fun)
    fun_kinds = _leaf_kinds(fun_leaves)
    if _TRACER in fun_kinds:
        wrapper_type: type[_JitWrapper] = _InlineJitWrapper
    else:
        wrapper_type = _WRAPPER_TYPES[donate]
    return wrapper_type(fun, donate, fun_leaves, fun_kinds)
