"""`filter_closure_convert`: hoists the values a function closes over into a pytree."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.tree_util as jtu

from ._eval_shape import is_shaped, merge_output, split_output
from ._module import Module, field

__all__ = ["filter_closure_convert"]

_T = TypeVar("_T")


def _signature(leaf: Any) -> tuple[tuple[int, ...], Any]:
    return tuple(leaf.shape), jax.numpy.result_type(leaf)


class _ClosureConverted(Module):
    """A function traced at example arguments, as a pytree: the values it
    closed over (tracers included) are its leaves, `consts`."""

    consts: list[Any]
    jaxpr: Any = field(static=True)
    in_treedef: Any = field(static=True)
    in_mask: tuple[bool, ...] = field(static=True)
    in_static: tuple[Any, ...] = field(static=True)
    in_signature: tuple[Any, ...] = field(static=True)
    out_box: Any = field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = jtu.tree_flatten((args, kwargs))
        mask = tuple(is_shaped(leaf) for leaf in leaves)
        dynamic = [leaf for leaf, shaped in zip(leaves, mask) if shaped]
        static = tuple(leaf for leaf, shaped in zip(leaves, mask) if not shaped)
        if treedef != self.in_treedef or mask != self.in_mask:
            raise ValueError(
                "filter_closure_convert: called with arguments structured as "
                f"{treedef}, but it was traced for {self.in_treedef}."
            )
        if static != self.in_static:
            raise ValueError(
                "filter_closure_convert: called with non-array arguments "
                f"{static}, but it was traced for {self.in_static}."
            )
        signature = tuple(_signature(leaf) for leaf in dynamic)
        if signature != self.in_signature:
            raise ValueError(
                "filter_closure_convert: called with arrays of (shape, dtype) "
                f"{signature}, but it was traced for {self.in_signature}."
            )
        out_dynamic = jax.core.eval_jaxpr(self.jaxpr, self.consts, *dynamic)
        return merge_output(out_dynamic, self.out_box)


def filter_closure_convert(fun: Callable[..., _T], *args: Any, **kwargs: Any) -> Any:
    """Traces `fun` at example arguments into a pytree whose leaves are the
    values it closes over.

    Closed-over tracers (say, of an enclosing `jax.grad`) become explicit
    leaves, so the result can safely cross API boundaries that forbid them,
    such as `jax.custom_vjp` rules. All closed-over arrays are hoisted, not just
    floating-point ones.

    **Arguments:**

    - `fun`: the callable to convert.
    - `*args`, `**kwargs`: example arguments. Arrays (and
      `jax.ShapeDtypeStruct`s) only give shapes and dtypes; other leaves are
      static and baked in.

    **Returns:** a callable pytree, called like `fun` with arguments of the same
    structure, shapes, dtypes and non-array values (otherwise `ValueError`). A
    plain Python function without a closure cannot close over anything and is
    returned as it is.

    ```python
    >>> import jax, jax.numpy as jnp
    >>> import filterax as fx
    >>> def outer(scale):
    ...     converted = fx.filter_closure_convert(lambda x: scale * x, jnp.ones(2))
    ...     assert len(jax.tree.leaves(converted)) == 1  # `scale` is a leaf
    ...     return converted(jnp.arange(2.0)).sum()
    >>> jax.grad(outer)(3.0)
    Array(1., dtype=float32, weak_type=True)

    ```
    """
    if isinstance(fun, types.FunctionType) and fun.__closure__ is None:
        return fun
    leaves, treedef = jtu.tree_flatten((args, kwargs))
    mask = tuple(is_shaped(leaf) for leaf in leaves)
    dynamic = [leaf for leaf, shaped in zip(leaves, mask) if shaped]
    static = tuple(leaf for leaf, shaped in zip(leaves, mask) if not shaped)

    def body(*traced: Any) -> Any:
        traced_iter, static_iter = iter(traced), iter(static)
        merged = [next(traced_iter if shaped else static_iter) for shaped in mask]
        call_args, call_kwargs = treedef.unflatten(merged)
        return split_output(fun(*call_args, **call_kwargs))

    closed_jaxpr, (_, out_box) = jax.make_jaxpr(body, return_shape=True)(*dynamic)
    return _ClosureConverted(
        consts=list(closed_jaxpr.consts),
        jaxpr=closed_jaxpr.jaxpr,
        in_treedef=treedef,
        in_mask=mask,
        in_static=static,
        in_signature=tuple(_signature(leaf) for leaf in dynamic),
        out_box=out_box,
    )
