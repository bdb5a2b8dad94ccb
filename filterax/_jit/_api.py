"""`filter_jit` and the wrapper it returns; see the folder's `__init__` for the
two routes a call takes."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, overload

import jax
import jax.tree_util as jtu

from .._compat import donation_warning_ignored, traceback_boundary
from .._errors import runtime_error_from
from .._filters import is_array
from .._split import flatten, is_module_type
from .._transformed import TRANSFORM_TYPES, wrapped_by_transform
from .._tree import tree_equal
from ._aot import CallPlan, Lowered
from ._compiled import Compiled, compiled_for
from ._direct import PENDING, Fallback, fallback_for
from ._donate import (
    Donate,
    DonateMode,
    restore_warnings,
    silencing_depth,
)
from ._keyed import (
    NO_HINTS,
    CallKey,
    describe_call,
    describe_items,
    describe_keywords,
    first_argument_leaf_count,
    raise_if_unhashable,
)
from ._layout import Layout, mesh_context
from ._outputs import MixedOutput

__all__ = ["JitWrapper", "filter_jit"]

_F = TypeVar("_F", bound=Callable[..., Any])


# `getattr`'s default for the function attributes a wrapper copies.
_ABSENT = object()


def holds_module(values: tuple) -> bool:
    """Whether a Module is among `values`, or inside tuples among them."""
    for value in values:
        if is_module_type(type(value)) or (
            type(value) is tuple and holds_module(value)
        ):
            return True
    return False


# What a wrapper copies from the function it wraps, as `functools.wraps` does.
_COPIED_ATTRIBUTES = (
    "__module__",
    "__name__",
    "__qualname__",
    "__doc__",
    "__annotations__",
)


class JitWrapper:
    """What `filter_jit` returns (for `donate="none"` and `"warn"`; subclasses
    handle the other modes).

    A pytree: its child is the wrapped function (a Module contributes its
    arrays), its static data the donation mode and the shared `Compiled`. A
    copy made by unflattening finds its `Compiled` again from the function it
    holds: the same one, sharing the compiled code, when only arrays changed;
    another when the function did (`tree_at` replacing a Module's activation,
    say).
    """

    def __init__(
        self,
        fun: Callable[..., Any],
        mode: DonateMode,
        known: Compiled | None = None,
        layout: Layout | None = None,
    ):
        self.fun = fun
        self.mode = mode
        self.donates = mode.donates
        self.compiled, self.fun_dynamic = compiled_for(fun, mode, known, layout)
        self.__wrapped__ = fun
        for attribute in _COPIED_ATTRIBUTES:
            value = getattr(fun, attribute, _ABSENT)
            if value is not _ABSENT:
                setattr(self, attribute, value)

    def _direct_groups(self, args: tuple, kwargs: dict) -> tuple | None:
        """The positional arguments of the direct body for this call, or `None`
        to take the keyed route (see `Compiled` for their order)."""
        if self.donates:
            return args[:1], self.fun_dynamic, args[1:], kwargs
        return self.fun_dynamic, args, kwargs

    def _arrange(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """The call as this wrapper passes it on (the same, but for the
        `*-except-first` modes). Only called when no argument is positional."""
        return args, kwargs

    @traceback_boundary
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        if not args and kwargs:
            args, kwargs = self._arrange(args, kwargs)
        try:
            if self.compiled.direct_ok is False:
                return self._call_keyed(args, kwargs)
            return self._call(args, kwargs)
        except Exception as error:
            translated = runtime_error_from(error)
            if translated is None:
                raise
            raise translated from None

    def _call(self, args: tuple, kwargs: dict) -> Any:
        compiled = self.compiled
        direct = compiled.direct_ok
        if direct is None:
            # The first call picks the route. Arguments holding Modules take
            # the keyed one: a Module is flattened once and then found by
            # identity (`_memo`), cheaper than JAX flattening it on every call.
            direct = compiled.direct_ok = not holds_module((*args, *kwargs.values()))
        groups = self._direct_groups(args, kwargs) if direct else None
        if groups is None:
            return self._call_keyed(args, kwargs)
        PENDING.call = (args, kwargs)
        try:
            out = compiled.direct(*groups)
        except Exception as error:
            fallback = fallback_for(error)
            if fallback is None:
                raise
        except BaseException:
            PENDING.call = None
            raise
        else:
            PENDING.call = None
            if out.__class__ is MixedOutput:
                return out.rebuild(lambda: flatten((self.fun_dynamic, args, kwargs))[0])
            return out
        # Out of the `except` block, so that errors raised from here on are
        # not chained to the one that sent the call here.
        if fallback is Fallback.KEYED:
            compiled.direct_ok = False
            return self._call_keyed(args, kwargs)
        out = self._call_keyed(args, kwargs)
        compiled.direct_ok = False
        return out

    def _call_keyed(self, args: tuple, kwargs: dict) -> Any:
        # `describe_call`, inline: this is the hot path of most calls.
        compiled = self.compiled
        last = compiled.last_call
        hints = NO_HINTS if last is None else last.tokens
        tokens: list[Any] = []
        # The function's own arrays first, then the arguments' (see `Compiled`).
        leaves = [*self.fun_dynamic]
        try:
            describe_items(args, tokens, leaves, hints)
            names = describe_keywords(kwargs, tokens, leaves, hints) if kwargs else ()
            if tokens == hints and last is not None and names == last.names:
                key = last
            else:
                key = compiled.last_call = CallKey(tokens, names)
        except Exception:
            raise_if_unhashable(args, kwargs)
            raise
        if self.donates:
            out = compiled.keyed(key, *self._donation_groups(args, key, leaves))
        else:
            out = compiled.keyed(key, leaves)
        if out.__class__ is MixedOutput:
            return out.rebuild(lambda: leaves)
        return out

    def _donation_groups(
        self, args: tuple, key: CallKey, leaves: list[Any]
    ) -> tuple[list[Any], list[Any], list[Any]]:
        """`(first argument's arrays, function's arrays, other arguments'
        arrays)` from the leaves of a call of a donating mode (the function's
        arrays, then the arguments')."""
        n_fun = len(self.fun_dynamic)
        first, rest = self._split_first(args, key, leaves[n_fun:])
        return first, leaves[:n_fun], rest

    def _split_first(
        self, args: tuple, key: CallKey, dynamic: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        """The dynamic leaves of the arguments as `(first argument's, the
        others')`; all of them in the second list when nothing is donated."""
        if not self.mode.donates:
            return [], dynamic
        # The first argument's leaves come first.
        n_first = first_argument_leaf_count(key, args) if args else 0
        return dynamic[:n_first], dynamic[n_first:]

    def lower(self, /, *args: Any, **kwargs: Any) -> Lowered:
        """Lowers `fun(*args, **kwargs)` ahead of time, without running it.

        **Arguments:** the arguments of a call, as for the wrapped function.

        **Returns:** a `Lowered` wrapping JAX's `jax.stages.Lowered`:
        `as_text()`, `cost_analysis()` and the rest work as for `jax.jit`, and
        `compile(compiler_options=...)` gives a function called with the same
        arguments as this one.

        **Raises:** `TypeError` naming the argument's key path when a non-array
        leaf is unhashable.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> power = fx.filter_jit(lambda x, n: x**n)
        >>> lowered = power.lower(jnp.ones(3), 2)
        >>> "stablehlo" in lowered.as_text()
        True
        >>> lowered.compile()(jnp.full(3, 2.0), 2)
        Array([4., 4., 4.], dtype=float32)

        ```
        """
        args, kwargs = self._arrange(args, kwargs)
        depth = silencing_depth()
        try:
            try:
                tokens, dynamic, names = describe_call(args, kwargs, None)
                key = CallKey(tokens, names)
            except TypeError:
                raise_if_unhashable(args, kwargs)
                raise
            first, rest = self._split_first(args, key, dynamic)
            plan = CallPlan(
                key,
                self.fun_dynamic,
                len(first),
                self.mode,
                args,
                kwargs,
                dynamic,
                self._arrange,
            )
            with donation_warning_ignored(self.mode.silences_warning):
                lowered = self.compiled.keyed.lower(key, *plan.groups(first, rest))
        finally:
            restore_warnings(depth)
        return Lowered(lowered, plan)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        # Used as a decorator in a class body: `model.method` becomes a pytree
        # whose child is `model`, so the model's arrays are traced, not hashed.
        if instance is None:
            return self
        return _JitBoundMethod(self, instance)

    def __repr__(self) -> str:
        return f"<filter_jit of {getattr(self, '__qualname__', self.fun)!s}>"


class _ExceptFirstJitWrapper(JitWrapper):
    """For `donate="warn-except-first"`: the direct route passes the first
    argument apart, so that it is not donated. A first argument passed by
    keyword is passed by position instead, so that it is kept all the same."""

    def _arrange(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """A call given by keyword only, with the function's first parameter
        moved to the front if it was given."""
        if args or not kwargs:
            return args, kwargs
        name = self.__dict__.get("_first_parameter", _ABSENT)
        if name is _ABSENT:
            name = self._first_parameter = _first_parameter_name(self.fun)
        if name is None or name not in kwargs:
            return args, kwargs
        rest = dict(kwargs)
        return (rest.pop(name),), rest

    def _direct_groups(self, args: tuple, kwargs: dict) -> tuple | None:
        if not args:
            return None
        return args[:1], self.fun_dynamic, args[1:], kwargs


def _first_parameter_name(fun: Callable[..., Any]) -> str | None:
    """The name of `fun`'s first parameter when it may be passed by position
    or by keyword, else `None`."""
    try:
        parameters = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return None
    if parameters and parameters[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        return parameters[0].name
    return None


class _SilencingMixin(JitWrapper):
    """For `donate="all"` and `"all-except-first"`: undoes, once the call
    returns, the warning filter that tracing installed."""

    @traceback_boundary
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        depth = silencing_depth()
        try:
            return super().__call__(*args, **kwargs)
        finally:
            restore_warnings(depth)


class _SilencingJitWrapper(_SilencingMixin, JitWrapper):
    pass


class _SilencingExceptFirstJitWrapper(_SilencingMixin, _ExceptFirstJitWrapper):
    pass


_WRAPPER_TYPES: dict[DonateMode, type[JitWrapper]] = {
    DonateMode.NONE: JitWrapper,
    DonateMode.WARN: JitWrapper,
    DonateMode.ALL: _SilencingJitWrapper,
    DonateMode.WARN_EXCEPT_FIRST: _ExceptFirstJitWrapper,
    DonateMode.ALL_EXCEPT_FIRST: _SilencingExceptFirstJitWrapper,
}


class _ShardedMixin(JitWrapper):
    """For a `filter_jit` given `in_shardings` or `out_shardings` (its
    `Compiled` has a layout): arrays not yet committed to devices are placed
    before the call (see `_layout`). A subclass, so that calls without
    shardings pay nothing for it."""

    @traceback_boundary
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        layout: Layout = self.compiled.layout  # type: ignore[assignment]
        mesh = layout.explicit_mesh
        if mesh is not None and jax.sharding.get_abstract_mesh().empty:
            with mesh_context(mesh):
                args, kwargs = layout.place(args, kwargs)
                return super().__call__(*args, **kwargs)
        args, kwargs = layout.place(args, kwargs)
        return super().__call__(*args, **kwargs)

    def lower(self, /, *args: Any, **kwargs: Any) -> Lowered:
        layout: Layout = self.compiled.layout  # type: ignore[assignment]
        mesh = layout.explicit_mesh
        if mesh is not None and jax.sharding.get_abstract_mesh().empty:
            with mesh_context(mesh):
                return super().lower(*args, **kwargs)
        return super().lower(*args, **kwargs)

    lower.__doc__ = JitWrapper.lower.__doc__


_SHARDED_TYPES: dict[type[JitWrapper], type[JitWrapper]] = {
    base: type(f"_Sharded{base.__name__.lstrip('_')}", (_ShardedMixin, base), {})
    for base in {*_WRAPPER_TYPES.values()}
}
_SHARDED_WRAPPER_TYPES: dict[DonateMode, type[JitWrapper]] = {
    mode: _SHARDED_TYPES[base] for mode, base in _WRAPPER_TYPES.items()
}


def _flatten_wrapper(wrapper: JitWrapper) -> tuple[tuple[Any], tuple]:
    return (wrapper.fun,), (type(wrapper), wrapper.mode, wrapper.compiled)


def _unflatten_wrapper(static: tuple, children: Any) -> JitWrapper:
    wrapper_type, mode, compiled = static
    return wrapper_type(children[0], mode, compiled)


for _wrapper_type in {*_WRAPPER_TYPES.values(), *_SHARDED_WRAPPER_TYPES.values()}:
    jtu.register_pytree_with_keys(
        _wrapper_type,
        lambda wrapper: (
            ((jtu.GetAttrKey("fun"), wrapper.fun),),
            _flatten_wrapper(wrapper)[1],
        ),
        _unflatten_wrapper,
        flatten_func=_flatten_wrapper,
    )


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
    def __func__(self) -> JitWrapper:
        wrapper: JitWrapper = self.func  # type: ignore[assignment]
        return wrapper

    @property
    def __self__(self) -> Any:
        return self.args[0]

    def lower(self, /, *args: Any, **kwargs: Any) -> Lowered:
        """As [`filter_jit(...).lower`][filterax.filter_jit], for this method:
        the compiled function is called without the instance, as the method
        is."""
        instance = self.args[0]
        return self.__func__.lower(instance, *args, **kwargs).bound_to(instance)

    def __repr__(self) -> str:
        return f"<bound method {self.func!r} of {self.args[0]!r}>"

    # As for `BoundMethod`, a Module: the same method of equal instances.
    def __eq__(self, other: object) -> Any:
        if type(other) is not _JitBoundMethod or self.func is not other.func:
            return False
        return tree_equal(self.args[0], other.args[0])

    def __hash__(self) -> int:
        return hash((self.func, self.args[0]))


jtu.register_pytree_with_keys(
    _JitBoundMethod,
    lambda bound: (((jtu.GetAttrKey("__self__"), bound.args[0]),), bound.func),
    lambda wrapper, children: _JitBoundMethod(wrapper, *children),
    flatten_func=lambda bound: ((bound.args[0],), bound.func),
)


@overload
def filter_jit(
    fun: _F,
    *,
    donate: Donate = "none",
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> _F: ...


@overload
def filter_jit(
    fun: None = None,
    *,
    donate: Donate = "none",
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> Callable[[_F], _F]: ...


def filter_jit(
    fun: Any = None,
    *,
    donate: Donate = "none",
    in_shardings: Any = None,
    out_shardings: Any = None,
) -> Any:
    """Compiles `fun`, tracing every array it is given and hashing everything else.

    Every JAX or NumPy array leaf of the arguments (NumPy scalars and typed key
    arrays included) and every `jax.Ref` is traced: calling again with new
    values of the same shapes and dtypes reuses the compiled code. Every other
    leaf (Python numbers, strings, functions...) is static: part of the
    compilation cache key, so it must be hashable, and a new value compiles
    again. Outputs that are not arrays come back as the very Python objects the
    trace produced; a Ref the function was given and returns (a Module holding
    state, say) comes back as the very Ref object that went in. Writes to Refs
    made inside are visible after the call.

    `fun` may be a function, a Module method (also as a decorator in the class
    body) or a callable Module; arrays inside `fun` itself are traced too, so
    two Modules of the same structure share one compilation. `fun` is traced
    exactly once per compilation. Called inside another transformation (with
    tracers), it becomes part of the enclosing program, and its trace is
    cached like `jax.jit`'s.

    **Arguments:**

    - `fun`: the callable to compile. Omit it to get a decorator, as in
      `@filter_jit(donate="all")`.
    - `donate`: which argument buffers JAX may reuse for the outputs.
      `"none"` (default); `"all"`: every array argument; `"all-except-first"`:
      all but those in the first argument (by position, or by keyword under
      the name of `fun`'s first parameter); `"warn"` and
      `"warn-except-first"`: the same, but JAX's "Some donated buffers were
      not usable" warning is shown (the other modes silence it). Arrays inside
      `fun` itself (`filter_jit(model, donate="all")`) are donated by every mode
      but `"none"`, as in Equinox.
    - `in_shardings`: how the array arguments are laid out over devices: a
      pytree prefix of the pair `(args, kwargs)` (a method decorated in its
      class body counts `self` among `args`) whose leaves are
      `jax.sharding.Sharding`s, `PartitionSpec`s (under `jax.set_mesh`) or
      `None` (unconstrained); a sharding covering a subtree applies to every
      array in it, and non-array leaves ignore it. Arrays not yet committed to
      devices (fresh ones, NumPy arrays) are placed on theirs before the call,
      replicated on the mesh when unconstrained; an array committed elsewhere
      is resharded inside the compiled function. `None` (default): as given.
    - `out_shardings`: likewise, a prefix of the output. Output subtrees it
      leaves unconstrained that have the structure, shapes and dtypes of an
      argument given shardings (an updated model, or optax's `mu` and `nu`
      built by `init`) are laid out like that argument; other arrays are left
      to XLA, on the mesh of the inputs.

    **Returns:** the compiled function, a pytree whose child is `fun`, with a
    `.lower(*args, **kwargs)` method for ahead-of-time compilation.

    **Raises:** `ValueError` for an unknown `donate`; `TypeError` if a leaf of
    `in_shardings` or `out_shardings` is no sharding (naming where). When
    called: `TypeError` naming the argument's key path (like
    `args[1]['opts']`) if a non-array leaf is unhashable; `ValueError` naming
    the key path where `in_shardings` or `out_shardings` is not a prefix of
    the arguments or output.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_jit
    ... def scale(x, factor, label):
    ...     return {"value": x * factor, "label": label.upper()}
    >>> scale(jnp.arange(3.0), 2.0, label="doubled")
    {'label': 'DOUBLED', 'value': Array([0., 2., 4.], dtype=float32)}

    ```

    With shardings: a batch split over a mesh's `"data"` axis, the
    parameters replicated, the output kept split.

    ```python
    >>> import jax
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    >>> @fx.filter_jit(in_shardings=((replicated, rows), None), out_shardings=rows)
    ... def predict(params, x):
    ...     return x @ params["w"] + params["b"]
    >>> params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    >>> predict(params, jnp.ones((8, 3))).sharding.is_equivalent_to(rows, 2)
    True

    ```
    """
    mode = DonateMode.parse(donate)
    layout = None
    if in_shardings is not None or out_shardings is not None:
        layout = Layout(in_shardings, out_shardings)
    if fun is None:
        return functools.partial(
            filter_jit,
            donate=donate,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
        )
    if not callable(fun):
        raise TypeError(f"filter_jit: expected a callable, got {fun!r}.")
    if type(fun) in TRANSFORM_TYPES:
        _warn_if_it_hides_a_module(fun)
    if layout is None:
        return _WRAPPER_TYPES[mode](fun, mode)
    return _SHARDED_WRAPPER_TYPES[mode](fun, mode, None, layout)


def _warn_if_it_hides_a_module(fun: Any) -> None:
    inner = wrapped_by_transform(fun)
    if (
        inner is not fun
        and is_module_type(type(inner))
        and any(map(is_array, jtu.tree_leaves(inner)))
    ):
        warnings.warn(
            f"filter_jit is given a JAX transform (`jax.vmap`, `jax.jit`...) of a "
            f"{type(inner).__qualname__}: the transformed function is not a "
            "pytree, so the Module's arrays are compiled in as constants, not "
            "traced (a new model compiles again, and gradients never reach "
            "them). Use the filtered transforms, e.g. "
            "`filter_jit(filter_vmap(model))`.",
            UserWarning,
            stacklevel=3,
        )
