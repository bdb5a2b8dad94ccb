"""`filter_pmap`: `jax.pmap` over the arrays of arbitrary pytrees.

Argument and axis handling are `filter_vmap`'s (see `_axes.py`). Like
`filter_jit`, everything that is not an array is static: the arguments'
`StaticPart` is passed to `jax.pmap` as a static broadcasted argument.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, Literal, TypeVar, overload

import jax
import jax.tree_util as jtu
import numpy as np

from .._compat import donation_warning_ignored, traceback_boundary
from .._module import FunctionWrapper
from .._tree._split import StaticPart, is_dynamic_leaf, shape_signature
from .._tree._structure import argument_path, differences_text
from ._axes import (
    DEFAULT_AXES,
    MappedArguments,
    MappedOutput,
    batch_size,
    map_arguments,
    raise_for_batched_unmapped_output,
    split_mapped_output,
)

__all__ = ["PmapCompiled", "PmapLowered", "PmapWrapper", "filter_pmap"]

_F = TypeVar("_F", bound=Callable[..., Any])
_WHO = "filter_pmap"


class PmapWrapper(FunctionWrapper):
    """What `filter_pmap` returns: a pytree whose child is the wrapped function
    and whose static data are the mapping options."""

    _transform_name = _WHO
    _keeps_annotations = False  # the mapped function takes other shapes

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        axis_name: Hashable | None,
        axis_size: int | None,
        donate: str,
        pmap_kwargs: tuple[tuple[str, Any], ...],
    ):
        super().__init__(
            fun, (in_axes, out_axes, axis_name, axis_size, donate, pmap_kwargs)
        )
        self.in_axes = in_axes
        self.out_axes = out_axes
        self.axis_name = axis_name
        self.axis_size = axis_size
        self.donate = donate
        self.pmap_kwargs = pmap_kwargs
        # One `jax.pmap` per tuple of per-leaf input axes (they must be fixed
        # when `jax.pmap` is called); each compiles per static part.
        self._pmapped: dict[tuple[int | None, ...], Any] = {}

    @classmethod
    def _from_options(cls, fun: Callable[..., Any], options: tuple) -> PmapWrapper:
        return cls(fun, *options)

    def _body(
        self, static: StaticPart, dynamic: list[Any]
    ) -> tuple[list, list, MappedOutput]:
        args, kwargs = static.merge(dynamic[: static.num_dynamic])
        return split_mapped_output(
            self.fun(*args, **kwargs), self.out_axes, _WHO, dynamic
        )

    def _pmapped_for(self, axes: tuple[int | None, ...]) -> Any:
        pmapped = self._pmapped.get(axes)
        if pmapped is None:
            pmapped = jax.pmap(
                self._body,
                in_axes=(None, list(axes)),
                out_axes=(0, None, None),
                static_broadcasted_argnums=(0,),
                axis_name=self.axis_name,
                axis_size=self.axis_size,
                donate_argnums=() if self.donate == "none" else (1,),
                **dict(self.pmap_kwargs),
            )
            self._pmapped[axes] = pmapped
        return pmapped

    def _prepare(
        self, args: tuple, kwargs: dict
    ) -> tuple[tuple[int | None, ...], MappedArguments, list[Any]]:
        """The per-leaf input axes, the split call and its dynamic leaves (with
        a dummy mapped array when nothing is mapped: `jax.pmap` needs one)."""
        # As Equinox's `filter_pmap`: an int axis on a non-array leaf (an
        # ensemble's activation functions, given `in_axes=0`) broadcasts it.
        call = map_arguments(
            self.fun, self.in_axes, args, kwargs, _WHO, broadcast_non_arrays=True
        )
        size = batch_size(call, self.axis_size, _WHO)
        try:
            hash(call.static)
        except TypeError:
            _raise_unhashable(args, kwargs)
        dynamic, axes = list(call.dynamic), list(call.axes)
        if not call.mapped:
            dynamic.append(np.zeros(size, np.int8))
            axes.append(0)
        return tuple(axes), call, dynamic

    @traceback_boundary
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        axes, call, dynamic = self._prepare(args, kwargs)
        try:
            with donation_warning_ignored(self.donate == "all"):
                mapped, unmapped, info = self._pmapped_for(axes)(call.static, dynamic)
        except ValueError as error:
            raise_for_batched_unmapped_output(
                error,
                functools.partial(self._body, call.static),
                list(axes),
                dynamic,
                self.axis_name,
                self.axis_size,
                _WHO,
            )
            raise
        return info.rebuild(mapped, unmapped, _WHO, lambda: dynamic)

    def lower(self, /, *args: Any, **kwargs: Any) -> PmapLowered:
        """Lowers `fun(*args, **kwargs)` ahead of time.

        **Arguments:** the arguments of a call.

        **Returns:** a [`PmapLowered`][filterax._mapping._pmap.PmapLowered]:
        JAX's `jax.stages.Lowered` for the underlying `jax.pmap` (`as_text()`
        and the rest), whose `compile()` gives a function called with the
        original arguments.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> lowered = fx.filter_pmap(lambda x, n: x + n).lower(jnp.ones((1, 3)), 2)
        >>> "stablehlo" in lowered.as_text()
        True
        >>> lowered.compile()(jnp.zeros((1, 3)), 2)
        Array([[2., 2., 2.]], dtype=float32)

        ```
        """
        axes, call, dynamic = self._prepare(args, kwargs)
        lowered = self._pmapped_for(axes).lower(call.static, dynamic)
        return PmapLowered(
            lowered, self, axes, call.static, _shapes(dynamic), (args, kwargs)
        )


def _raise_unhashable(args: tuple, kwargs: dict) -> None:
    for path, leaf in jtu.tree_leaves_with_path((args, kwargs)):
        if is_dynamic_leaf(leaf):
            continue
        try:
            hash(leaf)
        except TypeError as error:
            raise TypeError(
                f"{_WHO}: the argument at {argument_path(path)} is an unhashable "
                f"{type(leaf).__name__} ({error}); non-array leaves are static and "
                "must be hashable."
            ) from None
    raise TypeError(f"{_WHO}: a non-array argument is unhashable.")


def _shapes(leaves: list[Any]) -> list[tuple[tuple[int, ...], Any]]:
    return [(leaf.shape, leaf.dtype) for leaf in leaves]


class PmapLowered:
    """`filter_pmap(f).lower(*args, **kwargs)`: JAX's `Lowered` for that call.

    `compile(compiler_options=...)` gives a [`PmapCompiled`][]; every other
    attribute (`as_text()`, `cost_analysis()`, ...) is `jax.stages.Lowered`'s.
    """

    def __init__(
        self,
        lowered: Any,
        wrapper: PmapWrapper,
        axes: tuple[int | None, ...],
        static: StaticPart,
        signature: list[tuple[tuple[int, ...], Any]],
        example: tuple[tuple, dict],
    ):
        #: JAX's own `jax.stages.Lowered` (public, as in Equinox).
        self.lowered = lowered
        self._wrapper = wrapper
        self._axes = axes
        self._static = static
        self._example = example
        self._signature = signature
        # The instance of a bound method, passed before the call's arguments.
        self._first: tuple[Any, ...] = ()

    def compile(self, compiler_options: dict[str, Any] | None = None) -> PmapCompiled:
        """Compiles the lowered call.

        **Arguments:**

        - `compiler_options`: XLA compiler options, as for
          `jax.stages.Lowered.compile`.

        **Returns:** a [`PmapCompiled`][], called with arguments like the
        lowered call's.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> compiled = fx.filter_pmap(lambda x: 2 * x).lower(jnp.ones((1, 2))).compile()
        >>> compiled(jnp.ones((1, 2)))
        Array([[2., 2.]], dtype=float32)

        ```
        """
        compiled = self.lowered.compile(compiler_options)
        return PmapCompiled(compiled, self)

    def bound_to(self, first: Any) -> PmapLowered:
        """This lowered call, compiling to a function that takes its arguments
        but the first, which is `first` (a bound method's instance)."""
        bound = object.__new__(PmapLowered)
        bound.__dict__.update(self.__dict__, _first=(first,))
        return bound

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the instance lacks; a copy that is not yet
        # filled in (`copy.copy`) must not look for `lowered` in itself.
        if name in ("lowered", "_wrapper"):
            raise AttributeError(name)
        return getattr(self.lowered, name)


class PmapCompiled:
    """A compiled `filter_pmap` call, called with the original arguments: their
    non-array parts and mapped axes must be the lowered call's, their arrays the
    same shapes and dtypes."""

    def __init__(self, compiled: Any, lowered: PmapLowered):
        #: JAX's own `jax.stages.Compiled` (public, as in Equinox).
        self.compiled = compiled
        self._lowered = lowered

    @traceback_boundary
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        lowered = self._lowered
        wrapper = lowered._wrapper
        args = (*lowered._first, *args)
        axes, call, dynamic = wrapper._prepare(args, kwargs)
        if (
            axes != lowered._axes
            or call.static != lowered._static
            or _shapes(dynamic) != lowered._signature
        ):
            listing = differences_text(
                shape_signature(lowered._example),
                shape_signature((args, kwargs)),
                "(args, kwargs)",
            )
            raise ValueError(
                f"{_WHO}: a compiled function was called with arguments that differ "
                f"from the ones it was lowered for ({listing or 'their mapped axes'}). "
                "Call it with the same structure, non-array values and axes, or "
                "lower it again."
            )
        with donation_warning_ignored(wrapper.donate == "all"):
            mapped, unmapped, info = self.compiled(dynamic)
        return info.rebuild(mapped, unmapped, _WHO, lambda: dynamic)

    def __getattr__(self, name: str) -> Any:
        if name in ("compiled", "_lowered"):
            raise AttributeError(name)
        return getattr(self.compiled, name)


@overload
def filter_pmap(
    fun: _F,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: Literal["none", "all", "warn"] = "none",
    **pmap_kwargs: Any,
) -> _F: ...


@overload
def filter_pmap(
    fun: None = None,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: Literal["none", "all", "warn"] = "none",
    **pmap_kwargs: Any,
) -> Callable[[_F], _F]: ...


def filter_pmap(
    fun: Any = None,
    *,
    in_axes: Any = DEFAULT_AXES,
    out_axes: Any = DEFAULT_AXES,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: Literal["none", "all", "warn"] = "none",
    **pmap_kwargs: Any,
) -> Any:
    """Runs `fun` in parallel over devices, mapping over the arrays of arbitrary
    pytrees.

    The conventions are [`filter_vmap`][filterax.filter_vmap]'s: by default
    every array leaf is split over its leading axis, one slice per device, and
    everything else is broadcast; arrays inside `fun` itself are broadcast too.
    Like [`filter_jit`][filterax.filter_jit], the function is compiled: array
    leaves are traced, every other leaf is static (hashed; a new value
    compiles again), and non-array outputs come back as Python objects.

    For new code, consider `filter_jit` with sharded inputs (see
    [`filter_shard`][filterax.filter_shard]), which JAX recommends over
    `pmap`.

    **Arguments:**

    - `fun`: the function to parallelise. Omit it to get a decorator.
    - `in_axes`, `out_axes`, `axis_name`, `axis_size`: as for `filter_vmap`.
      The mapped size must not exceed the number of devices used. Unlike
      `filter_vmap`, and as Equinox's, an integer axis on an argument leaf
      that is not an array passes it to every device (`in_axes=(0, None)` for
      an ensemble whose members hold activation functions).
    - `donate`: `"none"` (default), `"all"` (donate every array argument and
      silence JAX's unusable-donation warning) or `"warn"` (donate, and let the
      warning through).
    - `**pmap_kwargs`: passed on to `jax.pmap` (`devices`, `backend`...).

    **Returns:** the parallelised function, with a `.lower(*args, **kwargs)`
    method.

    **Raises:** when called, the errors of `filter_vmap`, and `TypeError` naming
    the key path of an unhashable non-array argument leaf.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> n = jax.local_device_count()
    >>> @fx.filter_pmap(axis_name="devices")
    ... def normalise(x, label):
    ...     return x / jax.lax.psum(x, "devices"), label
    >>> out, label = normalise(jnp.ones(n), "shares")
    >>> bool(jnp.allclose(out, 1 / n)), label
    (True, 'shares')

    ```
    """
    if donate not in ("none", "all", "warn"):
        raise ValueError(
            f"filter_pmap: donate={donate!r} is not one of 'none', 'all', 'warn'."
        )
    if fun is None:
        return functools.partial(
            filter_pmap,
            in_axes=in_axes,
            out_axes=out_axes,
            axis_name=axis_name,
            axis_size=axis_size,
            donate=donate,
            **pmap_kwargs,
        )
    if not callable(fun):
        raise TypeError(f"filter_pmap: expected a callable, got {fun!r}.")
    return PmapWrapper(
        fun,
        in_axes,
        out_axes,
        axis_name,
        axis_size,
        donate,
        tuple(
            (name, tuple(value) if isinstance(value, list) else value)
            for name, value in sorted(pmap_kwargs.items(), key=lambda item: item[0])
        ),
    )
