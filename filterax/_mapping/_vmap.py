"""`filter_vmap`: vectorising over the arrays of arbitrary pytrees."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np

from .._compat import traceback_boundary
from .._module import FunctionWrapper
from .._tree._filters import is_ref
from ._axes import (
    DEFAULT_AXES,
    MappedOutput,
    batch_size,
    is_batched_ref_write_error,
    map_arguments,
    raise_for_batched_unmapped_output,
    split_mapped_output,
)

__all__ = ["VmapWrapper", "filter_vmap"]

_F = TypeVar("_F", bound=Callable[..., Any])
_WHO = "filter_vmap"


class VmapWrapper(FunctionWrapper):
    """What `filter_vmap` returns: a pytree whose child is the wrapped function
    and whose static data are the mapping options (so two wrappers of one
    function with one set of options compare equal once flattened, and
    `filter_jit` shares their compilation). As a decorator in a class body,
    `model.method` is a pytree holding `model`, which is then the first
    argument (mapped per `in_axes`)."""

    _transform_name = _WHO
    _keeps_annotations = False  # the mapped function takes other shapes

    def __init__(
        self,
        fun: Callable[..., Any],
        in_axes: Any,
        out_axes: Any,
        axis_name: Hashable | None,
        axis_size: int | None,
        vmap_kwargs: tuple[tuple[str, Any], ...],
    ):
        super().__init__(fun, (in_axes, out_axes, axis_name, axis_size, vmap_kwargs))
        self.in_axes = in_axes
        self.out_axes = out_axes
        self.axis_name = axis_name
        self.axis_size = axis_size
        self.vmap_kwargs = vmap_kwargs

    @classmethod
    def _from_options(cls, fun: Callable[..., Any], options: tuple) -> VmapWrapper:
        return cls(fun, *options)

    @traceback_boundary
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        call = map_arguments(self.fun, self.in_axes, args, kwargs, _WHO)
        batch_size(call, self.axis_size, _WHO)
        fun, out_axes, call_static = self.fun, self.out_axes, call.static

        def mapped_fun(dynamic: list[Any]) -> tuple[list, list, MappedOutput]:
            call_args, call_kwargs = call_static.merge(dynamic)
            return split_mapped_output(
                fun(*call_args, **call_kwargs), out_axes, _WHO, dynamic
            )

        vmapped = jax.vmap(
            mapped_fun,
            in_axes=(call.axes,),
            out_axes=(0, None, None),
            axis_name=self.axis_name,
            axis_size=self.axis_size,
            **dict(self.vmap_kwargs),
        )
        try:
            mapped_out, unmapped_out, info = vmapped(call.dynamic)
        except ValueError as error:
            raise_for_batched_unmapped_output(
                error,
                mapped_fun,
                call.axes,
                call.dynamic,
                self.axis_name,
                self.axis_size,
                _WHO,
            )
            raise
        except Exception as error:
            if is_batched_ref_write_error(error):
                _ref_write_error(error, call.dynamic, call.axes)
            raise
        # `jax.vmap` hands back an argument the function returned untouched
        # as it came: a NumPy array would come out aliasing the caller's.
        mapped_out = [
            jnp.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf
            for leaf in mapped_out
        ]
        return info.rebuild(mapped_out, unmapped_out, _WHO, lambda: call.dynamic)


def _ref_write_error(error: Exception, dynamic: list[Any], axes: list[Any]) -> None:
    shared = sum(
        1 for leaf, axis in zip(dynamic, axes) if axis is None and is_ref(leaf)
    )
    raise ValueError(
        "filter_vmap: the function writes to a Ref that is shared across the batch"
        + (f" ({shared} Ref argument(s) have the axis None)" if shared else "")
        + ". A Ref passed with an integer in_axes holds one slot per example and "
        "may be written; one with the axis None, or closed over, is shared: it may "
        "be read inside filter_vmap, but not written. Pass the Ref as an argument "
        "with an integer axis (if_array(0) does so), or write it outside the map."
    ) from error


@overload
def filter_vmap(
    fun: _F,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    **vmap_kwargs: Any,
) -> _F: ...


@overload
def filter_vmap(
    fun: None = None,
    *,
    in_axes: Any = ...,
    out_axes: Any = ...,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    **vmap_kwargs: Any,
) -> Callable[[_F], _F]: ...


def filter_vmap(
    fun: Any = None,
    *,
    in_axes: Any = DEFAULT_AXES,
    out_axes: Any = DEFAULT_AXES,
    axis_name: Hashable | None = None,
    axis_size: int | None = None,
    **vmap_kwargs: Any,
) -> Any:
    """Vectorises `fun` over the arrays of arbitrary pytrees.

    By default every array leaf of the arguments is mapped over its leading
    axis and everything else is broadcast; outputs are stacked along axis 0.
    Typed key arrays are mapped like any other array. A `jax.Ref` is mapped
    like an array when its axis is an int (per-example state: one slot per
    example) and shared when it is `None`; writes made inside are visible
    after the call. Arrays inside `fun` itself (a Module, a bound method) are
    broadcast: to map over a model, pass it as an argument.

    **Arguments:**

    - `fun`: the function to vectorise. Omit it to get a decorator.
    - `in_axes`: a pytree prefix of the positional arguments (a tuple, one entry
      per argument) whose leaves are an int (the axis to map over), `None`
      (broadcast) or a callable `leaf -> int | None`; it is descended into as
      JAX sees it, so a callable Module there is a node, not a spec. An int or
      callable alone applies to every argument. A dict maps parameter names to
      such specs; unnamed arguments get `if_array(0)`. Keyword arguments get
      `if_array(0)` unless a dict `in_axes` names them. An int axis on a leaf
      that is not an array or a Ref is an error.
    - `out_axes`: likewise, a pytree prefix of the output: where the mapped axis
      goes in each output array; `None` for outputs that do not depend on the
      mapped inputs. A Python number given an int axis is broadcast into an
      array, as in Equinox; any other non-array output given one is an error.
    - `axis_name`: a name for the mapped axis, for collectives such as
      `jax.lax.psum`.
    - `axis_size`: the batch size; needed only when no argument is mapped.
    - `**vmap_kwargs`: passed on to `jax.vmap` (e.g. `spmd_axis_name`).

    **Returns:** the vectorised function, a pytree whose child is `fun`.

    **Raises:** when called, `ValueError` naming the key path if the mapped axes
    disagree on the batch size, if nothing is mapped and `axis_size` is
    missing, if an axis spec is invalid or out of range, or if it maps a leaf
    that is not an array.

    ```python
    >>> import jax.numpy as jnp
    >>> import filterax as fx
    >>> @fx.filter_vmap(in_axes=(0, None))
    ... def affine(x, params):
    ...     return params["w"] * x + params["b"], params["name"]
    >>> out, name = affine(jnp.arange(3.0), {"w": 2.0, "b": jnp.ones(()), "name": "f"})
    >>> out, name
    (Array([1., 3., 5.], dtype=float32), 'f')

    ```
    """
    if fun is None:
        return functools.partial(
            filter_vmap,
            in_axes=in_axes,
            out_axes=out_axes,
            axis_name=axis_name,
            axis_size=axis_size,
            **vmap_kwargs,
        )
    if not callable(fun):
        raise TypeError(f"filter_vmap: expected a callable, got {fun!r}.")
    return VmapWrapper(
        fun, in_axes, out_axes, axis_name, axis_size, tuple(sorted(vmap_kwargs.items()))
    )
