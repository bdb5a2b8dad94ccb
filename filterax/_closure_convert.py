"""`filter_closure_convert`: hoists the values a function closes over into a pytree."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
from jax.core import eval_jaxpr

from ._compat import same_structure, traceback_boundary
from ._eval_shape import is_shaped, traced_call
from ._module import Module, field
from ._tree._split import StaticPart, split
from ._tree._structure import differences_text

__all__ = ["filter_closure_convert"]


def _struct(leaf: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(leaf.shape), jax.numpy.result_type(leaf))


class _ConvertedBase(Module):
    """What both forms of a closure-converted function know: the structure,
    shapes and static values of the example call and of its output."""

    in_static: StaticPart = field(static=True)
    in_structs: tuple[jax.ShapeDtypeStruct, ...] = field(static=True)
    out_static: StaticPart = field(static=True)
    out_structs: tuple[jax.ShapeDtypeStruct, ...] = field(static=True)

    @property
    def in_struct(self) -> Any:
        """`(args, kwargs)` of the example call, arrays as `ShapeDtypeStruct`s."""
        return self.in_static.merge(self.in_structs)

    @property
    def out_struct(self) -> Any:
        """The output, with `ShapeDtypeStruct`s for its arrays."""
        return self.out_static.merge(self.out_structs)

    def _dynamic_arguments(self, args: tuple, kwargs: dict) -> list[Any]:
        dynamic, call_static = split((args, kwargs), is_shaped)
        expected = self.in_static
        # Static values are compared with `==` alone: inside a trace JAX may
        # hand over a Python float as its own float subclass.
        if (
            not same_structure(call_static.treedef, expected.treedef)
            or call_static.mask != expected.mask
            or call_static.static != expected.static
            or tuple(map(_struct, dynamic)) != self.in_structs
        ):
            called = call_static.merge(tuple(map(_struct, dynamic)))
            listing = differences_text(
                self.in_struct, called, "(args, kwargs)", compare_values=False
            )
            raise ValueError(
                "filter_closure_convert: called with arguments that differ from the "
                f"example it was traced at ({listing or 'they differ'}). Call it "
                "with the same structure, shapes, dtypes and non-array values."
            )
        return dynamic


class _ClosureConverted(_ConvertedBase):
    """A function traced at example arguments, as a pytree: the values it
    closed over (tracers included) are its leaves, `consts`."""

    consts: list[Any]
    jaxpr: Any = field(static=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dynamic = self._dynamic_arguments(args, kwargs)
        out_dynamic = eval_jaxpr(self.jaxpr, self.consts, *dynamic)
        return self.out_static.merge(out_dynamic)


class _TrivialClosureConvert(_ConvertedBase):
    """A function that closes over nothing: called as it is."""

    fn: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._dynamic_arguments(args, kwargs)
        return self.fn(*args, **kwargs)


@traceback_boundary
def filter_closure_convert(fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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
    structure, shapes, dtypes and non-array values (otherwise `ValueError`
    naming where they differ). Its `in_struct` and `out_struct` give the
    example call and the output, with `jax.ShapeDtypeStruct`s for arrays. A
    plain Python function without a closure cannot close over anything and is
    wrapped as it is.

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
    dynamic, in_static = split((args, kwargs), is_shaped)
    in_structs = tuple(map(_struct, dynamic))
    body = traced_call(fun, in_static)
    if isinstance(fun, types.FunctionType) and fun.__closure__ is None:
        out_dynamic, out_static = jax.eval_shape(body, dynamic)
        return _TrivialClosureConvert(
            in_static, in_structs, out_static, tuple(out_dynamic), fun
        )
    closed_jaxpr, (out_dynamic, out_static) = jax.make_jaxpr(
        lambda *traced: body(list(traced)), return_shape=True
    )(*dynamic)
    return _ClosureConverted(
        in_static,
        in_structs,
        out_static,
        tuple(out_dynamic),
        list(closed_jaxpr.consts),
        closed_jaxpr.jaxpr,
    )
