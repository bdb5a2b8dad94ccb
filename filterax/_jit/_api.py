"""`filter_jit` and `JitWrapper`, the one wrapper it returns; see the folder's
`__init__` for the two routes a call takes."""

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
from .._mapping._shard import mesh_context
from .._module import FunctionWrapper
from .._transformed import TRANSFORM_TYPES, wrapped_by_transform
from .._tree._filters import is_array
from .._tree._split import STATIC, MixedOutput, flatten, is_module_type, leaf_kinds
from .._warnings import FilteraxWarning
from ._aot import CallPlan, Lowered
from ._compiled import REROUTE, Compiled, compiled_for, rebuild
from ._describe import describe, first_argument_leaf_count, raise_if_unhashable
from ._layout import Layout, on_auto_mesh
from ._policy import Donate, Policy, restore_warnings, silencing_depth

__all__ = ["JitWrapper", "filter_jit"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _holds_module(values: tuple) -> bool:
    """Whether a Module is among `values`, or inside tuples among them."""
    for value in values:
        if is_module_type(type(value)) or (
            type(value) is tuple and _holds_module(value)
        ):
            return True
    return False


class JitWrapper(FunctionWrapper):
    """What `filter_jit` returns: one class for every donation mode and
    sharding, its `Policy` built once.

    A `FunctionWrapper`: its child is the wrapped function (a Module
    contributes its arrays), its options the `Policy` and the shared
    `Compiled`. A copy made by unflattening finds its `Compiled` again from
    the function it holds: the same one when only arrays changed; another
    when the function did (`tree_at` replacing a Module's activation, say).
    """

    _transform_name = "filter_jit"

    def __init__(
        self, fun: Callable[..., Any], policy: Policy, known: Compiled | None = None
    ):
        compiled, self.fun_dynamic = compiled_for(fun, policy, known)
        super().__init__(fun, (policy, compiled))
        self.policy = policy
        self.compiled = compiled

    @classmethod
    def _from_options(cls, fun: Callable[..., Any], options: tuple) -> JitWrapper:
        policy, compiled = options
        return cls(fun, policy, compiled)

    @traceback_boundary
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        try:
            if self.policy.plain:
                if self.compiled.direct_ok is False:  # the common case: one frame less
                    return self._call_keyed(args, kwargs)
                return self._call(args, kwargs)
            return self._call_with_policy(args, kwargs)
        except Exception as error:
            translated = runtime_error_from(error)
            if translated is None:
                raise
            raise translated from None

    def _call_with_policy(self, args: tuple, kwargs: dict) -> Any:
        """A call with donation warnings silenced, the first argument kept or
        shardings applied."""
        policy = self.policy
        if not args and kwargs:
            args, kwargs = self._arrange(args, kwargs)
        depth = silencing_depth()
        try:
            layout = policy.layout
            if layout is None:
                return self._call(args, kwargs)
            mesh = layout.explicit_mesh
            if mesh is not None and jax.sharding.get_abstract_mesh().empty:
                with mesh_context(mesh):
                    return self._call(*layout.place(args, kwargs))
            return self._call(*layout.place(args, kwargs))
        finally:
            restore_warnings(depth)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        compiled = self.compiled
        direct = compiled.direct_ok
        if direct is None:
            # The first call picks the route: arguments holding Modules or
            # non-array leaves take the keyed one (a Module is flattened once
            # and then found by identity, cheaper than JAX flattening it).
            # Arrays on an `Auto` mesh take it too, their shardings in the key.
            leaves = flatten((args, kwargs))[0]
            if self.policy.layout is None and on_auto_mesh(leaves):
                compiled.with_shardings = True
            direct = compiled.direct_ok = not (
                compiled.with_shardings
                or _holds_module((*args, *kwargs.values()))
                or STATIC in leaf_kinds(leaves)
            )
        if direct:
            groups = self.policy.direct(self.fun_dynamic, args, kwargs)
            if groups is not None:
                out: Any
                try:
                    out = compiled.direct(*groups)
                except Exception:
                    # JAX rejected a leaf that is no array (a string, an int
                    # too large): the keyed route makes it static.
                    if STATIC not in leaf_kinds(flatten((args, kwargs))[0]):
                        raise
                    out = REROUTE
                if out is not REROUTE:
                    if out.__class__ is MixedOutput:
                        return rebuild(
                            out, lambda: flatten((self.fun_dynamic, args, kwargs))[0]
                        )
                    return out
                compiled.direct_ok = False
        return self._call_keyed(args, kwargs)

    def _call_keyed(self, args: tuple, kwargs: dict) -> Any:
        compiled = self.compiled
        last = compiled.last_call
        try:
            key, leaves = describe(
                args, kwargs, last, self.fun_dynamic, compiled.with_shardings
            )
        except Exception:
            raise_if_unhashable(args, kwargs)
            raise
        if key is not last:
            compiled.last_call = key
        policy = self.policy
        if policy.donates:
            n_first = first_argument_leaf_count(key, args) if args else 0
            out = compiled.keyed(
                key, *policy.keyed(leaves, len(self.fun_dynamic), n_first)
            )
        else:
            out = compiled.keyed(key, leaves)
        if out.__class__ is MixedOutput:
            return rebuild(out, lambda: leaves)
        if out is REROUTE:
            # On an `Auto` mesh: keys carry the leaves' shardings from now on.
            compiled.with_shardings = True
            return self._call_keyed(args, kwargs)
        return out

    def _arrange(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """For the `*-except-first` modes, a call given by keyword only: the
        function's first parameter, if given, moved to the front (passed by
        position, so that it is kept all the same)."""
        if args or not kwargs or not self.policy.except_first:
            return args, kwargs
        name = self.__dict__.get("_first_parameter", _ABSENT)
        if name is _ABSENT:
            name = self._first_parameter = _first_parameter_name(self.fun)
        if name is None or name not in kwargs:
            return args, kwargs
        rest = dict(kwargs)
        return (rest.pop(name),), rest

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
        layout = self.policy.layout
        mesh = None if layout is None else layout.explicit_mesh
        if mesh is not None and jax.sharding.get_abstract_mesh().empty:
            with mesh_context(mesh):
                return self._lower(args, kwargs)
        return self._lower(args, kwargs)

    def _lower(self, args: tuple, kwargs: dict) -> Lowered:
        args, kwargs = self._arrange(args, kwargs)
        depth = silencing_depth()
        try:
            try:
                key, leaves = describe(args, kwargs, None, self.fun_dynamic, True)
            except TypeError:
                raise_if_unhashable(args, kwargs)
                raise
            policy = self.policy
            n_first = (
                first_argument_leaf_count(key, args) if args and policy.donates else 0
            )
            plan = CallPlan(
                key, self.fun_dynamic, n_first, policy, args, kwargs, self._arrange
            )
            with donation_warning_ignored(policy.silences):
                dynamic = leaves[len(self.fun_dynamic) :]
                lowered = self.compiled.keyed.lower(key, *plan.groups(dynamic))
        finally:
            restore_warnings(depth)
        return Lowered(lowered, plan)


_ABSENT = object()


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
    layout = None
    if in_shardings is not None or out_shardings is not None:
        layout = Layout(in_shardings, out_shardings)
    policy = Policy(donate, layout)
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
    return JitWrapper(fun, policy)


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
            FilteraxWarning,
            stacklevel=3,
        )
