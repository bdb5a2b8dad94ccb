"""`filter_pmap`: `jax.pmap` over the arrays of arbitrary pytrees.

Argument and axis handling are `filter_vmap`'s (see `_vmap.py`). Like
`filter_jit`, everything that is not an array is static: part of a hashable key
passed to `jax.pmap` as a static broadcasted argument.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Hashable
from typing import Any, Literal, TypeVar, overload

import jax
import jax.tree_util as jtu
import numpy as np

from ._bound_method import BoundMethod
from ._filters import is_array
from ._vmap import (
    DEFAULT_AXES,
    batch_size,
    broadcast_prefix,
    call_path,
    named_in_axes,
    rebuild_mapped_output,
    resolve_axis,
    split_mapped_output,
    unmapped_output_error,
)

__all__ = ["filter_pmap"]

_F = TypeVar("_F", bound=Callable[..., Any])

_DONATION_WARNING = "Some donated buffers were not usable"


class _PmapWrapper:
    """What `filter_pmap` returns."""

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        axis_name: Hashable | None,
        axis_size: int | None,
        donate: str,
    ):
        self._fun = fun
        self._in_axes = in_axes
        self._out_axes = out_axes
        self._axis_name = axis_name
        self._axis_size = axis_size
        self._donate = donate
        # One `jax.pmap` per tuple of per-leaf input axes (they must be fixed
        # when `jax.pmap` is called); each compiles per static key.
        self._pmapped: dict[tuple[int | None, ...], Any] = {}
        self.__wrapped__ = fun
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                setattr(self, attribute, getattr(fun, attribute))
            except AttributeError:
                pass

    def _body(self, key: tuple, dynamic: list[Any]) -> Any:
        treedef, is_dynamic, static, _ = key
        dynamic_iter, static_iter = iter(dynamic), iter(static)
        leaves = [next(dynamic_iter if d else static_iter) for d in is_dynamic]
        args, kwargs = treedef.unflatten(leaves)
        return split_mapped_output(
            self._fun(*args, **kwargs), self._out_axes, "filter_pmap"
        )

    def _pmapped_for(self, axes: tuple[int | None, ...]) -> Any:
        pmapped = self._pmapped.get(axes)
        if pmapped is None:
            pmapped = jax.pmap(
                self._body,
                in_axes=(None, list(axes)),
                out_axes=(0, None, None),
                static_broadcasted_argnums=(0,),
                axis_name=self._axis_name,
                axis_size=self._axis_size,
                donate_argnums=() if self._donate == "none" else (1,),
            )
            self._pmapped[axes] = pmapped
        return pmapped

    def _prepare(
        self, args: tuple, kwargs: dict
    ) -> tuple[tuple[int | None, ...], tuple, list[Any]]:
        """The per-leaf input axes, the static key and the array leaves."""
        who = "filter_pmap"
        args_axes, kwargs_axes = named_in_axes(self._fun, self._in_axes, args, kwargs)
        pairs = broadcast_prefix(
            (args_axes, kwargs_axes),
            (args, kwargs),
            name=f"{who}: in_axes",
            root="the arguments",
            describe_path=call_path,
        )
        dynamic, axes, static, is_dynamic, mapped = [], [], [], [], []
        for path, leaf, spec in pairs:
            axis = resolve_axis(spec, leaf, f"{who}: in_axes", call_path(path))
            if is_array(leaf):
                dynamic.append(leaf)
                axes.append(axis)
                is_dynamic.append(True)
                if axis is not None:
                    mapped.append((call_path(path), leaf, axis))
            else:
                static.append(leaf)
                is_dynamic.append(False)
                try:
                    hash(leaf)
                except TypeError as error:
                    raise TypeError(
                        f"{who}: the argument at {call_path(path)} is an unhashable "
                        f"{type(leaf).__name__} ({error}); non-array leaves are "
                        "static and must be hashable."
                    ) from None
        size = batch_size(mapped, self._axis_size, who)
        if not mapped:
            # `jax.pmap` needs a mapped argument to run at all: add one, which
            # the body never reads (its leaves are rebuilt from `is_dynamic`).
            dynamic.append(np.zeros(size, np.int8))
            axes.append(0)
        # Like `filter_jit`'s: static leaves and their types, where they sit.
        static_tuple = tuple(static)
        key = (
            jtu.tree_structure((args, kwargs)),
            tuple(is_dynamic),
            static_tuple,
            tuple(map(type, static_tuple)),
        )
        return tuple(axes), key, dynamic

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        axes, key, dynamic = self._prepare(args, kwargs)
        try:
            with warnings.catch_warnings():
                if self._donate == "all":
                    warnings.filterwarnings("ignore", message=_DONATION_WARNING)
                mapped_out, unmapped_out, box = self._pmapped_for(axes)(key, dynamic)
        except ValueError as error:
            if "but output was batched" in str(error):
                # Trace again, shapes only, with every output mapped, to name
                # the outputs that were declared unmapped.
                everything_mapped = jax.vmap(
                    functools.partial(self._body, key),
                    in_axes=(list(axes),),
                    axis_name=self._axis_name,
                    axis_size=self._axis_size,
                )
                _, _, box = jax.eval_shape(everything_mapped, dynamic)
                unmapped_output_error(error, box.value[4], "filter_pmap")
            raise
        return rebuild_mapped_output(mapped_out, unmapped_out, box, "filter_pmap")

    def lower(self, /, *args: Any, **kwargs: Any) -> Any:
        """Lowers `fun(*args, **kwargs)` ahead of time: JAX's `Lowered` for
        the underlying `jax.pmap`.

        ```python
        >>> import jax.numpy as jnp
        >>> import filterax as fx
        >>> lowered = fx.filter_pmap(lambda x: x + 1).lower(jnp.ones((2, 3)))
        >>> "stablehlo" in lowered.as_text()
        True

        ```
        """
        axes, key, dynamic = self._prepare(args, kwargs)
        return self._pmapped_for(axes).lower(key, dynamic)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return BoundMethod(self, instance)

    def __repr__(self) -> str:
        return f"<filter_pmap of {getattr(self, '__qualname__', self._fun)!s}>"


@overload
def filter_pmap(
    fun: _F,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: Literal["none", "all", "warn"] = "none",
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
) -> Callable[[_F], _F]: ...


def filter_pmap(
    fun: Any = None,
    *,
    in_axes: Any = DEFAULT_AXES,
    out_axes: Any = DEFAULT_AXES,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    donate: Literal["none", "all", "warn"] = "none",
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
      The mapped size must not exceed the number of local devices.
    - `donate`: `"none"` (default), `"all"` (donate every array argument and
      silence JAX's unusable-donation warning) or `"warn"` (donate, and let the
      warning through).

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
        )
    if not callable(fun):
        raise TypeError(f"filter_pmap: expected a callable, got {fun!r}.")
    return _PmapWrapper(fun, in_axes, out_axes, axis_name, axis_size, donate)
